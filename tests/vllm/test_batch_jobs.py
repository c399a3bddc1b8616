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


FORCED = {"structured_outputs": {"regex": "def f\\(\\): pass"}}
"""Text the grammar fixes: the one text two requests may be expected to share (docs/architecture.md,
"What a test of the real engine may assume"); the others are compared on what braid controls."""


def _shape(body: dict[str, Any]) -> tuple[object, ...]:
    choices = body["choices"]
    return (len(choices), [c["index"] for c in choices], [c["finish_reason"] for c in choices], body["usage"])


def test_a_job_answers_each_line_as_the_route_answers_it(vllm_server: VllmServer) -> None:
    """Lines (a prompt list among them) get in the output file what the same bodies get from the
    routes directly: the same shape, finish reasons and usage (``ignore_eos`` fixes the lengths),
    and the same text where a grammar fixes it; the engine is left with nothing (about 5 s)."""
    url, model = vllm_server.url, vllm_server.model
    plain = {"model": model, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    bodies: list[tuple[str, dict[str, Any]]] = [("/v1/completions", {**plain, "prompt": p}) for p in PROMPTS]
    bodies.append(("/v1/completions", {**plain, "prompt": PROMPTS[:3], "max_tokens": 6}))
    bodies.append(("/v1/completions", {**plain, "prompt": PROMPTS[0], "max_tokens": 32, "ignore_eos": False, **FORCED}))
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
        if "structured_outputs" in body:
            assert [c["text"] for c in answered["body"]["choices"]] == ["def f(): pass"]
            assert [c["text"] for c in direct["choices"]] == ["def f(): pass"]
            assert answered["body"]["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        else:
            assert _shape(answered["body"]) == _shape(direct), i
    vllm_server.wait_engine_idle(within=10)


def test_chat_lines_on_the_real_engine(vllm_server: VllmServer) -> None:
    url, model = vllm_server.url, vllm_server.model
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 32,
        "temperature": 0,
        **FORCED,
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
    answered = row["response"]["body"]
    assert answered["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"] == "def f(): pass"
    assert answered["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
