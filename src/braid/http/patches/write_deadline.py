"""Write deadline: a connection whose client takes none of a response for ``write_timeout`` is closed.

hypercorn's trio worker writes every chunk of a response with a shielded ``send_all`` and no
timeout, so that no cancellation cuts a chunk in half. A client that stays connected and reads
nothing therefore holds that write, its response task and its connection for ever: braid's stall
timeout frees the engine work of such a stream (:mod:`braid.stream.run`), but not the socket, and a
server drain waits for that write past its graceful timeout, for ever.

:class:`WriteDeadlineTCPServer` keeps the shield and bounds the write:

* A chunk is written in slices of at most :data:`SLICE` (16 KiB), each under a shielded cancel
  scope with its own deadline ``write_timeout`` seconds ahead: the client must take each slice
  (or what is left of the chunk) within ``write_timeout``. So a client that reads nothing, or
  less than 16 KiB per ``write_timeout`` (about 0.5 KiB/s at the default 30 s), is cut, and any
  faster one is not. That is the rate the stall timeout asks of a stream's reader too (one chunk
  of up to 64 events, about 16 KiB, per ``stall_timeout``). Slicing bounds a large body (a
  non-streaming batch's JSON can be megabytes) by the client's progress, not by its size.
* When a deadline passes, the connection is reset (``SO_LINGER`` 0, then closed): a plain close
  would queue its FIN behind the unsent bytes, which a client that reads nothing never takes, so
  the kernel would keep the socket and the client would never learn. Then hypercorn's protocol
  is told the connection closed, which cancels the response task as a client disconnect does
  (and with it the run and its engine requests: :mod:`braid.routes.body`).
* A drain cuts writes off at its end: :meth:`WriteDeadlines.cut_off` moves every deadline, of the
  writes waiting now and of those that start later, to the end of the graceful period. Without
  it a drain would wait up to ``write_timeout`` past that end for a client that reads nothing.

A write cut by its deadline may leave part of a chunk on the wire; the connection is reset at
once, so nothing is written after it. Cancellation from outside (a client disconnect, the
drain's own cancellation) still never cuts a write: the scope is shielded, as hypercorn's is.

The options come from the hypercorn ``Config`` the server was started with, as
:attr:`write_deadlines` (``braid.http.server.hypercorn_config`` sets it); a plain hypercorn ``Config``
has none, and then every write is hypercorn's own, unbounded.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
from typing import Any

import trio
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.locked_send import LockedSendTCPServer
from braid.http.patches.patch import Patch, Upstream, stacked

log = logging.getLogger("braid")

SLICE = 16 * 1024
"""The most bytes one deadline covers: a client must take this much per ``write_timeout``."""

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, drops unsent data


class WriteDeadlines:
    """One server's write policy: ``timeout`` per slice, and the drain's cut-off for all of them.

    Shared by every connection of the server (hypercorn hands each its ``Config``), on the Trio
    thread only.
    """

    def __init__(self, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError(f"write timeout must be > 0, not {timeout}")
        self.timeout = timeout
        self._cut_off = math.inf
        self._waiting: set[trio.CancelScope] = set()

    def deadline(self) -> float:
        """The deadline of a slice that starts now."""
        return min(trio.current_time() + self.timeout, self._cut_off)

    def cut_off(self, at: float) -> None:
        """No write may wait past ``at`` (the end of a drain's graceful period): the writes
        waiting now get it as their deadline if theirs is later, and so do later writes."""
        self._cut_off = min(self._cut_off, at)
        for scope in self._waiting:
            scope.deadline = min(scope.deadline, self._cut_off)

    def track(self, scope: trio.CancelScope) -> None:
        self._waiting.add(scope)

    def untrack(self, scope: trio.CancelScope) -> None:
        self._waiting.discard(scope)

    @property
    def waiting(self) -> int:
        """Writes waiting on their socket now."""
        return len(self._waiting)


def _reset(stream: object) -> None:
    """Make the next close of ``stream``'s socket a reset (a best effort: not every stream has one)."""
    sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass  # already closed or reset


class WriteDeadlineTCPServer(LockedSendTCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.write_deadlines: WriteDeadlines | None = getattr(self.config, "write_deadlines", None)

    async def protocol_send(self, event: Event) -> None:
        if self.write_deadlines is not None and type(event) is RawData:
            async with self.send_lock:
                await self.send_locked(event.data)
        else:
            await super().protocol_send(event)

    async def send_locked(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` whole, each slice within its deadline; the caller holds ``send_lock``.

        Never raises for a closed or broken connection, nor for a passed deadline: the protocol
        is told the connection closed, as hypercorn does when a write fails.
        """
        deadlines = self.write_deadlines
        if deadlines is None:
            await super().send_locked(data)
            return
        with memoryview(data) as view:
            for start in range(0, len(view), SLICE):
                with trio.CancelScope(shield=True, deadline=deadlines.deadline()) as scope:
                    deadlines.track(scope)
                    try:
                        await self.stream.send_all(view[start : start + SLICE])
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        broken = True
                    else:
                        broken = False
                    finally:
                        deadlines.untrack(scope)
                if scope.cancelled_caught:
                    await self._abandon(len(view) - start)
                    return
                if broken:
                    await self.protocol.handle(Closed())
                    return

    async def _abandon(self, unsent: int) -> None:
        deadlines = self.write_deadlines
        assert deadlines is not None
        log.info(
            "reset a connection: %d bytes of a response waited past their deadline "
            "(the %g s write timeout, or the end of a drain)",
            unsent,
            deadlines.timeout,
        )
        _reset(self.stream)
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
        await self.protocol.handle(Closed())


PATCH = Patch(
    name="write_deadline",
    module=__name__,
    why="a client that reads nothing holds its response's write, and a drain, for ever",
    target=Upstream("hypercorn.trio.run", "TCPServer"),
    apply=stacked(WriteDeadlineTCPServer, TCPServer),
    relies_on=(
        Upstream("hypercorn.trio.tcp_server", "TCPServer.protocol_send"),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.send_lock", instance=True),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.stream", instance=True),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.protocol", instance=True),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.config", instance=True),
    ),
)

__all__ = ["PATCH", "SLICE", "WriteDeadlineTCPServer", "WriteDeadlines"]
