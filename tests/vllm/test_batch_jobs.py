"""A batch job on the real engine: the tier's shared braid server (its store is the session's,
tests/conftest.py), the `openai` client, completions and chat lines, answers as a client's."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import httpx
import openai

from tests.helpers import VllmServer

PROMPTS = ["def main(", "import os", "class A:", "for i in range(", "return x"]


def _wait(client: openai.OpenAI, batch_id: str, within: float = 120.0) -> Any:
    deadline = time.monotonic() + within
    while (job := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_a_job_answers_each_line_as_the_route_answers_it(vllm_server: VllmServer) -> None:
    """Greedy lines (a prompt list among them, and chat) get in the output file exactly what the
    same bodies get from the routes directly; the engine is left with nothing (about 5 s)."""
    url, model = vllm_server.url, vllm_server.model
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"model": model, "prompt": p, "max_tokens": 8, "temperature": 0}) for p in PROMPTS
    ]
    bodies.append(("/v1/completions", {"model": model, "prompt": PROMPTS[:3], "max_tokens": 6, "temperature": 0}))
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": u, "body": b} for i, (u, b) in enumerate(bodies)]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    source = client.files.create(
        file=("in.jsonl", io.BytesIO("\n".join(json.dumps(line) for line in lines).encode())), purpose="batch"
    )
    job = _wait(
        client, client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h").id
    )
    assert job.status == "completed" and job.request_counts is not None
    assert (job.request_counts.completed, job.request_counts.failed) == (len(lines), 0) and job.error_file_id is None
    rows = {r["custom_id"]: r for r in map(json.loads, client.files.content(job.output_file_id).text.splitlines())}
    for i, (route, body) in enumerate(bodies):
        direct = httpx.post(url + route, json=body, timeout=60).json()
        answered = rows[f"c{i}"]["response"]
        assert answered["status_code"] == 200
        assert [c["text"] for c in answered["body"]["choices"]] == [c["text"] for c in direct["choices"]], i
        assert answered["body"]["usage"] == direct["usage"]
    vllm_server.wait_engine_idle(within=10)


def test_chat_lines_on_the_real_engine(vllm_server: VllmServer) -> None:
    url, model = vllm_server.url, vllm_server.model
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    line = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": body}
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    source = client.files.create(file=("c.jsonl", io.BytesIO(json.dumps(line).encode())), purpose="batch")
    job = _wait(
        client,
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    assert job.status == "completed", job
    (row,) = map(json.loads, client.files.content(job.output_file_id).text.splitlines())
    direct = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    assert row["response"]["body"]["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
