"""HTTP/2: request body data that arrives after braid has answered is dropped, not a crash.

braid answers some requests before it reads their bodies: a 401 (no key), a 429 (a full queue),
a 503 (draining), a 413 (a declared body over the limit). On HTTP/1.1 the connection then closes.
On HTTP/2 hypercorn forgets a stream once its response has ended, and its ``H2Protocol`` looks
up every ``DATA`` frame's stream with ``self.streams[stream_id]``: the client's body, still on
its way, raised ``KeyError`` and took the connection (and, before :mod:`braid.http.patches.isolate`, the
server) down. hypercorn already ignores a late end of stream the same way; this does it for data.

:class:`LateDataH2Protocol` drops such frames before hypercorn sees them, after giving their bytes
back to the connection's flow-control window (so the client's other streams are not starved).
:func:`late_data_dropped` installs it where hypercorn's protocol wrapper looks it up, for the
duration of a ``with`` block, as :func:`braid.http.patches.fast_send.fast_send` does for its server.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import h2.events
import hypercorn.protocol
from hypercorn.protocol.h2 import H2Protocol

from braid.http.patches.swap import swapped


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


def late_data_dropped() -> AbstractContextManager[None]:
    """Within the block, hypercorn's HTTP/2 connections use :class:`LateDataH2Protocol`; the
    stock class is put back after (:func:`braid.http.patches.swap.swapped`)."""
    return swapped(hypercorn.protocol, "H2Protocol", H2Protocol, LateDataH2Protocol)


__all__ = ["LateDataH2Protocol", "late_data_dropped"]
