"""HTTP/1.1: a chunked response's body chunks framed without h11's state machine.

hypercorn hands each body chunk to h11 as a ``Data`` event: h11 checks its connection state,
runs the (unchanging) transition for ``Data`` in ``SEND_BODY``, and asks its writer to frame the
bytes. For a streamed response that is every event of every stream, and it costs about twenty
times the framing itself (docs/performance-log.md, round 10).

:class:`DirectBodyH11Protocol` frames such a chunk itself, exactly as h11's chunked writer does
(``<size in hex>\\r\\n<data>\\r\\n``, nothing for an empty chunk), but only when h11 says the
response is being sent chunked and nothing else can happen: our state is ``SEND_BODY`` and the
writer is h11's ``ChunkedWriter``. Anything else (a response with a Content-Length, an HTTP/1.0
client, the headers, the end of the body, an error state) takes hypercorn's own path, so h11
still sees every state change. The patch puts the class where hypercorn's protocol wrapper looks
it up (``hypercorn.protocol.H11Protocol``), as :mod:`braid.http.patches.h2_late_data` does for
HTTP/2.
"""

from __future__ import annotations

import h11
from h11._writers import ChunkedWriter
from hypercorn.events import RawData
from hypercorn.protocol.events import Body
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol

from braid.http.patches.patch import Patch, Upstream, stacked


class DirectBodyH11Protocol(H11Protocol):
    async def stream_send(self, event: StreamEvent) -> None:
        if type(event) is Body:
            connection = self.connection
            # h11's own writer for this response, private but the one thing that says "chunked"
            if connection.our_state is h11.SEND_BODY and type(getattr(connection, "_writer", None)) is ChunkedWriter:
                data = event.data
                if data:  # an empty chunk would read as the end of the body: h11 writes nothing
                    await self.send(RawData(data=b"%x\r\n%b\r\n" % (len(data), data)))
                return
        await super().stream_send(event)


PATCH = Patch(
    name="h11_body",
    module=__name__,
    why="h11's state machine costs about twenty times the framing of each streamed body chunk",
    target=Upstream("hypercorn.protocol", "H11Protocol"),
    apply=stacked(DirectBodyH11Protocol, H11Protocol),
    relies_on=(
        Upstream("hypercorn.protocol.h11", "H11Protocol.stream_send"),
        Upstream("hypercorn.protocol.h11", "H11Protocol.connection", instance=True),
        Upstream("hypercorn.protocol.h11", "H11Protocol.send", instance=True),
        Upstream("h11._writers", "ChunkedWriter"),
        Upstream("h11._connection", "Connection._writer", instance=True),
    ),
)

__all__ = ["PATCH", "DirectBodyH11Protocol"]
