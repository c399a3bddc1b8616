"""Tool parsers on the streaming chat path: what ``--tool-call-parser`` costs per token.

What is measured and how:

* Load: vLLM's own load generator, ``vllm bench serve --backend openai-chat --endpoint
  /v1/chat/completions`` (random dataset, the serving section's sizes: 32 input / 64 output
  tokens, ``--ignore-eos``, temperature 1.0, streamed with usage, all requests released at once
  and capped by ``--max-concurrency``), in one long-lived worker process
  (``bench.vllm_tools.Worker("bench")``), as in ``bench.serving``.
* Servers, four up at once on the same tiny model and engine settings (``tools.servers``):
  braid and vLLM's server without parser flags, and braid and vLLM's server with
  ``tools.servers.TOOL_FLAGS`` (``--enable-auto-tool-choice --tool-call-parser pythonic``).
* Runs: a plain chat stream (no ``tools`` in the request) on all four servers, the number that
  must not move when the parser is on; and the same stream with ``tools`` (a small list) and
  ``tool_choice: "auto"`` added to every request (``--extra-body``) on the two servers with the
  flags, where each choice's parser is fed every step. The tiny model's chat template does not
  render the tools, so the prompts are the same tokens either way and the difference is the
  front end's. The model's text is random: the parser sees text, mostly not a call.
* Rounds: the runs alternate (``bench.serving.alternating_runs``): round 0 goes braid without
  the parser, braid with it (plain, then tools), vLLM without, vLLM with (plain, then tools) at
  each concurrency; round 1 the reverse; and so on. Each comparison is between runs of the same
  round, next to each other, so the machine's drift hits both sides.
* Reported: median over rounds (min–max) of output tok/s, ITL p50/p99, TTFT p50 (as ``vllm bench
  serve`` computes them: a chat stream's first chunk carries the role) and the front-end
  process's CPU seconds per output token (``/proc/PID/stat`` around each run; the EngineCore's
  is not counted); then per-round ratios (with the parser / without; tools / plain; braid /
  vLLM), median (min–max) over rounds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import Section, section_main, table
from bench.serving import INPUT_LEN, OUTPUT_LEN, SEED, _spread, alternating_runs, serve_argv
from bench.vllm_tools import WORK, Worker, engine_core_pid, start_pair

CONCURRENCIES = (1, 64)
PARSER = "+parser"
TOOLS = "+parser/tools"
KINDS = ("braid", "braid" + PARSER, "braid" + TOOLS, "vllm", "vllm" + PARSER, "vllm" + TOOLS)
"""The runs of a round, in round 0's order: server, then ``+parser`` (the server started with
the tool flags, a plain request) or ``+parser/tools`` (that server, the request with tools)."""

LABELS = {
    "braid": "braid",
    "braid" + PARSER: "braid + parser, no tools",
    "braid" + TOOLS: "braid + parser, tools",
    "vllm": "vLLM server",
    "vllm" + PARSER: "vLLM server + parser, no tools",
    "vllm" + TOOLS: "vLLM server + parser, tools",
}

TOOL_BODY = {
    "tool_choice": "auto",
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                    "required": ["city"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            },
        },
    ],
}

METRICS = {
    "out tok/s": "output_throughput",
    "ITL p50 ms": "p50_itl_ms",
    "ITL p99 ms": "p99_itl_ms",
    "TTFT p50 ms": "p50_ttft_ms",
}

COMPARISONS = (
    ("braid: parser on / off, no tools", "braid" + PARSER, "braid"),
    ("vLLM server: parser on / off, no tools", "vllm" + PARSER, "vllm"),
    ("braid + parser: tools / no tools", "braid" + TOOLS, "braid" + PARSER),
    ("vLLM server + parser: tools / no tools", "vllm" + TOOLS, "vllm" + PARSER),
    ("braid / vLLM server, no parser", "braid", "vllm"),
    ("braid / vLLM server, parser, no tools", "braid" + PARSER, "vllm" + PARSER),
    ("braid / vLLM server, parser, tools", "braid" + TOOLS, "vllm" + TOOLS),
)


def _config(quick: bool) -> tuple[int, dict[int, int]]:
    """(rounds, prompts per concurrency)."""
    if quick:
        return 1, {1: 8, 64: 64}
    return 6, {1: 24, 64: 256}


def chat_argv(servers: dict[str, Any], model_dir: Path, prefix: str) -> Callable[[str, int, int, str], list[str]]:
    """``argv(kind, concurrency, prompts, tag)`` for :func:`bench.serving.alternating_runs`: a
    streamed chat run on ``servers[kind]``, with :data:`TOOL_BODY` in every request when the kind
    ends with ``+parser/tools``."""

    def chat(kind: str) -> dict[str, Any]:
        return {
            "backend": "openai-chat",
            "endpoint": "/v1/chat/completions",
            "extra_body": TOOL_BODY if kind.endswith(TOOLS) else None,
        }

    return serve_argv(servers, model_dir, prefix, chat)


def cpu_per_token(res: dict[str, Any]) -> float:
    """µs of the front-end process's CPU per output token of one run."""
    return float(res["cpu"][1]) * 1e6 / res["total_output_tokens"]


def run(quick: bool) -> Section:
    started = time.monotonic()
    load_before = os.getloadavg()
    rounds, prompts = _config(quick)
    from tools.servers import TOOL_FLAGS, tiny_model_dir

    model_dir = tiny_model_dir()
    with ExitStack() as stack:
        bench_worker = stack.enter_context(Worker("bench", WORK / "chat-tools-bench.log"))
        braid, vllm = stack.enter_context(start_pair("chat-tools"))
        braid_p, vllm_p = stack.enter_context(
            start_pair("chat-tools-parser", braid_extra=TOOL_FLAGS, vllm_extra=TOOL_FLAGS)
        )
        servers = {
            "braid": braid,
            "braid" + PARSER: braid_p,
            "braid" + TOOLS: braid_p,
            "vllm": vllm,
            "vllm" + PARSER: vllm_p,
            "vllm" + TOOLS: vllm_p,
        }
        engine_pids = {kind: engine_core_pid(s) for kind, s in servers.items()}
        argv = chat_argv(servers, model_dir, "chat-tools")
        for kind in KINDS:  # warm-up, not recorded
            bench_worker.call(op="serve", argv=argv(kind, 16, 16, f"warmup-{kind}"))
        setup_s = time.monotonic() - started
        runs = alternating_runs(bench_worker, servers, engine_pids, argv, CONCURRENCIES, prompts, rounds, kinds=KINDS)
    total_s = time.monotonic() - started
    load_after = os.getloadavg()

    rows = []
    for c in CONCURRENCIES:
        for kind in KINDS:
            rs = runs[kind][c]
            rows.append(
                [
                    LABELS[kind],
                    c,
                    *[_spread([r[m] for r in rs]) for m in METRICS.values()],
                    _spread([cpu_per_token(r) for r in rs]),
                ]
            )

    def value(res: dict[str, Any], key: str) -> float:
        """A metric of one run; ``cpu``: the front end's CPU µs per output token."""
        return cpu_per_token(res) if key == "cpu" else float(res[key])

    def ratios(a: str, b: str, c: int, key: str) -> list[float]:
        """a / b, per round (both runs of a round are next to each other)."""
        return [value(x, key) / value(y, key) for x, y in zip(runs[a][c], runs[b][c], strict=True)]

    def ratio_cell(values: list[float]) -> str:
        med = statistics.median(values)
        if len(values) < 2:
            return f"{med:.3f}"
        return f"{med:.3f} ({min(values):.3f}–{max(values):.3f})"

    ratio_rows = []
    for c in CONCURRENCIES:
        for name, a, b in COMPARISONS:
            ratio_rows.append([name, c, *[ratio_cell(ratios(a, b, c, m)) for m in (*METRICS.values(), "cpu")]])

    def delta_us(a: str, b: str, c: int) -> float:
        """Median over rounds of a's front-end CPU per token minus b's, µs."""
        return statistics.median(
            cpu_per_token(x) - cpu_per_token(y) for x, y in zip(runs[a][c], runs[b][c], strict=True)
        )

    def med_ratio(a: str, b: str, c: int, key: str) -> float:
        return statistics.median(ratios(a, b, c, key))

    c_hi = max(CONCURRENCIES)
    headlines = (
        f"chat stream c={c_hi}, no tools in the request: braid with/without the pythonic tool parser "
        f"out tok/s {med_ratio('braid' + PARSER, 'braid', c_hi, 'output_throughput'):.3f}, front-end CPU/token "
        f"{med_ratio('braid' + PARSER, 'braid', c_hi, 'cpu'):.3f} (vLLM server: "
        f"{med_ratio('vllm' + PARSER, 'vllm', c_hi, 'output_throughput'):.3f}, "
        f"{med_ratio('vllm' + PARSER, 'vllm', c_hi, 'cpu'):.3f}); with tools (auto) braid's front end "
        f"{delta_us('braid' + TOOLS, 'braid' + PARSER, c_hi):+.1f} µs/token, vLLM's "
        f"{delta_us('vllm' + TOOLS, 'vllm' + PARSER, c_hi):+.1f}",
    )
    md = [
        f"Mode: {'quick' if quick else 'full'}; {rounds} round(s), the order of the runs reversed every round "
        f"(round 0: {' → '.join(LABELS[k] for k in KINDS)}, at each concurrency). Prompts per run: "
        + ", ".join(f"{prompts[c]} at concurrency {c}" for c in CONCURRENCIES)
        + f"; {INPUT_LEN} random input tokens as one user message, {OUTPUT_LEN} output tokens "
        f"(`max_completion_tokens`), ignore_eos, temperature 1.0. Load generator: `vllm bench serve --backend "
        f"openai-chat --endpoint /v1/chat/completions --dataset-name random --request-rate inf --max-concurrency C "
        f'--seed {SEED}`, and for the `tools` runs `--extra-body` with `tool_choice: "auto"` and two small tools. '
        f"`+ parser`: the server started with `{' '.join(TOOL_FLAGS)}` (`tools.servers.TOOL_FLAGS`); the four "
        f"servers are up at once, on `tools.servers.engine_settings()`. The tiny model's chat template does not "
        f"render tools, so the prompts are the same either way; its text is random, so the parser mostly sees text.",
        "",
        "Each cell: median over rounds (min–max over rounds). `front-end CPU µs/token`: the server process's CPU "
        "seconds over the run (EngineCore not counted) per output token.",
        "",
        table(["system", "concurrency", *METRICS.keys(), "front-end CPU µs/token"], rows),
        "",
        "Ratios, each taken within a round (the two runs are next to each other), median (min–max) over rounds:",
        "",
        table(["ratio", "concurrency", *METRICS.keys(), "front-end CPU/token"], ratio_rows),
        "",
        "Front-end CPU per output token, with tools minus without (same server, same round; median over "
        "rounds): "
        + "; ".join(
            f"c={c}: braid {delta_us('braid' + TOOLS, 'braid' + PARSER, c):+.1f} µs, vLLM server "
            f"{delta_us('vllm' + TOOLS, 'vllm' + PARSER, c):+.1f} µs"
            for c in CONCURRENCIES
        )
        + ".",
        "",
        f"Machine: 2 cores, shared; load average {load_before[0]:.1f} at start, {load_after[0]:.1f} at end. "
        f"Setup (four server starts, worker import, warm-up) {setup_s:.0f} s; section {total_s:.0f} s.",
    ]
    return Section("Tool parsers on the streaming chat path", "\n".join(md), headlines)


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
