"""Connection churn: many clients, a new connection per streaming request, half of them hanging up.

``python -m bench.load [--clients 300] [--seconds 20] [--hangup 0.5] [--server-arg=--backlog=100 ...]``
(or ``python -m bench.run --only load``, which runs the servers of :data:`CONFIGS`).

braid runs as ``braid serve --engine scripted --token-delay 0.001`` pinned to core 0 (or ``--url``
and ``--pid`` name a server already running); the load generator is one Trio process on core 1.
Each of ``clients`` tasks loops for ``seconds``: it opens a new TCP connection, POSTs one streaming
request (one prompt, ``max_tokens`` tokens, ``ignore_eos``) and then, by its role (fixed per client,
spread evenly):

* a **reader** (``1 - hangup`` of the clients) reads the whole response and checks it: status
  200, chunked framing that ends, SSE events that parse, exactly one ``data: [DONE]`` and it last,
  no error event, a choice that finished with ``length``;
* a **hang-up** client reads a random number of events (1 to half the stream) and goes away:
  half of them with a RST (``SO_LINGER`` 0, then close), half with a FIN (``shutdown(SHUT_WR)``,
  then read to the server's close: a plain close with unread data would be a RST too).

Counted per request: connects that failed or took longer than ``connect_timeout`` (the kernel
drops a SYN when the listen queue is full; the client retries it 1 s, 3 s, 7 s later), connects
slower than 0.5 s (a retried SYN), resets and early EOFs where the client expected data, responses
not complete within ``response_timeout``, 5xx and other non-200 statuses, malformed streams. Also
the kernel's own counters of the listen queue (``TcpExt: ListenOverflows, ListenDrops``, system
wide: nothing else should be connecting meanwhile).

Afterwards: braid's ``/metrics`` must show nothing in flight (``braid_engine_requests_in_flight``
0, waited for up to 10 s), and braid's RSS and open file descriptors after the load (and a
settling second) are compared with their values after the warm-up.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
import resource
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import attrs
import httpx
import trio

from bench.common import Section, percentile, rss_bytes, table

SERVER_CPU = 0
LOAD_CPU = 1
MiB = 1024 * 1024
_LINGER_RESET = struct.pack("ii", 1, 0)


@attrs.frozen
class LoadConfig:
    clients: int = 300
    seconds: float = 20.0
    hangup: float = 0.5
    """The fraction of clients that hang up mid-stream (half RST, half FIN)."""
    max_tokens: int = 64
    token_delay: float = 0.001
    connect_timeout: float = 10.0
    response_timeout: float = 30.0
    seed: int = 0


@attrs.define
class Tally:
    """What every request ended as, and the latencies of those that connected."""

    outcomes: Counter[str] = attrs.Factory(Counter)
    connect_s: list[float] = attrs.Factory(list)
    first_byte_s: list[float] = attrs.Factory(list)
    whole_s: list[float] = attrs.Factory(list)  # readers' complete responses
    examples: dict[str, str] = attrs.Factory(dict)  # the first detail seen per failure kind

    def fail(self, kind: str, detail: str = "") -> None:
        self.outcomes[kind] += 1
        self.examples.setdefault(kind, detail)

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def failures(self) -> int:
        return sum(n for k, n in self.outcomes.items() if not k.startswith("ok"))


# --- one request ------------------------------------------------------------------------------------


class Failed(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail


def _head(buf: bytes | bytearray) -> tuple[int, dict[str, str], int] | None:
    """(status, headers, body offset) once the response head is complete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, end + 4


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        eol = body.index(b"\r\n", at)
        size = int(body[at:eol].split(b";", 1)[0], 16)
        if size == 0:
            if body[eol + 2 :] != b"\r\n":
                raise ValueError("bytes after the last chunk")
            return bytes(out)
        out += body[eol + 2 : eol + 2 + size]
        if body[eol + 2 + size : eol + 4 + size] != b"\r\n":
            raise ValueError("a chunk without its CRLF")
        at = eol + 4 + size


def check_stream(raw: bytes) -> None:
    """Raise ``Failed("malformed" | "error_event", ...)`` unless ``raw`` (the SSE body) is one
    well-formed completion stream."""
    events: list[object] = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        if block.startswith(":"):
            continue  # a heartbeat comment
        if "\n" in block or not block.startswith("data: "):
            raise Failed("malformed", f"not an SSE data event: {block[:60]!r}")
        data = block[len("data: ") :]
        events.append("[DONE]" if data == "[DONE]" else json.loads(data))
    if events.count("[DONE]") != 1 or events[-1] != "[DONE]":
        raise Failed("malformed", f"{events.count('[DONE]')} [DONE], last event {str(events[-1:])[:60]}")
    if any(isinstance(e, dict) and "error" in e for e in events):
        raise Failed("error_event", str(next(e for e in events if isinstance(e, dict) and "error" in e))[:120])
    finishes = [c.get("finish_reason") for e in events if isinstance(e, dict) for c in e.get("choices", ())]
    if "length" not in finishes:
        raise Failed("malformed", "no choice finished with 'length'")


async def _connect(port: int, cfg: LoadConfig, tally: Tally) -> trio.SocketStream:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    start = trio.current_time()
    try:
        with trio.fail_after(cfg.connect_timeout):
            await sock.connect(("127.0.0.1", port))
    except trio.TooSlowError:
        sock.close()
        raise Failed("connect_timeout") from None
    except OSError as exc:
        sock.close()
        raise Failed("connect_error", errno.errorcode.get(exc.errno or 0, str(exc))) from None
    tally.connect_s.append(trio.current_time() - start)
    return trio.SocketStream(sock)


async def one_request(port: int, request: bytes, role: str, rng: random.Random, cfg: LoadConfig, tally: Tally) -> str:
    """One connection, one request; returns the outcome (``ok`` or ``ok_rst`` / ``ok_fin`` for a
    hang-up that went as planned), or raises :class:`Failed`."""
    stream = await _connect(port, cfg, tally)
    try:
        sent = trio.current_time()
        await stream.send_all(request)
        buf = bytearray()
        head = None
        stop_after = rng.randint(1, max(1, cfg.max_tokens // 2)) if role != "read" else None
        with trio.move_on_after(cfg.response_timeout) as timeout:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    raise Failed("eof_early", f"after {len(buf)} bytes")
                if not buf:
                    tally.first_byte_s.append(trio.current_time() - sent)
                buf += data
                if head is None:
                    head = _head(buf)
                    if head is None:
                        continue
                    status = head[0]
                    if status >= 500:
                        raise Failed("status_5xx", str(status))
                    if status != 200:
                        raise Failed(f"status_{status}", bytes(buf[head[2] :])[:120].decode(errors="replace"))
                if stop_after is not None:
                    if buf.count(b"\n\n", head[2]) >= stop_after:
                        return await _hang_up(stream, role)
                elif buf.endswith(b"\r\n0\r\n\r\n"):
                    break
        if timeout.cancelled_caught:
            raise Failed("response_timeout", f"{len(buf)} bytes in {cfg.response_timeout:g} s")
        assert head is not None
        try:
            body = _dechunk(bytes(buf[head[2] :]))
        except ValueError as exc:
            raise Failed("malformed", f"chunked framing: {exc}") from None
        check_stream(body)
        tally.whole_s.append(trio.current_time() - sent)
        return "ok"
    except (trio.BrokenResourceError, ConnectionResetError) as exc:
        raise Failed("reset", repr(exc.__cause__ or exc)[:80]) from None
    finally:
        if stream.socket.fileno() != -1:
            stream.socket.close()


async def _hang_up(stream: trio.SocketStream, role: str) -> str:
    if role == "rst":
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        stream.socket.close()
        return "ok_rst"
    stream.socket.shutdown(socket.SHUT_WR)  # the server sees the end of the request stream
    with trio.move_on_after(10):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass  # the server reset it: also gone
        return "ok_fin"
    raise Failed("fin_not_closed", "the server kept the connection 10 s after the client's FIN")


def roles(clients: int, hangup: float) -> list[str]:
    """Per client: ``read``, ``rst`` or ``fin``, hang-ups spread evenly and alternating."""
    out = []
    hung = 0.0
    for i in range(clients):
        due = (i + 1) * hangup
        if due - hung >= 1 - 1e-9:
            out.append("rst" if int(hung) % 2 == 0 else "fin")
            hung += 1
        else:
            out.append("read")
    return out


async def drive(port: int, cfg: LoadConfig) -> Tally:
    """Every client's loop, until ``cfg.seconds`` have passed (a request under way then finishes)."""
    tally = Tally()
    body = json.dumps({"prompt": "x", "stream": True, "max_tokens": cfg.max_tokens, "ignore_eos": True}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    end = trio.current_time() + cfg.seconds

    async def client(i: int, role: str) -> None:
        rng = random.Random(cfg.seed * 100_003 + i)
        await trio.sleep(rng.random() * 0.5)  # not all 300 SYNs in the same millisecond
        while trio.current_time() < end:
            try:
                tally.outcomes[await one_request(port, request, role, rng, cfg, tally)] += 1
            except Failed as failed:
                tally.fail(failed.kind, failed.detail)
                await trio.sleep(0.05)  # as a client library's retry would, not a busy loop

    async with trio.open_nursery() as nursery:
        for i, role in enumerate(roles(cfg.clients, cfg.hangup)):
            nursery.start_soon(client, i, role)
    return tally


# --- around it: the server, its metrics, the kernel's counters ----------------------------------------


def listen_counters() -> dict[str, int]:
    """The kernel's TcpExt ListenOverflows and ListenDrops (system wide)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table_ = dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=True))
            return {k: table_.get(k, 0) for k in ("ListenOverflows", "ListenDrops")}
    return {}


def metrics(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{", 1)[0]] = out.get(name.split("{", 1)[0], 0.0) + float(value)
    return out


LEFT_OVER = ("braid_engine_requests_in_flight", "braid_admission_queued_requests", "braid_admission_slots_in_use")
"""Gauges that must all read 0 once the load is over: engine requests, queued requests, granted slots."""


def wait_idle(base: str, within: float = 10.0) -> tuple[float, float]:
    """(seconds until braid had nothing in flight, nothing queued and no slot granted; the sum of
    those gauges then, 0 when idle)."""
    start = time.monotonic()
    while True:
        m = metrics(base)
        left = sum(m.get(name, 0.0) for name in LEFT_OVER) if LEFT_OVER[0] in m else -1.0
        if left == 0 or time.monotonic() - start > within:
            return time.monotonic() - start, left
        time.sleep(0.1)


def _fds(pid: int | None) -> int:
    return len(os.listdir(f"/proc/{pid}/fd")) if pid else 0


@contextmanager
def _pinned(cpu: int) -> Iterator[None]:
    if (os.cpu_count() or 1) <= cpu:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


@attrs.frozen
class Result:
    label: str
    cfg: LoadConfig
    tally: Tally
    listen: dict[str, int]  # the counters' increase during the load
    idle_after_s: float
    in_flight_after: float
    rss_before: int
    rss_after: int
    fds_before: int  # the server's open file descriptors (its sockets, mostly)
    fds_after: int
    load_cpu_s: float  # the load generator's own CPU time (is it the bottleneck?)
    wall_s: float


def measure(label: str, cfg: LoadConfig, base: str, pid: int | None) -> Result:
    """Warm up, then run the load against ``base`` and collect everything around it."""
    for _ in range(5):
        httpx.post(
            base + "/v1/completions", json={"prompt": "x", "max_tokens": 8, "stream": True}, timeout=10
        ).raise_for_status()
    time.sleep(0.5)
    rss_before = rss_bytes(pid) if pid else 0
    fds_before = _fds(pid)
    port = int(base.rsplit(":", 1)[1])
    listen_before = listen_counters()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    with _pinned(LOAD_CPU):
        tally = trio.run(drive, port, cfg)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    listen_after = listen_counters()
    idle_s, in_flight = wait_idle(base)
    time.sleep(1.0)
    return Result(
        label,
        cfg,
        tally,
        {k: listen_after[k] - listen_before.get(k, 0) for k in listen_after},
        idle_s,
        in_flight,
        rss_before,
        rss_bytes(pid) if pid else 0,
        fds_before,
        _fds(pid),
        (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime),
        wall,
    )


def run_server(label: str, cfg: LoadConfig, server_args: Sequence[str], rounds: int = 1) -> list[Result]:
    """Start ``braid serve`` and run the load ``rounds`` times against it (the RSS after each
    round shows whether memory stays flat once the first round has warmed it up)."""
    from bench.apps.proc import free_port, server

    port = free_port()
    argv = ["braid", "serve", "--engine", "scripted", "--token-delay", str(cfg.token_delay), "--port", str(port)]
    name = "braid-load-" + re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")
    with server(name, [*argv, *server_args], port, cpu=SERVER_CPU) as proc:
        return [
            measure(label if rounds == 1 else f"{label}, round {i + 1}", cfg, f"http://127.0.0.1:{port}", proc.pid)
            for i in range(rounds)
        ]


# --- report --------------------------------------------------------------------------------------------


FAILURE_COLUMNS = ("connect_timeout", "connect_error", "reset", "eof_early", "response_timeout", "status_5xx")


def report(results: Sequence[Result]) -> str:
    rows = []
    for r in results:
        t = r.tally
        o = t.outcomes
        slow = sum(1 for c in t.connect_s if c > 0.5)
        other = t.failures - sum(o[k] for k in FAILURE_COLUMNS)
        rows.append(
            [
                r.label,
                t.requests,
                f"{t.requests / r.wall_s:.0f}",
                o["ok"],
                f"{o['ok_rst']} / {o['ok_fin']}",
                *(o[k] for k in FAILURE_COLUMNS),
                other,
                slow,
                f"{percentile(t.connect_s, 99) * 1000:.0f}" if t.connect_s else "-",
                f"{max(t.connect_s, default=0):.2f}",
                f"{percentile(t.first_byte_s, 50) * 1000:.0f} / {percentile(t.first_byte_s, 99) * 1000:.0f}"
                if t.first_byte_s
                else "-",
                f"{r.listen.get('ListenOverflows', 0)} / {r.listen.get('ListenDrops', 0)}",
                f"{r.in_flight_after:.0f}",
                f"{r.rss_before / MiB:.1f} → {r.rss_after / MiB:.1f}",
                f"{r.fds_before} → {r.fds_after}",
                f"{r.load_cpu_s / r.wall_s:.0%}",
            ]
        )
    header = [
        "server",
        "requests",
        "req/s",
        "read whole, well-formed",
        "hung up RST / FIN",
        "connect timeouts",
        "connect errors",
        "resets",
        "early EOFs",
        "response timeouts",
        "5xx",
        "other failures",
        "connects > 0.5 s",
        "connect p99 (ms)",
        "connect max (s)",
        "first byte p50 / p99 (ms)",
        "listen overflows / drops",
        "in flight + queued + slots after",
        "RSS MiB before → after",
        "open fds before → after",
        "load generator CPU",
    ]
    lines = [table(header, rows), ""]
    for r in results:
        odd = {k: v for k, v in r.tally.examples.items() if v}
        if odd:
            lines.append(f"- {r.label}: " + "; ".join(f"{k}: {v}" for k, v in sorted(odd.items())))
    return "\n".join(lines)


def _describe(cfg: LoadConfig) -> str:
    return (
        f"{cfg.clients} clients for {cfg.seconds:g} s, a new connection per request, "
        f"{cfg.hangup:.0%} of them hanging up mid-stream (half RST, half FIN); streams of "
        f"{cfg.max_tokens} tokens from `--engine scripted --token-delay {cfg.token_delay:g}`"
    )


CONFIGS: tuple[tuple[str, list[str]], ...] = (
    ("hypercorn's accept (backlog 100, one per round)", ["--backlog", "100", "--accept-batch", "1"]),
    ("backlog 2048, one per round", ["--accept-batch", "1"]),
    ("braid (backlog 2048, batched accept)", []),
    ("braid, admission on (64 slots, 256 queued)", ["--max-in-flight-requests", "64"]),
)
"""bench.run's servers: hypercorn's and trio's accept as they come, then braid's two fixes."""


def run(quick: bool) -> Section:
    cfg = LoadConfig(clients=100 if quick else 300, seconds=5 if quick else 20)
    results = [r for label, argv in CONFIGS for r in run_server(label, cfg, argv, rounds=2 if not argv else 1)]
    md = f"{_describe(cfg)}. Server on core {SERVER_CPU}, load generator on core {LOAD_CPU}.\n\n" + report(results)
    headline = "; ".join(
        f"{r.label}: {r.tally.requests} requests, {r.tally.failures} failed, in flight after {r.in_flight_after:.0f}"
        for r in results
    )
    return Section(f"Connection churn ({cfg.clients} clients)", md, (f"connection churn: {headline}",))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = LoadConfig()
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--seconds", type=float, default=d.seconds)
    p.add_argument("--hangup", type=float, default=d.hangup, help="fraction of clients that hang up mid-stream")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--token-delay", type=float, default=d.token_delay)
    p.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    p.add_argument("--response-timeout", type=float, default=d.response_timeout)
    p.add_argument("--label", default="braid")
    p.add_argument("--rounds", type=int, default=1, help="runs of the load against one server")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="an extra `braid serve` argument (repeatable; use --server-arg=--x)",
    )
    p.add_argument("--url", default=None, help="load a server already running here instead of starting one")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, for its RSS")
    args = p.parse_args(argv)
    cfg = LoadConfig(
        clients=args.clients,
        seconds=args.seconds,
        hangup=args.hangup,
        max_tokens=args.max_tokens,
        token_delay=args.token_delay,
        connect_timeout=args.connect_timeout,
        response_timeout=args.response_timeout,
    )
    if args.url:
        results = [measure(args.label, cfg, args.url.rstrip("/"), args.pid) for _ in range(args.rounds)]
    else:
        results = run_server(args.label, cfg, args.server_arg, args.rounds)
    print(f"{_describe(cfg)}\n\n{report(results)}")
    return 1 if any(r.tally.failures or r.in_flight_after for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
