"""What more than one test module uses: braid on a live server, the SSE parser, small builders.

Fixtures stay in conftest.py; the classes and functions behind them live here, so that test
modules import from one place and never from each other or from a conftest.
"""

from __future__ import annotations

import json
import threading
from functools import partial
from typing import Any

import attrs
import httpx
import pytest
import trio

from braid.engine.scripted import ByteTokenizer, ScriptedEngine
from braid.http.app import BraidApp, Settings, create_app
from braid.plan import Plan, make_plan
from braid.request import Limits, parse_request
from braid.server import ServerConfig, serve
from braid.tokenize import INLINE_CHARS
from tools.servers import ServerProcess

# --- SSE -------------------------------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[Any]:
    """SSE bytes -> events: dicts for JSON data, "[DONE]", and ":" for comments. Raises
    ValueError on anything that is not one-line vLLM-style framing. The tests and the parity tier
    share it; the model has its own (``model.parse_sse``), which is part of the spec."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        if "\n" in block:
            raise ValueError(f"multi-line SSE event: {block[:80]!r}")
        if block.startswith(":"):
            events.append(":")
        elif block == "data: [DONE]":
            events.append("[DONE]")
        elif block.startswith("data: "):
            events.append(json.loads(block[len("data: ") :]))
        else:
            raise ValueError(f"not an SSE data line: {block[:80]!r}")
    return events


# --- braid on a live server ---------------------------------------------------------------------


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


# --- builders ------------------------------------------------------------------------------------


def plan_for(engine: ScriptedEngine, body: bytes) -> Plan:
    req = parse_request(body, Limits(vocab_size=engine.info.vocab_size))
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-t", created=0)


class RecordingTokenizer(ByteTokenizer):
    """Notes which thread each encode ran on, and how many encode_many calls overlapped."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.threads: list[str] = []  # "inline" (the test's thread) or "worker"
        self.main = threading.get_ident()
        self.gate = gate
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def _where(self) -> str:
        return "inline" if threading.get_ident() == self.main else "worker"

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(self._where())
        return super().encode(text, add_special_tokens=add_special_tokens)

    def encode_many(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            self.threads.append("many:" + self._where())
            if self.gate is not None:
                assert self.gate.wait(10), "the Trio thread did not run while the batch was tokenizing"
            return [ByteTokenizer.encode(self, t, add_special_tokens=add_special_tokens) for t in texts]
        finally:
            with self._lock:
                self.active -= 1


def big_batch(count: int = 64) -> list[str]:
    per = INLINE_CHARS // count + 8
    return [f"{i:04d}" + "x" * per for i in range(count)]
