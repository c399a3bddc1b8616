"""vLLM's own router (``vllm-router``, a Rust binary in a PyPI wheel) in front of braid replicas,
for the deployment tests (tests/deploy/test_router.py).

:func:`router_binary` finds the ``vllm-router`` console script beside this interpreter, installing
the pinned wheel (:data:`VERSION`) with this interpreter's pip when it is missing or another
version; :func:`run_router` starts it on a free loopback port in front of the given workers, waits
until it answers, and stops it on exit. Its Prometheus exporter gets a free port too (its default,
29000, would make two routers collide).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import attrs

from tools.servers import free_port, stop, wait_healthy

VERSION = "0.1.17"
"""The vllm-router release the tests run. Its ``power_of_two`` polls each worker's ``GET
/get_load`` for ``{"load": N}``, on an interval its start-up log names (5 s, not a flag)."""


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


__all__ = ["VERSION", "Router", "router_binary", "run_router"]
