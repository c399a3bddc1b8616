"""Fast send: write a response chunk straight to the socket when the socket can take it.

hypercorn's trio worker sends every chunk of every response through ``TCPServer.protocol_send``,
which takes a ``trio.Lock``, opens a shielded ``CancelScope`` and awaits ``SocketStream.send_all``:
two trips through the trio scheduler per chunk, whether or not the kernel's send buffer has room.
A stream sends a chunk per engine step, so under many concurrent streams that path is a large
share of the front end's thread (docs/performance.md, round 2).

:class:`FastSendTCPServer` keeps hypercorn's contract and skips the trip when it is not needed:

* When no other send is in progress on the connection (the lock is free), the chunk is written
  with one non-blocking ``send(2)``. If the kernel takes all of it, that is the whole send: no lock,
  no scope, no scheduler trip. The caller is not checkpointed, so a loop that only sends must
  checkpoint itself (braid's stream body does, once per chunk).
* If the kernel takes only part, the lock is taken at once (it is free and nothing yielded since
  the check, so no other chunk can get in between) and the rest goes through the stock
  shielded ``send_all``: a chunk is never cut in half by a cancellation, exactly as in hypercorn.
* If the kernel takes nothing (buffer full) or the socket errors, the chunk takes hypercorn's own
  path untouched, which waits for room or reports the closed connection as it always has.
* TLS streams and anything that is not a plain ``trio.SocketStream`` always take the stock path.

"Stock" here is :class:`~braid.http.patches.write_deadline.WriteDeadlineTCPServer`'s path: hypercorn's,
with each slice of a write bounded by the server's write deadline when it has one. A server whose
hypercorn ``Config`` has ``fast_send`` false (``braid serve --stock-send``) takes that path for
every chunk.

:func:`fast_send` installs the subclass where hypercorn's trio worker looks it up, for the
duration of a ``with`` block, and puts the stock class back after.
"""

from __future__ import annotations

import socket
from contextlib import AbstractContextManager
from typing import Any

import hypercorn.trio.run
import trio
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.swap import swapped
from braid.http.patches.write_deadline import WriteDeadlineTCPServer


def _raw_socket(stream: object) -> socket.socket | None:
    if type(stream) is not trio.SocketStream:
        return None  # TLS (trio.SSLStream) or a test double: the stock path
    raw = getattr(stream.socket, "_sock", None)
    return raw if isinstance(raw, socket.socket) else None


class FastSendTCPServer(WriteDeadlineTCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        enabled = getattr(self.config, "fast_send", True)  # braid.http.server's Config says; hypercorn's has none
        self._raw = _raw_socket(self.stream) if enabled else None  # a connection's stream never changes

    async def protocol_send(self, event: Event) -> None:
        if type(event) is RawData and not self.send_lock.locked():
            raw = self._raw
            if raw is not None:
                data = event.data
                try:
                    sent = raw.send(data)
                except OSError:  # BlockingIOError included: nothing was written
                    sent = 0
                if sent == len(data):
                    return
                if sent > 0:
                    await self._send_rest(memoryview(data)[sent:])
                    return
        await super().protocol_send(event)

    async def _send_rest(self, rest: memoryview) -> None:
        self.send_lock.acquire_nowait()  # free, and nothing has yielded since it was checked
        try:
            if self.write_deadlines is not None:
                await self.send_bounded(rest)
                return
            try:
                with trio.CancelScope(shield=True):
                    await self.stream.send_all(rest)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
        finally:
            self.send_lock.release()


def fast_send(enabled: bool = True) -> AbstractContextManager[None]:
    """Within the block, hypercorn's trio worker serves connections with :class:`FastSendTCPServer`
    (process-wide, the stock class restored on exit; :func:`braid.http.patches.swap.swapped`). With
    ``enabled=False`` it does nothing."""
    return swapped(hypercorn.trio.run, "TCPServer", TCPServer, FastSendTCPServer, enabled)


__all__ = ["FastSendTCPServer", "fast_send"]
