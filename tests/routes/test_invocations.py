"""braid.routes.invocations called directly: a body is placed on chat, else completions, as vLLM places it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from braid.routes.body import CompletionStream
from braid.routes.common import JsonResponse
from braid.routes.invocations import NO_HANDLER, invocations
from tests.routes.test_completions import JSON, read, send, state


async def answer(body: bytes, content_type: str = JSON) -> tuple[int, Any]:
    r = await invocations(state(), read(body), content_type=content_type, request_id=None)
    if isinstance(r, CompletionStream):
        return 200, await send(r)
    assert isinstance(r, JsonResponse)
    return r.status, json.loads(r.body)


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"prompt": ["Hello", "World"], "max_tokens": 3, "temperature": 0}


async def test_a_chat_body_is_answered_as_chat() -> None:
    status, body = await answer(json.dumps(CHAT).encode())
    assert status == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"]["role"] == "assistant"


async def test_a_completions_body_is_answered_as_completions() -> None:
    status, body = await answer(json.dumps(COMPLETION).encode())
    assert status == 200 and body["object"] == "text_completion" and len(body["choices"]) == 2


async def test_a_chat_body_streams_as_chat() -> None:
    status, raw = await answer(json.dumps({**CHAT, "stream": True}).encode())
    assert status == 200 and b'"object":"chat.completion.chunk"' in raw and raw.rstrip().endswith(b"data: [DONE]")


async def test_a_body_with_both_shapes_is_chat_as_vllm_tries_chat_first() -> None:
    status, body = await answer(json.dumps({**COMPLETION, **CHAT}).encode())
    assert status == 200 and body["object"] == "chat.completion"


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        # each shape's schema refuses it (vLLM's pydantic refuses both models)
        {**CHAT, "temperature": "hot"},
        {**COMPLETION, "messages": "hi", "n": "two"},
    ],
)
async def test_a_body_neither_schema_takes_is_vllms_400(body: object) -> None:
    status, err = await answer(json.dumps(body).encode())
    assert status == 400
    assert err["error"] == {"message": NO_HANDLER, "type": "BadRequestError", "param": None, "code": 400}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # completions' schema takes any object of the right types: its handler finds no prompt
        ({"max_tokens": 3}, "prompt"),
        ({"messages": [[{"role": "user", "content": "a"}]]}, "prompt"),  # batched chat
        ({"tokens": [1, 2]}, "prompt"),
        # refused by a route's own check, not its schema: that route's answer, as vLLM's
        ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ({**COMPLETION, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_a_body_of_a_shape_gets_that_route_s_refusal(body: object, param: str) -> None:
    status, err = await answer(json.dumps(body).encode())
    assert status == 400 and err["error"]["type"] == "BadRequestError" and err["error"]["param"] == param


async def test_not_json_is_a_json_decode_error() -> None:
    status, err = await answer(b'{"prompt": "x",')
    assert status == 400 and err["error"]["type"] == "Bad Request"
    assert err["error"]["message"].startswith("JSON decode error")


async def test_a_placed_body_keeps_its_route_s_errors() -> None:
    # (through the app, SageMaker's adapter header replaces model: tests/http/test_invocations.py)
    status, err = await answer(json.dumps({**CHAT, "model": "nope"}).encode())
    assert status == 404 and err["error"]["param"] == "model"
    status, err = await answer(json.dumps({**COMPLETION, "model": "nope"}).encode())
    assert status == 404 and err["error"]["type"] == "NotFoundError"


async def test_the_content_type_is_checked_before_the_body_is_read() -> None:
    async def never() -> bytes:
        raise AssertionError("read")

    r = await invocations(state(), never, content_type="text/plain", request_id=None)
    assert isinstance(r, JsonResponse) and r.status == 400
    assert msgspec.json.decode(r.body)["error"]["type"] == "Bad Request"
