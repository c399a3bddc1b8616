"""The ``/v1/messages`` cases of the parity tier (issue 31 §5), sent to braid and to vLLM's own
server as the rest of the matrix is (tests/parity/matrix.py), compared by
tests/parity/test_messages_parity.py. Greedy throughout: Anthropic's body has no ``seed``.

The tool cases run pythonic's parser on both servers (tools/servers.py TOOL_FLAGS); the tiny
model never chooses a tool itself, so the calls are forced (``any``, a named tool), which both
servers turn into the same structured output. Their schemas are enums, so a call ends early.
"""

from __future__ import annotations

from typing import Any

from tests.parity.matrix import MODEL, Case

PATH = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
TEXT = "def parse(self, data):"
USER = [{"role": "user", "content": TEXT}]
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
TIME = {"name": "get_time", "input_schema": {"properties": {"zone": {"type": "string", "enum": ["UTC"]}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "sunny, 21 C"}]},
            {"type": "text", "text": "And now?"},
        ],
    },
]


def _msg(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": USER} | fields


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(name: str, body: Any, *, path: str = PATH, **kw: Any) -> None:
        c.append(Case(f"messages: {name}", "messages", body, path=path, **kw))

    for stream in (False, True):
        s = ", streamed" if stream else ""
        add(f"text{s}", _msg(stream=stream))
        add(f"system string{s}", _msg(system="You write Python.", stream=stream))
        add(f"stop_sequences{s}", _msg(stop_sequences=["(", ":", "\n", " "], max_tokens=24, stream=stream))
        add(f"tools, auto{s}", _msg(tools=[WEATHER, TIME], stream=stream))
        # the grammar lets the tiny model write whitespace until max_tokens: the call is cut, and the
        # answer is what an empty completion is (one empty text block; no blocks in a stream)
        add(
            f"tool_choice any, cut by max_tokens{s}",
            _msg(tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=48, stream=stream),
        )
        add(
            f"tool_choice tool{s}",
            _msg(
                tools=[WEATHER, TIME], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=48, stream=stream
            ),
        )
        add(f"tool history{s}", _msg(messages=HISTORY, tools=[WEATHER], stream=stream))
        add(f"max_tokens 1{s}", _msg(max_tokens=1, stream=stream))
    for stream in (False, True):
        add(
            "tool_choice tool, cut by max_tokens" + (", streamed" if stream else ""),
            _msg(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=3, stream=stream),
        )
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"}
    add("system text blocks, billing header dropped", _msg(system=[billing, {"type": "text", "text": "Be brief."}]))
    add(
        "multi-turn with content blocks",
        _msg(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "import os"}, {"type": "text", "text": "x = 1"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": "Answer in code."},
                {"role": "user", "content": TEXT},
            ]
        ),
    )
    add("top_p and top_k", _msg(top_p=0.5, top_k=5))
    # no temperature: the model's generation_config decides it on both; top_k 1 keeps it greedy
    add("no temperature, top_k 1", {k: v for k, v in _msg(top_k=1).items() if k != "temperature"})
    add(
        "tool_choice tool, disable_parallel_tool_use",
        _msg(
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            max_tokens=48,
        ),
    )
    add("tool_choice none", _msg(tools=[WEATHER], tool_choice={"type": "none"}))
    add("thinking disabled", _msg(thinking={"type": "disabled"}))
    add("thinking adaptive, output_config effort", _msg(thinking={"type": "adaptive"}, output_config={"effort": "low"}))
    add(
        "assistant thinking in the history",
        _msg(
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                {"role": "user", "content": TEXT},
            ]
        ),
    )
    add("metadata is ignored", _msg(metadata={"user_id": "u-1"}))
    add("assistant last (a prefill)", _msg(messages=[*USER, {"role": "assistant", "content": "    return"}]))
    add("max_tokens past the context", _msg(max_tokens=5000))
    add("empty messages", _msg(messages=[]))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    add("an image block (a text-only model)", _msg(messages=[{"role": "user", "content": [image]}]))
    add("stop_sequences and tools, streamed", _msg(tools=[WEATHER], stop_sequences=["\n"], max_tokens=24, stream=True))
    # count_tokens
    add("count_tokens", {"model": MODEL, "messages": USER}, path=COUNT)
    add(
        "count_tokens with system, tools and history",
        {"model": MODEL, "system": "Be brief.", "messages": HISTORY, "tools": [WEATHER]},
        path=COUNT,
    )
    add("count_tokens, unknown model", {"model": "nope", "messages": USER}, path=COUNT)
    # errors
    add("unknown model", _msg(model="nope"))
    add("unknown model, streamed", _msg(model="nope", stream=True))
    add("tool_choice names no tool", _msg(tools=[WEATHER], tool_choice={"type": "tool", "name": "other"}))
    add("tool_choice without tools", _msg(tool_choice={"type": "auto"}))
    add("missing max_tokens", {"model": MODEL, "messages": USER}, deviation="messages_schema_error_shape")
    add("max_tokens 0", _msg(max_tokens=0), deviation="messages_schema_error_shape")
    add("bad role", _msg(messages=[{"role": "tool", "content": "x"}]), deviation="messages_schema_error_shape")
    add(
        "tool_choice tool without a name",
        _msg(tools=[WEATHER], tool_choice={"type": "tool"}),
        deviation="messages_schema_error_shape",
    )
    add("not JSON", b"{", deviation="messages_schema_error_shape")
    add(
        "thinking enabled (a token budget)",
        _msg(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2000),
    )
    return c


MESSAGES_MATRIX: list[Case] = _cases()

SHOWS: dict[str, tuple[str, ...]] = {
    **{
        f"messages: {name}{s}": shown
        for s in ("", ", streamed")
        for name, shown in (
            ("stop_sequences", ('"stop_sequence"',)),
            ("max_tokens 1", ('"max_tokens"',)),
        )
    },
    # streamed, a forced call shows its tool_use block whether or not max_tokens cuts it
    "messages: tool_choice tool, streamed": ('"tool_use"', '"name": "get_weather"'),
    "messages: text, streamed": ('"delta:text_delta"',),
    "messages: count_tokens": ('"input_tokens"',),
}
"""What vLLM's answer to a case must show (in its compared view, as JSON text), so that a match
is not two servers agreeing on nothing: the forced calls are made, the stop string is hit."""

SHOWS_EITHER: dict[str, tuple[tuple[str, ...], ...]] = {
    # Greedy, the tiny model closes this forced call on some kinds of CPU and writes whitespace
    # inside it until max_tokens on others (its weights differ in the last bits between them):
    # then a whole answer is the cut call's 400 on both servers. Either way they must agree;
    # tests/vllm/test_anthropic_client.py makes a whole forced call on every machine (sampled).
    "messages: tool_choice tool": (('"tool_use"', '"name": "get_weather"'), ('"status": 400', '"BadRequestError"')),
}
"""Cases that must show one of several things (each as :data:`SHOWS` says)."""
