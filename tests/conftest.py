"""Shared fixtures: braid on real hypercorn (loopback, port 0) inside the test's own trio run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial

import attrs
import httpx
import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import BraidApp, Settings, create_app
from braid.server import ServerConfig, serve


@attrs.define
class LiveServer:
    url: str
    engine: ScriptedEngine
    app: BraidApp
    shutdown: trio.Event

    def gauge(self, name: str) -> float:
        return self.app.state.metrics.registry.get_sample_value(name) or 0.0

    async def wait_idle(self, within: float) -> float:
        """Wait until no engine request is in flight; return how long that took (fails past ``within``)."""
        start = trio.current_time()
        with trio.move_on_after(within):
            while self.engine.in_flight or self.gauge("braid_engine_requests_in_flight"):
                await trio.sleep(0.002)
            return trio.current_time() - start
        pytest.fail(
            f"engine requests still in flight after {within} s: engine={self.engine.in_flight} "
            f"gauge={self.gauge('braid_engine_requests_in_flight')}"
        )


async def start_server(nursery: trio.Nursery, *, token_delay: float = 0.0, **settings: object) -> LiveServer:
    engine = ScriptedEngine(token_delay=token_delay)
    app = create_app(engine, Settings(**settings))  # type: ignore[arg-type]
    shutdown = trio.Event()
    cfg = ServerConfig(port=0, graceful_timeout=1.0, keep_alive_timeout=75.0)
    urls = await nursery.start(partial(serve, app, cfg, shutdown=shutdown, handle_signals=False))
    return LiveServer(urls[0], engine, app, shutdown)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[LiveServer]:
    srv = await start_server(nursery, token_delay=0.001)
    yield srv
    srv.shutdown.set()


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        yield c


def parse_sse(raw: bytes) -> list[object]:
    """SSE bytes -> events: dicts for JSON data, "[DONE]", and ":" for comments."""
    events: list[object] = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        assert block.count("\n") == 0, f"one line per event expected: {block!r}"
        if block.startswith(":"):
            events.append(":")
        elif block == "data: [DONE]":
            events.append("[DONE]")
        else:
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: ") :]))
    return events
