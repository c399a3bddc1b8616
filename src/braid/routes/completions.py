"""``POST /v1/completions``: its view, its output, and its OpenAPI entry.

The view is the data path in order: :func:`~braid.routes.common.admit`, validate
(:func:`braid.wire.completions_request.parse_request`), tokenize and plan
(:func:`~braid.routes.common.plan_request`), run (:func:`~braid.routes.common.open_run`), then
merge and encode, streamed (:func:`~braid.routes.common.stream`) or whole
(:func:`~braid.routes.common.collect`), with the shared merger of :mod:`braid.stream.merge` over
completions' shapes (:class:`braid.wire.completions_response.CompletionEvents`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from braid.engine.base import Tokenizer
from braid.errors import BraidError
from braid.routes.common import (
    AppState,
    Prepared,
    Route,
    ViewResult,
    admit,
    collect,
    error_response,
    open_run,
    plan_request,
    stream,
)
from braid.stream.merge import ResponseCollector, StreamMerger
from braid.stream.plan import Plan
from braid.stream.render import ChoiceRenderer
from braid.wire import shapes
from braid.wire.completions_request import CompletionBody, parse_request
from braid.wire.completions_response import CompletionEvents
from braid.wire.openapi import GENERATION_ERRORS, REQUEST_ID, Operation, generation_ok, json_body, ref


async def completions(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    background: bool = False,
) -> ViewResult:
    """Answer one completions request: a JSON response, or the stream to send as a 200.

    ``content_type`` and ``request_id`` are the request's ``Content-Type`` and ``X-Request-Id``
    headers (``None`` when absent); ``background``, that its API key is a background key
    (``braid.http.auth``). ``read_body()`` reads the request body; it is called only
    after the checks that need no body (the content type, a draining server, a dead engine), so a
    request refused by them costs no read.

    * Every :class:`~braid.errors.BraidError` before a response is committed comes back as its
      JSON error (status and vLLM's body): a body that is not JSON, an invalid or over-long
      request (400), an unknown model (404), a full admission queue (429, decided before the
      body is read), a draining server or dead engine (503), a request that used up its
      ``request_timeout`` before its run (408). 429 and 503 carry ``Retry-After``. No engine
      request has been opened by then, and the request's admission ticket is closed.
    * A streaming request returns a :class:`~braid.routes.body.CompletionStream`, not yet
      started: the caller sends it as quart sends a ``ResponseBody`` (``async with stream: async
      for data in stream:``), and its run opens in ``__aenter__``. Errors after that are SSE
      error events.
    * A non-streaming request runs here, to the end (all or nothing): 200 with the body, or the
      run's error (engine failure 500, late rejection 400) as its JSON error (leaving the run
      raises the error itself, not a group around it).
    * Cancellation (client gone, drain deadline) propagates after the run has aborted every
      engine request it opened; it is never turned into a response.
    * Anything else is a bug, raised as it is; the app answers it with a 500.
    """
    try:
        ticket, arrived, deadline = admit(state, content_type, request_id, background)
        try:
            prepared = await prepare(state, await read_body(), request_id, deadline)
        except BaseException:
            ticket.close()
            raise
        run = open_run(state, prepared.plan, ticket, arrived, deadline)
        if prepared.plan.stream:
            return stream(run, prepared.merger())
        return await collect(run, request_id, prepared.collector())
    except BraidError as err:
        return error_response(err)


async def prepare(state: AppState, body: bytes, request_id: str | None, deadline: float) -> Prepared:
    """Validate (:func:`~braid.wire.completions_request.parse_request`), tokenize and plan one
    body: the view's steps between admission and the run (:class:`~braid.routes.common.Prepare`)."""
    req = parse_request(body, state.limits)
    plan = await plan_request(state, req, request_id, deadline, "cmpl")
    return Prepared(plan, ChoiceRenderer(plan, state.engine.tokenizer), _events(plan))


def _events(plan: Plan) -> CompletionEvents:
    return CompletionEvents(plan.meta, logprobs=plan.logprobs is not None, return_token_ids=plan.return_token_ids)


def merger(plan: Plan, tokenizer: Tokenizer) -> StreamMerger:
    """The stream of a completions plan: legacy logprobs, ``text_completion`` chunks."""
    return StreamMerger(plan, ChoiceRenderer(plan, tokenizer), _events(plan))


def collector(plan: Plan, tokenizer: Tokenizer) -> ResponseCollector:
    """The whole body of a completions plan."""
    return ResponseCollector(plan, ChoiceRenderer(plan, tokenizer), _events(plan))


EXAMPLES: dict[str, object] = {
    "text": {"prompt": "Say this is a test", "max_tokens": 16, "temperature": 0},
    "batch_stream": {
        "prompt": ["The sky is", "Water is"],
        "max_tokens": 8,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "token_ids_logprobs": {
        "prompt": [[72, 101, 108], [108, 111]],
        "max_tokens": 4,
        "logprobs": 2,
        "echo": True,
        "return_token_ids": True,
    },
    "prompt_logprobs": {"prompt": [72, 105], "max_tokens": 2, "prompt_logprobs": 1, "stop": ["\n"]},
}

ROUTES = (
    Route(
        "/v1/completions",
        completions,
        Operation(
            "post",
            "/v1/completions",
            "Create a completion (OpenAI's legacy completions API, as vLLM serves it)",
            (generation_ok("The completion", shapes.Completion, shapes.CompletionChunk), *GENERATION_ERRORS),
            request=json_body(ref(CompletionBody), EXAMPLES),
            parameters=(REQUEST_ID,),
            structs=(CompletionBody, shapes.Completion, shapes.CompletionChunk),
            # msgspec gives ``prompt`` the default the decoder needs to report a missing prompt
            # itself (a 400 naming it); to a client it is required.
            required=((CompletionBody, "prompt"),),
        ),
        reports_load=True,
    ),
)


__all__ = ["ROUTES", "collector", "completions", "merger", "prepare"]
