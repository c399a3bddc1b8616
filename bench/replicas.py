"""Replicas behind vLLM's router against one replica: throughput, TTFT and prefix-cache hit rate by
routing policy, on a multi-turn chat workload (each conversation its own long system prompt, its
turns one after another, the conversations at once).

Two braid replicas on the real engine (tiny model), each publishing its KV-cache events; the
workload runs once against replica 0 alone, then through ``vllm-router`` (tools/router.py's pinned
release) with ``round_robin``, ``cache_aware`` and ``kv_aware`` in front of both. Each run has
texts of its own, so none finds another's blocks in the prefix caches. The hit rate is per token,
from the replicas' ``vllm:prefix_cache_*`` counters; TTFT is the client's (a streamed request's
first content chunk). Budget: under 3 minutes (22 s on an idle 2-core machine: the replicas'
start, then four runs of a few seconds).

On a 2-core machine the two replicas share the cores that one replica has alone, so the
throughput column shows the routing's cost, not the gain of a second engine: on a real
deployment each replica has its own device.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import httpx

from bench.common import Section, percentile, table
from tools.router import VERSION, Replicas, run_replicas, run_router
from tools.servers import ServerProcess

LOGS = Path("/tmp/braid-bench-replicas")


@attrs.frozen
class Run:
    """One setup's results."""

    requests_per_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    hit_rate: float
    """Prefix-cache hits over queries, in tokens, over the replicas the run used."""

    def cells(self) -> list[object]:
        return [self.requests_per_s, self.tokens_per_s, self.ttft_p50_ms, self.ttft_p95_ms, self.hit_rate]


def _chat(url: str, salt: str, c: int, turns: int, ttfts: list[float], tokens: list[int]) -> None:
    """One conversation, turn by turn, streamed."""
    messages = [
        {"role": "system", "content": f"{salt} chat {c}. " + " ".join(f"rule {i}: be brief." for i in range(60))}
    ]
    with httpx.Client(timeout=120) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"question {turn}: what is {turn} + {c}?"})
            body = {"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True}
            body["stream_options"] = {"include_usage": True}
            start, first, text, used = time.perf_counter(), None, [], 0
            with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        used = event["usage"]["completion_tokens"]
                    for ch in event["choices"]:
                        piece = ch["delta"].get("content")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
            ttfts.append((first or time.perf_counter()) - start)
            tokens.append(used)
            messages.append({"role": "assistant", "content": "".join(text)})


def _hits(replicas: tuple[ServerProcess, ...]) -> tuple[float, float]:
    ms = [r.metrics() for r in replicas]
    return sum(m["vllm:prefix_cache_hits_total"] for m in ms), sum(m["vllm:prefix_cache_queries_total"] for m in ms)


def workload(url: str, replicas: tuple[ServerProcess, ...], salt: str, chats: int, turns: int) -> Run:
    """``chats`` conversations at once against ``url``; the hit rate from ``replicas``' counters."""
    ttfts: list[float] = []
    tokens: list[int] = []
    hits, queries = _hits(replicas)
    start = time.perf_counter()
    with ThreadPoolExecutor(chats) as pool:
        for f in [pool.submit(_chat, url, salt, c, turns, ttfts, tokens) for c in range(chats)]:
            f.result()
    took = time.perf_counter() - start
    new_hits, new_queries = _hits(replicas)
    rate = (new_hits - hits) / max(new_queries - queries, 1.0)
    return Run(len(ttfts) / took, sum(tokens) / took, percentile(ttfts, 50) * 1e3, percentile(ttfts, 95) * 1e3, rate)


def measure(chats: int, turns: int, logs: Path = LOGS, pair: Replicas | None = None) -> dict[str, Run]:
    """Each setup's run (:func:`workload`), by the setup's name, on ``pair`` (two replicas that
    publish their KV-cache events), or on two started for it."""
    if pair is None:
        with run_replicas(2, logs, "--enable-server-load-tracking") as started:
            return measure(chats, turns, logs, started)
    replicas = pair.servers[:2]
    rows: dict[str, Run] = {}
    salt = str(time.monotonic_ns())
    rows["1 replica"] = workload(replicas[0].url, replicas[:1], f"one {salt}", chats, turns)
    for policy in ("round_robin", "cache_aware", "kv_aware"):
        extra = pair.kv_aware_args() if policy == "kv_aware" else []
        with run_router([r.url for r in replicas], policy, logs / f"{policy}.log", *extra) as router:
            rows[f"2 replicas, {policy}"] = workload(router.url, replicas, f"{policy} {salt}", chats, turns)
    return rows


def run(quick: bool) -> Section:
    chats, turns = (4, 3) if quick else (8, 4)
    rows = measure(chats, turns)
    header = ["setup", "requests/s", "output tok/s", "TTFT p50 ms", "TTFT p95 ms", "prefix-cache hit rate"]
    md = "\n".join(
        [
            f"{chats} conversations at once, {turns} turns each (a system prompt of about 3 engine blocks, "
            f"16 output tokens a turn, streamed); vllm-router {VERSION}; two braid replicas on one 2-core "
            "machine, so they share the cores one replica has alone: the throughput shows what routing "
            "costs here, not what a second device gains.",
            "",
            table(header, [[name, *run.cells()] for name, run in rows.items()]),
        ]
    )
    best = {name: run.hit_rate for name, run in rows.items()}
    headline = ", ".join(f"{k.removeprefix('2 replicas, ')} {v:.2f}" for k, v in best.items() if k != "1 replica")
    return Section("Replicas behind vLLM's router", md, (f"replicas: prefix-cache hit rate {headline}",))


__all__ = ["Run", "measure", "run", "workload"]
