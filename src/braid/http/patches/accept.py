"""Batched accept: the accept loop takes every connection that is waiting, not one per scheduler round.

hypercorn's trio worker accepts with ``trio.serve_listeners`` over a ``trio.SocketListener``, and
trio's ``accept`` ends with a checkpoint even when a connection was waiting: the loop takes one
connection, then waits for its next turn, one turn per scheduler round. Under load a round runs
every busy stream once, tens of milliseconds with hundreds of streams, so the loop takes a few
dozen connections a second however many wait, while the listen queue fills and the kernel drops
new connections once it is full (a client's connect then takes a retried SYN: 1 s, 3 s, 7 s).

:class:`BatchAcceptListener` wraps trio's listener. Its ``accept`` first tries a non-blocking
``accept(2)`` on the listening socket and returns what it got at once, with no checkpoint, up to
:data:`ACCEPT_BATCH` times in a row; after that, or when nothing waits, or on any error, it is
trio's ``accept`` (which waits, checkpoints, and raises or skips errors as trio does). So when
the loop gets its turn it takes up to ``ACCEPT_BATCH`` connections, as asyncio's accept loop
(under uvicorn, vLLM's server) takes up to its backlog per wake-up. Starting a connection's
task costs the loop microseconds; the connection's own work runs in that task, later.

:data:`PATCH` makes hypercorn's trio worker build its listeners with it: hypercorn looks
``trio.SocketListener`` up through its module's ``trio`` global when a server starts, and the
patch puts a view of trio there that differs only in that name. A batch of 1
(:class:`~braid.http.patches.patch.PatchSettings`) leaves trio's own listener, one connection per
round.
"""

from __future__ import annotations

import socket
import types
from typing import Any

import trio

from braid.http.patches.patch import ACCEPT_BATCH, Patch, PatchSettings, Upstream


class BatchAcceptListener(trio.abc.Listener[trio.SocketStream]):
    def __init__(self, sock: trio.socket.SocketType, batch: int = ACCEPT_BATCH) -> None:
        self._listener = trio.SocketListener(sock)
        raw = getattr(sock, "_sock", None)
        self._raw: socket.socket | None = raw if isinstance(raw, socket.socket) else None
        self._batch = batch
        self._streak = 0  # connections returned since the last yield

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._listener.socket

    async def accept(self) -> trio.SocketStream:
        """A waiting connection at once (no checkpoint), up to ``batch`` in a row; else trio's
        ``SocketListener.accept``."""
        if self._raw is not None and self._streak < self._batch:
            try:
                conn, _ = self._raw.accept()
            except OSError:  # BlockingIOError: none waits; anything else: trio's accept handles it
                pass
            else:
                self._streak += 1
                return trio.SocketStream(trio.socket.from_stdlib_socket(conn))
        self._streak = 0
        return await self._listener.accept()

    async def aclose(self) -> None:
        await self._listener.aclose()


class _TrioForHypercorn(types.ModuleType):
    """trio, as hypercorn's trio worker sees it while the patch is on: every name is ``trio``'s
    except ``SocketListener``."""

    def __init__(self, real: Any, batch: int) -> None:
        super().__init__("trio")
        self._trio = real  # trio, or what an earlier patch of hypercorn put there
        self._batch = batch

    def SocketListener(self, sock: trio.socket.SocketType) -> BatchAcceptListener:  # trio's name
        return BatchAcceptListener(sock, self._batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trio, name)


def _apply(current: Any, settings: PatchSettings) -> Any:
    return current if settings.accept_batch <= 1 else _TrioForHypercorn(current, settings.accept_batch)


PATCH = Patch(
    name="accept",
    module=__name__,
    why="the accept loop takes one connection per scheduler round, and the kernel drops the rest",
    target=Upstream("hypercorn.trio.run", "trio"),
    apply=_apply,
    relies_on=(
        Upstream("trio", "SocketListener"),  # what hypercorn calls through the view
        Upstream("trio._socket", "_SocketType._sock", instance=True),  # the socket accept(2) is called on
    ),
)

__all__ = ["ACCEPT_BATCH", "PATCH", "BatchAcceptListener"]
