"""The front end's work, counted: the CI guard of issue 45 §3.

Timed tests are noise on a shared machine; work is countable. This runs fixed workloads against
the production app (``create_app`` on the scripted engine in lockstep, served by braid's own
hypercorn with its patches, on a loopback port) and counts what the *server's* tasks do:

* ``calls``: Python function calls (a profiler hook's ``call`` events, generator and coroutine
  resumptions included) made while a server task runs on the Trio thread;
* ``thread_calls``: the same on worker threads (the store's, ``to_thread``'s);
* ``steps``: Trio task steps of the server's tasks (each one a checkpoint that yielded);
* ``sends``: events handed to the server's connections for writing (hypercorn's and braid's
  ``protocol_send``: data, and a connection's close); ``bytes``: what the clients received.

The clients are tasks named ``work-client``; their steps are not counted. The scripted engine
runs in the server's tasks, so its own work is in the counts too. Each count is divided by the
workload's output tokens (``/token``) or requests (``/req``; job lines for ``job_lines``).

Trio shuffles each scheduler batch; the runs here seed that shuffle (Trio's Hypothesis hook does
the same) and fix ``PYTHONHASHSEED``, so a count repeats to within a call or two.

The budgets live in ``tools/work_budgets.json``. Each is the largest of ``--runs`` runs (every
other one beside a process that keeps a core busy) plus a tolerance: twice the spread of those runs, and at least :data:`PER_TOKEN_FLOOR` of a per-token
count (under one extra call per token, so one planted step per token fails) or
:data:`PER_REQUEST_SHARE` of a per-request count.

Run::

    python -m tools.work                 # check every budget; exit 1 when a count passes one
    python -m tools.work --update        # run each workload --runs times, write the budgets
    python -m tools.work --top 15        # also the functions called most per token, per workload
    python -m tools.work --plant         # with one extra call per rendered output (must fail)

A change that adds work fails ``tests/test_work.py``; if the work is meant, ``--update`` and the
budget file's diff say how much it costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import attrs
import trio

BUDGETS = Path(__file__).with_name("work_budgets.json")
UPDATE_COMMAND = "python -m tools.work --update"
CLIENT = "work-client"
SEED = 1234
PER_TOKEN_FLOOR = {"calls": 0.25, "thread_calls": 0.25, "steps": 0.02, "sends": 0.02, "bytes": 0.5}
"""The least tolerance of a per-token count: a quarter of the smallest step a change can add."""
PER_REQUEST_SHARE = 0.005
"""The least tolerance of a per-request count, as a share of its median."""


# --- counting -------------------------------------------------------------------------------------


class _Count:
    """What the server's tasks do while a workload runs."""

    def __init__(self) -> None:
        self.calls: Counter[CodeType] = Counter()
        self.cells: list[list[int]] = []
        """One per worker thread, written by that thread alone: no lock, no lost count."""
        self.steps = 0
        self.bytes = 0
        self.active = False

    def trio_hook(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.calls[frame.f_code] += 1

    @property
    def thread_calls(self) -> int:
        return sum(cell[0] for cell in self.cells)


_COUNT = _Count()
_local = threading.local()


def _thread_hook(frame: FrameType, event: str, arg: object) -> None:
    """Installed with ``threading.setprofile`` before the server starts a thread."""
    if event == "call" and _COUNT.active:
        cell = getattr(_local, "cell", None)
        if cell is None:
            cell = _local.cell = [0]
            _COUNT.cells.append(cell)
        cell[0] += 1


class _Instrument(trio.abc.Instrument):
    """Profiles each step of a task that is not a client's."""

    def __init__(self, count: _Count) -> None:
        self.count = count
        self.on = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith(CLIENT):
            return
        self.count.steps += 1
        self.on = True
        sys.setprofile(self.count.trio_hook)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on:
            sys.setprofile(None)
            self.on = False


def _seed_trio() -> None:
    """Trio's scheduler, shuffled by a seeded random (what its Hypothesis plugin does)."""
    import trio._core._run as run

    run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    run._r.seed(SEED)


# --- the workloads --------------------------------------------------------------------------------


@attrs.frozen
class Result:
    requests: int
    tokens: int
    calls: int
    thread_calls: int
    steps: int
    sends: int
    bytes: int
    top: list[tuple[str, int]]

    def rates(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in ("calls", "thread_calls", "steps", "sends", "bytes"):
            total = getattr(self, name)
            out[f"{name}/token"] = total / self.tokens
            out[f"{name}/req"] = total / self.requests
        return out


@attrs.frozen
class Workload:
    name: str
    about: str
    requests: Callable[[], list[tuple[str, dict[str, Any]]]]
    """(path, JSON body) of each request, sent ``concurrency`` at a time, in order."""
    concurrency: int = 1
    parsers: bool = False
    """The server parses tool calls with vLLM's hermes parser (imports vLLM's parsers)."""
    job: bool = False
    """The requests are the lines of one batch job (``POST /v1/batches``), not HTTP requests."""


def _completions(prompts: int, stream: bool, max_tokens: int = 32) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scripted",
        "prompt": [f"prompt number {i} of the batch" for i in range(prompts)] if prompts > 1 else "one prompt",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "seed": 7,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _chat_tool(i: int) -> dict[str, Any]:
    say = f"Let me look that up for request {i}. {_CALL}"
    return {
        "model": "scripted",
        "messages": [{"role": "user", "content": f"<braid:say>{say}</braid:say>"}],
        "tools": _TOOLS,
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


WORKLOADS = (
    Workload(
        "stream_batch",
        "one streamed /v1/completions of 64 prompts x 32 tokens",
        lambda: [("/v1/completions", _completions(64, stream=True))],
    ),
    Workload(
        "json_batch",
        "one JSON /v1/completions of 64 prompts x 32 tokens",
        lambda: [("/v1/completions", _completions(64, stream=False))],
    ),
    Workload(
        "stream_requests",
        "64 streamed one-prompt /v1/completions x 32 tokens, 16 at a time (vLLM's bench serve's shape)",
        lambda: [("/v1/completions", _completions(1, stream=True)) for _ in range(64)],
        concurrency=16,
    ),
    Workload(
        "chat_tools",
        "16 streamed chats with hermes' tool parser, text then a call, 4 at a time",
        lambda: [("/v1/chat/completions", _chat_tool(i)) for i in range(16)],
        concurrency=4,
        parsers=True,
    ),
    Workload(
        "job_lines",
        "a batch job of 64 /v1/completions lines x 16 tokens (per request: per line)",
        lambda: [
            ("/v1/completions", {**_completions(1, stream=False, max_tokens=16), "prompt": f"line {i}"})
            for i in range(64)
        ],
        job=True,
    ),
)


_USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')


def _tokens(raw: bytes) -> int:
    """The completion tokens of a response or a job's row: its (a stream's last) usage."""
    found = _USAGE.findall(raw)
    if not found:
        raise RuntimeError(f"no usage in {raw[-300:]!r}")
    return int(found[-1])


async def _post(port: int, path: str, body: bytes) -> bytes:
    """One HTTP/1.1 request on a connection of its own; the whole response (``Connection: close``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: work\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
        parts = []
        while chunk := await stream.receive_some(1 << 16):
            parts.append(chunk)
    raw = b"".join(parts)
    if not raw.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {raw[:300]!r}")
    _COUNT.bytes += len(raw) if _COUNT.active else 0
    return raw


@contextlib.contextmanager
def _planted(plant: bool) -> Iterator[None]:
    """``--plant``: one extra Python call for every output the renderer renders (once per token
    of a stream in lockstep): the defect the guard exists to catch."""
    if not plant:
        yield
        return
    from braid.stream.render import ChoiceRenderer

    original = ChoiceRenderer.render

    def render(self: ChoiceRenderer, prompt_idx: int, output: Any) -> Any:
        return original(self, prompt_idx, output)

    ChoiceRenderer.render = render  # type: ignore[method-assign]
    try:
        yield
    finally:
        ChoiceRenderer.render = original  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def _served(workload: Workload) -> AsyncIterator[tuple[Any, int]]:
    """The app on the scripted engine with a store of its own, served on a free loopback port,
    its batch runner running; (app, port)."""
    from braid.engine.scripted import ScriptedEngine
    from braid.http.app import create_app
    from braid.http.server import ServerConfig, serve
    from braid.settings import ParserOptions, Settings
    from braid.store.db import open_store
    from braid.store.options import StoreOptions

    settings = Settings()
    if workload.parsers:
        settings = Settings(parsers=ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes"))
    with tempfile.TemporaryDirectory(prefix="braid-work-") as tmp:
        async with open_store(StoreOptions(storage_dir=tmp), int(time.time())) as store:
            app = create_app(ScriptedEngine(token_delay=0.0), settings, store=store)
            shutdown = trio.Event()

            async def run(task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(app, ServerConfig(port=0), shutdown=shutdown, handle_signals=False, task_status=task_status)

            async with trio.open_nursery() as nursery:
                urls = await nursery.start(run)
                assert app.batches is not None  # create_app makes one with a store
                await nursery.start(app.batches.run)
                yield app, int(urls[0].rsplit(":", 1)[1])
                shutdown.set()
                nursery.cancel_scope.cancel()


async def _requests(port: int, requests: list[tuple[str, bytes]], concurrency: int) -> int:
    """Send ``requests``, ``concurrency`` at a time from client tasks; their output tokens."""
    tokens = 0
    pending = iter(requests)

    async def client() -> None:
        nonlocal tokens
        for path, body in pending:
            raw = await _post(port, path, body)  # not `tokens += await ...`: that loses updates
            tokens += _tokens(raw)

    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(client, name=f"{CLIENT}-{i}")
    return tokens


async def _job(app: Any, lines: list[tuple[str, bytes]]) -> int:
    """The lines as one batch job, created as ``POST /v1/batches`` creates it and run by the
    server's runner; the output tokens of its rows. The runner's write of a running job's counts
    every ``COUNTS_EVERY`` seconds is off: it is per half second, not per line, and a slower
    machine would make one more."""
    from braid.batch import runner as batch_runner
    from braid.routes import batches
    from braid.store.records import ANONYMOUS, FileRecord, new_id

    batch_runner.COUNTS_EVERY = float("inf")

    runner, state = app.batches, app.state
    store = runner.store
    now = int(time.time())
    file_id = new_id("file-")
    text = b"".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": path}).encode()[:-1]
        + b', "body": '
        + body
        + b"}\n"
        for i, (path, body) in enumerate(lines)
    )
    staged = store.temp_path(file_id)
    staged.write_bytes(text)
    await store.add_file(FileRecord(file_id, ANONYMOUS, "work.jsonl", "batch", len(text), now, None), written=staged)
    create = {"input_file_id": file_id, "endpoint": lines[0][0], "completion_window": "24h"}
    created = await batches.create(
        store,
        ANONYMOUS,
        json.dumps(create).encode(),
        engine=state.engine,
        settings=state.settings,
        limits=state.limits,
        jobs=runner,
        now=now,
    )
    batch_id = json.loads(created.body)["id"]
    # The runner's count of its jobs, not the store: a client's store reads would add worker
    # thread calls that depend on the clock. (The runner has no event for a job's end.)
    while runner.active:  # noqa: ASYNC110
        await trio.sleep(0.002)
    record = await store.load_batch(batch_id)
    if record is None or record.status != "completed" or record.counts.failed:
        raise RuntimeError(f"the job ended {record and record.status}: {record and record.counts}")
    assert record.output_file_id is not None
    with (await store.local_path(record.output_file_id)).open("rb") as f:
        return sum(_tokens(row) for row in f if row.strip())


async def _as_client(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a task named as a client's (its steps and calls are not counted)."""
    result: list[Any] = []

    async def client() -> None:
        result.append(await fn(*args))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client, name=f"{CLIENT}-main")
    return result[0]


def _name(code: CodeType) -> str:
    path = code.co_filename
    for marker in ("site-packages/", "/src/"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
    return f"{path}:{code.co_firstlineno} {code.co_qualname}"


def _drop_instrumentation(count: _Count) -> None:
    """Take out the calls the counting itself makes. After each step it profiles, Trio's run loop
    asks ``"after_task_step" in instruments`` (a ``UserDict``) and calls the instrument, with the
    hook still on: one ``UserDict.__contains__``, ``Instruments.call`` and ``after_task_step`` per
    step. The same ``__contains__`` inside a step (``reschedule`` asks it too) is Trio's own work
    and stays counted."""
    own = {_Instrument.before_task_step.__code__, _Instrument.after_task_step.__code__}
    for code in list(count.calls):
        if code in own or code.co_qualname == "Instruments.call":
            del count.calls[code]
        elif code.co_qualname == "UserDict.__contains__":
            count.calls[code] -= count.steps


async def _measure(workload: Workload, plant: bool) -> Result:
    count = _COUNT
    requests = [(path, json.dumps(body).encode()) for path, body in workload.requests()]
    async with _served(workload) as (app, port):
        # A warm-up of the same shape first: imports, caches and first-use work are not counted.
        if workload.job:
            await _as_client(_job, app, requests[:8])
        else:
            await _as_client(_requests, port, requests[: workload.concurrency], workload.concurrency)
        _seed_trio()
        instrument = _Instrument(count)
        with _planted(plant):
            count.active = True
            trio.lowlevel.add_instrument(instrument)
            try:
                if workload.job:
                    tokens = await _as_client(_job, app, requests)
                else:
                    tokens = await _as_client(_requests, port, requests, workload.concurrency)
            finally:
                trio.lowlevel.remove_instrument(instrument)
                sys.setprofile(None)  # this task's step began with the hook on: no after_task_step
                count.active = False
    _drop_instrumentation(count)
    return Result(
        requests=len(requests),
        tokens=tokens,
        calls=sum(count.calls.values()),
        thread_calls=count.thread_calls,
        steps=count.steps,
        sends=sum(n for code, n in count.calls.items() if code.co_name == "protocol_send"),
        bytes=count.bytes,
        top=[(_name(code), n) for code, n in count.calls.most_common(60)],
    )


# --- the command ----------------------------------------------------------------------------------


def _one(name: str, plant: bool) -> Result:
    """Measure one workload in this process (a fresh one: see :func:`run_one`)."""
    (workload,) = [w for w in WORKLOADS if w.name == name]
    threading.setprofile(_thread_hook)  # before the server starts its first thread
    return trio.run(_measure, workload, plant)


def run_one(name: str, *, plant: bool = False) -> Result:
    """Measure one workload in a process of its own, with a fixed hash seed: nothing an earlier
    workload warmed or started is in its count."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    argv = [sys.executable, "-m", "tools.work", "--one", name, *(["--plant"] if plant else [])]
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"workload {name} failed:\n{out.stderr[-3000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["top"] = [tuple(t) for t in data["top"]]
    return Result(**data)


METRICS = ("calls", "thread_calls", "steps", "sends", "bytes")


def tolerance(metric: str, per: str, values: list[float]) -> float:
    """How far over the largest of ``values`` (one count's runs) its budget is (see the module)."""
    spread = max(values) - min(values)
    if per == "token":
        floor = PER_TOKEN_FLOOR[metric]
    else:
        floor = PER_REQUEST_SHARE * statistics.median(values)
    return max(2 * spread, floor)


@contextlib.contextmanager
def _busy_core(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def update(runs: int) -> dict[str, Any]:
    """Run every workload ``runs`` times and write the budgets."""
    out: dict[str, Any] = {
        "command": UPDATE_COMMAND,
        "runs": runs,
        "rule": "budget = largest run + max(2 x spread of the runs, a floor: "
        f"{PER_TOKEN_FLOOR} per token, {PER_REQUEST_SHARE:.1%} of the median per request)",
        "workloads": {},
    }
    for workload in WORKLOADS:
        results = []
        for i in range(runs):
            # Every other run beside a process that keeps a core busy: what depends on timing (a
            # worker thread's return, rows gathered for a write) shows in the spread.
            with _busy_core(i % 2 == 1):
                results.append(run_one(workload.name))
        entry: dict[str, Any] = {"about": workload.about, "tokens": results[0].tokens, "requests": results[0].requests}
        for key in results[0].rates():
            metric, per = key.split("/")
            values = [r.rates()[key] for r in results]
            if max(values) == 0:
                continue
            entry[key] = {
                "budget": round(max(values) + tolerance(metric, per, values), 3),
                "runs": [round(v, 3) for v in values],
            }
        out["workloads"][workload.name] = entry
        print(f"{workload.name}: {_table_row(results[0])}", flush=True)
    BUDGETS.write_text(json.dumps(out, indent=1) + "\n")
    return out


def _table_row(r: Result) -> str:
    rates = r.rates()
    return (
        f"{rates['calls/token']:8.1f} calls/token {rates['calls/req']:9.0f} calls/req "
        f"{rates['steps/token']:6.2f} steps/token {rates['sends/token']:5.2f} sends/token "
        f"{rates['bytes/token']:6.1f} B/token {rates['thread_calls/req']:7.0f} thread calls/req"
    )


def check(*, plant: bool = False, top: int = 0, only: list[str] | None = None) -> list[str]:
    """Every workload once against its budgets; the counts that passed one (empty: all within)."""
    budgets = json.loads(BUDGETS.read_text())["workloads"]
    over: list[str] = []
    for workload in WORKLOADS:
        if only and workload.name not in only:
            continue
        result = run_one(workload.name, plant=plant)
        print(f"{workload.name:16s} {_table_row(result)}", flush=True)
        entry = budgets.get(workload.name)
        if entry is None:
            over.append(f"{workload.name}: no budget ({UPDATE_COMMAND})")
            continue
        if (result.tokens, result.requests) != (entry["tokens"], entry["requests"]):
            over.append(
                f"{workload.name}: {result.tokens} tokens in {result.requests} requests, "
                f"the budget's were {entry['tokens']} in {entry['requests']}"
            )
        for key, value in result.rates().items():
            budget = entry.get(key, {"budget": 0.0})["budget"]
            if value > budget:
                over.append(f"{workload.name}: {key} {value:.3f} > budget {budget:.3f}")
        for name, n in result.top[:top]:
            print(f"    {n / result.tokens:8.2f}/token {n / result.requests:9.1f}/req  {name}")
    return over


def main() -> None:
    p = argparse.ArgumentParser(description="The front end's work per token and per request, against budgets.")
    p.add_argument("--update", action="store_true", help="measure --runs times and write the budgets")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--plant", action="store_true", help="one extra call per rendered output (must fail)")
    p.add_argument("--top", type=int, default=0, help="show the N functions called most, per workload")
    p.add_argument("--only", action="append", help="this workload only (repeatable)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(attrs.asdict(_one(args.one, args.plant))))
        return
    if args.update:
        update(args.runs)
        return
    over = check(plant=args.plant, top=args.top, only=args.only)
    if over:
        print("over budget:\n  " + "\n  ".join(over))
        print(f"If the work is meant, `{UPDATE_COMMAND}` and let the diff of {BUDGETS.name} say what it costs.")
        raise SystemExit(1)
    print("every count within its budget")


if __name__ == "__main__":
    main()
