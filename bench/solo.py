"""Servers one at a time under ``vllm bench serve``: throughput and where the CPU goes, for profiling.

The serving section runs braid and vLLM's server side by side and reports ratios; this tool is
for A/B work on the front end. It starts every variant given (``braid`` or ``vllm``, each with
its own server flags and environment), all at once and idle but for the one under load, and
runs rounds of one load (concurrency C, N prompts, the serving section's request shape) on each
in turn, alternating the order, so the drift of a shared machine hits every variant. Per run it
prints output tok/s, TTFT p50 and the CPU per request of the front-end process and of its
EngineCore (CPU time is less disturbed by a noisy neighbour than wall-clock rates), then the
medians. With ``--pyspy FILE`` the first variant's last run is recorded with py-spy (raw
collapsed stacks, all threads).

Run: python -m bench.solo C N [--rounds R] [--output-len L] [--pyspy FILE] VARIANT...
where VARIANT is ``KIND[:FLAG,FLAG,...][@ENV=VALUE,...]``, e.g. ``braid``, ``braid:--stock-send``,
``vllm``, ``braid@PYTHONMALLOC=malloc``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.serving import INPUT_LEN, OUTPUT_LEN, SEED
from bench.vllm_tools import WORK, Worker, bench_serve_argv, cpu_seconds, engine_core_pid


def _variant(spec: str) -> tuple[str, list[str], dict[str, str]]:
    spec, _, env_part = spec.partition("@")
    kind, _, flags = spec.partition(":")
    if kind not in ("braid", "vllm"):
        raise SystemExit(f"unknown server kind {kind!r}")
    env = dict(kv.split("=", 1) for kv in env_part.split(",") if kv)
    return kind, [f for f in flags.split(",") if f], env


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("concurrency", type=int)
    p.add_argument("prompts", type=int)
    p.add_argument("variants", nargs="+")
    p.add_argument("--pyspy", default=None)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--output-len", type=int, default=OUTPUT_LEN, help="tokens per response (ignore_eos)")
    args = p.parse_args()
    from tools.servers import run_braid, run_vllm, tiny_model_dir

    model_dir = tiny_model_dir()
    with ExitStack() as stack:
        bench = stack.enter_context(Worker("bench", WORK / "solo-bench.log"))
        servers: list[tuple[str, Any, int]] = []
        for i, spec in enumerate(args.variants):
            kind, flags, env = _variant(spec)
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # tools.servers hands os.environ to the server
            try:
                run = run_braid if kind == "braid" else run_vllm
                srv = stack.enter_context(run(*flags, model_dir=model_dir, log=WORK / f"solo-{i}-{kind}.log"))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            servers.append((spec, srv, engine_core_pid(srv)))

        def argv(srv: Any, c: int, n: int) -> list[str]:
            return bench_serve_argv(
                srv.url,
                model_dir,
                concurrency=c,
                num_prompts=n,
                input_len=INPUT_LEN,
                output_len=args.output_len,
                seed=SEED,
            )

        for _, srv, _ in servers:
            bench.call(op="serve", argv=argv(srv, 16, 32))  # warm-up
        results: dict[str, list[tuple[float, float, float, float]]] = {spec: [] for spec, _, _ in servers}
        for r in range(args.rounds):
            for spec, srv, core in servers if r % 2 == 0 else servers[::-1]:
                spy = None
                if args.pyspy and spec == servers[0][0] and r == args.rounds - 1:
                    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
                    assert py_spy, "pip install py-spy"
                    spy = subprocess.Popen(
                        [
                            py_spy,
                            "record",
                            "--pid",
                            str(srv.pid),
                            "--rate",
                            "200",
                            "--format",
                            "raw",
                            "--threads",
                            "--nonblocking",
                            "-o",
                            args.pyspy,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                cpu0 = cpu_seconds(srv.pid), cpu_seconds(core)
                res = bench.call(op="serve", argv=argv(srv, args.concurrency, args.prompts))
                fe, ec = cpu_seconds(srv.pid) - cpu0[0], cpu_seconds(core) - cpu0[1]
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(30)
                n = max(res["completed"], 1)
                row = (res["output_throughput"], res["p50_ttft_ms"], 1e3 * fe / n, 1e3 * ec / n)
                results[spec].append(row)
                print(
                    f"round {r} {spec}: {row[0]:.0f} out tok/s, TTFT p50 {row[1]:.1f} ms, front end {row[2]:.2f} ms "
                    f"CPU/req, engine core {row[3]:.2f} ms CPU/req, failed {res['failed']}",
                    flush=True,
                )
        print(f"medians over {args.rounds} rounds, c={args.concurrency}, {args.prompts} prompts:")
        for spec, rows in results.items():
            med = [statistics.median(col) for col in zip(*rows, strict=True)]
            print(
                f"  {spec:40s} {med[0]:7.0f} out tok/s  TTFT p50 {med[1]:7.1f} ms  front end {med[2]:6.2f} ms/req  "
                f"engine core {med[3]:6.2f} ms/req"
            )


if __name__ == "__main__":
    main()
