"""What more than one test module uses: braid on a live server, the SSE parser, small builders.

Fixtures stay in conftest.py; the classes and functions behind them live here, so that test
modules import from one place and never from each other or from a conftest.
"""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import struct
import threading
from collections import defaultdict
from typing import Any

import attrs
import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry

from braid.engine.base import EngineOutput
from braid.engine.scripted import VOCAB_SIZE, ByteTokenizer, ScriptedEngine
from braid.http.app import BraidApp, create_app
from braid.http.server import ServerConfig, serve
from braid.routes import completions
from braid.settings import Settings
from braid.stream.heartbeat import TICK, Tick
from braid.stream.merge import Phase
from braid.stream.plan import Plan, make_plan
from braid.stream.run import Arrival
from braid.stream.tokenize import INLINE_CHARS
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits
from tools.servers import ServerProcess

# --- SSE ------------------------------------------------------------------------------------------


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie that no one reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


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


# --- the tiny model ------------------------------------------------------------------------------


@functools.cache
def no_whitespace() -> dict[str, int]:
    """A logit_bias that bans the tiny model's whitespace-only tokens: the JSON grammar allows
    whitespace between values, and the tiny model, forced into JSON, writes it for ever."""
    from transformers import AutoTokenizer

    from tools.servers import tiny_model_dir

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    return {str(i): -100 for i in range(tok.vocab_size) if tok.decode([i]) and not tok.decode([i]).strip()}


# --- metrics --------------------------------------------------------------------------------------


def aborts(registry: CollectorRegistry) -> dict[str, float]:
    """``braid_engine_aborts_total`` by cause, the causes that counted none left out."""
    return {
        s.labels["cause"]: s.value
        for m in registry.collect()
        for s in m.samples
        if s.name == "braid_engine_aborts_total" and s.value
    }


# --- braid on a live server -----------------------------------------------------------------------


@attrs.define
class LiveServer:
    url: str
    engine: ScriptedEngine
    app: BraidApp
    shutdown: trio.Event
    stopped: trio.Event
    """Set when ``serve`` has returned (after a drain: every connection closed)."""

    def gauge(self, name: str, **labels: str) -> float:
        return self.app.state.metrics.registry.get_sample_value(name, labels) or 0.0

    def aborts(self) -> dict[str, float]:
        """``braid_engine_aborts_total`` by cause, the causes that counted none left out."""
        return aborts(self.app.state.metrics.registry)

    async def wait_idle(self, within: float) -> float:
        """Wait until no engine request is in flight; return how long that took (fails past ``within``)."""
        start = trio.current_time()
        with trio.move_on_after(within):
            # The gauge falls in the same step as the engine's count (braid.stream.run), so
            # waking at the engine's changes sees both.
            await self.engine.wait_until(
                lambda: not self.engine.in_flight and not self.gauge("braid_engine_requests_in_flight")
            )
            return trio.current_time() - start
        pytest.fail(
            f"engine requests still in flight after {within} s: engine={self.engine.in_flight} "
            f"gauge={self.gauge('braid_engine_requests_in_flight')}"
        )


async def start_server(
    nursery: trio.Nursery,
    *,
    token_delay: float = 0.0,
    fast_send: bool = True,
    write_timeout: float | None = None,
    graceful_timeout: float = 1.0,
    **settings: object,
) -> LiveServer:
    """braid on the scripted engine, on a free loopback port. ``write_timeout`` defaults to the
    stall timeout, as in ``braid serve``."""
    engine = ScriptedEngine(token_delay=token_delay)
    app_settings = Settings(**settings)  # type: ignore[arg-type]
    app = create_app(engine, app_settings)
    shutdown = trio.Event()
    stopped = trio.Event()
    cfg = ServerConfig(
        port=0,
        graceful_timeout=graceful_timeout,
        keep_alive_timeout=75.0,
        fast_send=fast_send,
        write_timeout=write_timeout or app_settings.stall_timeout,
    )

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await serve(app, cfg, shutdown=shutdown, handle_signals=False, task_status=task_status)
        finally:
            stopped.set()

    urls = await nursery.start(run)
    return LiveServer(urls[0], engine, app, shutdown, stopped)


async def open_stalled_client(url: str, body: bytes) -> trio.SocketStream:
    """A client that sends its request and then reads nothing, with a small receive buffer, so
    the server's socket, then its stream buffer, then every driver back up behind it."""
    host, port = url.removeprefix("http://").split(":")
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)  # before connect: the window
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    await stream.send_all(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return stream


def listen_queue(port: int) -> tuple[int, int]:
    """(connections waiting to be accepted, the backlog) of this process's socket listening on
    ``port``, as the kernel holds them (Linux: a listening socket's ``tcp_info`` has its accept
    queue's length in ``tcpi_unacked`` and its limit in ``tcpi_sacked``)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket
        with sock:
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) or sock.getsockname()[1] != port:
                    continue
            except OSError:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            unacked, sacked = struct.unpack_from("2I", info, 24)
            return int(unacked), int(sacked)
    raise AssertionError(f"no listening socket on port {port}")


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


# --- builders -------------------------------------------------------------------------------------


def plan_for(engine: ScriptedEngine, body: bytes) -> Plan:
    req = parse_request(body, Limits(vocab_size=engine.info.vocab_size))
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-t", created=0)


def arrivals(batch: list[Arrival | Tick]) -> list[Arrival]:
    """A batch of a run with no heartbeat, as the outputs it holds (checked: no tick among them)."""
    outputs = [a for a in batch if a is not TICK]
    assert len(outputs) == len(batch), "a heartbeat tick from a run without a heartbeat"
    return outputs


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


# --- render and merge, fed by the scripted engine -------------------------------------------------
# The expected values are computed from the engine's own outputs (the deltas it yields), never from
# braid's rendering, so that every assertion compares two independent derivations.

TOK = ByteTokenizer()
LIMITS = Limits(vocab_size=VOCAB_SIZE)


def ids_of(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def make(body: dict, *, stream: bool) -> Plan:
    body = {**body, "stream": stream}
    if not stream:
        body.pop("stream_options", None)
    engine = ScriptedEngine()
    req = parse_request(json.dumps(body).encode(), LIMITS)
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-test", created=1700000000)


async def generate(plan: Plan) -> list[list[EngineOutput]]:
    """Every output of every prompt, per prompt, from a real ScriptedEngine run."""
    engine = ScriptedEngine()
    per_prompt = []
    for item in plan.items:
        async with engine.open_request(item.request) as outputs:
            per_prompt.append([o async for o in outputs])
    assert engine.in_flight == 0 and engine.aborted_total == 0
    return per_prompt


def interleave(per_prompt: list[list[EngineOutput]], seed: int) -> list[list[Arrival]]:
    """A random arrival order (each prompt's outputs stay in order), cut into random batches."""
    rng = random.Random(seed)
    queues = [[(i, o) for o in outs] for i, outs in enumerate(per_prompt)]
    order: list[Arrival] = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        order.append(q.pop(0))
    batches, at = [], 0
    while at < len(order):
        size = rng.randint(1, 4)
        batches.append(order[at : at + size])
        at += size
    return batches


async def run_stream(body: dict, seed: int = 0) -> tuple[Plan, list[list[EngineOutput]], list[Any]]:
    plan = make(body, stream=True)
    per_prompt = await generate(plan)
    merger = completions.merger(plan, TOK)
    raw = b"".join(merger.feed(batch) for batch in interleave(per_prompt, seed)) + merger.finish()
    assert merger.phase is Phase.DONE and raw.endswith(b"\n\n")
    return plan, per_prompt, parse_sse(raw)


async def run_whole(body: dict, seed: int = 0) -> tuple[Plan, list[list[EngineOutput]], dict]:
    plan = make(body, stream=False)
    per_prompt = await generate(plan)
    collector = completions.collector(plan, TOK)
    for batch in interleave(per_prompt, seed):
        collector.feed(batch)
    return plan, per_prompt, json.loads(collector.body())


def content_chunks(events: list[object]) -> list[dict]:
    return [e for e in events if isinstance(e, dict) and e["choices"]]


def by_index(events: list[object]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for e in content_chunks(events):
        assert len(e["choices"]) == 1
        out[e["choices"][0]["index"]].append(e["choices"][0])
    return out


class Expected:
    """Per global choice index, what the engine produced (texts, token ids, finish), by hand."""

    def __init__(self, plan: Plan, per_prompt: list[list[EngineOutput]]) -> None:
        self.text: dict[int, str] = defaultdict(str)
        self.token_ids: dict[int, list[int]] = defaultdict(list)
        self.finish: dict[int, tuple[str | None, object]] = {}
        self.prompt_ids: dict[int, tuple[int, ...]] = {}
        self.steps: dict[int, list] = defaultdict(list)
        self.prompt_tokens = 0
        for i, outs in enumerate(per_prompt):
            self.prompt_tokens += len(outs[0].prompt_token_ids)
            for out in outs:
                for d in out.choices:
                    g = i * plan.n + d.index
                    self.text[g] += d.text
                    self.token_ids[g] += d.token_ids
                    self.steps[g] += d.logprobs or ()
                    self.prompt_ids[g] = out.prompt_token_ids
                    if d.finish_reason is not None:
                        assert g not in self.finish
                        self.finish[g] = (d.finish_reason, d.stop_reason)
        self.completion_tokens = sum(len(t) for t in self.token_ids.values())


def cumulative_offsets(tokens: list[str], start: int = 0) -> list[int]:
    out = []
    for t in tokens:
        out.append(start)
        start += len(t)
    return out


def check_logprobs_entries(lp: dict, plan: Plan) -> None:
    assert plan.logprobs is not None  # the entries are there only when asked for
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert (logprob is None) == (top is None)
        if top is not None:
            assert top[tok] == logprob <= 0
            assert 1 <= len(top) <= plan.logprobs + 1
