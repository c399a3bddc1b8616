"""The shared vLLM tier server's last test: it kills the engine. Its file sorts after every other
module of tests/vllm (pytest runs them in name order), so no test runs on a dead engine."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.helpers import VllmServer

pytestmark = pytest.mark.vllm


def test_zz_a_dead_engine_fails_health_and_new_requests(vllm_server: VllmServer) -> None:
    """/health and new completions answer 503 once the engine has died."""
    children = subprocess.run(["pgrep", "-P", str(vllm_server.pid)], capture_output=True, text=True).stdout.split()
    assert children, "vLLM's EngineCore process was not found"
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while httpx.get(vllm_server.url + "/health").status_code != 503:
        assert time.monotonic() < deadline, "/health still 200 after the engine died"
        time.sleep(0.1)
    r = httpx.post(vllm_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"
