"""``POST /invocations``: SageMaker's one inference route, placed by the body's shape as vLLM 0.32
places it.

vLLM tries its request models in order, chat completions then completions, and hands the body
to the first that pydantic validates. A body one model's schema refuses (a field of the wrong
type, chat without ``messages``) goes on to the next; an error its validators raise as vLLM's own
(``VLLMValidationError``: ``top_logprobs`` without ``logprobs``, ``stream_options`` without
``stream``...) is the answer; and since completions' ``prompt`` is optional there, nearly any
object is a completions request, whose handler then refuses a missing prompt (400, ``param``
``prompt``). A body no model takes (its fields of the wrong types, or not an object) is vLLM's
400 ``Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest',
'CompletionRequest']``, a body that is not JSON its 400 ``JSON decode error``.

braid places a body the same way with its own validation, whose errors are split as vLLM's are
(the parity tier compares them): a :class:`~braid.errors.SchemaError` (vLLM's pydantic ``Bad
Request``) means "not this shape", any other 400 means "this route, which refuses it". The chosen
route's view then answers the request whole (admission, plan, run, a stream or a JSON body, its
errors).

SageMaker names a LoRA adapter in the header ``X-Amzn-SageMaker-Adapter-Identifier``, and vLLM
sets the body's ``model`` to that header's value before placing it, null when there is no such
header: on this route the body's own ``model`` is never read (:func:`adapter_from_header`), so any
name there is served by the base model.

The body is read (within the server's limits) before admission, since it must be read to be
placed; the view it goes to takes it as read. Batched chat is no shape of this route (vLLM places
it on completions, which finds no prompt), nor is ``/tokenize``. Like every route but ``/health``
it needs an API key when the server has keys (vLLM guards only ``/v1``-prefixed paths).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from braid.errors import BraidError, InvalidRequest, SchemaError
from braid.routes import chat, completions
from braid.routes.common import AppState, Route, View, ViewResult, error_response, require_json
from braid.wire import shapes
from braid.wire.chat_request import ChatBody, parse_chat
from braid.wire.completions_request import CompletionBody, parse_request
from braid.wire.openapi import GENERATION_ERRORS, REQUEST_ID, Operation, Outcome, json_body, ref, sse_event

NO_HANDLER = "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"
"""vLLM's message for a body no route takes (its request models' names, in the order it tries them)."""


ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
"""SageMaker's header naming the LoRA adapter a request is for."""


def adapter_from_header(body: bytes, header: Callable[[str], str | None]) -> bytes:
    """The body with its ``model`` set to the adapter header's value (null without the header),
    as vLLM's SageMaker layer sets it; a body that is not a JSON object is left as it is (it is
    refused as it is placed)."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    if not isinstance(data, dict):
        return body
    data["model"] = header(ADAPTER_HEADER)
    return msgspec.json.encode(data)


def _shape(check: Callable[[], object]) -> bool:
    """Whether a body is of the shape ``check`` validates: True when it passes or is refused by
    a check other than the schema's (that route answers it), False for a schema error."""
    try:
        check()
    except SchemaError:
        return False
    except BraidError:
        return True
    return True


def place(state: AppState, body: bytes) -> View:
    """The view a body goes to: chat's when it is of chat's shape, else completions' when it is
    of theirs; else :class:`~braid.errors.InvalidRequest` (vLLM's 400), or a
    :class:`~braid.errors.SchemaError` for a body that is not JSON (see the module docstring)."""
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise SchemaError(f"JSON decode error: {exc}") from None
    settings = state.settings
    if _shape(
        lambda: parse_chat(
            body,
            state.limits,
            max_model_len=state.engine.info.max_model_len,
            batch=False,
            trust_template=settings.trust_request_chat_template,
            parsers=settings.parsers,
        )
    ):
        return chat.chat_completions
    if _shape(lambda: parse_request(body, state.limits)):
        return completions.completions
    raise InvalidRequest(NO_HANDLER)


async def invocations(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    background: bool = False,
) -> ViewResult:
    """Answer the body as the route it is placed on answers it (see the module docstring)."""
    try:
        require_json(content_type)
        body = await read_body()
        view = place(state, body)
    except BraidError as err:
        return error_response(err)

    async def read_again() -> bytes:
        return body

    return await view(state, read_again, content_type=content_type, request_id=request_id, background=background)


EXAMPLES: dict[str, object] = {
    "chat": {"messages": [{"role": "user", "content": "Say this is a test"}], "max_tokens": 16},
    "completion": {"prompt": "Say this is a test", "max_tokens": 16},
}

ROUTES = (
    Route(
        "/invocations",
        invocations,
        Operation(
            "post",
            "/invocations",
            "SageMaker's inference route: a chat completions body is answered as /v1/chat/completions "
            "answers it, else a completions body as /v1/completions, as vLLM places it",
            (
                Outcome(
                    200,
                    "The chat completion or completion; with `stream`, server-sent events ending with `data: [DONE]`.",
                    {
                        "application/json": {"schema": {"anyOf": [ref(shapes.ChatCompletion), ref(shapes.Completion)]}},
                        "text/event-stream": {
                            "itemSchema": {"anyOf": [sse_event(shapes.ChatChunk), sse_event(shapes.CompletionChunk)]}
                        },
                    },
                    ("X-Request-Id",),
                ),
                *GENERATION_ERRORS,
            ),
            # Any object: which schema it must meet is what placing it decides, and its model
            # is replaced (SageMaker's adapter header) before either schema is checked.
            request=json_body(
                {
                    "type": "object",
                    "description": "A ChatBody (placed first) or a CompletionBody; `model` is not read "
                    "(set from the X-Amzn-SageMaker-Adapter-Identifier header)",
                },
                EXAMPLES,
            ),
            parameters=(REQUEST_ID,),
            structs=(
                ChatBody,
                CompletionBody,
                shapes.ChatCompletion,
                shapes.ChatChunk,
                shapes.Completion,
                shapes.CompletionChunk,
            ),
            # As on the routes it places a body on: defaulted for the decoders, required of a client.
            required=((ChatBody, "messages"), (CompletionBody, "prompt")),
        ),
        reports_load=True,
        adapt_body=adapter_from_header,
    ),
)


__all__ = ["ADAPTER_HEADER", "NO_HANDLER", "ROUTES", "adapter_from_header", "invocations", "place"]
