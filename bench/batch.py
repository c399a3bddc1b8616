"""The batch path: one request carrying many prompts.

What is measured and how:

* One ``/v1/completions`` request with 1, 8, 64, 256 or 1024 prompts (each 32 random token ids,
  given as token-id lists, the same lists for every system), ``max_tokens`` 16, ``ignore_eos``,
  temperature 1.0, non-streaming and streaming, to braid and to vLLM's own server (both up at
  once, same engine settings), against the engine alone: ``LLM.generate`` of the same token ids
  in a worker process (``bench.vllm_tools.Worker("offline")``).
* Wall time: from sending the request to the last byte of the response (streaming: to the end
  of the stream, ``[DONE]`` included), median over a few repetitions; the order of the five
  systems rotates between repetitions.
* Memory: the front-end process's peak RSS growth during the request: its VmRSS just before,
  then VmHWM reset (``echo 5 > /proc/PID/clear_refs``) and read after the response; the largest
  growth over the repetitions is reported (Python keeps freed memory, so the first one is
  usually the largest). The engine runs in a separate ``VLLM::EngineCore`` child process for
  both servers (vLLM's AsyncLLM and braid's engine-core client both start one;
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` only keeps the
  model runner inside that process instead of a third one), so the front-end figure holds no
  model or KV-cache memory; the EngineCore's growth is shown alongside.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import ExitStack
from typing import Any

import httpx

from bench.common import PLOTS, Section, Target, hwm_bytes, reset_hwm, rss_bytes, section_main, table
from bench.vllm_tools import WORK, Worker, engine_core_pid, random_token_prompts, start_pair

PROMPT_LEN = 32
MAX_TOKENS = 16  # 1024 prompts x 64 tokens x 5 systems x repetitions does not fit the section's budget
VOCAB = 2048
SEED = 6
SYSTEMS = ("braid", "vllm", "braid-stream", "vllm-stream", "offline")
LABELS = {
    "braid": "braid",
    "vllm": "vLLM server",
    "braid-stream": "braid (stream)",
    "vllm-stream": "vLLM server (stream)",
    "offline": "offline LLM.generate",
}


def _config(quick: bool) -> dict[int, int]:
    """Repetitions per batch size."""
    if quick:
        return {1: 1, 8: 1, 64: 2, 256: 1}
    return {1: 3, 8: 3, 64: 5, 256: 2, 1024: 1}


def post_batch(client: httpx.Client, server: Any, prompts: list[list[int]], max_tokens: int, stream: bool) -> None:
    """One ``/v1/completions`` request of these prompts (``ignore_eos``, temperature 1), read to
    its last byte; RuntimeError unless it is a 200 with every choice (a stream: ending in [DONE])."""
    body = {
        "model": server.model,
        "prompt": prompts,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "stream": stream,
    }
    if stream:
        tail = b""
        with client.stream("POST", server.url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{server.kind}: {r.status_code} {r.read()[:300]!r}")
            for chunk in r.iter_raw():
                tail = (tail + chunk)[-64:]
        if b"data: [DONE]" not in tail:
            raise RuntimeError(f"{server.kind}: stream did not end with [DONE]: {tail!r}")
    else:
        r = client.post(server.url + "/v1/completions", json=body)
        if r.status_code != 200 or len(r.json()["choices"]) != len(prompts):
            raise RuntimeError(f"{server.kind}: {r.status_code} {r.text[:300]}")


def _request(client: httpx.Client, server: Any, prompts: list[list[int]], stream: bool) -> tuple[float, int, int]:
    """(wall seconds, front-end peak growth bytes, engine-core peak growth bytes) of one request."""
    pids = [server.pid, engine_core_pid(server)]
    before = [rss_bytes(p) for p in pids]
    for p in pids:
        reset_hwm(p)
    start = time.perf_counter()
    post_batch(client, server, prompts, MAX_TOKENS, stream)
    took = time.perf_counter() - start
    growth = [hwm_bytes(p) - b for p, b in zip(pids, before, strict=True)]
    return took, growth[0], growth[1]


def _plot(walls: dict[str, dict[int, list[float]]], sizes: list[int]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"braid": "o-", "vllm": "s-", "braid-stream": "o--", "vllm-stream": "s--", "offline": "k^:"}
    for system in SYSTEMS:
        ax.plot(sizes, [statistics.median(walls[system][n]) for n in sizes], styles[system], label=LABELS[system])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("prompts in the one request")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"one batch request: {PROMPT_LEN} tokens in, {MAX_TOKENS} out per prompt", fontsize=10)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = PLOTS / "batch_wall.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(quick: bool) -> Section:
    started = time.monotonic()
    load_before = os.getloadavg()
    reps = _config(quick)
    sizes = sorted(reps)
    prompts = random_token_prompts(max(sizes), PROMPT_LEN, VOCAB, SEED)
    walls: dict[str, dict[int, list[float]]] = {s: {n: [] for n in sizes} for s in SYSTEMS}
    mem: dict[str, dict[int, list[int]]] = {s: {n: [] for n in sizes} for s in SYSTEMS if s != "offline"}
    engine_mem: dict[str, dict[int, list[int]]] = {s: {n: [] for n in sizes} for s in SYSTEMS if s != "offline"}
    with ExitStack() as stack:
        offline = stack.enter_context(Worker("offline", WORK / "batch-offline.log"))
        braid, vllm = stack.enter_context(start_pair("batch"))
        client = stack.enter_context(httpx.Client(timeout=600))
        setup_s = time.monotonic() - started
        servers = {"braid": braid, "vllm": vllm}
        # warm-up, not recorded
        offline.call(op="generate", prompt_token_ids=prompts[:8], max_tokens=MAX_TOKENS)
        for s in servers.values():
            _request(client, s, prompts[:8], stream=False)
            _request(client, s, prompts[:8], stream=True)
        for n in sizes:
            batch = prompts[:n]
            for r in range(reps[n]):
                for system in SYSTEMS[r % len(SYSTEMS) :] + SYSTEMS[: r % len(SYSTEMS)]:
                    if system == "offline":
                        out = offline.call(op="generate", prompt_token_ids=batch, max_tokens=MAX_TOKENS)
                        if out["output_tokens"] != n * MAX_TOKENS:
                            raise RuntimeError(f"offline made {out['output_tokens']} tokens, expected {n * MAX_TOKENS}")
                        walls[system][n].append(out["walls"][0])
                        continue
                    server = servers[system.split("-")[0]]
                    took, growth, engine_growth = _request(client, server, batch, stream=system.endswith("stream"))
                    walls[system][n].append(took)
                    mem[system][n].append(growth)
                    engine_mem[system][n].append(engine_growth)
    total_s = time.monotonic() - started
    load_after = os.getloadavg()

    def med(system: str, n: int) -> float:
        return statistics.median(walls[system][n])

    def cell(system: str, n: int) -> str:
        v = walls[system][n]
        return f"{med(system, n):.3g}" if len(v) < 2 else f"{med(system, n):.3g} ({min(v):.3g}–{max(v):.3g})"

    wall_rows = [
        [
            n,
            reps[n],
            *[cell(s, n) for s in SYSTEMS],
            f"{med('braid', n) / med('offline', n):.2f}",
            f"{med('vllm', n) / med('offline', n):.2f}",
            f"{med('braid-stream', n) / med('offline', n):.2f}",
            f"{med('vllm-stream', n) / med('offline', n):.2f}",
        ]
        for n in sizes
    ]
    mib = 1024 * 1024
    mem_rows = [
        [n, *[f"{max(0, *mem[s][n]) / mib:.1f}" for s in mem], *[f"{max(0, *engine_mem[s][n]) / mib:.1f}" for s in mem]]
        for n in sizes
    ]
    ratio64 = med("braid", 64) / med("offline", 64)
    targets = (
        Target(
            "braid 64-prompt non-streaming wall / offline generate",
            ratio64,
            1.2,
            False,
            why_missed=f"braid {med('braid', 64) * 1000:.0f} ms vs offline {med('offline', 64) * 1000:.0f} ms "
            f"(vLLM's server {med('vllm', 64) * 1000:.0f} ms) over {reps[64]} repetitions",
        ),
    )
    plot = _plot(walls, sizes)
    md = [
        f"Mode: {'quick' if quick else 'full'}. One request per measurement; each prompt is {PROMPT_LEN} random token ids "
        f"(seed {SEED}, ids 3–{VOCAB - 1}, as token-id lists), `max_tokens` {MAX_TOKENS} (not 64: 1024 prompts x 64 tokens "
        f"x 5 systems x repetitions would not fit the section's 4-minute budget on 2 shared cores), `ignore_eos`, "
        f"temperature 1.0. Offline: `LLM.generate` of the same token ids with `tools.servers.engine_settings()`.",
        "",
        "Wall time in seconds, median (min–max) over the repetitions, and the ratio of the medians to offline:",
        "",
        table(
            [
                "prompts",
                "reps",
                *[LABELS[s] for s in SYSTEMS],
                "braid/offline",
                "vLLM/offline",
                "braid stream/offline",
                "vLLM stream/offline",
            ],
            wall_rows,
        ),
        "",
        "Peak RSS growth during the request, MiB (VmHWM after a reset minus VmRSS before; largest over the "
        "repetitions). Front end = the server process (braid, or vLLM's API server); engine core = its "
        "`VLLM::EngineCore` child, which holds the model and KV cache for both servers:",
        "",
        table(
            [
                "prompts",
                "braid",
                "vLLM server",
                "braid (stream)",
                "vLLM server (stream)",
                "engine core: braid",
                "engine core: vLLM",
                "engine core: braid (stream)",
                "engine core: vLLM (stream)",
            ],
            mem_rows,
        ),
        "",
        "In both servers the engine core is a separate process (vLLM's server runs AsyncLLM; braid drives the "
        "engine core from its own thread, `braid.engine.vllm_core`); "
        "`VLLM_ENABLE_V1_MULTIPROCESSING=0` (set by `tools.servers`) only keeps the model runner inside that "
        "process (the `uni` executor) instead of a third one. So the front-end column is the front end's own memory.",
        f"Machine: 2 cores shared with another engineer's runs; load average {load_before[0]:.1f} at start, "
        f"{load_after[0]:.1f} at end. Setup {setup_s:.0f} s; section {total_s:.0f} s.",
    ]
    biggest = max(sizes)
    headlines = (
        f"batch 64 prompts non-streaming: braid {med('braid', 64) * 1000:.0f} ms, vLLM server {med('vllm', 64) * 1000:.0f} ms, "
        f"offline {med('offline', 64) * 1000:.0f} ms (braid/offline {ratio64:.2f}); {biggest} prompts: braid "
        f"{med('braid', biggest):.2f} s, vLLM {med('vllm', biggest):.2f} s, offline {med('offline', biggest):.2f} s",
    )
    return Section("The batch path (one request, many prompts)", "\n".join(md), headlines, targets, (plot,))


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
