"""Fast send: write a response chunk straight to the socket when the socket can take it.

hypercorn's trio worker sends every chunk of every response through ``TCPServer.protocol_send``,
which takes a ``trio.Lock``, opens a shielded ``CancelScope`` and awaits ``SocketStream.send_all``:
two trips through the trio scheduler per chunk, whether or not the kernel's send buffer has room.
A stream sends a chunk per engine step, so under many concurrent streams that path is a large
share of the front end's thread (docs/performance-log.md, round 2).

:class:`FastSendTCPServer` keeps hypercorn's contract and skips the trip when it is not needed:

* When no other send is in progress on the connection (the lock is free), the chunk is written
  with one non-blocking ``send(2)``. If the kernel takes all of it, that is the whole send: no lock,
  no scope, no scheduler trip. The caller is not checkpointed, so a loop that only sends must
  checkpoint itself (braid's stream body does, once per chunk).
* If the kernel takes only part, the lock is taken at once (it is free and nothing yielded since
  the check, so no other chunk can get in between) and the rest goes through
  :meth:`~braid.http.patches.locked_send.LockedSendTCPServer.send_locked`: hypercorn's shielded
  ``send_all``, or, with :mod:`braid.http.patches.write_deadline` on, its bounded write. A chunk
  is never cut in half by a cancellation, exactly as in hypercorn.
* If the kernel takes nothing (buffer full) or the socket errors, the chunk takes the path of the
  class this patch is stacked on (hypercorn's, or the write deadline's: the installer puts fast
  send last), which waits for room or reports the closed connection as it always has.
* TLS streams and anything that is not a plain ``trio.SocketStream`` always take that path too.

``braid serve --stock-send`` turns this patch off, and only this one.
"""

from __future__ import annotations

import socket
from typing import Any

import trio
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.locked_send import LockedSendTCPServer
from braid.http.patches.patch import Patch, Upstream, stacked


def _raw_socket(stream: object) -> socket.socket | None:
    if type(stream) is not trio.SocketStream:
        return None  # TLS (trio.SSLStream) or a test double: the stock path
    raw = getattr(stream.socket, "_sock", None)
    return raw if isinstance(raw, socket.socket) else None


class FastSendTCPServer(LockedSendTCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._raw = _raw_socket(self.stream)  # a connection's stream never changes

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
                    self.send_lock.acquire_nowait()  # free, and nothing has yielded since it was checked
                    try:
                        await self.send_locked(memoryview(data)[sent:])
                    finally:
                        self.send_lock.release()
                    return
        await super().protocol_send(event)


PATCH = Patch(
    name="fast_send",
    module=__name__,
    why="every response chunk pays a lock, a shielded scope and two scheduler trips, room or not",
    target=Upstream("hypercorn.trio.run", "TCPServer"),
    apply=stacked(FastSendTCPServer, TCPServer),
    relies_on=(
        Upstream("hypercorn.trio.tcp_server", "TCPServer.protocol_send"),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.send_lock", instance=True),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.stream", instance=True),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.protocol", instance=True),
        Upstream("trio._socket", "_SocketType._sock", instance=True),  # the socket send(2) is called on
    ),
)

__all__ = ["PATCH", "FastSendTCPServer"]
