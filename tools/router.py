"""vLLM's own router (``vllm-router``, a Rust binary in a PyPI wheel) in front of braid replicas,
and the replicas to put behind it, for the deployment tests (tests/deploy/test_router.py) and
bench/replicas.py.

:func:`router_binary` finds the ``vllm-router`` console script beside this interpreter, installing
the pinned wheel (:data:`VERSION`) with this interpreter's pip when it is missing or another
version; :func:`run_router` starts it on a free loopback port in front of the given workers, waits
until it answers, and stops it on exit. Its Prometheus exporter gets a free port too (its default,
29000, would make two routers collide). :func:`run_replicas` starts braid replicas at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from importlib import metadata
from pathlib import Path

import attrs

from tools.servers import ServerProcess, free_port, run_braid, stop, tiny_model_dir, wait_healthy

VERSION = "0.1.17"
"""The vllm-router release the tests run. Its ``power_of_two`` polls each worker's ``GET
/get_load`` for ``{"load": N}``, on an interval its start-up log names (5 s, not a flag)."""

BLOCK_SIZE = 128
"""vLLM's KV-cache block on its CPU build, in tokens: what ``kv_aware`` hashes prompts by."""


def _installed() -> str | None:
    try:
        return metadata.version("vllm-router")
    except metadata.PackageNotFoundError:
        return None


def router_binary() -> str:
    """The ``vllm-router`` executable of :data:`VERSION`; installs it with pip first if needed."""
    if _installed() != VERSION:
        argv = [sys.executable, "-m", "pip", "install", "--quiet", f"vllm-router=={VERSION}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or _installed() != VERSION:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    found = Path(sys.executable).parent / "vllm-router"
    if os.access(found, os.X_OK):
        return str(found)
    on_path = shutil.which("vllm-router")
    if on_path is None:
        raise RuntimeError("vllm-router is installed but its console script is not found")
    return on_path


@attrs.frozen
class Router:
    url: str
    policy: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def run_router(
    workers: Sequence[str],
    policy: str,
    log: Path,
    *extra: str,
    poll_interval: int = 1,
    timeout: float = 60.0,
) -> Iterator[Router]:
    """``vllm-router`` with ``policy`` in front of ``workers`` (their base URLs); ``poll_interval``:
    its ``--worker-startup-check-interval``. Stopped with SIGTERM (then killed) on exit."""
    binary = router_binary()
    port = free_port()
    argv = [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *workers,
        "--worker-startup-check-interval",
        str(poll_interval),
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "info",
        *extra,
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("vllm-router", proc, url, log, timeout)
        yield Router(url, policy, proc, log)
    finally:
        stop(proc)


@attrs.frozen
class Replicas:
    """braid replicas on the real engine (:func:`run_replicas`); the first ``len(event_ports)``
    publish their KV-cache events, replica ``i`` on ``event_ports[i]``."""

    servers: tuple[ServerProcess, ...]
    event_ports: tuple[int, ...]

    def kv_aware_args(self) -> list[str]:
        """The router's flags for ``kv_aware`` in front of the publishing replicas: each one's
        event endpoint, the engine's block size and the model's name (which vllm-router 0.1.17
        requires with static sources)."""
        argv = ["--kv-event-block-size", str(BLOCK_SIZE), "--kv-event-model", self.servers[0].model]
        for replica, port in zip(self.servers, self.event_ports, strict=False):
            argv += ["--kv-event-source", f"{replica.url}=tcp://127.0.0.1:{port}"]
        return argv


@contextmanager
def run_replicas(count: int, logs: Path, *args: str, publishers: int | None = None) -> Iterator[Replicas]:
    """``count`` braid replicas on the tiny model, started at once (three take about 30 s on 2
    cores, where one alone takes 20), each with ``args``; the first ``publishers`` (all by
    default) publish their KV-cache events on ZMQ. Logs go to ``logs/replicaI.log``."""
    ports = tuple(free_port() for _ in range(count if publishers is None else publishers))
    # vLLM's default topic (empty): vllm-router 0.1.17 credited no prefix from events published
    # under another (docs/deploy.md)
    events = [
        (
            "--kv-events-config",
            json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}),
        )
        for port in ports
    ]
    model = tiny_model_dir()
    with ExitStack() as stack, ThreadPoolExecutor(count) as pool:
        started = [
            pool.submit(
                stack.enter_context,
                run_braid(*args, *(events[i] if i < len(ports) else ()), model_dir=model, log=logs / f"replica{i}.log"),
            )
            for i in range(count)
        ]
        yield Replicas(tuple(f.result() for f in started), ports)


__all__ = ["BLOCK_SIZE", "VERSION", "Replicas", "Router", "router_binary", "run_replicas", "run_router"]
