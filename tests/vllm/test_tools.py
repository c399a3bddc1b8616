"""Tool calls on the real engine, through the ``openai`` package (issue 26 §7, §9).

The tier's braid runs pythonic's tool parser (tools/servers.py TOOL_FLAGS). The tiny model cannot
choose a tool, but ``tool_choice: "required"`` or a named function make braid pass the parser's
JSON schema to vLLM's structured output, so the model writes a call that parses: the calls here
are real model output, forced, parsed by vLLM's parser through braid. README's example is the
first test.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.helpers import VllmServer, no_whitespace

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        # an enum, so that the tiny model's forced arguments end: a free string it may write for ever
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def client(server: VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)


def test_readme_required_call(vllm_server: VllmServer) -> None:
    reply = client(vllm_server).chat.completions.create(
        model=vllm_server.model,
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
        logit_bias=no_whitespace(),
    )
    choice = reply.choices[0]
    # "required" is one call or more (vLLM's schema: an array of at least one); how many the tiny
    # model writes depends on its weights, which differ from one kind of CPU to another
    calls = choice.message.tool_calls or []
    assert calls
    for call in calls:
        assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert choice.finish_reason == "tool_calls" and choice.message.content in ("", None)


def test_a_named_function_is_called_and_finishes_with_stop(vllm_server: VllmServer) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    c = client(vllm_server)
    reply = c.chat.completions.create(
        model=vllm_server.model,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice=named,
        max_tokens=200,
        temperature=0,
        logit_bias=no_whitespace(),
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert reply.choices[0].finish_reason == "stop"  # vLLM's rule for a named function

    # streamed: a request of its own (two greedy runs need not agree across requests), checked on
    # its own: the openai package's accumulation of the deltas gives a whole call of the schema
    with c.chat.completions.stream(
        model=vllm_server.model,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice=named,
        max_tokens=200,
        temperature=0,
        logit_bias=no_whitespace(),
    ) as stream:
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls or []
    assert streamed.function.name == "get_weather" and json.loads(streamed.function.arguments)["city"] in (
        "Paris",
        "Oslo",
    )
    assert final.choices[0].finish_reason == "stop"


def test_required_streamed_with_usage_and_n(vllm_server: VllmServer) -> None:
    c = client(vllm_server)
    events = list(
        c.chat.completions.create(
            model=vllm_server.model,
            messages=USER,
            tools=[WEATHER, TIME],
            tool_choice="required",
            max_tokens=300,
            logit_bias=no_whitespace(),
            n=2,
            temperature=1.0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert events[-1].usage is not None and events[-1].choices == []
    calls: dict[int, dict[int, list[str]]] = {0: {}, 1: {}}
    finish: dict[int, str | None] = {}
    for e in events[:-1]:
        for ch in e.choices:
            for piece in ch.delta.tool_calls or []:
                parts = calls[ch.index].setdefault(piece.index, ["", ""])
                if piece.function and piece.function.name:
                    parts[0] = piece.function.name
                parts[1] += (piece.function.arguments if piece.function else None) or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    for index in (0, 1):
        assert calls[index], f"choice {index} called nothing"
        for name, arguments in calls[index].values():
            assert name in ("get_weather", "get_time") and isinstance(json.loads(arguments), dict)
    assert finish == {0: "tool_calls", 1: "tool_calls"}


def test_auto_lets_the_model_answer_in_text(vllm_server: VllmServer) -> None:
    reply = client(vllm_server).chat.completions.create(
        model=vllm_server.model, messages=USER, tools=[WEATHER], max_tokens=8, temperature=0
    )
    choice = reply.choices[0]
    assert not choice.message.tool_calls and choice.message.content  # the tiny model writes Python
    assert choice.finish_reason in ("stop", "length")


def test_a_tool_result_goes_back_and_is_answered(vllm_server: VllmServer) -> None:
    # the two-step loop an agent runs: call, send the result back, get an answer
    c = client(vllm_server)
    first = c.chat.completions.create(
        model=vllm_server.model,
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
        logit_bias=no_whitespace(),
    )
    message = first.choices[0].message
    calls = message.tool_calls or []  # one or more (see test_readme_required_call)
    assert calls
    history: list[Any] = [
        *USER,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"} for call in calls),
    ]
    second = c.chat.completions.create(model=vllm_server.model, messages=history, tools=[WEATHER], max_tokens=8)
    assert second.choices[0].message.content is not None and not second.choices[0].message.tool_calls
