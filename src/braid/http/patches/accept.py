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

:func:`batched_accept` makes hypercorn's trio worker build its listeners with it, for the
duration of a ``with`` block (hypercorn looks ``trio.SocketListener`` up through its module's
``trio`` global when a server starts; that global is swapped for a view of trio that differs
only there, and put back after).
"""

from __future__ import annotations

import socket
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hypercorn.trio.run
import trio

ACCEPT_BATCH = 64
"""The most connections one turn of the accept loop takes without yielding."""


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
    """trio, as hypercorn's trio worker sees it during :func:`batched_accept`: every name is
    trio's except ``SocketListener``."""

    def __init__(self, batch: int) -> None:
        super().__init__("trio")
        self._batch = batch

    def SocketListener(self, sock: trio.socket.SocketType) -> BatchAcceptListener:  # trio's name
        return BatchAcceptListener(sock, self._batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(trio, name)


@contextmanager
def batched_accept(batch: int = ACCEPT_BATCH) -> Iterator[None]:
    """Within the block, hypercorn's trio worker accepts with :class:`BatchAcceptListener`,
    ``batch`` connections per turn at most.

    Process-wide, like :func:`braid.http.patches.fast_send.fast_send`, and restored on exit; a nested
    block (a second server started meanwhile) shares the outer one's swap and batch. A batch of
    1 (or less) leaves trio's own listener, one connection per round.
    """
    if batch <= 1 or hypercorn.trio.run.trio is not trio:  # trio's own, or swapped by an outer block
        yield
        return
    hypercorn.trio.run.trio = _TrioForHypercorn(batch)  # type: ignore[assignment]
    try:
        yield
    finally:
        hypercorn.trio.run.trio = trio  # type: ignore[assignment]


__all__ = ["ACCEPT_BATCH", "BatchAcceptListener", "batched_accept"]
