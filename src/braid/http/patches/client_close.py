"""Client close: when the client ends the connection, close it now, not at the keep-alive timeout.

hypercorn's trio ``TCPServer.run`` reads until the client's end of stream, then waits for the
connection's task group before it closes the socket. Between two requests that group holds the
keep-alive timer (a task sleeping ``keep_alive_timeout``, 75 s in braid), and a client that closes
an idle connection (one request per connection, the usual client, or a FIN that crosses the end
of a response) does not stop it: hypercorn's protocol has no request to cancel and does nothing.
So every such connection stayed open in CLOSE-WAIT, with its socket and two tasks, for 75 s.
Under connection churn that is the request rate times 75 s of sockets: 550 of them after 10 s of
300 clients, RSS growing by tens of MiB, file descriptors running out at a sustained rate
(``trio.serve_listeners`` then sleeps on EMFILE instead of accepting), and a FIN client waiting
for its close (docs/performance-log.md, round 7).

:class:`ClientCloseTCPServer` stops the keep-alive timer once the reading ends: the connection
has nothing left to wait for but its own requests, which hypercorn's protocol has already been
told about (a request in flight is cancelled as a disconnect, as before). Then the task group
ends and hypercorn closes the socket. It stops whichever timer the connection has, hypercorn's or
:mod:`braid.http.patches.keep_alive`'s.
"""

from __future__ import annotations

from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.patch import Patch, Upstream, stacked


class ClientCloseTCPServer(TCPServer):
    async def _read_data(self) -> None:
        await super()._read_data()  # returns at the client's EOF or reset, or a closed socket
        await self.idle_task.stop()  # (a cancellation is the connection's own end: nothing to stop)


PATCH = Patch(
    name="client_close",
    module=__name__,
    why="a connection the client closed stays open (CLOSE-WAIT, two tasks) until the keep-alive timeout",
    target=Upstream("hypercorn.trio.run", "TCPServer"),
    apply=stacked(ClientCloseTCPServer, TCPServer),
    relies_on=(
        Upstream("hypercorn.trio.tcp_server", "TCPServer._read_data"),
        Upstream("hypercorn.trio.tcp_server", "TCPServer.idle_task", instance=True),
    ),
)

__all__ = ["PATCH", "ClientCloseTCPServer"]
