"""Admission: a small request's first token while another client's 1024-prompt batch runs.

The case of issue 16: one client posts a batch of 1024 prompts (32 random token ids each,
``max_tokens`` 64, ``ignore_eos``, not streamed); one second later a second client sends one
streaming prompt (``max_tokens`` 8). Measured per trial and server:

* the small request's time to its first token (from sending it), and the same request's time on
  the idle server before the batch (the baseline);
* what the server answers to the batch (status) and how long the batch took;
* braid only: the peak of ``braid_engine_requests_in_flight`` (polled every 20 ms), which
  admission bounds.

Servers: braid with its default admission; vLLM's server as it ships (no queue cap), in the same
run, alternating; then vLLM's server with ``--max-num-queued-reqs`` (what it answers a batch
that does not fit).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import Section, Target, section_main, table
from bench.vllm_tools import random_token_prompts, start_pair

BATCH = 1024
DELAY = 1.0
VLLM_QUEUE_CAP = 256


def _first_token(client: httpx.Client, server: Any) -> float:
    body = {"model": server.model, "prompt": "hello there", "max_tokens": 8, "stream": True}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", server.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{server.kind}: no token (status {r.status_code})")
    return first


def trial(server: Any, prompts: list[list[int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(timeout=600) as client:
        out["idle_ms"] = _first_token(client, server) * 1000
        peak = [0.0]
        done = threading.Event()

        def batch() -> None:
            t0 = time.perf_counter()
            r = client.post(
                server.url + "/v1/completions",
                json={"model": server.model, "prompt": prompts, "max_tokens": 64, "ignore_eos": True},
            )
            out["batch_status"] = r.status_code
            out["batch_s"] = time.perf_counter() - t0
            done.set()

        def poll() -> None:
            while not done.is_set():
                if server.kind == "braid":
                    peak[0] = max(peak[0], server.metrics().get("braid_engine_requests_in_flight", 0.0))
                time.sleep(0.02)

        threads = [threading.Thread(target=batch), threading.Thread(target=poll)]
        for t in threads:
            t.start()
        time.sleep(DELAY)
        out["ttft_ms"] = _first_token(client, server) * 1000
        for t in threads:
            t.join()
        out["peak"] = peak[0]
    return out


def run(quick: bool) -> Section:
    from tools.servers import run_vllm, tiny_model_dir

    trials = 2 if quick else 4
    results: dict[str, list[dict[str, Any]]] = {"braid": [], "vllm": [], "vllm-capped": []}
    with start_pair("admission") as (braid, vllm):
        servers = {"braid": braid, "vllm": vllm}
        for s in servers.values():
            trial(s, random_token_prompts(64, 32, 2048, seed=1))  # warm-up
        for i in range(trials):
            prompts = random_token_prompts(BATCH, 32, 2048, seed=3000 + i)
            for name in ("braid", "vllm") if i % 2 == 0 else ("vllm", "braid"):
                results[name].append(trial(servers[name], prompts))
    with run_vllm("--max-num-queued-reqs", str(VLLM_QUEUE_CAP), model_dir=tiny_model_dir()) as capped:
        for i in range(max(1, trials // 2)):
            results["vllm-capped"].append(trial(capped, random_token_prompts(BATCH, 32, 2048, seed=3000 + i)))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    labels = {
        "braid": "braid (defaults)",
        "vllm": "vLLM server (no queue cap)",
        "vllm-capped": f"vLLM server, --max-num-queued-reqs {VLLM_QUEUE_CAP}",
    }
    rows = []
    for name, rs in results.items():
        statuses = sorted({r["batch_status"] for r in rs})
        rows.append(
            [
                labels[name],
                len(rs),
                f"{med(name, 'idle_ms'):.0f}",
                f"{med(name, 'ttft_ms'):.0f}",
                f"{max(r['ttft_ms'] for r in rs):.0f}",
                "/".join(map(str, statuses)),
                f"{med(name, 'batch_s'):.2f}",
                f"{max(r['peak'] for r in rs):.0f}" if name == "braid" else "–",
            ]
        )
    braid_ttft = med("braid", "ttft_ms")
    md = "\n".join(
        [
            f"Mode: {'quick' if quick else 'full'}. One client posts {BATCH} prompts of 32 random token ids "
            f"(`max_tokens` 64, `ignore_eos`); {DELAY:g} s later another client streams one prompt "
            "(`max_tokens` 8). Medians over the trials (braid and vLLM's server alternating):",
            "",
            table(
                [
                    "server",
                    "trials",
                    "small request TTFT, idle (ms)",
                    "small request TTFT during the batch (ms)",
                    "worst (ms)",
                    "batch status",
                    "batch time (s)",
                    "braid in flight, peak",
                ],
                rows,
            ),
        ]
    )
    return Section(
        title="Admission: a small request beside a 1024-prompt batch",
        markdown=md,
        headlines=(
            f"admission: small request's first token during a {BATCH}-prompt batch: braid {braid_ttft:.0f} ms, "
            f"vLLM server {med('vllm', 'ttft_ms'):.0f} ms; batch {med('braid', 'batch_s'):.2f} s vs "
            f"{med('vllm', 'batch_s'):.2f} s",
        ),
        targets=(
            Target(
                "small request's first token during a 1024-prompt batch, braid defaults (ms)",
                braid_ttft,
                1000.0,
                higher_is_better=False,
                unit=" ms",
                why_missed="see the admission section",
            ),
        ),
    )


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
