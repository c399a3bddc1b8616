"""vLLM's metric families (``vllm:*``) on braid's /metrics, from the engine core's own statistics
(braid.engine.vllm_stats): their names, types and label names, and values that move."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import VllmServer

pytestmark = pytest.mark.vllm

Family = tuple[str, frozenset[str]]
"""A family's type and label names (a histogram's ``le`` left out)."""

REQUIRED: dict[str, Family] = {
    "vllm:num_requests_running": ("gauge", frozenset({"model_name", "engine"})),
    "vllm:num_requests_waiting": ("gauge", frozenset({"model_name", "engine"})),
    "vllm:kv_cache_usage_perc": ("gauge", frozenset({"model_name", "engine"})),
    "vllm:prefix_cache_queries": ("counter", frozenset({"model_name", "engine"})),
    "vllm:prefix_cache_hits": ("counter", frozenset({"model_name", "engine"})),
    "vllm:num_preemptions": ("counter", frozenset({"model_name", "engine"})),
    "vllm:prompt_tokens": ("counter", frozenset({"model_name", "engine"})),
    "vllm:generation_tokens": ("counter", frozenset({"model_name", "engine"})),
    "vllm:request_success": ("counter", frozenset({"model_name", "engine", "finished_reason"})),
    "vllm:time_to_first_token_seconds": ("histogram", frozenset({"model_name", "engine"})),
    "vllm:inter_token_latency_seconds": ("histogram", frozenset({"model_name", "engine"})),
    "vllm:e2e_request_latency_seconds": ("histogram", frozenset({"model_name", "engine"})),
    "vllm:request_queue_time_seconds": ("histogram", frozenset({"model_name", "engine"})),
}
"""The families issue 27 asks for, as vLLM's PrometheusStatLogger declares them."""


def families(url: str, prefix: str = "vllm:") -> dict[str, Family]:
    """The families a server's /metrics exposes whose names start with ``prefix``."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, Family] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(prefix):
            labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
            out[family.name] = (family.type, labels)
    return out


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and set(labels.items()) <= ls)


def test_vllm_families_under_vllm_names_with_vllms_types_and_labels(vllm_server: VllmServer) -> None:
    got = families(vllm_server.url)
    missing = {name: spec for name, spec in REQUIRED.items() if got.get(name) != spec}
    assert not missing, {name: (spec, got.get(name)) for name, spec in missing.items()}
    # braid's own families stay beside them
    assert "braid_admission_queued_requests" in families(vllm_server.url, "braid_")


def test_vllm_families_count_what_the_engine_did(vllm_server: VllmServer) -> None:
    url, model = vllm_server.url, vllm_server.model
    vllm_server.wait_engine_idle()
    before = samples(url)
    prompt = "The quick brown fox jumps over the lazy dog. " * 40  # several KV blocks
    body = {"model": model, "prompt": prompt, "max_tokens": 5, "ignore_eos": True}
    for _ in range(2):
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        assert any(line == "data: [DONE]" for line in r.iter_lines())
    vllm_server.wait_engine_idle()
    after = samples(url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    labels = {"model_name": model, "engine": "0"}
    assert moved("vllm:generation_tokens_total", **labels) == 15
    assert moved("vllm:prompt_tokens_total", **labels) >= 3 * 30
    assert moved("vllm:request_success_total", finished_reason="length", **labels) == 3
    # The same prompt three times: the second and third find its full blocks in the prefix cache.
    assert moved("vllm:prefix_cache_queries_total", **labels) > 0
    assert moved("vllm:prefix_cache_hits_total", **labels) > 0
    for hist in ("e2e_request_latency_seconds", "request_queue_time_seconds", "time_to_first_token_seconds"):
        assert moved(f"vllm:{hist}_count", **labels) == 3, hist
    assert moved("vllm:inter_token_latency_seconds_count", **labels) == 3 * 4
    # Idle again: nothing running, nothing waiting (in the engine or in braid's admission).
    assert value(after, "vllm:num_requests_running", **labels) == 0
    assert value(after, "vllm:num_requests_waiting", **labels) == 0
