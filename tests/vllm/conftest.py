"""One real braid server on vLLM, shared by the whole vLLM tier (engine starts cost 15-40 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import attrs
import httpx
import pytest

from tests.test_cli import _free_port


@attrs.frozen
class VllmServer:
    url: str
    model: str
    pid: int

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"metric {name} not exposed")

    def wait_engine_idle(self, within: float = 5.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < within:
            if self.metric("braid_engine_requests_in_flight") == 0 and self.metric("braid_engine_unfinished_requests") == 0:
                return time.monotonic() - start
            time.sleep(0.01)
        raise AssertionError(
            f"engine not idle after {within} s: braid in flight {self.metric('braid_engine_requests_in_flight')}, "
            f"vLLM unfinished {self.metric('braid_engine_unfinished_requests')}"
        )


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    port = _free_port()
    log = open(os.environ.get("BRAID_VLLM_LOG", "/tmp/braid-vllm-tier.log"), "wb")
    # No --model: the default tiny model is built (once per machine, cached) and served.
    proc = subprocess.Popen(
        [sys.executable, "-m", "braid", "serve", "--engine", "vllm", "--port", str(port), "--fault-hooks",
         "--seed", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"braid serve --engine vllm exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"braid serve --engine vllm did not start in 600 s; see {log.name}")
        time.sleep(0.5)
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    yield VllmServer(url, model, proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
