"""Classes: an interactive stream's first token beside a saturating background load, against beside an
equal interactive load (issue 28 §4; the background class of docs/admission.md).

What is measured and how:

* The load: ``CLIENTS`` clients, each posting one ``/v1/completions`` request after another with
  ``PROMPTS`` prompts of 32 random token ids (``max_tokens`` ``TOKENS``, ``ignore_eos``, not
  streamed): ``CLIENTS`` x ``PROMPTS`` prompts wanted at once against braid's 68 slots, so the
  engine never runs out of work. *Background*: every load request carries ``service_tier: "flex"``
  (the background class); *interactive*: the same requests without it.
* The probe: every ``PROBE_EVERY`` seconds, after ``WARMUP`` seconds of load, one streamed
  one-prompt request (``max_tokens`` 8), interactive; its time to the first token (from sending it
  to the first ``data: {`` line). Also the probe's time on the idle server, before each window.
* The load's rate: prompts of load requests that ended inside the probe window, per second.
* Servers: braid with its defaults (background cap ``--batch-max-slots`` 0, i.e. every slot but the
  reserve) under both loads, and vLLM's server under the interactive load (it has no background
  class: ``service_tier: "flex"`` is refused there), up at once, the windows' order rotating from
  round to round. Then, without ``--quick``, braid again with ``--batch-max-slots`` 16 and 32 under
  the background load: the curve of the probe's wait and the load's rate over the cap.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import Section, Target, percentile, section_main, table
from bench.vllm_tools import WORK, random_token_prompts, start_pair

CLIENTS = 4
PROMPTS = 64
TOKENS = 32
PROBE_EVERY = 0.5
WARMUP = 2.0
CAPS = (16, 32)


def _first_token(client: httpx.Client, server: Any) -> float:
    body = {"model": server.model, "prompt": "hello there", "max_tokens": 8, "stream": True}
    t0 = time.perf_counter()
    with client.stream("POST", server.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0
    raise RuntimeError(f"{server.kind}: no token from the probe (status {r.status_code})")


def window(server: Any, background: bool, seconds: float, seed: int, vocab: int = 2048) -> dict[str, Any]:
    """One window: the load on ``server`` for ``WARMUP`` + ``seconds``, the probe during the last
    ``seconds``. Returns the probe's idle and loaded first-token times (ms), the prompts of load
    requests that ended inside the probe window and their rate. A load request answered with
    anything but 200 is a RuntimeError (a refused load would make a fast, meaningless window)."""
    stop = threading.Event()
    ended: list[tuple[float, int]] = []  # (time, prompts) of each load request that ended with 200
    failures: list[int] = []
    lock = threading.Lock()

    def load(k: int) -> None:
        prompts = random_token_prompts(PROMPTS, 32, vocab, seed=seed * 100 + k)
        body: dict[str, Any] = {"model": server.model, "prompt": prompts, "max_tokens": TOKENS, "ignore_eos": True}
        if background:
            body["service_tier"] = "flex"
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                r = c.post(server.url + "/v1/completions", json=body)
                with lock:
                    if r.status_code == 200:
                        ended.append((time.perf_counter(), PROMPTS))
                    else:
                        failures.append(r.status_code)

    with httpx.Client(timeout=600) as client:
        idle = _first_token(client, server) * 1000
        threads = [threading.Thread(target=load, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(WARMUP)
        t0 = time.perf_counter()
        probes = []
        while time.perf_counter() - t0 < seconds:
            tick = time.perf_counter()
            probes.append(_first_token(client, server) * 1000)
            time.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - tick)))
        t1 = time.perf_counter()
        stop.set()
        for t in threads:
            t.join()
    if failures:
        raise RuntimeError(f"{server.kind}: load requests failed with {sorted(set(failures))}")
    done = sum(n for at, n in ended if t0 <= at <= t1)
    return {"idle": idle, "probes": probes, "done": done, "rate": done / (t1 - t0)}


def _row(label: str, results: list[dict[str, Any]]) -> list[object]:
    probes = [p for r in results for p in r["probes"]]
    return [
        label,
        len(probes),
        f"{statistics.median(r['idle'] for r in results):.0f}",
        f"{percentile(probes, 50):.0f}",
        f"{percentile(probes, 90):.0f}",
        f"{max(probes):.0f}",
        f"{statistics.median(r['rate'] for r in results):.0f}",
    ]


def run(quick: bool) -> Section:
    from tools.servers import run_braid, tiny_model_dir

    rounds, seconds = (1, 6.0) if quick else (2, 12.0)
    windows = (("braid", True), ("braid", False), ("vllm", False))
    results: dict[tuple[str, bool], list[dict[str, Any]]] = {w: [] for w in windows}
    with start_pair("classes") as (braid, vllm):
        servers = {"braid": braid, "vllm": vllm}
        for s in servers.values():
            window(s, False, 1.0, seed=0)  # warm-up: the engine's first batches of each size are slow
        for r in range(rounds):
            for kind, background in windows[r % 3 :] + windows[: r % 3]:
                results[(kind, background)].append(window(servers[kind], background, seconds, seed=r + 1))
    curve: dict[int, list[dict[str, Any]]] = {}
    if not quick:
        for cap in CAPS:
            with run_braid(
                "--batch-max-slots", str(cap), model_dir=tiny_model_dir(), log=WORK / f"classes-cap{cap}.log"
            ) as capped:
                window(capped, True, 1.0, seed=0)
                curve[cap] = [window(capped, True, seconds, seed=1)]

    header = [
        "server, load",
        "probes",
        "probe TTFT idle (ms)",
        "p50 under load (ms)",
        "p90 (ms)",
        "worst (ms)",
        "load's prompts/s",
    ]
    rows = [
        _row("braid, background load (`service_tier: flex`)", results[("braid", True)]),
        _row("braid, interactive load", results[("braid", False)]),
        _row("vLLM server, interactive load", results[("vllm", False)]),
    ]
    rows += [_row(f"braid `--batch-max-slots {cap}`, background load", rs) for cap, rs in curve.items()]
    bg = percentile([p for r in results[("braid", True)] for p in r["probes"]], 50)
    fg = percentile([p for r in results[("braid", False)] for p in r["probes"]], 50)
    md = "\n".join(
        [
            f"Mode: {'quick' if quick else 'full'}. {CLIENTS} clients post {PROMPTS}-prompt requests one after another "
            f"(32 random token ids, `max_tokens` {TOKENS}, `ignore_eos`); after {WARMUP:g} s, a streamed one-prompt "
            f"request every {PROBE_EVERY:g} s for {seconds:g} s, {rounds} window(s) per row, the order rotating. "
            "The load's rate counts the prompts of load requests that ended inside the probe window.",
            "",
            table(header, rows),
        ]
    )
    return Section(
        title="Classes: an interactive stream beside background and interactive load",
        markdown=md,
        headlines=(
            f"classes: a stream's first token beside a saturating load: background {bg:.0f} ms, "
            f"interactive {fg:.0f} ms (p50)",
        ),
        targets=(
            Target(
                "stream's TTFT p50 beside background load / beside interactive load",
                bg / fg,
                2.0,
                higher_is_better=False,
                unit="×",
                why_missed="see the classes section",
            ),
        ),
    )


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
