"""braid.wire.chat_request: ``tool_choice`` as vLLM's validator and server check it (issue 26)."""

from __future__ import annotations

import json

import attrs
import pytest

from braid.errors import InvalidRequest
from braid.settings import ParserOptions
from braid.wire.chat_request import ChatRequest, ToolChoice, parse_chat
from braid.wire.fields import Limits

LIMITS = Limits(max_prompts=8, max_choices=64, max_logprobs=20, vocab_size=2048)
USER = [{"role": "user", "content": "Hi"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
HERMES = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")


def chat(body: dict, parsers: ParserOptions = HERMES, *, batch: bool = False) -> ChatRequest:
    messages = [USER, USER] if batch else USER
    return parse_chat(
        json.dumps({"messages": messages, **body}).encode(), LIMITS, max_model_len=2048, batch=batch, parsers=parsers
    )


@pytest.mark.parametrize("batch", [False, True])
def test_the_modes_and_vllms_defaults(batch: bool) -> None:
    assert chat({}, batch=batch).tool_choice == ToolChoice("none")
    assert chat({"tools": TOOLS}, batch=batch).tool_choice == ToolChoice("auto")
    assert chat({"tools": TOOLS, "tool_choice": "none"}, batch=batch).tool_choice.mode == "none"
    required = chat({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}, batch=batch)
    assert required.tool_choice == ToolChoice("required", raw="required", parallel=False)
    named = chat({"tools": TOOLS, "tool_choice": NAMED}, batch=batch).tool_choice
    assert (named.mode, named.name, named.raw, named.parallel) == ("named", "get_time", NAMED, True)
    # the batch route renders its tools too (vLLM's validates them and drops them)
    assert chat({"tools": TOOLS}, batch=batch).template.tools is not None


def test_a_named_function_takes_over_a_response_format() -> None:
    # vLLM refuses a named function with structured_outputs only; its schema wins over response_format
    req = chat({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}})
    assert req.tool_choice.mode == "named" and req.structured is not None


def test_tools_reach_the_template_unless_excluded_under_none() -> None:
    assert chat({"tools": TOOLS, "tool_choice": "none"}).template.tools is not None
    excluded = ParserOptions(exclude_tools_when_tool_choice_none=True)
    assert chat({"tools": TOOLS, "tool_choice": "none"}, excluded).template.tools is None
    both = attrs.evolve(HERMES, exclude_tools_when_tool_choice_none=True)
    assert chat({"tools": TOOLS, "tool_choice": "required"}, both).template.tools is not None


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"tools": []}, "`tools` must not be an empty array", "tools"),
        ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set.", "tool_choice"),
        ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set.", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "Invalid value for `tool_choice`: sometimes!", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "Invalid value for `function`", "tool_choice.function"),
        (
            {"tools": TOOLS, "tool_choice": {"function": {}}},
            "Expected field `name` in `function`",
            "tool_choice.function.name",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"function": {"name": ""}}},
            "Invalid `name` in `function`",
            "tool_choice.function.name",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"function": {"name": "get_news"}}},
            "does not match any of the specified `tools`",
            "tool_choice",
        ),
        (
            {"tools": TOOLS, "tool_choice": NAMED, "structured_outputs": {"regex": "[a-z]+"}},
            "either use constraints for structured outputs or tools, not both",
            None,
        ),
    ],
)
def test_bad_tool_choices_are_400s_in_vllms_words(body: dict, message: str, param: str | None) -> None:
    for batch in (False, True):
        with pytest.raises(InvalidRequest) as exc:
            chat(body, batch=batch)
        assert message in exc.value.message and exc.value.param == param and exc.value.status == 400


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        (None, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (NAMED, 'tool_choice=function "get_time" requires --tool-call-parser to be set'),
    ],
)
def test_a_server_without_a_tool_parser_refuses_what_needs_one(tool_choice: object, message: str) -> None:
    body = {"tools": TOOLS} if tool_choice is None else {"tools": TOOLS, "tool_choice": tool_choice}
    for parsers in (ParserOptions(), ParserOptions(reasoning_parser="qwen3")):
        with pytest.raises(InvalidRequest) as exc:
            chat(body, parsers)
        assert exc.value.message == message and exc.value.param is None
    assert chat(body, HERMES).tool_choice.parses
    # "none" needs no parser: the tools go to the template, and nothing is parsed
    assert not chat({"tools": TOOLS, "tool_choice": "none"}, ParserOptions()).tool_choice.parses


def test_reasoning_effort_turns_thinking_on_or_off_as_vllms() -> None:
    # vLLM 0.32 adds reasoning_effort and enable_thinking (unless the kwargs set it) to the
    # template's variables, and hands its parsers those with the template fields
    assert chat({}).chat_template_kwargs == {"add_generation_prompt": True, "continue_final_message": False}
    high = chat({"reasoning_effort": "high", "chat_template_kwargs": {"x": 1}})
    assert high.template.kwargs == {"x": 1, "reasoning_effort": "high", "enable_thinking": True}
    assert high.chat_template_kwargs == {
        "x": 1,
        "add_generation_prompt": True,
        "continue_final_message": False,
        "reasoning_effort": "high",
        "enable_thinking": True,
    }
    assert chat({"reasoning_effort": "none"}).template.kwargs["enable_thinking"] is False
    kept = chat({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}})
    assert kept.template.kwargs["enable_thinking"] is True and kept.chat_template_kwargs["enable_thinking"] is True
    # the request's fields win over the same keys in chat_template_kwargs, as vLLM merges them
    over = chat({"add_generation_prompt": False, "chat_template_kwargs": {"add_generation_prompt": True}})
    assert over.chat_template_kwargs["add_generation_prompt"] is False


@pytest.mark.parametrize("effort", ["extreme", 3, ""])
def test_a_reasoning_effort_not_of_vllms_is_a_schema_error(effort: object) -> None:
    with pytest.raises(InvalidRequest) as exc:
        chat({"reasoning_effort": effort})
    assert exc.value.param == "body.reasoning_effort"
