"""hypercorn's write of one chunk under its send lock, as a method that patches can override.

Not a patch: :class:`LockedSendTCPServer` behaves exactly as hypercorn's ``TCPServer``. It is the
common base of :mod:`braid.http.patches.fast_send` and :mod:`braid.http.patches.write_deadline`,
which are installed independently. When fast send cannot write a whole chunk at once it takes the
lock and sends the rest with :meth:`~LockedSendTCPServer.send_locked`. The write deadline
overrides that method, so with both on the rest is bounded too, and with the write deadline off
it is hypercorn's write.
"""

from __future__ import annotations

import trio
from hypercorn.events import Closed
from hypercorn.trio.tcp_server import TCPServer


class LockedSendTCPServer(TCPServer):
    async def send_locked(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` whole; the caller holds ``send_lock``.

        This is hypercorn's ``protocol_send`` for ``RawData``, less the lock. It is shielded, so a
        cancellation never cuts a chunk in half. A closed or broken connection is not raised: the
        protocol is told it closed.
        """
        try:
            with trio.CancelScope(shield=True):
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())


__all__ = ["LockedSendTCPServer"]
