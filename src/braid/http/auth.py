"""API keys: ASGI middleware that refuses every request without a valid key, before routing.

The contract, when ``Settings.api_keys`` is not empty:

* Every request needs ``Authorization: Bearer <key>`` with one of the keys, or (a braid
  extension, for Anthropic's clients) ``x-api-key: <key>`` when it has no ``Authorization``
  header: every route, an
  unknown path (401, not 404), any method, a websocket. Deny by default: routes added later
  are guarded without being listed here.
* The exemptions are exact: ``GET``/``HEAD`` of ``/health`` (probes carry no key), and of
  ``/metrics`` with ``Settings.metrics_public``. Exact means both the decoded ``scope["path"]``,
  which quart routes on, and the undecoded ``scope["raw_path"]`` equal the path, so
  ``/health/``, ``//health``, ``/%68ealth``, ``/health/../v1/models`` or an absolute-form target
  ``http://h/health`` need a key. The decision reads only the request target as the server
  parsed it, never the ``Host`` header or a URL rebuilt from it.
* A missing or wrong key is a 401 in vLLM's error shape (:class:`~braid.errors.Unauthorized`;
  on Anthropic's routes, ``/v1/messages`` and ``/v1/messages/count_tokens``, in Anthropic's)
  with ``WWW-Authenticate: Bearer``, sent without reading the body, and on HTTP/1.1 with
  ``Connection: close``; a websocket is closed before it is accepted.
* Keys are compared in constant time: the SHA-256 of the presented token against the SHA-256 of
  every key, all of them every time, so neither the matching key nor a key's length shows in
  the timing.

* A request with a valid key carries its owner id in its scope (:data:`OWNER`:
  :func:`braid.store.records.owner_of` the key, never the key itself), which the store's routes
  file everything under; without keys the middleware is not there and they use the anonymous
  owner.

* A request with one of ``Settings.background_keys`` runs in the background class: the guard
  sets :data:`BACKGROUND` in its scope, and the generating routes read it
  (``docs/admission.md``). Which key matched is found in the same constant-time pass.

With no keys the middleware is not installed at all (:func:`install`): everything is open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from braid.errors import Unauthorized
from braid.http.asgi import ASGIApp, Receive, Scope, Send
from braid.settings import Settings
from braid.store.records import owner_of
from braid.wire.anthropic_response import ANTHROPIC_PATHS
from braid.wire.anthropic_response import error_body as anthropic_error_body
from braid.wire.output import encode, error_body

_OPEN_METHODS = frozenset({"GET", "HEAD"})

BACKGROUND = "braid.background"
"""The ASGI scope key set (to True) for a request that presented a background key."""

OWNER = "braid.owner"
"""The ASGI scope key holding the owner id of a request's valid key (``braid.store.records``)."""


def parse_key_file(text: str) -> list[str]:
    """The keys of a key file: one per line, surrounding whitespace stripped; blank lines and
    lines starting with ``#`` are skipped (a ``#`` inside a key is part of the key)."""
    keys = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class KeyGuard:
    """The ASGI middleware around the app (see the module's contract)."""

    def __init__(
        self, app: ASGIApp, keys: Iterable[str], open_paths: Iterable[str], background: Iterable[str] = ()
    ) -> None:
        self.app = app
        back = frozenset(background)
        self._digests = [(_digest(k.encode()), k in back) for k in keys]
        if not self._digests:
            raise ValueError("KeyGuard needs at least one key")
        if not back <= {k for k in keys}:
            raise ValueError("a background key must be one of the keys")
        self._open = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan" or self._exempt(scope):
            await self.app(scope, receive, send)
            return
        match = self._match(scope)
        if match is not None:
            background, token = match
            scope = {**scope, OWNER: owner_of(token)}
            if background:
                scope[BACKGROUND] = True
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            anthropic = scope["path"] in ANTHROPIC_PATHS
            await _refuse(send, close=scope.get("http_version", "1.1").startswith("1"), anthropic=anthropic)

    def _exempt(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] not in _OPEN_METHODS:
            return False
        path = scope["path"]
        return path in self._open and scope.get("raw_path", path.encode()) == path.encode()

    def _match(self, scope: Scope) -> tuple[bool, bytes] | None:
        """None: no valid key; else whether the key presented is a background key, and the key."""
        headers = scope["headers"]
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if values:
            if len(values) != 1:
                return None
            scheme, _, token = values[0].strip().partition(b" ")
            if scheme.lower() != b"bearer":
                return None
        else:
            # Anthropic's clients send the key as x-api-key; read only without Authorization,
            # so that a request presents one credential, never two that could disagree.
            values = [v for k, v in headers if k.lower() == b"x-api-key"]
            if len(values) != 1:
                return None
            token = values[0]
        presented = _digest(token.strip())
        ok = background = False
        for digest, is_background in self._digests:  # every key, every time: no early exit on a match
            hit = hmac.compare_digest(presented, digest)
            ok |= hit
            background |= hit and is_background
        return (background, token.strip()) if ok else None


async def _refuse(send: Send, *, close: bool, anthropic: bool = False) -> None:
    err = Unauthorized("Missing or invalid API key: send Authorization: Bearer <key> (or x-api-key: <key>).")
    body = encode(anthropic_error_body(err)) if anthropic else error_body(err)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
    ]
    if close:
        # The body is left unread, and hypercorn closes an HTTP/1.1 connection whose request body
        # had not all arrived when the answer ended; saying so up front keeps a keep-alive
        # client from sending its next request into that closing connection.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": Unauthorized.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: Any, settings: Settings) -> None:
    """Wrap a quart app's ``asgi_app`` in a :class:`KeyGuard` when ``settings.api_keys`` is set."""
    if not settings.api_keys:
        return
    app.asgi_app = KeyGuard(app.asgi_app, settings.api_keys, settings.open_paths, settings.background_keys)


__all__ = ["BACKGROUND", "OWNER", "KeyGuard", "install", "parse_key_file"]
