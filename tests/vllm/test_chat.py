"""Chat on the real engine: the tiny model's chat template, through the official openai client."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.helpers import VllmServer, parse_sse

pytestmark = pytest.mark.vllm

MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]


def test_the_prompt_is_the_models_template(vllm_server: VllmServer) -> None:
    """prompt_tokens is the length of the template's text tokenized without special tokens."""
    from transformers import AutoTokenizer

    from tools.servers import tiny_model_dir

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n")
    r = httpx.post(
        vllm_server.url + "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "return_token_ids": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])


def test_openai_client_chat_streamed_and_not(vllm_server: VllmServer) -> None:
    # Each answer is checked against itself: two requests need not sample alike, greedy or seeded
    # (docs/architecture.md, "What a test of the real engine may assume").
    client = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)
    done = client.chat.completions.create(model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=0)
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert done.usage is not None
    assert done.usage.completion_tokens == 8 or choice.finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model=vllm_server.model,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant"
    finishes = [d.finish_reason for d in deltas if d.finish_reason]
    assert finishes in (["stop"], ["length"]) and deltas[-1].finish_reason == finishes[0]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens == done.usage.prompt_tokens
    assert usage.completion_tokens == 8 if finishes == ["length"] else 1 <= usage.completion_tokens <= 8
    assert "".join(d.delta.content or "" for d in deltas) or finishes == ["stop"]
    two = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7, n=2
    )
    assert [c.index for c in two.choices] == [0, 1] and all(c.message.role == "assistant" for c in two.choices)
    assert two.usage is not None and two.usage.completion_tokens <= 16
    vllm_server.wait_engine_idle()


def test_batched_chat_streams_with_n(vllm_server: VllmServer) -> None:
    # Sampled: the stream is a request of its own, checked against itself and against the whole
    # answer on shape only (two requests with one seed need not sample alike).
    convs = [[{"role": "user", "content": t}] for t in ("import os", "class A:", "for i in")]
    body = {"messages": convs, "max_tokens": 5, "temperature": 1.0, "seed": 1, "n": 2}
    whole = httpx.post(vllm_server.url + "/v1/chat/completions/batch", json=body, timeout=60).json()
    assert [c["index"] for c in whole["choices"]] == list(range(6))
    r = httpx.post(
        vllm_server.url + "/v1/chat/completions/batch",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=60,
    )
    events = parse_sse(r.content)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    usage = events[-2]["usage"]
    roles: dict[int, int] = {}
    finishes: dict[int, str] = {}
    for e in events[:-2]:
        (c,) = e["choices"]
        i = c["index"]
        assert i not in finishes, "nothing after a choice's finish_reason"
        roles[i] = roles.get(i, 0) + (c["delta"].get("role") == "assistant")
        if c["finish_reason"]:
            finishes[i] = c["finish_reason"]
    assert roles == dict.fromkeys(range(6), 1)
    assert set(finishes) == set(range(6)) and set(finishes.values()) <= {"stop", "length"}
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"] and usage["completion_tokens"] <= 6 * 5
    vllm_server.wait_engine_idle()


def test_openai_client_response_format_json_schema_parses(vllm_server: VllmServer) -> None:
    """A bounded schema with no place for whitespace: left to itself the tiny model fills the
    JSON grammar's optional whitespace (after a key, after a colon) with newlines or spaces
    until max_tokens, even with vLLM's ``disable_any_whitespace`` (tried: the same on vLLM's
    own server, which shares the engine). A string enum has no such place."""
    import json

    schema = {"type": "string", "enum": ["yes", "no", "maybe"]}
    client = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)
    for stream in (False, True):
        kwargs: dict[str, Any] = {
            "model": vllm_server.model,
            "messages": MESSAGES,
            "max_tokens": 16,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
        }
        if stream:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(**kwargs, stream=True)
                if c.choices
            )
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        assert json.loads(text) in ("yes", "no", "maybe"), text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=vllm_server.model,
            messages=MESSAGES,
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )
