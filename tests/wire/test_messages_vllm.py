"""braid.wire.messages against vLLM 0.32's own code, on the same bodies: what a chat template gets
from a conversation, and what is refused where.

vLLM's side is its installed package, run in-process without an engine or a model: its pydantic
request models behind a FastAPI app that has vLLM's exception handlers (so an error's type and
``param`` are those vLLM's server answers), and its ``parse_chat_messages`` on the validated
messages (the dicts its renderer hands the template, in the "string" content format of the
tiny model's template). braid's side is its parsers: ``parse_chat`` (single and batch routes),
``parse_tokenize``, ``parse_tools``. Dicts are compared as JSON texts, so key order counts: a
template that dumps a message or a tool call with ``tojson`` sees it.

Skipped without vLLM (and FastAPI, which vLLM brings).
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Any

import pytest

from braid.errors import BraidError
from braid.wire.chat_request import parse_chat
from braid.wire.fields import Limits
from braid.wire.messages import parse_tools
from braid.wire.tokenize_request import TokenizeChat, parse_tokenize

pytest.importorskip("vllm")
pytest.importorskip("fastapi")

# at module level: FastAPI resolves the routes' (string) annotations in the module's globals
from fastapi import Depends, FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient
from vllm.entrypoints.openai.chat_completion.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
)
from vllm.entrypoints.serve.exception_handling.register import init_exception_handler
from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest, TokenizeRequest
from vllm.entrypoints.serve.utils.api_utils import validate_json_request
from vllm.renderers.chat_utils import parse_chat_messages

LIMITS = Limits(vocab_size=259, max_logprobs=20)


def call(id_: object = "c1", name: object = "f", arguments: Any = '{"a": 1}', **extra: Any) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}, **extra}


def asst(*calls: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls), **fields}


USER = {"role": "user", "content": "hi"}

# name -> one conversation
CONVERSATIONS: dict[str, list[Any]] = {
    "plain, extra keys dropped": [{"role": "user", "content": "hi", "extra": 1}],
    "a tool-call turn": [USER, asst(call()), {"role": "tool", "content": "42", "tool_call_id": "c1"}, USER],
    "two calls, content with them": [USER, asst(call("a"), call("b", "g", "{}"), content="Let me see.")],
    "call keys reordered, extras kept after": [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "y": 3,
                    "type": "function",
                    "function": {"x": 2, "arguments": '{"b": 1, "a": 2}', "name": "f"},
                    "id": "c",
                }
            ],
            "name": "bob",
            "zz": 1,
        }
    ],
    "with reasoning, the call's keys in the same order": [
        asst({"y": 3, "type": "function", "function": {"arguments": "{}", "name": "f"}, "id": "c"}, reasoning="r")
    ],
    "arguments: invalid JSON is {}": [asst(call(arguments="{nope"))],
    "arguments: a JSON array is {}": [asst(call(arguments="[1]"))],
    "arguments: JSON null is {}": [asst(call(arguments="null"))],
    "arguments: 0 is {}": [asst(call(arguments="0"))],
    "arguments: empty is {}": [asst(call(arguments=""))],
    "arguments: blank is {}": [asst(call(arguments="  "))],
    "arguments: nested values, duplicate keys": [
        asst(call(arguments='{"a": {"b": [1, 2.5, null, true]}, "c": "\\u00e9", "a2": 1, "a2": 2}'))
    ],
    "arguments: NaN and big numbers as Python's json reads them": [
        asst(call(arguments='{"a": NaN, "b": 123456789012345678901234567890, "c": 1e400}'))
    ],
    "tool_calls [] is dropped": [{"role": "assistant", "content": "x", "tool_calls": []}],
    "tool_calls null": [{"role": "assistant", "content": "x", "tool_calls": None}],
    "tool_calls a string: its characters": [{"role": "assistant", "content": "x", "tool_calls": ""}],
    "a user's tool_calls are ignored": [{"role": "user", "content": "x", "tool_calls": [{"id": 1}]}],
    "a user's tool_calls object is ignored": [{"role": "user", "content": "x", "tool_calls": {"a": 1}}],
    "a custom role's valid calls are ignored": [{"role": "bot", "content": "x", "tool_calls": [call()]}],
    "a tool message's calls are ignored": [{"role": "tool", "content": "x", "tool_call_id": "c", "tool_calls": [1]}],
    "reasoning, both keys": [{"role": "assistant", "content": "a", "reasoning": "r"}],
    "reasoning_content, renamed": [{"role": "assistant", "content": "a", "reasoning_content": "rc"}],
    "reasoning wins over reasoning_content": [
        {"role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "rc"}
    ],
    "reasoning null, reasoning_content taken": [
        {"role": "assistant", "content": "a", "reasoning": None, "reasoning_content": "rc"}
    ],
    "reasoning of another type, passed as it is": [{"role": "assistant", "content": "a", "reasoning": 5}],
    "reasoning_content of another type": [{"role": "assistant", "content": "a", "reasoning_content": [1]}],
    "a user's reasoning is dropped": [{"role": "user", "content": "a", "reasoning": "r"}],
    "tool message": [{"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}],
    "tool message, text parts joined": [
        {"role": "tool", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "tool_call_id": "c"}
    ],
    "tool message without tool_call_id": [{"role": "tool", "content": "42"}],
    "tool message with tool_call_id null": [{"role": "tool", "content": "42", "tool_call_id": None}],
    "tool message without content": [{"role": "tool", "tool_call_id": "c"}],
    "tool message, a name of another type is ignored": [
        {"role": "tool", "content": "x", "tool_call_id": "c", "name": 5}
    ],
    "an assistant's tool_call_id is dropped": [{"role": "assistant", "content": "x", "tool_call_id": "c"}],
    "a user's tool_call_id of another type is ignored": [{"role": "user", "content": "x", "tool_call_id": 5}],
    "a custom role's tool_call_id is dropped": [{"role": "bot", "content": "x", "tool_call_id": "c"}],
    "name on a user": [{"role": "user", "content": "x", "name": "bob"}],
    "task": [{"role": "user", "content": "x", "task": "t"}, {"role": "assistant", "content": "y", "task": "u"}],
    "task of another type is ignored": [{"role": "user", "content": "x", "task": 5}],
    "function role": [{"role": "function", "content": "x", "name": "f"}],
    "function role without a name": [{"role": "function", "content": "x"}],
    "developer": [{"role": "developer", "content": "d"}, USER],
    "developer with tools: vLLM's type's key order": [
        {"role": "developer", "content": "d", "tools": [{"type": "function", "function": {"x": 1, "name": "f"}}]},
        USER,
    ],
    "developer with tools of another shape, as sent": [
        {"role": "developer", "content": "d", "tools": [{"type": "function"}]},
        USER,
    ],
    "developer with tools 5": [{"role": "developer", "content": "d", "tools": 5}],
    "a user's tools are dropped": [{"role": "user", "content": "d", "tools": [{"type": "function"}]}],
    "no content": [{"role": "user"}, {"role": "bot"}],
    "assistant with text parts and a call": [
        {"role": "assistant", "content": [{"type": "text", "text": "a"}], "tool_calls": [call(arguments="{}")]}
    ],
    "an assistant's function_call and refusal of other types": [
        {"role": "assistant", "content": "x", "function_call": 5, "refusal": 5}
    ],
    "system billing header dropped": [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1\nreal"},
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "x-anthropic-billing-header: z"},
                {"type": "text", "text": "b"},
            ],
        },
    ],
    # refused
    "a custom tool call": [asst({"id": "d", "type": "custom", "custom": {"name": "g", "input": "i"}})],
    "a custom call after a function call": [
        asst(call(), {"id": "d", "type": "custom", "custom": {"name": "g", "input": "i"}})
    ],
    "arguments an object": [asst(call(arguments={"a": 1}))],
    "arguments missing": [asst({"id": "c", "type": "function", "function": {"name": "f"}})],
    "arguments null": [asst(call(arguments=None))],
    "the second call bad": [asst(call(), call(arguments={}))],
    "a bad call in the second message": [asst(call()), asst({"id": "c", "type": "function", "function": {}})],
    "a call that is a string": [asst("x")],
    "a call that is null": [asst(None)],
    "a call without type": [asst({"id": "c", "function": {"name": "f", "arguments": "{}"}})],
    "a call with type null": [asst(call(type=None))],
    "a call without id": [asst({"type": "function", "function": {"name": "f", "arguments": "{}"}})],
    "a call with an integer id": [asst(call(1))],
    "a call whose function is a string": [asst({"id": "c", "type": "function", "function": "f"})],
    "a call whose name is a number": [asst(call(name=3))],
    "a custom call without input": [asst({"id": "d", "type": "custom", "custom": {"name": "g"}})],
    "tool_calls a number on an assistant": [{"role": "assistant", "content": "x", "tool_calls": 5}],
    "tool_calls true on a user": [{"role": "user", "content": "x", "tool_calls": True}],
    "tool_calls a string of characters": [{"role": "assistant", "content": "x", "tool_calls": "ab"}],
    "tool_calls an object": [{"role": "assistant", "content": "x", "tool_calls": {"id": "c1"}}],
    "a custom role's bad calls": [{"role": "bot", "content": "x", "tool_calls": [call(arguments=None)]}],
    "a tool message's calls without its id": [{"role": "tool", "content": "x", "tool_calls": [{"id": "c"}]}],
    "tool_call_id a number": [{"role": "tool", "content": "42", "tool_call_id": 5}],
    "tool_call_id a list": [{"role": "tool", "content": "42", "tool_call_id": ["c"]}],
    "a function role's tool_call_id a number": [{"role": "function", "content": "x", "tool_call_id": 7}],
    "a custom role's tool_call_id a number": [{"role": "bot", "content": "x", "tool_call_id": 5}],
    "a custom role's reasoning a number": [{"role": "bot", "content": "x", "reasoning": 5}],
    "tool_calls null and reasoning a number": [
        {"role": "assistant", "content": "x", "tool_calls": None, "reasoning": 5}
    ],
    "function_call bad and a bad call": [
        {"role": "assistant", "content": "x", "function_call": 5, "tool_calls": [{"id": "c"}]}
    ],
    "name null": [{"role": "user", "content": "x", "name": None}],
    "name a number": [{"role": "user", "content": "x", "name": 5}],
    "a developer's name a number": [{"role": "developer", "content": "d", "name": 5}],
    "content null on a user": [{"role": "user", "content": None}],
    "content null on a tool message": [{"role": "tool", "content": None, "tool_call_id": "c"}],
    "content a number": [{"role": "user", "content": 5}],
    "no role": [{"content": "x"}],
    "role a number": [{"role": 5, "content": "x"}],
    "a message that is a string": ["x"],
    "a bad call before a bad message": [asst({"id": "c"}), {"role": "tool", "content": "x", "tool_call_id": 5}],
}


class Vllm:
    """vLLM's server, as far as the request models, the validation and the message parsing go."""

    def __init__(self) -> None:
        # what parse_chat_messages reads of a text-only model's config
        config = types.SimpleNamespace(enable_prompt_embeds=False, multimodal_config=None, is_multimodal_model=False)

        def rendered(messages: Any) -> list[Any]:
            conversation, _, _ = parse_chat_messages(messages, config, "string")  # type: ignore[arg-type]
            return list(conversation)

        def answer(value: object) -> PlainTextResponse:
            # json.dumps: NaN as vLLM's dicts hold it, key order as they have it
            return PlainTextResponse(json.dumps(value))

        app = FastAPI()
        app.state.args = types.SimpleNamespace(log_error_stack=False)
        init_exception_handler(app)
        json_only = [Depends(validate_json_request)]

        @app.post("/v1/chat/completions", dependencies=json_only)
        async def chat(request: ChatCompletionRequest) -> PlainTextResponse:
            tools = None if request.tools is None else [t.model_dump() for t in request.tools]
            return answer({"conversation": rendered(request.messages), "tools": tools})

        @app.post("/v1/chat/completions/batch", dependencies=json_only)
        async def batch(request: BatchChatCompletionRequest) -> PlainTextResponse:
            # as vLLM's batch serving renders each conversation: it validates it as its own chat
            # request (whose "before" validator changes the message dicts in place), then renders
            # the batch request's messages
            conversations = []
            for messages in request.messages:
                request.to_chat_completion_request(messages)
                conversations.append(rendered(messages))
            return answer(conversations)

        @app.post("/tokenize", dependencies=json_only)
        async def tokenize(request: TokenizeRequest) -> PlainTextResponse:
            assert isinstance(request, TokenizeChatRequest)
            return answer(rendered(request.messages))

        self.client = TestClient(app, raise_server_exceptions=False)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        r = self.client.post(path, json=body)
        if r.status_code == 200:
            return json.loads(r.text)
        error = r.json()["error"]
        return (r.status_code, error["type"], error["param"])


@pytest.fixture(scope="module")
def vllm() -> Iterator[Vllm]:
    yield Vllm()


def braid(parse: Any) -> Any:
    try:
        return parse()
    except BraidError as exc:
        return (exc.status, exc.type, exc.param)


def as_json(conversation: Any) -> Any:
    return json.loads(json.dumps([m.as_template_input() for m in conversation]))


def same(ours: Any, theirs: Any) -> bool:
    """Equal, key order included (NaN equal to itself)."""
    return json.dumps(ours) == json.dumps(theirs)


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_a_chat_conversation_is_what_vllm_makes_of_it(vllm: Vllm, name: str) -> None:
    body = {"messages": CONVERSATIONS[name]}
    theirs = vllm.post("/v1/chat/completions", body)
    ours = braid(lambda: parse_chat(json.dumps(body).encode(), LIMITS, max_model_len=2048, batch=False))
    if not isinstance(ours, tuple):
        ours = {"conversation": as_json(ours.conversations[0]), "tools": None}
    assert same(ours, theirs), f"braid: {ours}\nvLLM:  {theirs}"


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_a_batch_conversation_is_what_vllm_makes_of_it(vllm: Vllm, name: str) -> None:
    body = {"messages": [[USER], CONVERSATIONS[name]]}
    theirs = vllm.post("/v1/chat/completions/batch", body)
    ours = braid(lambda: parse_chat(json.dumps(body).encode(), LIMITS, max_model_len=2048, batch=True))
    if not isinstance(ours, tuple):
        ours = [as_json(c) for c in ours.conversations]
    assert same(ours, theirs), f"braid: {ours}\nvLLM:  {theirs}"


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_a_tokenized_conversation_is_what_vllm_makes_of_it(vllm: Vllm, name: str) -> None:
    body = {"messages": CONVERSATIONS[name]}
    theirs = vllm.post("/tokenize", body)
    ours = braid(lambda: parse_tokenize(json.dumps(body).encode(), model="m"))
    if not isinstance(ours, tuple):
        assert isinstance(ours, TokenizeChat)
        ours = as_json(ours.messages)
    assert same(ours, theirs), f"braid: {ours}\nvLLM:  {theirs}"


def tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


TOOLS: dict[str, list[Any]] = {
    "name only": [tool()],
    "every field": [tool(description="d", parameters={"type": "object", "properties": {}}, strict=True)],
    "nulls": [tool(description=None, parameters=None, strict=None, defer_loading=None)],
    "strict false": [tool(strict=False)],
    "defer_loading on the tool": [{**tool(), "defer_loading": True}],
    "defer_loading on both": [{**tool(defer_loading=False), "defer_loading": True}],
    "defer_loading on the function": [tool(defer_loading=True)],
    "extra keys dropped, keys in order": [{"x": 1, "function": {"parameters": {}, "y": 2, "name": "g"}}],
    "several": [tool(), tool(name="g", description="the g")],
    # refused
    "a tool that is a string": ["f"],
    "type custom": [{"type": "custom", "custom": {"name": "f"}}],
    "type null": [{"type": None, "function": {"name": "f"}}],
    "no function": [{"type": "function"}],
    "function a string": [{"type": "function", "function": "f"}],
    "no name": [tool(name=None)],
    "name a number": [tool(name=1)],
    "description a number": [tool(description=1)],
    "parameters a list": [tool(parameters=[])],
    "parameters a string": [tool(parameters="{}")],
    "strict a string": [tool(strict="maybe")],
    "defer_loading a string": [{**tool(), "defer_loading": "x"}],
    "the second tool bad": [tool(), tool(name=None)],
    "type and name bad": [{"type": "x", "function": {"name": 1}}],
}


@pytest.mark.parametrize("name", list(TOOLS))
def test_tools_are_what_vllm_hands_the_template(vllm: Vllm, name: str) -> None:
    # tool_choice "none": the tools reach the template and no tool parser is involved
    theirs = vllm.post("/v1/chat/completions", {"messages": [USER], "tools": TOOLS[name], "tool_choice": "none"})
    ours = braid(lambda: parse_tools(TOOLS[name]))
    if isinstance(theirs, dict):
        theirs = theirs["tools"]
        ours = list(ours)
    assert same(ours, theirs), f"braid: {ours}\nvLLM:  {theirs}"
