"""Front-end ceiling: how many streamed events per second braid's HTTP front end can serve on one core.

Every server runs pinned to core 0 (``taskset -c 0``) and is loaded by ``wrk`` pinned to core 1
(one thread, ``CONNECTIONS`` keep-alive connections), each request being
``{"prompt": "x", "max_tokens": 64, "stream": true, "ignore_eos": true}``: 64 token events plus
``data: [DONE]``. The servers:

* braid: ``braid serve --engine scripted --token-delay 0`` (the whole data path, no model; at zero
  delay the scripted engine runs in lockstep with its reader, one output per token, so a response
  is 64 events, where an engine on its own clock would merge them), and
  the same with ``--stock-send`` (hypercorn's own send path instead of :mod:`braid.http.patches.fast_send`);
* bare hypercorn-trio: a bare ASGI app on hypercorn's trio worker streaming the very bytes braid
  sent (captured from braid first), with one body send per event, and with one per response; and
  the per-event app again on braid's fast send, so braid can be compared like for like;
* FastAPI + uvicorn (vLLM's HTTP stack): a ``StreamingResponse`` with one send per event.

All servers run at once (idle but for the one under load). Each wrk run has a short warm-up, then
lasts 10 s (3 s in quick mode); in full mode the streaming runs are done twice, in opposite
orders, against a neighbour whose load drifts. Requests/s come from wrk's own count; events/s is
requests/s x 64 (the ``[DONE]`` line is not counted). The server's CPU time over the run (from
/proc) gives CPU per request, which a busy neighbour disturbs less. Non-streaming requests are
measured the same way (braid, the bare app, and FastAPI in full mode).

Last, braid (in-process, with a counter of its ASGI body sends) is profiled with py-spy under the
same load, and the samples are attributed to hypercorn/h11, quart, braid's own code and trio.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs
import httpx

from bench.apps.proc import cpu_seconds, free_port, server
from bench.common import Section, Target, table
from braid.routes.body import GATHER_ROUNDS

SERVER_CPU = 0
LOAD_CPU = 1
CONNECTIONS = 16
TOKENS = 64
STREAM_BODY = {"prompt": "x", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
JSON_BODY = {"prompt": "x", "max_tokens": TOKENS, "stream": False, "ignore_eos": True}
TARGET_RATIO = 0.7
STOCK = "braid, hypercorn's stock send (--stock-send)"
BARE_FAST = "bare hypercorn-trio + braid's fast send, one send per event"
STREAM_FILE = Path("/tmp/bench-ceiling-stream.sse")
JSON_FILE = Path("/tmp/bench-ceiling-body.json")

WRK_INSTALL = (
    "wrk is not installed, and the ceiling benchmark needs it as its load generator. "
    "Install it with `sudo apt-get install -y wrk` (Debian/Ubuntu; `brew install wrk` on macOS), then re-run."
)

# wrk cannot POST without a script; done() prints one JSON line that run_wrk parses.
_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[%(body)s]]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"bytes\\": %%d, \\"connect\\": %%d, " ..
    "\\"read\\": %%d, \\"write\\": %%d, \\"status\\": %%d, \\"timeout\\": %%d, \\"p50_us\\": %%d, \\"p99_us\\": %%d}\\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@attrs.frozen
class WrkResult:
    requests: int
    seconds: float
    wire_bytes: int
    errors: int  # socket errors + non-2xx responses
    p50_ms: float
    p99_ms: float
    server_cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s / max(self.requests, 1) * 1e6

    @property
    def server_cpu_share(self) -> float:
        return self.server_cpu_s / self.seconds


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError(WRK_INSTALL)
    return path


def _pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) > max(SERVER_CPU, LOAD_CPU) else []


@contextmanager
def _lua(body: dict[str, object]) -> Iterator[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-wrk-", delete=False) as f:
        f.write(_LUA % {"body": json.dumps(body)})
    try:
        yield f.name
    finally:
        os.unlink(f.name)


def _wrk_argv(url: str, script: str, seconds: int) -> list[str]:
    return [
        *_pin(LOAD_CPU),
        wrk_path(),
        "-t1",
        f"-c{CONNECTIONS}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        script,
        url,
    ]


def _parse_wrk(out: str, cpu_s: float) -> WrkResult:
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            d = json.loads(line[len("WRKJSON ") :])
            errors = d["connect"] + d["read"] + d["write"] + d["status"] + d["timeout"]
            return WrkResult(
                d["requests"], d["duration_us"] / 1e6, d["bytes"], errors, d["p50_us"] / 1e3, d["p99_us"] / 1e3, cpu_s
            )
    raise RuntimeError(f"wrk printed no summary:\n{out}")


def run_wrk(url: str, body: dict[str, object], seconds: int, warmup: int, pid: int) -> WrkResult:
    """A warm-up run, then the measured run; the server's CPU time is taken around the latter."""
    with _lua(body) as script:
        if warmup:
            subprocess.run(_wrk_argv(url, script, warmup), check=True, capture_output=True)
        cpu0 = cpu_seconds(pid)
        done = subprocess.run(_wrk_argv(url, script, seconds), check=True, capture_output=True, text=True)
        return _parse_wrk(done.stdout, cpu_seconds(pid) - cpu0)


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def _check(url: str, body: dict[str, object], expect: bytes) -> None:
    """One request before the load: the server must answer 200 with as many bytes as braid did."""
    r = httpx.post(url, json=body, timeout=10)
    if r.status_code != 200 or len(r.content) != len(expect):
        raise RuntimeError(f"{url} answered {r.status_code} with {len(r.content)} B, expected 200 with {len(expect)} B")
    if body.get("stream") and len(_events(r.content)) != len(_events(expect)):
        raise RuntimeError(f"{url} streamed {len(_events(r.content))} events, expected {len(_events(expect))}")


# ---------------------------------------------------------------------------------------------
# py-spy: record raw collapsed stacks, then attribute samples.


def _frame_file(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; the line number may be absent.
    if frame.endswith(")") and " (" in frame:
        return frame.rsplit(" (", 1)[1][:-1].rsplit(":", 1)[0]
    return ""


def _frame_func(frame: str) -> str:
    return frame.rsplit(" (", 1)[0]


def _category(frame: str) -> str | None:
    """The component a frame's own code belongs to; None for stdlib and generated code
    (contextlib, attrs/dataclass ``__init__``, outcome...), which is charged to its caller."""
    path = _frame_file(frame)
    func = _frame_func(frame)
    p = "/" + path.replace("\\", "/")
    if "/h11/" in p:
        return "h11 (HTTP/1.1 state machine)"
    if "/hypercorn/" in p:
        return "hypercorn"
    if "/quart_trio/" in p or "/quart/" in p or "/werkzeug/" in p:
        return "quart / quart-trio / werkzeug"
    if "/bench/apps/" in p:
        return "the benchmark's send counter (bench/apps)"
    if "braid/" in p:
        name = p.rsplit("braid/", 1)[1]
        if name in ("stream/render.py", "stream/merge.py", "wire/output.py") or name.endswith("_response.py"):
            return "braid: render / encode / merge"
        if name == "engine/scripted.py":
            return "braid: scripted engine"
        if name in ("stream/run.py", "routes/body.py"):
            return "braid: run + stream body (channels, tasks)"
        return "braid: view, request parsing, plan"
    if "/trio/" in p:
        if "_io_epoll" in p and func.endswith("get_events"):
            return "trio: waiting in epoll (idle)"
        if "_io_epoll" in p or "_highlevel_socket" in p or "/_socket.py" in p:
            return "trio: socket I/O (syscalls included)"
        return "trio: scheduler, cancel scopes, channels"
    if "prometheus_client" in p:
        return "prometheus-client"
    return None


def _owner(frames: list[str]) -> str:
    """The category of the innermost frame that has one (see :func:`_category`)."""
    for frame in reversed(frames):
        cat = _category(frame)
        if cat is not None:
            return cat
    return "other"


# Inclusive shares: a sample counts for a phase when the phase's frame is anywhere on its stack.
PHASES = (
    (
        "quart's response loop (`ASGIHTTPConnection._send_response`): body iteration + sends",
        "ASGIHTTPConnection._send_response (quart/asgi.py)",
    ),
    (
        "… body sends: hypercorn `HTTPStream.app_send` → h11 → trio socket",
        "HTTPStream.app_send (hypercorn/protocol/http_stream.py)",
    ),
    (
        "… braid `CompletionStream.__anext__` (channel receive + merge)",
        "CompletionStream.__anext__ (braid/routes/body.py)",
    ),
    ("… … braid `StreamMerger.feed` (render + encode)", "StreamMerger.feed (braid/merge.py)"),
    ("braid drivers (`CompletionRun._drive`), engine included", "CompletionRun._drive (braid/run.py)"),
    ("… the scripted engine (`_Generation.steps`)", "_Generation.steps (braid/engine/scripted.py)"),
    (
        "request in: hypercorn reading + h11 parsing (`TCPServer._read_data`)",
        "TCPServer._read_data (hypercorn/trio/tcp_server.py)",
    ),
    (
        "quart dispatch + braid's view: parse, validate, plan (`full_dispatch_request`)",
        "QuartTrio.full_dispatch_request (quart_trio/app.py)",
    ),
)


@attrs.frozen
class Profile:
    samples: int
    seconds: float
    by_category: list[tuple[str, float]]  # self time, % of samples
    top_self: list[tuple[str, float]]
    top_inclusive: list[tuple[str, float]]
    phases: list[tuple[str, float]]
    scheduler_self: float  # % of samples in trio's run loop itself
    sends_per_response: float
    responses: int


def _short(frame: str) -> str:
    path = _frame_file(frame)
    func = _frame_func(frame)
    for marker in ("site-packages/", "src/"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    return f"{func} ({path})"


def parse_raw(text: str) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """Total samples, and samples by category (self), by leaf frame (self), by frame (inclusive)."""
    total = 0
    cats: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if _frame_file(f)]  # drop the process/thread pseudo-frames
        if not frames:
            continue
        total += n
        cats[_owner(frames)] += n
        leaf[_short(frames[-1])] += n
        for f in {_short(f) for f in frames}:
            incl[f] += n
    return total, cats, leaf, incl


def profile_braid(seconds: int, warmup: int) -> Profile | None:
    """braid in-process (bench.apps.braid_counting) under the streaming load, sampled by py-spy."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return None
    port = free_port()
    stats = Path(tempfile.gettempdir()) / f"bench-braid-sends-{port}.json"
    out = Path(tempfile.gettempdir()) / f"bench-pyspy-{port}.txt"
    url = f"http://127.0.0.1:{port}/v1/completions"
    with (
        server(
            "braid-counting",
            ["bench.apps.braid_counting", "--port", str(port), "--stats", str(stats)],
            port,
            cpu=SERVER_CPU,
        ) as proc,
        _lua(STREAM_BODY) as script,
    ):
        if warmup:
            subprocess.run(_wrk_argv(url, script, warmup), check=True, capture_output=True)
        load = subprocess.Popen(
            _wrk_argv(url, script, seconds + 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(1)
            spy_run = subprocess.run(
                [
                    *_pin(LOAD_CPU),
                    spy,
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--duration",
                    str(seconds),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--idle",
                    "-o",
                    str(out),
                ],
                capture_output=True,
                text=True,
            )
        finally:
            load.wait()
    if spy_run.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy_run.returncode}): {spy_run.stderr.strip()[-500:]}")
    text = out.read_text()
    out.unlink()
    counts = json.loads(stats.read_text()) if stats.exists() else {"responses": 0, "body_sends": 0}
    stats.unlink(missing_ok=True)
    return analyse(text, seconds, counts)


def analyse(text: str, seconds: int, counts: dict[str, int]) -> Profile:
    """A :class:`Profile` from py-spy's raw output and the counted sends."""
    total, cats, leaf, incl = parse_raw(text)
    pct = lambda n: 100.0 * n / max(total, 1)  # noqa: E731
    skip = ("run (trio/_core/_run.py)", "unrolled_run", "<module>", "main (", "_call_with_frames_removed")
    inclusive = [
        (f, pct(n))
        for f, n in incl.most_common(60)
        if not any(s in f for s in skip) and "bench/apps" not in f and pct(n) < 97
    ]
    return Profile(
        samples=total,
        seconds=seconds,
        by_category=[(c, pct(n)) for c, n in cats.most_common()],
        top_self=[(f, pct(n)) for f, n in leaf.most_common(15)],
        top_inclusive=inclusive[:15],
        phases=[(label, pct(incl.get(frame, 0))) for label, frame in PHASES],
        scheduler_self=pct(sum(n for f, n in leaf.items() if f.startswith("unrolled_run (trio/"))),
        sends_per_response=counts["body_sends"] / max(counts["responses"], 1),
        responses=counts["responses"],
    )


# ---------------------------------------------------------------------------------------------


def _capture(base: str) -> tuple[bytes, bytes]:
    stream = httpx.post(base + "/v1/completions", json=STREAM_BODY, timeout=10)
    body = httpx.post(base + "/v1/completions", json=JSON_BODY, timeout=10)
    stream.raise_for_status()
    body.raise_for_status()
    events = _events(stream.content)
    if len(events) != TOKENS + 1 or events[-1] != b"data: [DONE]":
        raise RuntimeError(f"braid streamed {len(events)} events, expected {TOKENS} and [DONE]")
    return stream.content, body.content


def _combine(runs: list[WrkResult]) -> WrkResult:
    """Several runs of one configuration as one: totals, the mean p50 and the worst p99."""
    return WrkResult(
        requests=sum(r.requests for r in runs),
        seconds=sum(r.seconds for r in runs),
        wire_bytes=sum(r.wire_bytes for r in runs),
        errors=sum(r.errors for r in runs),
        p50_ms=sum(r.p50_ms for r in runs) / len(runs),
        p99_ms=max(r.p99_ms for r in runs),
        server_cpu_s=sum(r.server_cpu_s for r in runs),
    )


def run(quick: bool) -> Section:
    wrk_path()  # fail first, with the install hint, if wrk is missing
    run_s, warm_s, prof_s = (3, 1, 3) if quick else (10, 2, 10)
    passes = 1 if quick else 2  # full mode: A B C D, then D C B A, against a drifting neighbour
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        ports = {name: free_port() for name in ("braid", "braid-stock", "bare", "bare-fast", "fastapi")}
        url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        braid = stack.enter_context(
            server(
                "braid",
                ["braid", "serve", "--engine", "scripted", "--token-delay", "0", "--port", str(ports["braid"])],
                ports["braid"],
                cpu=SERVER_CPU,
            )
        )
        braid_stock = stack.enter_context(
            server(
                "braid-stock",
                [
                    "braid",
                    "serve",
                    "--engine",
                    "scripted",
                    "--token-delay",
                    "0",
                    "--stock-send",
                    "--port",
                    str(ports["braid-stock"]),
                ],
                ports["braid-stock"],
                cpu=SERVER_CPU,
            )
        )
        raw, body = _capture(url["braid"])
        STREAM_FILE.write_bytes(raw)
        JSON_FILE.write_bytes(body)
        stack.callback(STREAM_FILE.unlink, missing_ok=True)
        stack.callback(JSON_FILE.unlink, missing_ok=True)
        payload = ["--stream", str(STREAM_FILE), "--json", str(JSON_FILE)]
        bare = stack.enter_context(
            server(
                "bare-hypercorn",
                ["bench.apps.bare_hypercorn", "--port", str(ports["bare"]), *payload],
                ports["bare"],
                cpu=SERVER_CPU,
            )
        )
        bare_fast = stack.enter_context(
            server(
                "bare-hypercorn-fast",
                ["bench.apps.bare_hypercorn", "--port", str(ports["bare-fast"]), *payload, "--fast-send"],
                ports["bare-fast"],
                cpu=SERVER_CPU,
            )
        )
        fast = stack.enter_context(
            server(
                "fastapi",
                ["bench.apps.fastapi_app", "--port", str(ports["fastapi"]), *payload],
                ports["fastapi"],
                cpu=SERVER_CPU,
            )
        )
        streaming = [
            ("braid", url["braid"] + "/v1/completions", braid.pid),
            (STOCK, url["braid-stock"] + "/v1/completions", braid_stock.pid),
            ("bare hypercorn-trio, one send per event", url["bare"] + "/per-event", bare.pid),
            (BARE_FAST, url["bare-fast"] + "/per-event", bare_fast.pid),
            ("bare hypercorn-trio, one send per response", url["bare"] + "/per-response", bare.pid),
            ("FastAPI + uvicorn, one send per event", url["fastapi"] + "/v1/completions", fast.pid),
        ]
        plain_cfg = [
            ("braid", url["braid"] + "/v1/completions", braid.pid),
            ("bare hypercorn-trio", url["bare"] + "/json", bare.pid),
            ("FastAPI + uvicorn", url["fastapi"] + "/v1/completions", fast.pid),
        ][: 2 if quick else 3]  # quick mode: no FastAPI non-streaming run (time budget)
        for _, target, _ in streaming:
            _check(target, STREAM_BODY, raw)
        for _, target, _ in plain_cfg:
            _check(target, JSON_BODY, body)
        stream_runs: dict[str, list[WrkResult]] = {name: [] for name, _, _ in streaming}
        for i in range(passes):
            for name, target, pid in streaming if i % 2 == 0 else streaming[::-1]:
                warm = warm_s if not stream_runs[name] else 0
                stream_runs[name].append(run_wrk(target, STREAM_BODY, run_s, warm, pid))
        plain = {name: run_wrk(target, JSON_BODY, run_s, warm_s, pid) for name, target, pid in plain_cfg}
    prof = profile_braid(prof_s, 1)
    streams = {name: _combine(runs) for name, runs in stream_runs.items()}
    per_pass = {name: [r.rps for r in runs] for name, runs in stream_runs.items()}
    event_sizes = [len(e) + 2 for e in _events(raw)[:-1]]
    return _section(
        run_s, streams, per_pass, plain, prof, event_sizes, len(raw), len(body), (load_before, os.getloadavg()[0])
    )


def _section(
    run_s: int,
    streams: dict[str, WrkResult],
    per_pass: dict[str, list[float]],
    plain: dict[str, WrkResult],
    prof: Profile | None,
    event_sizes: list[int],
    stream_bytes: int,
    json_bytes: int,
    load: tuple[float, float],
) -> Section:
    braid = streams["braid"]
    per_event = streams["bare hypercorn-trio, one send per event"]
    per_response = streams["bare hypercorn-trio, one send per response"]
    fastapi = streams["FastAPI + uvicorn, one send per event"]
    r_resp = braid.rps / per_response.rps
    r_event = braid.rps / per_event.rps
    r_fast = braid.rps / fastapi.rps
    stock = streams[STOCK]
    per_event_fast = streams[BARE_FAST]
    r_like = braid.rps / per_event_fast.rps  # the same HTTP stack on both sides: braid's own overhead
    r_stock = stock.rps / per_event.rps

    rows = [
        [
            name,
            r.rps,
            r.rps * TOKENS,
            " / ".join(f"{x:,.0f}" for x in per_pass[name]),
            f"{r.p50_ms:.1f} / {r.p99_ms:.1f}",
            f"{r.cpu_us_per_request:,.0f}",
            f"{100 * r.server_cpu_share:.0f}%",
            f"{r.wire_bytes / max(r.requests, 1):,.0f}",
            r.errors,
            f"{r.rps / braid.rps:.2f}",
        ]
        for name, r in streams.items()
    ]
    header = [
        "server (1 core)",
        "requests/s",
        "events/s",
        "req/s by pass",
        "p50 / p99 ms",
        "server CPU µs/request",
        "server CPU",
        "wire B/response",
        "errors",
        "vs braid (req/s)",
    ]
    mean_event = sum(event_sizes) / len(event_sizes)
    md = [
        f"Every server pinned to core {SERVER_CPU}, `wrk -t1 -c{CONNECTIONS}` pinned to core {LOAD_CPU}, "
        f"{run_s} s per run after a warm-up"
        + (
            f", {len(next(iter(per_pass.values())))} passes in opposite orders (rates below are over both)"
            if len(next(iter(per_pass.values()))) > 1
            else ""
        )
        + f". Each streaming response is {TOKENS} token events of "
        f"{mean_event:.0f} B (`data: {{...}}\\n\\n`, measured on braid's own output) plus `data: [DONE]`: "
        f"{stream_bytes:,} B of SSE per response, the very bytes every server sends. Events/s = requests/s × {TOKENS}. "
        f"1-minute load average {load[0]:.1f} before the runs and {load[1]:.1f} after "
        f"(the machine has {os.cpu_count()} cores, shared with other work).",
        "",
        '**Streaming** (`prompt: "x", max_tokens: 64, stream: true, ignore_eos: true`)',
        "",
        table(header, rows),
        "",
        table(
            ["ratio", "requests/s", "CPU per request (inverse)"],
            [
                [
                    "braid / bare hypercorn-trio, one send per response (the target's comparator)",
                    f"{r_resp:.2f}",
                    f"{per_response.cpu_us_per_request / braid.cpu_us_per_request:.2f}",
                ],
                [
                    "braid / bare hypercorn-trio, one send per event",
                    f"{r_event:.2f}",
                    f"{per_event.cpu_us_per_request / braid.cpu_us_per_request:.2f}",
                ],
                [
                    "braid / FastAPI + uvicorn (vLLM's stack)",
                    f"{r_fast:.2f}",
                    f"{fastapi.cpu_us_per_request / braid.cpu_us_per_request:.2f}",
                ],
                [
                    "braid / bare hypercorn-trio + the same fast send, one send per event (like for like)",
                    f"{r_like:.2f}",
                    f"{per_event_fast.cpu_us_per_request / braid.cpu_us_per_request:.2f}",
                ],
                [
                    "braid with hypercorn's stock send / bare hypercorn-trio, one send per event (like for like)",
                    f"{r_stock:.2f}",
                    f"{per_event.cpu_us_per_request / stock.cpu_us_per_request:.2f}",
                ],
                [
                    "braid / braid with hypercorn's stock send (what fast send buys)",
                    f"{braid.rps / stock.rps:.2f}",
                    f"{stock.cpu_us_per_request / braid.cpu_us_per_request:.2f}",
                ],
            ],
        ),
        "",
        "braid serves through `braid.http.patches.fast_send`: when the socket has room it writes each body chunk with "
        "one non-blocking `send(2)` instead of hypercorn's lock + shielded scope + `send_all` (two scheduler "
        "trips per chunk). The bare app of the issue runs hypercorn's stock send, so the two ratios above it "
        "credit braid with that change too; the like-for-like rows put braid and the bare app on the same send "
        "path and show braid's own overhead.",
        "",
        "The CPU column is the same ratio from the servers' own CPU time per request, which a busy neighbour "
        "on the shared core disturbs less than the wall-clock rate (see the 'server CPU' column: the share of "
        "core 0 each server got).",
        "",
        "The issue-6 target (≥ 0.7 of the bare hypercorn-trio app) is computed against the **one send per "
        "response** variant: it is hypercorn-trio's ceiling for these bytes, the one a front end that coalesces "
        "ready events (as braid does) can approach. The one-send-per-event app is what braid amounts to when "
        "each event arrives on its own; its ratio is reported too, but is not the target.",
    ]
    # One extra ASGI body send on the fast send path braid serves with: the bare app's per-event
    # variant on that path against its one-send response (66 sends vs 1 for the same bytes).
    send_us = max(per_event_fast.cpu_us_per_request - per_response.cpu_us_per_request, 0.0) / (TOKENS + 1)
    own_us = 0.0
    if prof is not None:
        sends_us = (prof.sends_per_response - 1) * send_us
        own_us = braid.cpu_us_per_request - per_response.cpu_us_per_request - sends_us
        md += [
            "",
            f"braid made **{prof.sends_per_response:.1f} ASGI body sends per response** ({prof.responses:,} responses, "
            f"counted in the profile run below; the last one is quart's empty end-of-body). The scripted engine (zero delay: "
            "lockstep with its reader) yields to the scheduler after every token; braid's body gathers what the drivers add for up to "
            f"{GATHER_ROUNDS} scheduler rounds (`braid.routes.body`), and a round that runs the body before the "
            "driver ends the gathering early (trio orders each round at random). From the bare app on the fast "
            f"send, one extra body send costs ≈ {send_us:,.0f} µs of CPU, so "
            f"braid's extra sends account for ≈ {sends_us:,.0f} µs of its {braid.cpu_us_per_request:,.0f} µs per "
            f"request; the other ≈ {own_us:,.0f} µs beyond the bare one-send response (≈ {own_us / TOKENS:,.0f} µs "
            "per event) is braid's own work: quart's request and response layers, the run's tasks and channel, "
            "the scripted engine, render and encode (see the profile).",
        ]
    prow = [
        [
            name,
            r.rps,
            f"{r.p50_ms:.1f} / {r.p99_ms:.1f}",
            f"{r.cpu_us_per_request:,.0f}",
            f"{100 * r.server_cpu_share:.0f}%",
            r.errors,
            f"{r.rps / plain['braid'].rps:.2f}",
        ]
        for name, r in plain.items()
    ]
    md += [
        "",
        f"**Non-streaming** (same request with `stream: false`: one {json_bytes} B JSON body)",
        "",
        table(
            [
                "server (1 core)",
                "requests/s",
                "p50 / p99 ms",
                "server CPU µs/request",
                "server CPU",
                "errors",
                "vs braid",
            ],
            prow,
        ),
        "",
        f"braid / bare hypercorn-trio, non-streaming: {plain['braid'].rps / plain['bare hypercorn-trio'].rps:.2f}.",
    ]
    if prof is not None:
        md += _profile_md(prof)
    else:
        md += ["", "py-spy is not installed (`.venv/bin/pip install py-spy`): no profile."]

    why = ""
    if r_resp < TARGET_RATIO:
        why = (
            f"braid {braid.rps:,.0f} req/s vs {per_response.rps:,.0f}; it spends {braid.cpu_us_per_request:,.0f} µs "
            f"of CPU per request vs {per_response.cpu_us_per_request:,.0f}"
        )
        if prof is not None:
            why += (
                f": {prof.sends_per_response:.0f} body sends per response (≈ {send_us:,.0f} µs each) and "
                f"≈ {own_us / TOKENS:,.0f} µs of its own work per event"
            )
    why_event = (
        ""
        if r_event >= TARGET_RATIO
        else (f"braid {braid.rps:,.0f} req/s vs {per_event.rps:,.0f} for the bare app sending each event on its own")
    )
    # The issue names one bare app; it has two honest readings, so both are reported: the same
    # send pattern as an event-by-event stream, and the stack's limit for these bytes.
    targets: tuple[Target, ...] = (
        Target(
            "front-end ceiling: braid / bare hypercorn-trio (one send per event), streaming req/s",
            round(r_event, 3),
            TARGET_RATIO,
            True,
            "",
            why_event,
        ),
        Target(
            "front-end ceiling: braid / bare hypercorn-trio (one send per response), streaming req/s",
            round(r_resp, 3),
            TARGET_RATIO,
            True,
            "",
            why,
        ),
    )
    why_like = (
        ""
        if r_like >= TARGET_RATIO
        else (f"braid {braid.rps:,.0f} req/s vs {per_event_fast.rps:,.0f} for the bare app on the same fast send")
    )
    targets += (
        Target(
            "front-end ceiling, like for like: braid / bare hypercorn-trio + the same fast send (one send per "
            "event), streaming req/s",
            round(r_like, 3),
            TARGET_RATIO,
            True,
            "",
            why_like,
        ),
    )
    headlines = (
        f"ceiling: braid {braid.rps:,.0f} req/s = {braid.rps * TOKENS:,.0f} events/s on 1 core; "
        f"{r_resp:.2f}x bare hypercorn-trio (1 send/response), {r_event:.2f}x (1 send/event), "
        f"{r_like:.2f}x the bare app on the same fast send, {r_fast:.2f}x FastAPI+uvicorn; "
        f"fast send: {braid.rps / stock.rps:.2f}x braid's stock-send rate",
    )
    return Section(
        "Front-end ceiling (1 core, scripted engine, zero token delay)", "\n".join(md), headlines, targets, ()
    )


def _profile_md(prof: Profile) -> list[str]:
    return [
        "",
        f"**Where braid's time goes** (py-spy {prof.seconds} s at 250 Hz, `--idle`, blocking mode so every "
        f"stack is whole; {prof.samples:,} samples of braid's server thread under the streaming load above, "
        "run with `bench.apps.braid_counting`, i.e. braid plus a counter on its ASGI sends). "
        "By phase (inclusive: the phase's frame is anywhere on the stack; indented rows are part of the row above):",
        "",
        table(
            ["phase", "% of samples"],
            [[label, f"{p:.1f}"] for label, p in prof.phases]
            + [["trio's run loop itself (`unrolled_run` self time)", f"{prof.scheduler_self:.1f}"]],
        ),
        "",
        "Self time, by the component of the innermost frame (C code such as msgspec or a socket syscall "
        "counts for its Python caller; stdlib and generated code such as contextlib or attrs `__init__` "
        "for the nearest caller that is not):",
        "",
        table(["where", "% of samples"], [[c, f"{p:.1f}"] for c, p in prof.by_category]),
        "",
        "Top frames by self time:",
        "",
        table(["frame", "% self"], [[f"`{f}`", f"{p:.1f}"] for f, p in prof.top_self[:12]]),
    ]


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    try:
        section = run(quick)
    except RuntimeError as err:
        if str(err) == WRK_INSTALL:
            print(err, file=sys.stderr)
            raise SystemExit(2) from None
        raise
    print(f"## {section.title}\n\n{section.markdown}\n")
    for t in section.targets:
        print(t.row())
    for h in section.headlines:
        print(h)


if __name__ == "__main__":
    main()
