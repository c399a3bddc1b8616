"""Memory under slow readers: braid's RSS while 100 clients read their long streams slowly.

braid runs as ``braid serve --engine scripted --token-delay 0.035`` (29 tokens/s per stream, about
7 KB/s of SSE at one event per token) pinned to core 0. ``CLIENTS`` raw-socket clients, each with ``SO_RCVBUF`` set to
4 KiB before it connects (so its kernel receive buffer cannot soak up the stream), each POST one
long stream and then read ``CHUNK`` bytes once a second: slower than braid produces, for
longer than the window (the engine generates for 5 s more than it lasts). braid must hold back (bounded channel, one body chunk in flight) instead of buffering;
its RSS (VmRSS of the server process) is sampled after every round of reads.

braid's ``--stall-timeout`` (30 s by default) aborts a stream when braid cannot hand an output to
the stream's writer for that long, i.e. when its client stops reading. These readers read every
second, so none may be cut: each stream must end with
``data: [DONE]``, with no error event, once the clients drain it at full speed after the
measurement. A control client that reads nothing at all shows that the timeout does fire (its
engine request is aborted, seen in braid's ``braid_engine_aborts`` metric).
"""

from __future__ import annotations

import json
import math
import select
import socket
import threading
import time

import attrs
import httpx

from bench.apps.proc import free_port, server
from bench.common import PLOTS, Section, rss_bytes, section_main, table

CLIENTS = 100
CHUNK = 3072  # bytes read per client per second (less than the 8 KiB receive buffer holds)
RCVBUF = 4096  # the kernel doubles it: 8 KiB per client socket
TOKEN_DELAY = 0.035
SERVER_CPU = 0
PLOT = PLOTS / "slow_readers_rss.png"
MiB = 1024 * 1024


@attrs.define
class Reader:
    """One client: counts what it has received; ``tail`` keeps the end of the last read, so markers
    split across two reads are still found."""

    sock: socket.socket
    received: int = 0
    reads: int = 0  # rounds in which this reader got data
    status: bytes = b""
    done: bool = False  # saw data: [DONE] and the chunked terminator
    error: bool = False  # saw an error event
    closed: bool = False  # the server closed the connection
    tail: bytes = b""

    def feed(self, data: bytes) -> None:
        if not data:
            self.closed = True
            return
        if not self.status:
            self.status = (self.tail + data).split(b"\r\n", 1)[0]
        window = self.tail + data
        self.error = self.error or b'data: {"error"' in window
        self.received += len(data)
        self.tail = window[-32:]
        if b"data: [DONE]" in window and self.tail.endswith(b"\r\n0\r\n\r\n"):
            self.done = True

    def read_once(self, size: int) -> None:
        """Take up to ``size`` bytes of what the socket holds now, without waiting for more."""
        got = 0
        rounds = self.reads
        while got < size and not (self.done or self.closed):
            try:
                data = self.sock.recv(size - got, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                self.closed = True
                return
            self.feed(data)
            got += len(data)
            self.reads = rounds + 1


def _open(port: int, body: bytes) -> Reader:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # before connect: sets the window
    s.connect(("127.0.0.1", port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return Reader(s)


def _metrics(client: httpx.Client) -> dict[str, float]:
    """braid's Prometheus samples, summed over labels (counters carry prometheus' ``_total``)."""
    out: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{", 1)[0]] = out.get(name.split("{", 1)[0], 0.0) + float(value)
    return out


class _MetricsPoller(threading.Thread):
    """Polls braid's /metrics about once a second in the background, so that a slow answer from the
    busy server never delays the readers' rounds; ``latest`` is the last answer."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.latest: dict[str, float] = {}
        self._base = base
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self._base, timeout=10) as client:
            while not self._stop_event.is_set():
                try:
                    self.latest = _metrics(client)
                except httpx.HTTPError:
                    pass
                self._stop_event.wait(1.0)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


@attrs.frozen
class Sample:
    t: float
    rss: int
    in_flight: float  # engine requests braid is driving
    received: int  # bytes received by the slow readers so far, all clients
    open_streams: int  # slow readers that have received their 200 response head
    aborts: float  # braid_engine_aborts_total so far, all causes (the control client should be the only one)


def _drain(readers: list[Reader], deadline: float) -> None:
    """Read every stream to its end at full speed (until ``deadline``)."""
    while time.monotonic() < deadline:
        live = [r for r in readers if not (r.done or r.closed)]
        if not live:
            return
        ready, _, _ = select.select([r.sock for r in live], [], [], 0.5)
        by_sock = {r.sock: r for r in live}
        for s in ready:
            by_sock[s].read_once(65536)


def run(quick: bool) -> Section:
    duration = 15 if quick else 60
    stall = 12.0 if quick else 30.0  # quick mode's window is shorter than the default 30 s
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [
        "braid",
        "serve",
        "--engine",
        "scripted",
        "--token-delay",
        str(TOKEN_DELAY),
        "--port",
        str(port),
        "--stall-timeout",
        str(stall),
    ]
    with server("braid-slow-readers", argv, port, cpu=SERVER_CPU) as proc:
        warm = httpx.post(
            base + "/v1/completions",
            json={"prompt": "x", "max_tokens": 8, "stream": True, "ignore_eos": True},
            timeout=10,
        )
        warm.raise_for_status()
        tokens = [e for e in warm.content.split(b"\n\n") if e and e != b"data: [DONE]"]
        event_bytes = sum(len(e) + 2 for e in tokens) / len(tokens)
        # Generated for longer than the window, so no stream ends in it. (Sizing by bytes, one
        # event per token, no longer holds: while a reader lags, its deltas merge into fewer,
        # larger events, in vLLM's output collector and in the scripted engine alike.)
        max_tokens = min(2000, math.ceil((duration + 5) / TOKEN_DELAY))
        assert event_bytes / TOKEN_DELAY > 2 * CHUNK, "braid must produce faster than the readers read"
        body = json.dumps({"prompt": "x", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}).encode()
        time.sleep(0.5)
        rss_idle = rss_bytes(proc.pid)
        readers = [_open(port, body) for _ in range(CLIENTS)]
        control = _open(port, body)  # reads nothing, ever
        samples: list[Sample] = []
        poller = _MetricsPoller(base)
        poller.start()
        time.sleep(0.5)
        start = time.monotonic()
        round_start = start
        while True:
            for r in readers:
                r.read_once(CHUNK)
            m = poller.latest
            now = time.monotonic() - start
            samples.append(
                Sample(
                    now,
                    rss_bytes(proc.pid),
                    m.get("braid_engine_requests_in_flight", 0.0),
                    sum(r.received for r in readers),
                    sum(1 for r in readers if r.status.startswith(b"HTTP/1.1 200")),
                    m.get("braid_engine_aborts_total", 0.0),
                )
            )
            if now >= duration:
                break
            # one read per client per round, rounds at least 1 s apart
            round_start = max(round_start + 1.0, time.monotonic())
            time.sleep(max(0.0, round_start - time.monotonic()))
        connected = sum(1 for r in readers if r.status.startswith(b"HTTP/1.1 200"))
        during = {
            "done": sum(r.done for r in readers),
            "error": sum(r.error for r in readers),
            "closed": sum(r.closed for r in readers),
        }
        per_client = [r.received for r in readers]
        reads = [r.reads for r in readers]
        _drain(readers, time.monotonic() + (20 if quick else 25))
        poller.stop()
        with httpx.Client(base_url=base, timeout=10) as client:
            m_end = _metrics(client)
        rss_end = rss_bytes(proc.pid)
        for r in [*readers, control]:
            r.sock.close()
    return _section(
        quick,
        duration,
        stall,
        max_tokens,
        event_bytes,
        rss_idle,
        rss_end,
        samples,
        readers,
        connected,
        during,
        per_client,
        reads,
        m_end,
    )


def _plot(samples: list[Sample], rss_idle: int, stall: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    t = [s.t for s in samples]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, height_ratios=[2, 1])
    ax.plot(t, [s.rss / MiB for s in samples], marker=".", label="braid server RSS")
    ax.axhline(rss_idle / MiB, color="grey", linestyle="--", label="idle, before the clients")
    opened = [s.t for s in samples if s.open_streams == CLIENTS]
    if opened:
        ax.axvline(opened[0], color="tab:orange", linestyle=":", label="all slow streams open")
    aborted = [s.t for s in samples if s.aborts >= 1]
    if aborted:
        ax.axvline(aborted[0], color="tab:red", linestyle=":", label="control client aborted (stall timeout)")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.set_title(f"braid RSS, {CLIENTS} clients reading {CHUNK / 1024:g} KiB/s each (stall timeout {stall:g} s)")
    ax2.plot(t, [s.received / MiB for s in samples], color="tab:green", label="MiB received by all slow readers")
    ax2.set_ylabel("MiB received")
    ax2.set_xlabel("seconds since the requests were sent")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=100)
    plt.close(fig)


def _section(
    quick: bool,
    duration: int,
    stall: float,
    max_tokens: int,
    event_bytes: float,
    rss_idle: int,
    rss_end: int,
    samples: list[Sample],
    readers: list[Reader],
    connected: int,
    during: dict[str, int],
    per_client: list[int],
    reads: list[int],
    m_end: dict[str, float],
) -> Section:
    _plot(samples, rss_idle, stall)
    opened = [s for s in samples if s.open_streams == CLIENTS and s.in_flight >= CLIENTS]
    first = opened[0] if opened else samples[0]
    last = samples[-1]
    peak = max(s.rss for s in samples)
    late = next(s for s in samples if s.t >= duration * 2 / 3)  # is the RSS flat by then?
    growth = last.rss - first.rss
    completed = sum(1 for r in readers if r.done and not r.error)
    cut = sum(1 for r in readers if r.error or (r.closed and not r.done))
    unfinished = len(readers) - completed - cut
    aborts = m_end.get("braid_engine_aborts_total", 0.0)
    step = 1 if quick else 5
    # the first few rounds always, then every ``step``-th sample and the last one
    rows = [
        [
            f"{s.t:.1f}",
            f"{s.rss / MiB:.1f}",
            f"{(s.rss - first.rss) / MiB:+.2f}",
            s.open_streams,
            f"{s.in_flight:.0f}",
            f"{s.aborts:.0f}",
            f"{s.received / CLIENTS / 1024:.0f}",
        ]
        for i, s in enumerate(samples)
        if i < 3 or i % step == 0 or i == len(samples) - 1
    ]
    mean_kib = sum(per_client) / len(per_client) / 1024
    stream_kib = max_tokens * event_bytes / 1024
    md = [
        f"braid (`--engine scripted --token-delay {TOKEN_DELAY:g}`, `--stall-timeout {stall:g}`, core {SERVER_CPU}) serves "
        f"{CLIENTS} streams of {max_tokens} tokens (~{stream_kib:.0f} KiB of SSE each). Each client socket has "
        f"`SO_RCVBUF` = {RCVBUF} B (set before connect) and reads {CHUNK} B once a second, while braid "
        f"could send ~{1 / TOKEN_DELAY * event_bytes / 1024:.0f} KiB/s per stream ({event_bytes:.0f} B per event). One more *control* client reads nothing. "
        f"RSS is VmRSS of the server process after each round of reads, for {duration} s"
        + (
            f" (quick mode: the stall timeout is lowered to {stall:g} s so that the window exceeds it)."
            if quick
            else "."
        ),
        "",
        table(
            ["", "value"],
            [
                [
                    "streams open (200 received)",
                    f"{connected} / {CLIENTS}, all from t = {first.t:.1f} s"
                    if opened
                    else f"{connected} / {CLIENTS} (never all at once: growth is from t = 0)",
                ],
                ["RSS idle (before the clients)", f"{rss_idle / MiB:.1f} MiB"],
                [f"RSS at the first sample with all streams open (t = {first.t:.1f} s)", f"{first.rss / MiB:.1f} MiB"],
                ["RSS at the last sample", f"{last.rss / MiB:.1f} MiB"],
                [
                    "growth, first → last sample",
                    f"{growth / MiB:+.2f} MiB ({growth / CLIENTS / 1024:+.1f} KiB per client)",
                ],
                [
                    f"growth over the last third, t = {late.t:.0f} s → {last.t:.0f} s",
                    f"{(last.rss - late.rss) / MiB:+.2f} MiB",
                ],
                ["peak RSS during the window", f"{peak / MiB:.1f} MiB"],
                ["RSS after the drain", f"{rss_end / MiB:.1f} MiB"],
                [
                    "streams that ended during the window (done / error / closed)",
                    f"{during['done']} / {during['error']} / {during['closed']}",
                ],
                [
                    "received per slow reader in the window (mean)",
                    f"{mean_kib:.0f} KiB in {sum(reads) / len(reads):.0f} rounds",
                ],
                ["streams completed (`[DONE]`, no error) after the drain", f"{completed} / {CLIENTS}"],
                ["streams cut (error event or closed early)", f"{cut}"],
                ["streams not finished by the drain deadline", f"{unfinished}"],
                ["braid_engine_aborts at the end (the control client is expected to count 1)", f"{aborts:.0f}"],
            ],
        ),
        "",
        f"Samples (every {step} s; all of them in `{PLOT.relative_to(PLOT.parents[2])}`):",
        "",
        table(
            [
                "t (s)",
                "RSS (MiB)",
                "Δ vs first (MiB)",
                "streams open",
                "engine requests in flight",
                "engine aborts",
                "KiB received per reader",
            ],
            rows,
        ),
        "",
        "Notes: RSS does not count the kernel's socket buffers (each reader's 8 KiB receive buffer and braid's "
        "send buffer hold part of every stream outside the process). braid's own backlog per stream is bounded: "
        "its channel (64 engine outputs) plus the one coalesced body chunk (up to 64 events, ~16 KiB) hypercorn "
        "is writing, and h11's chunk-framed copy of it. The RSS rises while those backlogs fill up to that bound "
        "(≈ 55 KiB per stream, under 1 KiB per buffered event), then stays flat; when it rises depends on how soon "
        "the server's core gets ahead of the readers (later on a busy machine). "
        f"The control client's engine request counts in 'engine requests in flight' until the stall timeout "
        f"({stall:g} s) aborts it (the 'engine aborts' column).",
        "",
        "What the stall timeout measures: a driver waits for room in the channel while the consumer writes its "
        "previous chunk (up to 64 events, ~16 KiB), and that write finishes only as the client frees its window. "
        f"So a reader taking {CHUNK} B/s makes braid wait up to ~{64 * event_bytes / CHUNK:.0f} s per chunk; a reader "
        f"slower than ~{64 * event_bytes / stall:.0f} B/s would be cut although it reads every second.",
    ]
    headline = (
        f"slow readers: {CLIENTS} clients at {CHUNK / 1024:g} KiB/s, braid RSS {first.rss / MiB:.1f} → "
        f"{last.rss / MiB:.1f} MiB over {duration} s ({growth / MiB:+.2f} MiB); {completed}/{CLIENTS} streams completed, "
        f"{cut} cut"
    )
    return Section(f"Memory under slow readers ({CLIENTS} clients)", "\n".join(md), (headline,), (), (PLOT,))


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
