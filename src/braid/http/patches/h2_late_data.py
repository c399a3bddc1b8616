"""HTTP/2: request body data that arrives after braid has answered is dropped, not a crash.

braid answers some requests before it reads their bodies: a 401 (no key), a 429 (a full queue),
a 503 (draining), a 413 (a declared body over the limit). On HTTP/1.1 the connection then closes.
On HTTP/2 hypercorn forgets a stream once its response has ended, and its ``H2Protocol`` looks
up every ``DATA`` frame's stream with ``self.streams[stream_id]``: the client's body, still on
its way, raised ``KeyError`` and took the connection (and, before :mod:`braid.http.patches.isolate`, the
server) down. hypercorn already ignores a late end of stream the same way; this does it for data.

:class:`LateDataH2Protocol` drops such frames before hypercorn sees them, after giving their bytes
back to the connection's flow-control window (so the client's other streams are not starved).
The patch puts it where hypercorn's protocol wrapper looks it up (``hypercorn.protocol.H2Protocol``).
"""

from __future__ import annotations

import h2.events
from hypercorn.protocol.h2 import H2Protocol

from braid.http.patches.patch import Patch, Upstream, stacked


class LateDataH2Protocol(H2Protocol):
    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        kept = []
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                # The stream was answered and closed: nobody reads this body any more.
                self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                kept.append(event)
        await super()._handle_events(kept)  # also flushes the window updates


PATCH = Patch(
    name="h2_late_data",
    module=__name__,
    why="over HTTP/2, body data for a stream already answered raises KeyError and ends the connection",
    target=Upstream("hypercorn.protocol", "H2Protocol"),
    apply=stacked(LateDataH2Protocol, H2Protocol),
    relies_on=(
        Upstream("hypercorn.protocol.h2", "H2Protocol._handle_events"),
        Upstream("hypercorn.protocol.h2", "H2Protocol.streams", instance=True),
        Upstream("hypercorn.protocol.h2", "H2Protocol.connection", instance=True),
        Upstream("h2.events", "DataReceived.flow_controlled_length"),
        Upstream("h2.connection", "H2Connection.acknowledge_received_data"),
    ),
)

__all__ = ["PATCH", "LateDataH2Protocol"]
