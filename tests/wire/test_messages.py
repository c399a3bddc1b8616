"""braid.wire.messages and braid.wire.chat_request: conversations, the template options, the chat body's rules."""

from __future__ import annotations

import json

import attrs
import pytest

from braid.engine.scripted import ByteTokenizer
from braid.errors import InvalidRequest, ModelNotFound, SchemaError
from braid.wire.chat_request import ChatRequest, parse_chat
from braid.wire.fields import Limits
from braid.wire.messages import (
    Message,
    RenderTimeError,
    TemplateOptions,
    echo_text,
    parse_messages,
    parse_tools,
    render,
    response_role,
)
from braid.wire.tokenize_request import TokenizeChat, parse_tokenize

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
    assert msgs == (Message("system", "a\nb"), Message("assistant", None), Message("tool", "42", tool_call_id="x"))


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
        # vLLM 0.32 locates it in the message union on the batch route too (tests/wire/test_messages_vllm.py)
        ({"messages": [USER, [{"content": "x"}]]}, True, "body.messages.1.0.ChatCompletionDeveloperMessageParam.role"),
        ({"messages": []}, True, "body.messages"),
        ({"messages": [USER, []]}, True, "body.messages.1"),
        ({"messages": [USER], "seed": 2**63}, False, "body.seed"),
    ],
)
def test_schema_errors_name_pydantics_location(body: dict, batch: bool, param: str) -> None:
    with pytest.raises(SchemaError) as exc:
        chat(body, batch=batch)
    assert exc.value.param == param


# -- tools, tool calls, tool messages (vLLM's own code checks the same bodies: test_messages_vllm.py)


def call(arguments: object = '{"city": "Paris"}', id_: object = "c1", **extra: object) -> dict:
    return {"id": id_, "type": "function", "function": {"name": "get_weather", "arguments": arguments}, **extra}


TOOL_TURN = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": None, "tool_calls": [call()]},
    {"role": "tool", "content": [{"type": "text", "text": "sunny"}], "tool_call_id": "c1"},
]


def test_a_tool_turn_is_handed_to_the_template_as_vllm_hands_it() -> None:
    inputs = [m.as_template_input() for m in parse_messages(TOOL_TURN)]
    assert inputs == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, "type": "function"}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    # key order too: a template that dumps a call with tojson writes it
    assert list(inputs[1]["tool_calls"][0]) == ["id", "function", "type"]
    assert list(inputs[1]["tool_calls"][0]["function"]) == ["arguments", "name"]


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
        ("", {}),
        ("{not json", {}),
        ("[1, 2]", {}),
        ("null", {}),
        ('"text"', {}),
    ],
)
def test_arguments_become_an_object_or_an_empty_one(arguments: str, parsed: dict) -> None:
    (m,) = parse_messages([{"role": "assistant", "tool_calls": [call(arguments)]}])
    assert m.tool_calls is not None and m.tool_calls[0].arguments == parsed
    assert m.chars == len("get_weather") + len(arguments)


def test_empty_or_null_tool_calls_are_no_key_and_other_roles_tool_fields_are_dropped() -> None:
    msgs = parse_messages(
        [
            {"role": "assistant", "content": "a", "tool_calls": []},
            {"role": "assistant", "content": "b", "tool_calls": None, "tool_call_id": "x"},
            {"role": "user", "content": "c", "tool_calls": [{"junk": 1}], "tool_call_id": 5, "reasoning": "r"},
        ]
    )
    assert [m.as_template_input() for m in msgs] == [
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]


def test_reasoning_name_task_and_a_developers_tools() -> None:
    msgs = parse_messages(
        [
            {"role": "developer", "content": "d"},
            {"role": "user", "content": "u", "name": "ann", "task": "t"},
            {"role": "assistant", "content": "a", "reasoning_content": "thought", "name": "bot"},
            {"role": "tool", "content": "x", "tool_call_id": None},
        ]
    )
    assert [m.as_template_input() for m in msgs] == [
        {"role": "developer", "content": "d", "tools": None},
        {"role": "user", "content": "u", "name": "ann", "task": "t"},
        {"role": "assistant", "content": "a", "reasoning": "thought", "reasoning_content": "thought", "name": "bot"},
        {"role": "tool", "content": "x", "tool_call_id": None},
    ]


def test_each_request_model_reads_messages_its_own_way() -> None:
    msgs = [{"role": "assistant", "content": "a", "reasoning_content": "r"}]
    assert parse_messages(msgs, model="chat")[0].reasoning == "r"
    assert parse_messages(msgs, model="tokenize")[0].reasoning is None  # TokenizeChatRequest renames nothing
    # a tool_calls that cannot be listed: vLLM's chat request fails listing it, whatever the role
    numbers = [{"role": "user", "content": "a", "tool_calls": 5}]
    with pytest.raises(InvalidRequest) as exc:
        parse_messages(numbers, model="chat")
    assert (type(exc.value), exc.value.param) == (InvalidRequest, None)
    assert parse_messages(numbers, model="tokenize")[0].as_template_input() == {"role": "user", "content": "a"}
    # a bad call: where pydantic puts it on the chat route, found while rendering elsewhere
    bad = [{"role": "assistant", "tool_calls": [call(), call({"a": 1})]}]
    with pytest.raises(SchemaError) as schema:
        parse_messages(bad, model="chat")
    assert schema.value.param == "body.1.ChatCompletionMessageFunctionToolCallParam.function"
    for model in ("batch", "tokenize"):
        with pytest.raises(RenderTimeError) as late:
            parse_messages(bad, "messages[0]", model=model)  # type: ignore[arg-type]
        assert late.value.param is None and late.value.status == 400


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {"role": "tool", "content": "x", "tool_call_id": 5},
            "body.messages.1.ChatCompletionDeveloperMessageParam.role",
        ),
        (
            {"role": "tool", "content": None, "tool_call_id": "c"},
            "body.messages.1.ChatCompletionDeveloperMessageParam.content",
        ),
        ({"role": "bot", "content": "x", "reasoning": 5}, "body.messages.1.ChatCompletionDeveloperMessageParam.role"),
        ({"role": "developer", "content": "x", "name": 5}, "body.messages.1.ChatCompletionDeveloperMessageParam.name"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c"}]},
            "body.0.ChatCompletionMessageFunctionToolCallParam.function",
        ),
        ({"role": "assistant", "tool_calls": [call(id_=None)]}, "body.0.ChatCompletionMessageFunctionToolCallParam.id"),
        (
            {"role": "assistant", "tool_calls": [call(type="x")]},
            "body.0.ChatCompletionMessageFunctionToolCallParam.type",
        ),
        ({"role": "assistant", "tool_calls": ["c"]}, "body.0.ChatCompletionMessageFunctionToolCallParam"),
        ("x", "body.messages.1.ChatCompletionDeveloperMessageParam"),
    ],
)
def test_malformed_tool_fields_are_400s_at_vllms_location(message: object, param: str) -> None:
    with pytest.raises(SchemaError) as exc:
        chat({"messages": [USER[0], message]})
    assert (exc.value.status, exc.value.param) == (400, param)


def test_a_custom_tool_call_is_refused_as_vllm_refuses_it() -> None:
    custom = {"id": "d", "type": "custom", "custom": {"name": "g", "input": "i"}}
    with pytest.raises(RenderTimeError) as exc:
        chat({"messages": [{"role": "assistant", "tool_calls": [call(), custom]}]})
    assert (exc.value.type, exc.value.param) == ("BadRequestError", "tool_calls")


def test_tools_are_dumped_as_vllm_dumps_them() -> None:
    tools = parse_tools(
        [
            {"function": {"name": "f"}},
            {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}, "strict": False, "x": 1}},
            {"type": "function", "function": {"name": "h"}, "defer_loading": True},
        ]
    )
    assert tools == (
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}},
        {
            "type": "function",
            "function": {"name": "g", "description": None, "parameters": {"type": "object"}, "strict": False},
        },
        {
            "type": "function",
            "function": {"name": "h", "description": None, "parameters": None, "defer_loading": True},
            "defer_loading": True,
        },
    )
    assert parse_tools(None) is None and parse_tools([]) == ()


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"name": "f"}, "body.tools"),
        (["f"], "body.tools.0"),
        ([{"type": "custom", "function": {"name": 1}}], "body.tools.0.type"),
        ([{"type": "function"}], "body.tools.0.function"),
        ([{"function": {"name": "f"}}, {"function": {"name": 1}}], "body.tools.1.function.name"),
        ([{"function": {"name": "f", "description": 2}}], "body.tools.0.function.description"),
        ([{"function": {"name": "f", "parameters": "{}"}}], "body.tools.0.function.parameters"),
        ([{"function": {"name": "f", "strict": "true"}}], "body.tools.0.function.strict"),  # braid: strict types
        ([{"function": {"name": "f"}, "defer_loading": 1}], "body.tools.0.defer_loading"),
    ],
)
def test_malformed_tools_are_400s_at_pydantics_location(tools: object, param: str) -> None:
    with pytest.raises(SchemaError) as exc:
        parse_tools(tools)
    assert (exc.value.status, exc.value.type, exc.value.param) == (400, "Bad Request", param)


class TemplateCall:
    """A tokenizer that records what ``render`` hands its template."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply_chat_template(self, messages: list, **kw: object) -> str:
        self.calls.append({"messages": messages, **kw})
        return "rendered"


def test_render_hands_the_template_the_tools_and_the_kwargs_as_vllm_merges_them() -> None:
    tok = TemplateCall()
    msgs = parse_messages(TOOL_TURN)
    tools = parse_tools([{"function": {"name": "get_weather"}}])
    options = TemplateOptions(kwargs={"x": 1, "gone": None, "also_gone": "auto", "zero": 0}, tools=tools)
    assert render(tok, msgs, options) == "rendered"  # type: ignore[arg-type]
    (seen,) = tok.calls
    assert seen["tools"] == list(tools or ()) and seen["template_kwargs"] == {"x": 1, "zero": 0}
    assert seen["messages"] == [m.as_template_input() for m in msgs]
    # the request's chat_template_kwargs["tools"] wins, unless it is null
    render(tok, msgs, attrs.evolve(options, kwargs={"tools": [{"mine": 1}]}))  # type: ignore[arg-type]
    render(tok, msgs, attrs.evolve(options, kwargs={"tools": None}))  # type: ignore[arg-type]
    render(tok, msgs, TemplateOptions())  # type: ignore[arg-type]
    assert [c["tools"] for c in tok.calls[1:]] == [[{"mine": 1}], list(tools or ()), None]
    assert all("tools" not in c["template_kwargs"] for c in tok.calls)


def test_the_scripted_format_shows_what_reaches_the_template() -> None:
    tools = parse_tools([{"function": {"name": "get_weather"}}])
    text = render(ByteTokenizer(), parse_messages(TOOL_TURN), TemplateOptions(tools=tools))
    assert text == (
        '<|tools|>\n{"type": "function", "function": {"name": "get_weather", "description": null, "parameters": null}}\n</s>\n'
        "<|user|>\nWeather?</s>\n"
        '<|assistant|>\n\n<tool_call>{"id": "c1", "function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, '
        '"type": "function"}</tool_call></s>\n'
        "<|tool|>[c1]\nsunny</s>\n"
        "<|assistant|>\n"
    )


def test_a_system_messages_billing_header_line_is_dropped() -> None:
    header = "x-anthropic-billing-header: cc_version=1; cch=abc"
    msgs = parse_messages(
        [
            {"role": "system", "content": f"{header}\nYou help."},
            {"role": "system", "content": [{"type": "text", "text": header}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": f"{header}\nkept"},
        ]
    )
    assert [m.content for m in msgs] == ["You help.", "b", f"{header}\nkept"]


def test_tokenize_finds_a_bad_call_after_its_other_checks_as_vllm_renders_it() -> None:
    bad = {"messages": [{"role": "assistant", "tool_calls": [call({"a": 1})]}]}
    with pytest.raises(RenderTimeError) as exc:
        parse_tokenize(json.dumps(bad).encode(), model="m")
    assert (exc.value.type, exc.value.param) == ("BadRequestError", None)
    with pytest.raises(ModelNotFound):  # the model is looked at first
        parse_tokenize(json.dumps({**bad, "model": "other"}).encode(), model="m")
    with pytest.raises(InvalidRequest, match="--trust-request-chat-template"):
        parse_tokenize(json.dumps({**bad, "chat_template": "x"}).encode(), model="m")


def test_tokenize_hands_its_tools_to_the_template() -> None:
    body = {
        "messages": TOOL_TURN,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {},
    }
    req = parse_tokenize(json.dumps(body).encode(), model="m")
    assert isinstance(req, TokenizeChat)
    assert req.template.tools == parse_tools(body["tools"]) and "tools" not in req.template.kwargs
    assert req.messages == parse_messages(TOOL_TURN, model="tokenize")


def test_a_template_that_fails_is_vllms_400() -> None:
    class Failing:
        def apply_chat_template(self, messages: list, **kw: object) -> str:
            raise ValueError("Tools should either be a JSON schema, or a callable function")

    with pytest.raises(InvalidRequest) as exc:
        render(Failing(), parse_messages(TOOL_TURN), TemplateOptions(kwargs={"tools": [5]}))  # type: ignore[arg-type]
    assert (exc.value.type, exc.value.param) == ("BadRequestError", None)
    assert "JSON schema" in exc.value.message
