"""A Responses body translated into the chat request it runs as (vLLM's construct_input_messages)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from braid.errors import InvalidRequest, NotFound, SchemaError
from braid.settings import ParserOptions
from braid.wire.fields import Limits
from braid.wire.responses_request import parse_responses

PARSERS = ParserOptions(tool_call_parser="pythonic", enable_auto_tool_choice=True)
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def parse(parsers: ParserOptions = PARSERS, **body: Any):  # type: ignore[no-untyped-def]
    return parse_responses(json.dumps(body).encode(), Limits(), max_model_len=1024, parsers=parsers)


def roles(req) -> list[tuple[str, str | None]]:  # type: ignore[no-untyped-def]
    return [(m.role, m.content) for m in req.chat.conversations[0]]


def test_a_string_with_instructions_is_a_system_and_a_user_message() -> None:
    req = parse(input="Hi", instructions="Be brief")
    assert roles(req) == [("system", "Be brief"), ("user", "Hi")]
    assert req.chat.template.add_generation_prompt and not req.chat.template.continue_final_message
    assert req.chat.body.max_tokens == 1024  # the context's room, shrunk by the plan
    assert req.chat.body.add_special_tokens  # as vLLM's Responses route tokenizes


def test_calls_join_the_assistant_message_and_outputs_are_tool_messages() -> None:
    req = parse(
        input=[
            {"role": "user", "content": "Q"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ],
        tools=[TOOL],
    )
    conv = req.chat.conversations[0]
    assert [m.role for m in conv] == ["user", "assistant", "tool", "tool"]
    assistant = conv[1]
    assert assistant.reasoning == "hmm" and assistant.tool_calls is not None
    assert [(c.id, c.name, dict(c.arguments)) for c in assistant.tool_calls] == [("c1", "f", {}), ("c2", "f", {"a": 1})]
    assert [(m.tool_call_id, m.content) for m in conv[2:]] == [("c1", "one"), ("c2", "two")]


def test_an_in_progress_last_message_is_continued() -> None:
    req = parse(
        input=[
            {"role": "user", "content": "Q"},
            {
                "type": "message",
                "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "A"}],
            },
        ]
    )
    assert roles(req)[-1] == ("assistant", "A")
    assert req.chat.template.continue_final_message and not req.chat.template.add_generation_prompt


@pytest.mark.parametrize(
    ("choice", "mode", "echo"),
    [
        ("auto", "auto", "auto"),
        ("none", "none", "none"),
        ("required", "required", "required"),
        ({"type": "function", "name": "f"}, "named", {"name": "f", "type": "function"}),
    ],
)
def test_tool_choice_with_tools(choice: object, mode: str, echo: object) -> None:
    req = parse(input="Hi", tools=[TOOL], tool_choice=choice)
    assert req.chat.tool_choice.mode == mode and req.echo.tool_choice == echo
    assert req.chat.tools is not None and req.chat.tools[0]["function"]["name"] == "f"
    assert req.echo.tools[0]["name"] == "f" and req.echo.tools[0]["type"] == "function"


def test_without_a_tool_parser_nothing_is_parsed() -> None:
    req = parse(ParserOptions(), input="Hi", tools=[TOOL])
    assert req.chat.tool_choice.mode == "none" and req.echo.tool_choice == "auto"
    assert req.chat.template.tools is not None  # the template still shows the tools


def test_auto_without_tools_is_none() -> None:
    assert parse(input="Hi").echo.tool_choice == "none"


def test_text_format_is_chats_response_format() -> None:
    req = parse(input="Hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
    assert req.chat.structured is not None and json.loads(req.chat.structured.json or "") == {"type": "object"}
    assert req.echo.text == {
        "format": {
            "name": "x",
            "schema": {"type": "object"},
            "type": "json_schema",
            "description": None,
            "strict": None,
        },
        "verbosity": None,
    }


def test_logprobs_need_the_include() -> None:
    assert parse(input="Hi", top_logprobs=3).chat.body.logprobs is None
    req = parse(input="Hi", top_logprobs=3, include=["message.output_text.logprobs"])
    assert req.chat.body.logprobs == 3 and req.echo.top_logprobs == 3


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"input": [{"type": "message", "role": "user"}]}, SchemaError, "body.input"),
        ({"input": [{"type": "function_call_output", "call_id": 1, "output": "x"}]}, SchemaError, "body.input"),
        (
            {"input": "Hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}},
            InvalidRequest,
            "tool_choice",
        ),
        ({"input": "Hi", "tools": [{"type": "function", "name": 3}]}, SchemaError, "body.tools.0.FunctionTool.name"),
        ({"input": "Hi", "reasoning": {"effort": "huge"}}, SchemaError, "body.reasoning.effort"),
        ({"input": "Hi", "previous_response_id": "resp_1"}, NotFound, "response_id"),
    ],
)
def test_refusals(body: dict[str, Any], error: type[Exception], param: str) -> None:
    with pytest.raises(error) as info:
        parse(**body)
    assert getattr(info.value, "param", None) == param
