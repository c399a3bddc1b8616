"""Isolation: a fault in one connection ends that connection, never the server.

hypercorn's trio worker runs each connection's ``TCPServer.run`` in the server's own nursery, and
``run`` lets anything but an ``OSError`` out. So one exception raised while a connection's bytes
are handled (a protocol library's bug, a hypercorn bug, a client finding either) cancelled every
other connection and ended ``hypercorn.trio.serve``: the whole replica went down for one bad
client (tests/http/test_auth.py's HTTP/2 test found one, :mod:`braid.http.patches.h2_late_data`).

:class:`IsolatedTCPServer` catches what a connection raises, logs it with its traceback as a bug,
and returns, so the connection's socket is closed (hypercorn's ``finally``) and the server goes
on. Cancellation is never caught: a drain or a server shutdown still ends every connection.
"""

from __future__ import annotations

import logging

from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.patch import Patch, Upstream, stacked

log = logging.getLogger("braid")


class IsolatedTCPServer(TCPServer):
    async def run(self) -> None:
        try:
            await super().run()
        except* Exception as group:  # any fault at all: it is this connection's alone
            log.error("a connection failed and was closed (a bug): %r", group.exceptions[0], exc_info=group)


PATCH = Patch(
    name="isolate",
    module=__name__,
    why="an exception in one connection's handling ends the whole server",
    target=Upstream("hypercorn.trio.run", "TCPServer"),
    apply=stacked(IsolatedTCPServer, TCPServer),
    relies_on=(Upstream("hypercorn.trio.tcp_server", "TCPServer.run"),),
)

__all__ = ["PATCH", "IsolatedTCPServer"]
