"""Admission on the real engine (the tier's shared braid server, default admission settings)."""

from __future__ import annotations

import random
import threading
import time

import httpx

from tests.helpers import VllmServer


def test_a_small_request_starts_beside_a_large_batch(vllm_server: VllmServer) -> None:
    """A 1-prompt stream sent while another client's 512-prompt batch runs gets its first token
    long before the batch ends (without admission it waited behind all 512 in vLLM's queue), and
    braid never grants more slots than it has; only prompts in their last tokens, whose slots
    went on to the next prompts (Settings.handover_tokens), are in the engine beyond them."""
    rnd = random.Random(7)
    prompts = [[rnd.randrange(10, 2000) for _ in range(32)] for _ in range(512)]
    url, model = vllm_server.url, vllm_server.model
    assert vllm_server.metric("braid_admission_slots_in_use") == 0
    result: dict[str, float] = {}
    done = threading.Event()
    peak = [0.0]
    peak_slots = [0.0]

    def batch() -> None:
        t0 = time.perf_counter()
        body = {"model": model, "prompt": prompts, "max_tokens": 64, "ignore_eos": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200 and len(r.json()["choices"]) == 512
        result["batch"] = time.perf_counter() - t0
        done.set()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], vllm_server.metric("braid_engine_requests_in_flight"))
            peak_slots[0] = max(peak_slots[0], vllm_server.metric("braid_admission_slots_in_use"))
            time.sleep(0.02)

    threads = [threading.Thread(target=batch), threading.Thread(target=poll)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if "small" not in result and line.startswith("data: {"):
                result["small"] = time.perf_counter() - t0
    small_done = time.perf_counter()
    for t in threads:
        t.join()
    # Relative, so a slow machine does not flake it: the small request is served while the batch
    # is still far from done.
    assert result["small"] < 0.25 * result["batch"], result
    assert small_done - t0 < 0.5 * result["batch"], result
    # The tier's engine runs the tiny model's 64 sequences plus braid's reserve of 4; a wave of
    # the batch near its end may have handed its slots on already, waiting in the engine's queue.
    assert 0 < peak_slots[0] <= 68, peak_slots
    assert 0 < peak[0] <= 68 + 64, peak
    vllm_server.wait_engine_idle()
    assert vllm_server.metric("braid_admission_slots_in_use") == 0
    assert vllm_server.metric("braid_admission_queued_requests") == 0
