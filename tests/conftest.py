"""Shared fixtures: braid on real hypercorn (loopback, port 0) inside the test's own trio run,
and (session-wide) one real ``braid serve --engine vllm`` for the vLLM and parity tiers."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
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


@attrs.frozen
class VllmServer:
    url: str
    model: str
    pid: int

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"metric {name} not exposed")

    def wait_engine_idle(self, within: float = 5.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < within:
            if self.metric("braid_engine_requests_in_flight") == 0 and self.metric("braid_engine_unfinished_requests") == 0:
                return time.monotonic() - start
            time.sleep(0.01)
        raise AssertionError(
            f"engine not idle after {within} s: braid in flight {self.metric('braid_engine_requests_in_flight')}, "
            f"vLLM unfinished {self.metric('braid_engine_unfinished_requests')}"
        )


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One braid on vLLM for the whole session. No --model: the default tiny model is built
    (once per machine, cached) and served, as ``make serve`` does."""
    from tools.servers import run_braid

    log = Path(os.environ.get("BRAID_VLLM_LOG", "/tmp/braid-vllm-tier.log"))
    with run_braid("--fault-hooks", seed=0, log=log) as server:
        yield VllmServer(server.url, server.model, server.pid)
        # a clean drain on SIGTERM is part of what the tier checks
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
