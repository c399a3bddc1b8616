"""``POST /invocations``: SageMaker's one inference route, placed by the body's shape as vLLM 0.32
places it.

vLLM tries its request models in order, chat completions then completions, and hands the body
to the first whose validation it passes; a body neither takes is its 400 ``Cannot find suitable
handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']`` (a
generating model's list), and a body that is not JSON its 400 ``JSON decode error``. braid does
the same with its own validation (:func:`braid.wire.chat_request.parse_chat`, then
:func:`braid.wire.completions_request.parse_request`): any 400 of one is "not this shape". The
chosen route's view then answers the request whole (admission, plan, run, a stream or a JSON
body, its errors), so an unknown ``model`` is chat's or completions' 404, as on vLLM.

The body is read (within the server's limits) before admission, since it must be read to be
placed; the view it goes to takes it as read. Neither batched chat (vLLM places it nowhere) nor
``/tokenize`` is a shape this route takes. Like every route but ``/health`` it needs an API key
when the server has keys (vLLM guards only ``/v1``-prefixed paths).
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


def _takes(check: Callable[[], object]) -> bool:
    try:
        check()
    except BraidError as err:
        if err.status != 400:
            raise
        return False
    return True


def place(state: AppState, body: bytes) -> View:
    """The view a body goes to: chat's when it is a valid chat body, else completions' when it
    is a valid completions body; else :class:`~braid.errors.InvalidRequest` (vLLM's 400), or a
    :class:`~braid.errors.SchemaError` for a body that is not JSON."""
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise SchemaError(f"JSON decode error: {exc}") from None
    settings = state.settings
    if _takes(
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
    if _takes(lambda: parse_request(body, state.limits)):
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
            request=json_body({"anyOf": [ref(ChatBody), ref(CompletionBody)]}, EXAMPLES),
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
    ),
)


__all__ = ["NO_HANDLER", "ROUTES", "invocations", "place"]
