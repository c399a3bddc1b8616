"""braid.wire.messages and braid.wire.chat_request: conversations, the template options, the chat body's rules."""

from __future__ import annotations

import json

import pytest

from braid.engine.scripted import ByteTokenizer
from braid.errors import InvalidRequest, SchemaError
from braid.wire.chat_request import ChatRequest, parse_chat
from braid.wire.fields import Limits
from braid.wire.messages import Message, TemplateOptions, echo_text, parse_messages, render, response_role

LIMITS = Limits(vocab_size=259, max_logprobs=20)
USER = [{"role": "user", "content": "Hi"}]


def chat(body: dict, *, batch: bool = False, trust: bool = False) -> ChatRequest:
    return parse_chat(json.dumps(body).encode(), LIMITS, max_model_len=2048, batch=batch, trust_template=trust)


def test_text_parts_are_joined_by_newlines_and_none_content_is_kept() -> None:
    msgs = parse_messages(
        [
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "42", "tool_call_id": "x"},
        ]
    )
    assert msgs == (Message("system", "a\nb"), Message("assistant", None), Message("tool", "42"))


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], InvalidRequest),
        ("hi", SchemaError),
        ([{"content": "x"}], SchemaError),
        ([{"role": 3, "content": "x"}], SchemaError),
        (["x"], SchemaError),
        ([{"role": "user", "content": 5}], SchemaError),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], InvalidRequest),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], InvalidRequest),
        ([{"role": "user", "content": [{"type": "text"}]}], SchemaError),
    ],
)
def test_what_is_not_a_conversation_is_a_400(messages: object, error: type[InvalidRequest]) -> None:
    with pytest.raises(error) as exc:
        parse_messages(messages)
    assert exc.value.status == 400


def test_the_scripted_template_and_the_reply_role() -> None:
    tok = ByteTokenizer()
    msgs = (Message("system", "s"), Message("user", "u"))
    assert render(tok, msgs, TemplateOptions()) == "<|system|>\ns</s>\n<|user|>\nu</s>\n<|assistant|>\n"
    assert response_role(msgs, TemplateOptions()) == "assistant"
    cont = (*msgs, Message("assistant", "Hel"))
    options = TemplateOptions(add_generation_prompt=False, continue_final_message=True)
    assert render(tok, cont, options).endswith("<|assistant|>\nHel")
    assert response_role(cont, options) == "assistant"
    assert echo_text(cont, "assistant") == "Hel" and echo_text(msgs, "assistant") == ""
    assert response_role(msgs, TemplateOptions(add_generation_prompt=False)) == "user"


def test_both_template_flags_are_a_400() -> None:
    with pytest.raises(InvalidRequest, match="Cannot set both"):
        chat({"messages": USER, "continue_final_message": True})


def test_chat_defaults_differ_from_completions() -> None:
    req = chat({"messages": USER})
    assert req.body.add_special_tokens is False
    assert req.body.max_tokens == 2048  # the context's room: the plan shrinks it per prompt
    req = chat({"messages": USER, "max_tokens": 7, "max_completion_tokens": 3})
    assert req.body.max_tokens == 3


def test_echo_asks_for_the_prompts_logprobs_at_top_logprobs() -> None:
    assert chat({"messages": USER, "echo": True}).body.prompt_logprobs == 0
    req = chat({"messages": USER, "echo": True, "stream": True, "logprobs": True, "top_logprobs": 2})
    assert req.body.prompt_logprobs == 2
    assert chat({"messages": USER, "top_logprobs": 0}).body.prompt_logprobs is None


def test_logprobs_is_a_flag_and_top_logprobs_the_count() -> None:
    req = chat({"messages": USER, "logprobs": True, "top_logprobs": 3})
    assert (req.logprobs, req.top_logprobs, req.body.logprobs) == (True, 3, 3)
    req = chat({"messages": USER, "logprobs": True})
    assert (req.logprobs, req.body.logprobs) == (True, 0)
    assert chat({"messages": USER}).body.logprobs is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "logprobs"),
        ({"tools": []}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        # vLLM names no param for these
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, None),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, None),
        ({"chat_template": "{{ 1 }}"}, None),
        ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, None),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 2, "temperature": 0}, None),
        ({"use_beam_search": True}, "use_beam_search"),
    ],
)
def test_chat_rules_are_400s_naming_the_field(body: dict, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as exc:
        chat({"messages": USER, **body})
    assert exc.value.param == param


def test_tools_pass_with_tool_choice_none_and_a_trusted_template_passes() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat({"messages": USER, "tools": tools, "tool_choice": "none"})
    assert chat({"messages": USER, "chat_template": "{{ 1 }}"}, trust=True).template.chat_template == "{{ 1 }}"


def test_the_batch_route_takes_a_list_of_conversations() -> None:
    req = chat({"messages": [USER, [{"role": "user", "content": "x"}]], "n": 2, "temperature": 1}, batch=True)
    assert len(req.conversations) == 2 and req.batch
    with pytest.raises(InvalidRequest):
        chat({"messages": []}, batch=True)
    with pytest.raises(InvalidRequest, match=r"messages\[1\]"):
        chat({"messages": [USER, []]}, batch=True)
    with pytest.raises(SchemaError):
        chat({"messages": USER}, batch=True)  # a conversation where a list of them belongs


@pytest.mark.parametrize(
    ("body", "batch", "param"),
    [
        ({}, False, "body.messages"),
        ({"messages": "x"}, False, "body.messages"),
        ({"messages": [{"content": "x"}]}, False, "body.messages.0.ChatCompletionDeveloperMessageParam.role"),
        ({"messages": [USER, [{"content": "x"}]]}, True, "body.messages.1.0.role"),
        ({"messages": []}, True, "body.messages"),
        ({"messages": [USER, []]}, True, "body.messages.1"),
        ({"messages": [USER], "seed": 2**63}, False, "body.seed"),
        ({"messages": [USER], "tool_choice": "auto"}, True, "body.tool_choice"),
    ],
)
def test_schema_errors_name_pydantics_location(body: dict, batch: bool, param: str) -> None:
    with pytest.raises(SchemaError) as exc:
        chat(body, batch=batch)
    assert exc.value.param == param
