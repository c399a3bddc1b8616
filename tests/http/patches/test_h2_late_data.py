"""braid.http.patches.h2_late_data: over HTTP/2, a body still arriving after braid answered is dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from tests.helpers import LiveServer, start_server


@pytest.fixture
async def guarded(nursery: trio.Nursery) -> AsyncIterator[LiveServer]:
    srv = await start_server(nursery, api_keys=("k",))
    yield srv
    srv.shutdown.set()


async def test_bodies_answered_before_they_arrive_leave_the_connection_working(guarded: LiveServer) -> None:
    """Each 1 MiB body gets its 401 before it is read; the rest of it still arrives. Five of them
    are 80 times the connection's initial flow-control window (64 KiB): unless the dropped bytes
    are given back to the window, the later requests on the connection stall."""
    big = b'{"prompt": "' + b"x" * 2**20 + b'"}'
    async with httpx.AsyncClient(base_url=guarded.url, http1=False, http2=True, timeout=10) as client:
        for _ in range(5):
            r = await client.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
            assert r.http_version == "HTTP/2" and r.status_code == 401
        r = await client.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 2},
            headers={"Authorization": "Bearer k"},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert not guarded.stopped.is_set()
