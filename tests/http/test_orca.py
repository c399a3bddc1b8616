"""The ORCA load report (braid.http.orca): ``endpoint-load-metrics`` on whole answers that ask for it."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, Gauge

from braid.http.orca import load_header
from braid.metrics import EngineFamilies, Metrics
from tests.helpers import start_server

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


def vllm_like_metrics(waiting: float, kv: float, queued: float) -> Metrics:
    """Metrics forwarding a registry holding vLLM's two gauges, in vLLM's order of registration."""
    registry = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    Gauge("vllm:num_requests_waiting", "", list(labels), registry=registry).labels(**labels).set(waiting)
    Gauge("vllm:num_requests_running", "", list(labels), registry=registry).labels(**labels).set(5)
    Gauge("vllm:kv_cache_usage_perc", "", list(labels), registry=registry).labels(**labels).set(kv)
    m = Metrics()
    m.track_admission(lambda: 0, lambda: queued)
    m.track_engine(EngineFamilies(registry, "vllm:", "vllm:num_requests_waiting"), lambda: queued)
    return m


def test_the_report_names_vllms_figures_with_the_admission_queue_added() -> None:
    m = vllm_like_metrics(waiting=2, kv=0.25, queued=3)
    assert load_header("text", m) == (
        (
            "endpoint-load-metrics",
            "TEXT named_metrics.num_requests_waiting=5.0, named_metrics.kv_cache_usage_perc=0.25",
        ),
    )
    ((name, value),) = load_header("JSON", m)
    assert name == "endpoint-load-metrics" and value.startswith("JSON ")
    assert json.loads(value.removeprefix("JSON ")) == {
        "named_metrics": {"num_requests_waiting": 5.0, "kv_cache_usage_perc": 0.25}
    }


@pytest.mark.parametrize("fmt", [None, "", "xml", "text "])
def test_no_report_for_a_format_vllm_does_not_know(fmt: str | None) -> None:
    assert load_header(fmt, vllm_like_metrics(0, 0, 0)) == ()


async def test_whole_answers_of_completions_chat_and_invocations_carry_it(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    ask = {"endpoint-load-metrics-format": "text"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        for path, body in (
            ("/v1/completions", COMPLETION),
            ("/v1/chat/completions", CHAT),
            ("/invocations", CHAT),
            ("/invocations", COMPLETION),
        ):
            r = await c.post(path, json=body, headers=ask)
            # the scripted engine keeps no vLLM families: admission's queue alone
            assert r.status_code == 200 and r.headers["endpoint-load-metrics"] == (
                "TEXT named_metrics.num_requests_waiting=0.0"
            ), path
            r = await c.post(path, json=body, headers={"endpoint-load-metrics-format": "json"})
            assert r.headers["endpoint-load-metrics"] == 'JSON {"named_metrics": {"num_requests_waiting": 0.0}}'
            assert "endpoint-load-metrics" not in (await c.post(path, json=body)).headers
            async with c.stream("POST", path, json={**body, "stream": True}, headers=ask) as s:
                assert s.status_code == 200 and "endpoint-load-metrics" not in s.headers
                await s.aread()
        # not on errors, nor on the batch route (as vLLM)
        r = await c.post("/v1/completions", json={"prompt": []}, headers=ask)
        assert r.status_code == 400 and "endpoint-load-metrics" not in r.headers
        batch = {"messages": [CHAT["messages"]], "max_tokens": 2}
        r = await c.post("/v1/chat/completions/batch", json=batch, headers=ask)
        assert r.status_code == 200 and "endpoint-load-metrics" not in r.headers
    server.shutdown.set()
