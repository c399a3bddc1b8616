"""Issue 28 §1: where a 1024-prompt batch's time goes, braid against vLLM's server and the engine alone.

``python -m bench.batch_profile [--rounds 3] [--tokens 32,128] [--prompts 1024] [--profile]``

* One ``/v1/completions`` request with 1024 prompts of 32 random token ids (token-id lists, the
  same for every system: ``bench.batch``'s prompts), ``ignore_eos``, temperature 1, 32 and 128
  tokens out, JSON and streamed, to braid (defaults) and vLLM's own server, both up at once on
  ``tools.servers.engine_settings()`` (``max_num_seqs`` 64), and the engine alone: ``LLM.generate``
  of the same token ids in a worker process. Every round runs the five systems once, in an order
  that rotates from round to round, so the machine's noise hits all of them.
* Wall: from sending the request to the last byte (streamed: ``[DONE]`` included). CPU: user +
  system seconds of the front-end process and of its ``EngineCore`` child over the request.
* Engine steps: :mod:`bench.step_probe` (loaded through a ``sitecustomize.py`` this module writes,
  nothing in ``src/``) logs every scheduler step of every engine core: its time, the engine's
  running and waiting counts, and the requests and tokens it scheduled. Per request: the steps,
  the mean running / waiting / scheduled requests per step, the wall per step, the steps that ran
  fewer than ``max_num_seqs`` requests with nothing waiting (*under-filled*), and the time from
  the request's start to the first step and from the last step to the response's end.
* ``--profile``: after the rounds, one more braid request per shape (32 tokens out) with py-spy
  (``pip install py-spy``; not a project dependency) sampling braid's process, all threads,
  idle included; the top functions of the Trio thread by self and by inclusive samples.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.batch import post_batch
from bench.common import Section, Target, table
from bench.vllm_tools import ROOT, WORK, Worker, cpu_env, cpu_seconds, engine_core_pid, random_token_prompts, start_pair

PROMPT_LEN = 32
VOCAB = 2048
SEED = 6
CAP = 64  # max_num_seqs of tools.servers.engine_settings(): what a full step runs
SYSTEMS = ("braid", "vllm", "braid-stream", "vllm-stream", "offline")
PROBE = WORK / "step-probe"


def _probe_env(steps_dir: Path) -> dict[str, str]:
    """Environment that loads bench.step_probe into every Python process started with it."""
    site = PROBE / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text("from bench.step_probe import install\n\ninstall()\n")
    if steps_dir.exists():
        shutil.rmtree(steps_dir)
    steps_dir.mkdir(parents=True)
    # this checkout's src/ ahead of any installed braid, so the servers run the code being measured
    return {"PYTHONPATH": f"{site}:{ROOT / 'src'}:{ROOT}", "BRAID_STEP_PROBE": str(steps_dir)}


class ProbedWorker(Worker):
    """``bench.vllm_tools``'s offline worker, with the step probe loaded (Worker sets its own PYTHONPATH)."""

    def __init__(self, log: Path, env: dict[str, str]) -> None:
        WORK.mkdir(parents=True, exist_ok=True)
        self.kind = "offline"
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.vllm_tools", "worker", "offline"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            cwd=ROOT,
            env={**os.environ, **cpu_env(), **env},
        )


def _steps(path: Path, t0: float, t1: float) -> list[tuple[float, int, int, int, int]]:
    rows: list[tuple[float, int, int, int, int]] = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 5 and t0 <= float(f[0]) <= t1:
            rows.append((float(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4])))
    return rows


def _step_stats(rows: list[tuple[float, int, int, int, int]], t0: float, t1: float) -> dict[str, float]:
    if not rows:
        return {"steps": 0}
    times = [r[0] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    med_gap = statistics.median(gaps) if gaps else 0.0
    return {
        "steps": len(rows),
        "tokens": sum(r[4] for r in rows),
        "running": statistics.fmean(r[1] for r in rows),
        "waiting": statistics.fmean(r[2] for r in rows),
        "scheduled": statistics.fmean(r[3] for r in rows),
        "underfilled": sum(1 for r in rows if r[1] < CAP and r[2] == 0),
        "ms_per_step": (times[-1] - times[0]) / max(1, len(rows) - 1) * 1000,
        "median_gap_ms": med_gap * 1000,
        # time between steps beyond 3x the median gap: the engine waiting for work (or the machine busy)
        "stall_s": sum(g for g in gaps if g > 3 * med_gap),
        "head_s": times[0] - t0,
        "tail_s": t1 - times[-1],
    }


def _measure_server(
    client: httpx.Client, server: Any, steps_dir: Path, prompts: list[list[int]], max_tokens: int, stream: bool
) -> dict[str, Any]:
    core = engine_core_pid(server)
    cpu0 = (cpu_seconds(server.pid), cpu_seconds(core))
    t0 = time.monotonic()
    post_batch(client, server, prompts, max_tokens, stream)
    t1 = time.monotonic()
    cpu1 = (cpu_seconds(server.pid), cpu_seconds(core))
    time.sleep(0.05)  # the probe's last line
    rows = _steps(steps_dir / f"steps-{core}.txt", t0, t1)
    return {
        "wall": t1 - t0,
        "front_cpu": cpu1[0] - cpu0[0],
        "core_cpu": cpu1[1] - cpu0[1],
        **_step_stats(rows, t0, t1),
    }


def _measure_offline(
    worker: ProbedWorker, steps_dir: Path, prompts: list[list[int]], max_tokens: int
) -> dict[str, Any]:
    cpu0 = cpu_seconds(worker.proc.pid)
    t0 = time.monotonic()
    out = worker.call(op="generate", prompt_token_ids=prompts, max_tokens=max_tokens)
    t1 = time.monotonic()
    if out["output_tokens"] != len(prompts) * max_tokens:
        raise RuntimeError(f"offline made {out['output_tokens']} tokens, expected {len(prompts) * max_tokens}")
    rows: list[tuple[float, int, int, int, int]] = []
    for path in steps_dir.glob("steps-*.txt"):
        rows += _steps(path, t0, t1)
    rows.sort()
    return {
        "wall": out["walls"][0],
        "front_cpu": 0.0,
        "core_cpu": cpu_seconds(worker.proc.pid) - cpu0,
        **_step_stats(rows, t0, t1),
    }


# --------------------------------------------------------------------------- py-spy


@contextmanager
def _pyspy(pid: int, out: Path, rate: int = 250) -> Iterator[None]:
    """py-spy sampling ``pid`` (all threads, idle included, raw collapsed stacks) while the block runs."""
    exe = Path(sys.executable).with_name("py-spy")
    proc = subprocess.Popen(
        [str(exe), "record", "-p", str(pid), "--idle", "--threads", "-r", str(rate), "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def _frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1].rstrip(")")
    return f"{name} ({file})"


IDLE_LEAVES = ("EpollIOManager.get_events (_io_epoll.py)", "get_events (_io_epoll.py)")


def _profile_summary(raw: Path, top: int = 18) -> dict[str, Any]:
    """Self and inclusive samples of the thread that runs Trio (the one whose stacks hold trio's run loop)."""
    threads: dict[str, list[tuple[list[str], int]]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "?")
        names = [_frame_name(f) for f in frames if not f.startswith(("thread ", "process "))]
        threads.setdefault(thread, []).append((names, int(count)))
    trio_thread = max(
        threads,
        key=lambda t: sum(c for names, c in threads[t] if any("_io_epoll" in n or "trio" in n for n in names)),
    )
    samples = threads[trio_thread]
    total = sum(c for _, c in samples)
    idle = sum(c for names, c in samples if names and names[-1] in IDLE_LEAVES)
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for names, c in samples:
        if names and names[-1] in IDLE_LEAVES:
            continue
        own[names[-1] if names else "?"] += c
        for n in set(names):
            inclusive[n] += c
    busy = max(1, total - idle)
    return {
        "thread": trio_thread,
        "samples": total,
        "idle": idle,
        "self": [(n, c, c / busy) for n, c in own.most_common(top)],
        "inclusive": [(n, c, c / busy) for n, c in inclusive.most_common(top * 3)],
        "other_threads": {t: sum(c for _, c in s) for t, s in threads.items() if t != trio_thread},
    }


# --------------------------------------------------------------------------- report


def _cell(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    if len(values) < 2:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def report(results: dict[str, dict[int, list[dict[str, Any]]]], token_counts: list[int], prompts: int) -> str:
    out = []
    rows = []
    for n in token_counts:
        med = {s: statistics.median(r["wall"] for r in results[s][n]) for s in SYSTEMS}
        rows.append(
            [
                n,
                *[_cell([r["wall"] for r in results[s][n]]) for s in SYSTEMS],
                f"{med['braid'] / med['vllm']:.2f}",
                f"{med['braid-stream'] / med['vllm-stream']:.2f}",
                f"{med['braid'] / med['offline']:.2f}",
                f"{med['braid-stream'] / med['offline']:.2f}",
                f"{med['vllm'] / med['offline']:.2f}",
            ]
        )
    out.append(f"Wall (s), median (min–max), {prompts} prompts:\n")
    out.append(
        table(
            [
                "tokens out",
                "braid JSON",
                "vLLM JSON",
                "braid stream",
                "vLLM stream",
                "offline",
                "braid/vLLM JSON",
                "braid/vLLM stream",
                "braid JSON/offline",
                "braid stream/offline",
                "vLLM JSON/offline",
            ],
            rows,
        )
    )
    out.append("\nEngine steps per request (medians over the rounds):\n")
    srows = []
    for n in token_counts:
        for s in SYSTEMS:
            rs = results[s][n]

            def m(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return statistics.median(r.get(key, 0.0) for r in rs)

            srows.append(
                [
                    n,
                    s,
                    f"{m('wall'):.2f}",
                    f"{m('steps'):.0f}",
                    f"{m('tokens'):.0f}",
                    f"{m('scheduled'):.1f}",
                    f"{m('running'):.1f}",
                    f"{m('waiting'):.1f}",
                    f"{m('underfilled'):.0f}",
                    f"{m('ms_per_step'):.2f}",
                    f"{m('median_gap_ms'):.2f}",
                    f"{m('stall_s'):.2f}",
                    f"{m('head_s') * 1000:.0f}",
                    f"{m('tail_s') * 1000:.0f}",
                    f"{m('front_cpu'):.2f}",
                    f"{m('core_cpu'):.2f}",
                ]
            )
    out.append(
        table(
            [
                "out",
                "system",
                "wall s",
                "steps",
                "tokens",
                "reqs/step",
                "running",
                "waiting",
                "under-filled steps",
                "ms/step",
                "median gap ms",
                "gaps > 3× median, s",
                "start → 1st step ms",
                "last step → end ms",
                "front-end CPU s",
                "engine CPU s",
            ],
            srows,
        )
    )
    return "\n".join(out)


def profile_report(name: str, summary: dict[str, Any]) -> str:
    busy = summary["samples"] - summary["idle"]
    lines = [
        f"\npy-spy, {name}: {summary['samples']} samples of the Trio thread, {summary['idle']} idle in epoll "
        f"({summary['idle'] / max(1, summary['samples']):.0%}); shares below are of the {busy} busy ones. "
        f"Other threads (all samples, idle included): {summary['other_threads']}\n",
        table(["self", "samples", "share"], [[n, c, f"{s:.1%}"] for n, c, s in summary["self"]]),
        "",
        table(["inclusive", "samples", "share"], [[n, c, f"{s:.1%}"] for n, c, s in summary["inclusive"]]),
    ]
    return "\n".join(lines)


def measure(
    rounds: int, token_counts: list[int], n_prompts: int, profile: bool = False, braid_args: tuple[str, ...] = ()
) -> tuple[dict[str, dict[int, list[dict[str, Any]]]], list[tuple[str, dict[str, Any]]]]:
    """The rounds: every system once per round and token count, the order rotating. Returns the
    results by system and token count, and the py-spy summaries (``profile``)."""
    prompts = random_token_prompts(n_prompts, PROMPT_LEN, VOCAB, SEED)
    started = time.monotonic()
    steps_dir = PROBE / "servers"
    offline_dir = PROBE / "offline"
    env = _probe_env(steps_dir)
    offline_env = {**env, "BRAID_STEP_PROBE": str(offline_dir)}
    shutil.rmtree(offline_dir, ignore_errors=True)
    offline_dir.mkdir(parents=True)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {s: {n: [] for n in token_counts} for s in SYSTEMS}
    profiles: list[tuple[str, dict[str, Any]]] = []
    with ExitStack() as stack:
        offline = ProbedWorker(WORK / "batch-profile-offline.log", offline_env)
        stack.enter_context(offline)
        braid, vllm = stack.enter_context(start_pair("batch-profile", env=env, braid_extra=braid_args))
        client = stack.enter_context(httpx.Client(timeout=600))
        servers = {"braid": braid, "vllm": vllm}
        print(f"servers up in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        # warm-up, not recorded: the whole batch once per system (the engine's first steps of a
        # batch size it has not run yet are slow)
        offline.call(op="generate", prompt_token_ids=prompts, max_tokens=8)
        for s in servers.values():
            for stream in (False, True):
                post_batch(client, s, prompts, 8, stream)
        for n in token_counts:
            for r in range(rounds):
                for system in SYSTEMS[r % len(SYSTEMS) :] + SYSTEMS[: r % len(SYSTEMS)]:
                    if system == "offline":
                        res = _measure_offline(offline, offline_dir, prompts, n)
                    else:
                        server = servers[system.split("-")[0]]
                        res = _measure_server(client, server, steps_dir, prompts, n, system.endswith("stream"))
                    results[system][n].append(res)
                    print(
                        f"{n} tokens round {r} {system}: {res['wall']:.2f} s, {res.get('steps')} steps",
                        file=sys.stderr,
                        flush=True,
                    )
        if profile:
            for stream in (False, True):
                name = f"braid {'stream' if stream else 'JSON'}, {n_prompts} prompts, {token_counts[0]} tokens out"
                raw = WORK / f"batch-profile-pyspy-{'stream' if stream else 'json'}.txt"
                with _pyspy(braid.pid, raw):
                    t0 = time.monotonic()
                    post_batch(client, braid, prompts, token_counts[0], stream)
                    wall = time.monotonic() - t0
                profiles.append((f"{name} (wall {wall:.2f} s under py-spy)", _profile_summary(raw)))
    return results, profiles


def run(quick: bool) -> Section:
    """``make bench``'s section (issue 28 §4): the 1024-prompt batch, JSON and streamed, 32 and 128
    tokens out, against vLLM's server and the engine alone; the target is issue 28's 0.9×."""
    token_counts = [32] if quick else [32, 128]
    rounds = 1 if quick else 3
    load_before = os.getloadavg()[0]
    results, _ = measure(rounds, token_counts, 1024)
    load_after = os.getloadavg()[0]

    def med(system: str, n: int) -> float:
        return statistics.median(r["wall"] for r in results[system][n])

    targets = []
    for n in token_counts:
        for shape, braid, vllm in (("JSON", "braid", "vllm"), ("streamed", "braid-stream", "vllm-stream")):
            targets.append(
                Target(
                    f"1024-prompt batch, {n} tokens out, {shape}: braid / vLLM's server",
                    med(braid, n) / med(vllm, n),
                    0.9,
                    higher_is_better=False,
                    unit="×",
                    why_missed="the progressive feed and the engine core's own process (docs/performance-log.md)",
                )
            )
    md = (
        f"Mode: {'quick' if quick else 'full'}; {rounds} round(s), load average {load_before:.1f} at the start, "
        f"{load_after:.1f} at the end. `python -m bench.batch_profile` gives the same with the engine's step "
        "trace and a py-spy profile (docs/performance-log.md, issue 28 §1).\n\n" + report(results, token_counts, 1024)
    )
    headline = ", ".join(
        f"{n} out: JSON {med('braid', n) / med('vllm', n):.2f}×, streamed "
        f"{med('braid-stream', n) / med('vllm-stream', n):.2f}× of vLLM's server"
        for n in token_counts
    )
    return Section(
        title="The 1024-prompt batch against vLLM's server and the engine alone",
        markdown=md,
        headlines=(f"batch_1024: {headline}",),
        targets=tuple(targets),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", default="32,128", help="comma-separated max_tokens values")
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--profile", action="store_true", help="then one py-spy'd braid request per shape")
    p.add_argument("--braid-arg", action="append", default=[], help="extra `braid serve` argument")
    args = p.parse_args()
    token_counts = [int(t) for t in args.tokens.split(",")]
    started = time.monotonic()
    load_before = os.getloadavg()
    results, profiles = measure(args.rounds, token_counts, args.prompts, args.profile, tuple(args.braid_arg))
    load_after = os.getloadavg()
    (WORK / "batch-profile.json").write_text(json.dumps({"results": results, "profiles": profiles}, default=str))
    print(report(results, token_counts, args.prompts))
    for name, summary in profiles:
        print(profile_report(name, summary))
    print(
        f"\nload average {load_before[0]:.1f} at start, {load_after[0]:.1f} at end; "
        f"{time.monotonic() - started:.0f} s in all; raw results in {WORK / 'batch-profile.json'}"
    )


if __name__ == "__main__":
    main()
