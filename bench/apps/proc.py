"""Start one benchmark server as a child process, wait until it answers, stop it on exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.common import ROOT
from tools.servers import stop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(
    name: str, module_argv: Sequence[str], port: int, *, cpu: int | None, health: str = "/health", timeout: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m <module_argv>`` (pinned to ``cpu`` with taskset when given), healthy on ``health``.

    The child's output goes to /tmp/bench-<name>.log. On exit it gets SIGTERM, then SIGKILL
    after 10 s. The yielded process's pid is the Python server itself (taskset execs it).
    """
    argv = [sys.executable, "-m", *module_argv]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    log = Path(f"/tmp/bench-{name}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} before answering; see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer {health} within {timeout:g} s; see {log}")
            time.sleep(0.1)
        yield proc
    finally:
        stop(proc)
