"""Anthropic's own client (the ``anthropic`` package) against braid on the real engine (issue 31
§5): ``messages.create`` and ``messages.stream``, text and a forced tool call, parsed by the
client's own models. One shared server (the tier's ``vllm_server``, pythonic's tool parser);
about 5 s of engine time in all. The key sent as ``x-api-key`` is checked on the scripted engine
(tests/http/test_anthropic.py), since the tier's shared server has no keys."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import pytest

from tests.helpers import VllmServer

pytestmark = pytest.mark.vllm

T = TypeVar("T")

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def client(server: VllmServer) -> anthropic.Anthropic:
    # The client adds /v1/messages to the base URL; its key goes out as x-api-key (unchecked here).
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def test_create_and_stream_agree(vllm_server: VllmServer) -> None:
    c = client(vllm_server)
    kwargs: dict[str, Any] = {
        "model": vllm_server.model,
        "max_tokens": 12,
        "extra_body": {"temperature": 0},  # this client version has no temperature argument
        "system": "You write Python.",
        "messages": [{"role": "user", "content": "def parse(self, data):"}],
    }
    message = c.messages.create(**kwargs)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 12
    (block,) = message.content
    assert block.type == "text" and block.text
    # Two requests need not sample alike (docs/architecture.md, "What a test of the real engine
    # may assume"): the stream is checked against itself, and against the whole answer on shape.
    with c.messages.stream(**kwargs) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    (streamed,) = final.content
    assert streamed.type == "text" and "".join(texts) == streamed.text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    assert final.usage.input_tokens == message.usage.input_tokens
    counted = c.messages.count_tokens(model=vllm_server.model, system=kwargs["system"], messages=kwargs["messages"])
    assert counted.input_tokens == message.usage.input_tokens


def _first_closing_seed(run: Callable[[dict[str, Any]], T], kwargs: dict[str, Any]) -> T:
    """``run(kwargs)`` with the first of a few seeds whose sampled call closes within max_tokens.

    Greedy, the tiny model may write whitespace inside the call until max_tokens (its weights
    differ in the last bits from one kind of CPU to another, and so does where greedy goes).
    Sampled with a seed (a braid extension of the body), it closes the call within 256 tokens for
    nearly every seed. Each request finds its own seed: two requests with one seed need not
    sample alike."""
    for seed in range(8):
        kwargs["extra_body"] = {"temperature": 1, "seed": seed}  # this client version has no such arguments
        try:
            return run(kwargs)
        except anthropic.APIError as err:
            assert "ended before its arguments were whole JSON" in str(err), err
    pytest.fail("no seed of eight closed the forced call within 256 tokens")


def _streamed(c: anthropic.Anthropic, kwargs: dict[str, Any]) -> tuple[anthropic.types.Message, str]:
    """The stream's final message, and the call's arguments as the stream's deltas wrote them."""
    parts = []
    with c.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                parts.append(event.delta.partial_json)
        return stream.get_final_message(), "".join(parts)


def test_a_forced_tool_call_whole_and_streamed(vllm_server: VllmServer) -> None:
    c = client(vllm_server)
    kwargs: dict[str, Any] = {
        "model": vllm_server.model,
        "max_tokens": 256,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "def parse(self, data):"}],
    }
    message = _first_closing_seed(lambda kw: c.messages.create(**kw), kwargs)
    calls = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use", message
    (call,) = calls
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Oslo")
    # The stream is a request of its own: it is checked against its own deltas, not the call above.
    final, arguments = _first_closing_seed(lambda kw: _streamed(c, kw), kwargs)
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.name == "get_weather" and streamed.input["city"] in ("Paris", "Oslo")
    assert json.loads(arguments) == streamed.input
    assert final.stop_reason == "tool_use"
    # the result goes back in Anthropic's shape, and the conversation goes on
    follow = c.messages.create(
        **{
            **kwargs,
            "tool_choice": {"type": "none"},
            "max_tokens": 4,
            "messages": [
                *kwargs["messages"],
                {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
            ],
        }
    )
    assert follow.stop_reason == "max_tokens" and follow.usage.input_tokens > message.usage.input_tokens


def test_errors_reach_the_client_as_its_exceptions(vllm_server: VllmServer) -> None:
    c = client(vllm_server)
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(model=vllm_server.model, max_tokens=0, messages=[{"role": "user", "content": "Hi"}])
