"""The ``/v1/responses`` cases sent to braid and to vLLM's own server (issue 31 §5).

Greedy unless a case is about sampling (then seeded). The tiny model writes no tool call or
reasoning by itself, so those cases force the text with a ``structured_outputs`` regex, which
vLLM's Responses route takes too: pythonic calls (``[get_weather(city='Paris')]``) for the tool
parser, and gemma4's channel markers for the reasoning parser (both servers run tools/servers.py's
TOOL_FLAGS).
"""

from __future__ import annotations

from typing import Any

from tests.parity.matrix import MODEL, Case

PATH = "/v1/responses"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = {"regex": r"\[get_weather\(city='Paris'\)\]"}
TWO_CALLS = {"regex": r"\[get_weather\(city='Paris'\), get_weather\(city='Rome'\)\]"}
THINK = r"<\|channel>thought" + "\n"  # gemma4's opener; its markers are plain text to the tiny model
THOUGHT = {"regex": THINK + r"Weather\.<channel\|>Sunny"}
THOUGHT_THEN_CALL = {"regex": THINK + r"Weather\.<channel\|>\[get_weather\(city='Paris'\)\]"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
]


def _r(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "input": "Hello there", "max_output_tokens": 8, "temperature": 0}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(name: str, group: str, body: Any, **kw: Any) -> None:
        c.append(Case("responses " + name, "responses " + group, body, path=PATH, **kw))

    for stream in (False, True):
        s = " streamed" if stream else ""
        st = True if stream else _DROP
        add("string input" + s, "whole" if not stream else "stream", _r(stream=st))
        add(
            "tool call" + s,
            "tools",
            _r(input="Weather in Paris?", tools=[WEATHER], structured_outputs=CALL, max_output_tokens=30, stream=st),
        )
        add(
            "two tool calls" + s,
            "tools",
            _r(input="Weather?", tools=[WEATHER], structured_outputs=TWO_CALLS, max_output_tokens=60, stream=st),
        )
        add(
            "named tool_choice" + s,
            "tools",
            _r(
                input="Hi",
                tools=[WEATHER],
                max_output_tokens=30,
                stream=st,
                tool_choice={"type": "function", "name": "get_weather"},
            ),
        )
        add("reasoning" + s, "reasoning", _r(input="Hi", structured_outputs=THOUGHT, max_output_tokens=40, stream=st))
        add(
            "reasoning hidden" + s,
            "reasoning",
            _r(input="Hi", structured_outputs=THOUGHT, max_output_tokens=40, include_reasoning=False, stream=st),
        )
        add(
            "reasoning then a call" + s,
            "reasoning",
            _r(
                input="Weather?", tools=[WEATHER], stream=st, structured_outputs=THOUGHT_THEN_CALL, max_output_tokens=60
            ),
        )
        add(
            "text.format json_schema" + s,
            "structured",
            _r(
                input="Hi",
                max_output_tokens=30,
                stream=st,
                text={"format": {"type": "json_schema", "name": "x", "strict": True, "schema": SCHEMA}},
            ),
        )
        add(
            "text.format json_object" + s,
            "structured",
            _r(input="Hi", max_output_tokens=20, stream=st, text={"format": {"type": "json_object"}}),
        )
        add(
            "logprobs" + s,
            "logprobs",
            _r(input="Hi", max_output_tokens=4, stream=st, top_logprobs=2, include=["message.output_text.logprobs"]),
            deviation="responses_stream_logprobs" if stream else None,
        )
        add("function call history" + s, "items", _r(input=HISTORY, tools=[WEATHER], stream=st))
        add(
            "instructions and echoed fields" + s,
            "whole" if not stream else "stream",
            _r(instructions="Be brief", metadata={"k": "v"}, user="u1", reasoning={"effort": "low"}, stream=st),
        )
    # -- whole responses and their fields
    add("required tool_choice", "tools", _r(input="Hi", tools=[WEATHER], tool_choice="required", max_output_tokens=30))
    add("tool_choice none with tools", "tools", _r(input="hi", tools=[WEATHER], tool_choice="none"))
    add(
        "parallel_tool_calls false",
        "tools",
        _r(
            input="Weather?",
            tools=[WEATHER],
            structured_outputs=TWO_CALLS,
            max_output_tokens=60,
            parallel_tool_calls=False,
        ),
    )
    add("text.format text", "structured", _r(text={"format": {"type": "text"}}, max_output_tokens=5))
    add("text.verbosity only", "structured", _r(text={"verbosity": "low"}, max_output_tokens=5))
    add("structured_outputs regex", "structured", _r(structured_outputs={"regex": "[a-c]{3}"}))
    add("seeded sampling", "whole", _r(temperature=0.9, seed=5))
    add("stop string", "whole", _r(input="Hi", stop=["#"], max_output_tokens=20))
    add("no max_output_tokens", "whole", _r(input="Hi", max_output_tokens=_DROP, stop=["\n"]))
    add("store false", "whole", _r(store=False))
    add("truncation auto", "whole", _r(truncation="auto"))
    add("service_tier flex", "whole", _r(service_tier="flex"))
    add("max_tool_calls echoed", "whole", _r(max_tool_calls=2))
    add("request_id names the response", "whole", _r(request_id="resp_mine"))
    add("unknown field ignored", "whole", _r(frobnicate=1))
    add("top_logprobs without include", "logprobs", _r(top_logprobs=5, max_output_tokens=3))
    # -- input items
    add(
        "input_text parts",
        "items",
        _r(
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hello"}, {"type": "input_text", "text": "there"}],
                }
            ]
        ),
    )
    add(
        "assistant history",
        "items",
        _r(
            input=[
                {"role": "user", "content": "Hi"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
                {"role": "user", "content": "Again"},
            ]
        ),
    )
    add(
        "developer message",
        "items",
        _r(input=[{"role": "developer", "content": "Be nice"}, {"role": "user", "content": "Hi"}]),
    )
    add(
        "reasoning item in history",
        "items",
        _r(
            input=[
                {"role": "user", "content": "Hi"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
                {"role": "user", "content": "More"},
            ]
        ),
    )
    add(
        "in-progress assistant message is continued",
        "items",
        _r(
            input=[
                {"role": "user", "content": "Hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [{"type": "output_text", "text": "Hello, my"}],
                },
            ],
            max_output_tokens=6,
        ),
    )
    # -- errors
    add("missing input", "errors", {"model": MODEL, "max_output_tokens": 8})
    add("input a number", "errors", _r(input=5))
    add("empty input list", "errors", _r(input=[]))
    add("unknown item type", "errors", _r(input=[{"type": "bogus"}]))
    add("item not an object", "errors", _r(input=["hi"]))
    add("message without role", "errors", _r(input=[{"type": "message", "content": "hi"}]))
    add("function_call without arguments", "errors", _r(input=[{"type": "function_call", "call_id": "c", "name": "f"}]))
    add("unknown model", "errors", _r(model="nope"))
    add("unknown model streamed", "errors", _r(model="nope", stream=True))
    add("required without tools", "errors", _r(tool_choice="required"))
    add("named function not in tools", "errors", _r(tools=[WEATHER], tool_choice={"type": "function", "name": "g"}))
    add("tool without a name", "errors", _r(tools=[{"type": "function", "parameters": {}}]))
    add(
        "non-function tool",
        "errors",
        _r(tools=[{"type": "web_search_preview"}], max_output_tokens=4),
        deviation="responses_function_tools_only",
    )
    add("text.format of an unknown type", "errors", _r(text={"format": {"type": "xml"}}))
    add("json_schema without a schema", "errors", _r(text={"format": {"type": "json_schema", "name": "x"}}))
    add(
        "text.format with structured_outputs",
        "errors",
        _r(text={"format": {"type": "json_object"}}, structured_outputs={"regex": "a"}),
    )
    add("prompt template", "errors", _r(prompt={"id": "p"}))
    add("background", "stored", _r(background=True))
    add("background streamed", "stored", _r(background=True, stream=True))
    add("background without store", "errors", _r(background=True, store=False))
    add("unknown previous_response_id", "errors", _r(previous_response_id="resp_x"))
    add("reasoning effort unknown", "errors", _r(reasoning={"effort": "huge"}))
    add("include unknown", "errors", _r(include=["nope"]))
    add("top_logprobs over the cap", "errors", _r(top_logprobs=30, include=["message.output_text.logprobs"]))
    add("max_output_tokens 0", "errors", _r(max_output_tokens=0))
    add("max_output_tokens over the context", "errors", _r(max_output_tokens=100000))
    add("temperature 3", "errors", _r(temperature=3))
    add("temperature a string", "errors", _r(temperature="x"))
    add("input too long", "errors", _r(input="word " * 1500))
    add("not JSON", "errors", b"notjson")
    add("not application/json", "errors", _r(), content_type="text/plain")
    return c


RESPONSES_CASES = _cases()
