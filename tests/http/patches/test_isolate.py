"""braid.http.patches.isolate: a fault while one connection is handled closes that connection only."""

from __future__ import annotations

import h2.events
import httpx
import hypercorn.protocol
import pytest
import trio
from hypercorn.protocol.h2 import H2Protocol

from tests.helpers import start_server


class _Faulty(H2Protocol):
    """An HTTP/2 protocol with a bug: any request body makes it raise."""

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        if any(isinstance(e, h2.events.DataReceived) for e in events):
            raise RuntimeError("a protocol bug")
        await super()._handle_events(events)


async def test_a_faulty_connection_does_not_end_the_server(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the installer stacks braid.http.patches.h2_late_data on whatever class is there: this one
    monkeypatch.setattr(hypercorn.protocol, "H2Protocol", _Faulty)
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, http1=False, http2=True, timeout=10) as h2_client:
        with pytest.raises(httpx.TransportError):
            await h2_client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200
    assert not srv.stopped.is_set()
    assert any("a connection failed" in rec.getMessage() for rec in caplog.records)
    srv.shutdown.set()
