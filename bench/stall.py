"""Front-end stall: how long a running stream goes without an event while a large batch is tokenized.

Not one of issue 6's five sections: it measures what a batch front end must not do, block every
other client while it prepares one client's big request. Both servers tokenize text prompts in
their front-end process; this shows whether that stops the other streams.

A trial, per server:

* One streaming request (a short text prompt, greedy, ``max_tokens`` 900, ``ignore_eos``) is read
  over a raw socket; the time of every ``recv`` that brings data is recorded.
* Once it has sent 40 events, a second client posts one request of 1024 text prompts (random
  words, ~600 characters each, new each trial, the same for both servers) whose *last* prompt is
  longer than the context. Both servers tokenize every prompt and then refuse the request with a
  400, so the engine does no work for the batch: any gap in the stream is the front end's.
* A second kind of trial sends a batch the servers accept: 1024 prompts of 32 random token ids
  (no tokenizing), ``max_tokens`` 1. The engine's prefill of the batch then slows the stream
  for both servers alike; what differs is the front end's work per prompt (vLLM's input
  processing, the add, the output processing of 1024 requests finishing in one step).
* Reported: the stream's longest gap between two ``recv``s while the batch request is open, its
  longest gap in the BASELINE_S before it (the baseline), and the batch's response time.

The stream is as long as the tiny model's context allows (900 tokens, about 1.1 s alone on this
machine), so the baseline is short and a trial fails only if the stream ended before the batch
was answered (it then did not cover the batch).
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import Section, section_main, table
from bench.vllm_tools import random_token_prompts, start_pair

BATCH = 1024
PROMPT_CHARS = 600
STREAM_EVENTS_BEFORE = 40
BASELINE_S = 0.3
WORDS = (
    "the",
    "model",
    "token",
    "stream",
    "batch",
    "server",
    "def",
    "return",
    "import",
    "class",
    "value",
    "naïve",
    "café",
    "東京",
    "x1",
    "(y)",
    "{z}",
    "0x2f",
    "self.",
    "élan",
)


def batch_prompts(seed: int) -> list[str]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(BATCH - 1):
        words: list[str] = []
        size = 0
        while size < PROMPT_CHARS:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        prompts.append(" ".join(words))
    prompts.append("overflow " * 1500)  # > 1024 tokens: refused once every prompt is tokenized
    return prompts


class Stream(threading.Thread):
    """A long stream read on its own thread; ``times`` holds the time of every recv with data."""

    def __init__(self, server: Any) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.times: list[float] = []
        self.events = 0
        self.stop = threading.Event()
        self.ended_at: float | None = None  # when the stream's [DONE] (or its end) came
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            body = json.dumps(
                {
                    "model": self.server.model,
                    "prompt": "def main():\n",
                    "max_tokens": 900,
                    "ignore_eos": True,
                    "temperature": 0,
                    "stream": True,
                }
            ).encode()
            host, port = self.server.url.removeprefix("http://").split(":")
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(head + body)
                sock.settimeout(30)
                while not self.stop.is_set():
                    data = sock.recv(1 << 16)
                    if not data:
                        self.ended_at = time.perf_counter()
                        raise RuntimeError(f"{self.server.kind}: the connection closed before [DONE]")
                    self.times.append(time.perf_counter())
                    self.events += data.count(b"data: ")
                    if b"[DONE]" in data:
                        self.ended_at = self.times[-1]
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by the trial
            if not self.stop.is_set():
                self.error = exc


def _max_gap(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start]
    after = [t for t in times if t > end]
    marks = before[-1:] + inside + after[:1]
    return max((b - a for a, b in zip(marks, marks[1:], strict=False)), default=end - start)


def trial(server: Any, prompts: list[Any], client: httpx.Client, expect: int = 400) -> dict[str, float]:
    stream = Stream(server)
    stream.start()
    deadline = time.monotonic() + 30
    while stream.events < STREAM_EVENTS_BEFORE:
        if stream.error or time.monotonic() > deadline:
            raise RuntimeError(f"{server.kind}: the stream did not start: {stream.error}")
        time.sleep(0.005)
    time.sleep(BASELINE_S)
    t0 = time.perf_counter()
    r = client.post(server.url + "/v1/completions", json={"model": server.model, "prompt": prompts, "max_tokens": 1})
    t1 = time.perf_counter()
    time.sleep(0.3)
    stream.stop.set()
    if r.status_code != expect:
        raise RuntimeError(f"{server.kind}: the batch answered {r.status_code}, not {expect}: {r.text[:300]}")
    if stream.error:
        raise RuntimeError(f"{server.kind}: the stream failed: {stream.error}")
    if stream.ended_at is not None and stream.ended_at < t1:
        raise RuntimeError(f"{server.kind}: the stream ended before the batch was answered: it did not cover it")
    stream.join(5)
    server.wait_idle(within=30)  # the stream's engine request is aborted when its socket closes
    return {
        "gap_ms": _max_gap(stream.times, t0, t1) * 1000,
        "baseline_ms": _max_gap(stream.times, t0 - BASELINE_S, t0) * 1000,
        "batch_ms": (t1 - t0) * 1000,
    }


KINDS = (("refused", 400), ("accepted", 200))


def _prompts(kind: str, seed: int) -> list[Any]:
    return batch_prompts(seed) if kind == "refused" else random_token_prompts(BATCH, 32, 2048, seed=seed)


def run(quick: bool) -> Section:
    started = time.monotonic()
    trials = 3 if quick else 6
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with start_pair("stall") as (braid, vllm), httpx.Client(timeout=120) as client:
        servers = {"braid": braid, "vllm": vllm}
        for kind, expect in KINDS:
            for s in servers.values():
                trial(s, _prompts(kind, 999), client, expect)  # warm-up, not recorded
            for i in range(trials):
                prompts = _prompts(kind, 2000 + i)
                for name in ("braid", "vllm") if i % 2 == 0 else ("vllm", "braid"):
                    results.setdefault((kind, name), []).append(trial(servers[name], prompts, client, expect))
    load = os.getloadavg()[0]
    rows = []
    for kind, _ in KINDS:
        for name, label in (("braid", "braid"), ("vllm", "vLLM server")):
            rs = results[(kind, name)]
            med = {k: statistics.median(r[k] for r in rs) for k in ("gap_ms", "baseline_ms", "batch_ms")}
            rows.append(
                [
                    kind,
                    label,
                    len(rs),
                    f"{med['baseline_ms']:.0f}",
                    f"{med['gap_ms']:.0f}",
                    f"{max(r['gap_ms'] for r in rs):.0f}",
                    f"{med['batch_ms']:.0f}",
                ]
            )

    def gap(kind: str, name: str) -> float:
        return statistics.median(r["gap_ms"] for r in results[(kind, name)])

    md = [
        f"Mode: {'quick' if quick else 'full'}. A greedy stream runs while another client posts one batch of {BATCH} "
        f"prompts. *refused*: text prompts of ~{PROMPT_CHARS} characters whose last prompt is longer than the "
        "context: both servers tokenize every prompt, then answer 400, so the engine does no work for it and the "
        "gap is the front end's alone. *accepted*: 32 random token ids per prompt, `max_tokens` 1: the engine's "
        "prefill of the batch slows the stream for both servers alike. Longest gap between the stream's `recv`s, "
        f"ms, medians over {trials} trials per server (alternating):",
        "",
        table(
            [
                "batch",
                "server",
                "trials",
                f"longest gap, {BASELINE_S:g} s before (baseline)",
                "longest gap while the batch is open",
                "worst trial",
                "batch response (ms)",
            ],
            rows,
        ),
        "",
        f"Load average {load:.1f} at the end; section {time.monotonic() - started:.0f} s.",
    ]
    headlines = (
        f"stall (a stream's longest gap while a {BATCH}-prompt batch arrives): refused text batch braid "
        f"{gap('refused', 'braid'):.0f} ms vs vLLM server {gap('refused', 'vllm'):.0f} ms; accepted "
        f"token batch braid {gap('accepted', 'braid'):.0f} ms vs {gap('accepted', 'vllm'):.0f} ms",
    )
    return Section("Front-end stall while a large batch arrives", "\n".join(md), headlines, (), ())


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
