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
    client = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)
    done = client.chat.completions.create(model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=0)
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == choice.message.content
    two = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7, n=2
    )
    again = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7, n=2
    )
    assert [c.message.content for c in two.choices] == [c.message.content for c in again.choices]
    vllm_server.wait_engine_idle()


def test_batched_chat_streams_with_n(vllm_server: VllmServer) -> None:
    convs = [[{"role": "user", "content": t}] for t in ("import os", "class A:", "for i in")]
    body = {"messages": convs, "max_tokens": 5, "temperature": 1.0, "seed": 1, "n": 2}
    whole = httpx.post(vllm_server.url + "/v1/chat/completions/batch", json=body, timeout=60).json()
    assert [c["index"] for c in whole["choices"]] == list(range(6))
    r = httpx.post(vllm_server.url + "/v1/chat/completions/batch", json={**body, "stream": True}, timeout=60)
    events = parse_sse(r.content)
    texts: dict[int, str] = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["delta"].get("content", "")
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
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
