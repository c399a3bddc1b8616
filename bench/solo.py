"""One server alone under ``vllm bench serve``: throughput and where the CPU goes, for profiling.

The serving section runs braid and vLLM's server side by side on a 2-core machine, so each one's
engine competes with the other's idle loops and the ratios hide absolute costs. This tool starts
one server (``braid`` or ``vllm``, plus any extra server flags), warms it up, runs one load
(concurrency C, N prompts, the serving section's request shape) and prints output tok/s, TTFT
p50, and CPU per request of the front-end process and of its EngineCore. With ``--pyspy FILE`` it
also records the front-end process with py-spy (raw collapsed stacks) during the load.

Run: python -m bench.solo KIND C N [--rounds R] [--pyspy FILE] [SERVER FLAGS...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

from bench.serving import INPUT_LEN, OUTPUT_LEN, SEED
from bench.vllm_tools import WORK, Worker, bench_serve_argv, cpu_seconds, engine_core_pid


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["braid", "vllm"])
    p.add_argument("concurrency", type=int)
    p.add_argument("prompts", type=int)
    p.add_argument("--pyspy", default=None)
    p.add_argument("--rounds", type=int, default=1)
    args, extra = p.parse_known_args()  # the rest are server flags
    args.extra = [a for a in extra if a != "--"]
    from tools.servers import run_braid, run_vllm, tiny_model_dir

    model_dir = tiny_model_dir()
    run = run_braid if args.kind == "braid" else run_vllm
    with ExitStack() as stack:
        bench = stack.enter_context(Worker("bench", WORK / "solo-bench.log"))
        srv = stack.enter_context(run(*args.extra, model_dir=model_dir, log=WORK / f"solo-{args.kind}.log"))
        core = engine_core_pid(srv)

        def argv(c: int, n: int) -> list[str]:
            return bench_serve_argv(srv.url, model_dir, concurrency=c, num_prompts=n, input_len=INPUT_LEN,
                                    output_len=OUTPUT_LEN, seed=SEED)

        bench.call(op="serve", argv=argv(16, 32))  # warm-up
        for _ in range(args.rounds):
            spy = None
            if args.pyspy:
                py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
                assert py_spy, "pip install py-spy"
                spy = subprocess.Popen([py_spy, "record", "--pid", str(srv.pid), "--rate", "200", "--format", "raw",
                                        "--threads", "--nonblocking", "-o", args.pyspy],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cpu0 = cpu_seconds(srv.pid), cpu_seconds(core)
            res = bench.call(op="serve", argv=argv(args.concurrency, args.prompts))
            fe, ec = cpu_seconds(srv.pid) - cpu0[0], cpu_seconds(core) - cpu0[1]
            if spy is not None:
                spy.send_signal(2)
                threading.Thread(target=spy.wait).start()
                spy.wait(30)
            n = max(res["completed"], 1)
            print(f"{args.kind} c={args.concurrency} n={args.prompts}: {res['output_throughput']:.0f} out tok/s, "
                  f"{res['request_throughput']:.2f} req/s, TTFT p50 {res['p50_ttft_ms']:.1f} ms, "
                  f"front end {1e3 * fe / n:.1f} ms CPU/req, engine core {1e3 * ec / n:.1f} ms CPU/req, "
                  f"failed {res['failed']}", flush=True)


if __name__ == "__main__":
    main()
