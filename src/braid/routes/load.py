"""``GET /load`` (vLLM's) and ``GET /get_load`` (what vllm-router polls): the server's load figure.

vLLM 0.32 serves ``/load`` always, as ``{"server_load": N}``; with ``--enable-server-load-tracking``
``N`` counts its generation requests in flight (each counted from when its handler starts to when
its response has been sent), and without the flag it stays 0. braid serves the same route and
flag (``Settings.server_load_tracking``), and the same figure under the name vllm-router 0.1.x
reads: its ``power_of_two`` policy polls ``GET /get_load`` on each worker and takes ``load``
(vllm-project/router#174: it never asks ``/load``), so ``/get_load`` answers ``{"load": N}``.

**What N counts** (with the flag): every ``POST`` to a generating route (``/v1/completions``,
``/v1/chat/completions``, ``/v1/chat/completions/batch``, ``/invocations``; :data:`GENERATING`) from the moment the
app takes the request to the moment its answer has been sent, whatever that answer is (a stream,
a whole body, a 4xx or 5xx), or its client has gone and its run has aborted. So a request waiting
in braid's admission queue for engine slots counts, as one running in the engine does: braid
holds waiting prompts itself, and a figure of only the engine's requests would call a replica
with a long queue idle. A request is one, whatever its ``n`` or prompt count (as in vLLM). Not
counted: ``/tokenize`` and ``/detokenize`` (no engine request, as in vLLM), a request refused
by the API-key guard (it never reaches the app, as vLLM's middleware refuses it before its
handler), and any ``GET``. The count is kept at the ASGI edge (:mod:`braid.http.load`), so
nothing on the data path pays for it; without the flag the counter is not installed at all.

With API keys both routes need a key, like every route but ``/health`` (:mod:`braid.http.auth`);
vLLM leaves ``/load`` unguarded.
"""

from __future__ import annotations

import attrs
import msgspec

from braid.routes import chat, completions, invocations
from braid.wire.openapi import Operation, Outcome, ref

GENERATING: frozenset[str] = frozenset(r.path for r in (*completions.ROUTES, *chat.ROUTES, *invocations.ROUTES))
"""The routes whose ``POST`` s count in the load figure: those that open engine requests."""


@attrs.define
class ServerLoad:
    """The load figure of one app. ``open`` is changed only by :mod:`braid.http.load`."""

    tracking: bool = False
    """``--enable-server-load-tracking``: without it the figure is always 0, as vLLM's."""
    open: int = 0
    """Generating requests taken and not yet answered in full (see the module docstring)."""

    @property
    def figure(self) -> int:
        return self.open if self.tracking else 0


class LoadBody(msgspec.Struct, frozen=True):
    """vLLM's ``GET /load`` answer."""

    server_load: int


class RouterLoadBody(msgspec.Struct, frozen=True):
    """``GET /get_load``: the same figure under the name vllm-router reads."""

    load: int


def load_body(load: ServerLoad) -> bytes:
    return msgspec.json.encode(LoadBody(server_load=load.figure))


def router_load_body(load: ServerLoad) -> bytes:
    return msgspec.json.encode(RouterLoadBody(load=load.figure))


OPERATIONS = (
    Operation(
        "get",
        "/load",
        "The server's load (vLLM's route)",
        (
            Outcome(
                200,
                "Generating requests open now, queued ones included; 0 without --enable-server-load-tracking.",
                {"application/json": {"schema": ref(LoadBody)}},
            ),
        ),
        structs=(LoadBody,),
    ),
    Operation(
        "get",
        "/get_load",
        "The server's load, as vllm-router polls it",
        (
            Outcome(
                200,
                "The figure of GET /load, named load.",
                {"application/json": {"schema": ref(RouterLoadBody)}},
            ),
        ),
        structs=(RouterLoadBody,),
    ),
)
"""The two routes' OpenAPI entries (the app serves them beside its other GET routes)."""


__all__ = ["GENERATING", "OPERATIONS", "LoadBody", "RouterLoadBody", "ServerLoad", "load_body", "router_load_body"]
