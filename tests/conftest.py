"""Shared fixtures: braid on real hypercorn (loopback, port 0) inside the test's own trio run,
and (session-wide) one real ``braid serve --engine vllm`` for the vLLM and parity tiers."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import BraidApp, create_app
from braid.http.view import Settings
from braid.server import ServerConfig, serve
from tests.parity.compare import parse_sse as _parse_sse
from tools.servers import ServerProcess, run_braid


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


async def start_server(
    nursery: trio.Nursery, *, token_delay: float = 0.0, fast_send: bool = True, **settings: object
) -> LiveServer:
    engine = ScriptedEngine(token_delay=token_delay)
    app = create_app(engine, Settings(**settings))  # type: ignore[arg-type]
    shutdown = trio.Event()
    cfg = ServerConfig(port=0, graceful_timeout=1.0, keep_alive_timeout=75.0, fast_send=fast_send)
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
    """SSE bytes -> events: dicts for JSON data, "[DONE]", and ":" for comments (the parity
    tier's parser; anything that is not one-line vLLM-style framing raises ValueError)."""
    return list(_parse_sse(raw))


@attrs.frozen
class VllmServer:
    """The tier's braid server (a tools.servers.ServerProcess) with the checks its tests use."""

    process: ServerProcess

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def model(self) -> str:
        return self.process.model

    @property
    def pid(self) -> int:
        return self.process.pid

    def metric(self, name: str) -> float:
        value = self.process.metrics().get(name)
        if value is None:
            raise AssertionError(f"metric {name} not exposed")
        return value

    def wait_engine_idle(self, within: float = 5.0) -> float:
        """Seconds until braid has no request in flight and vLLM none unfinished."""
        return self.process.wait_idle(within)

    def fail_one_of(self, count: int, failing: int) -> dict[str, object]:
        """Stream a batch of ``count`` long prompts of which prompt ``failing`` fails after 3
        tokens (``--fault-hooks``); check the stream ends with the error and every sibling was
        aborted. Returns the request body."""
        aborts = self.metric("braid_engine_aborts_total")
        prompts = [f"y{i} = " for i in range(count)]
        prompts[failing] = "fail here braid:fail@3"
        body = {"model": self.model, "prompt": prompts, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=60) as r:
            events = parse_sse(r.read())
        assert events[-1] == "[DONE]" and "error" in events[-2]
        self.wait_engine_idle()
        assert self.metric("braid_engine_aborts_total") == aborts + count - 1
        return body


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One braid on vLLM for the whole session. No --model: the default tiny model is built
    (once per machine, cached) and served, as ``make serve`` does."""
    log = Path(os.environ.get("BRAID_VLLM_LOG", "/tmp/braid-vllm-tier.log"))
    with run_braid("--fault-hooks", seed=0, log=log) as server:
        yield VllmServer(server)
        # a clean drain on SIGTERM is part of what the tier checks
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
