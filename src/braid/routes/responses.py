"""``POST /v1/responses``: OpenAI's Responses API on the chat pipeline, as vLLM 0.32 serves it.

The request is validated into a chat request (:mod:`braid.wire.responses_request`), then takes
chat's data path unchanged: admission before the body is read, the model's chat template, the
request's tool and reasoning parsers (:mod:`braid.routes.chat`), the plan, the run with its aborts
on disconnect and its deadline, the renderer and the merger. Only the shapes differ
(:mod:`braid.wire.responses_response`): the ``response`` object, or its event stream, which
:class:`ResponsesMerger` ends as the Responses API does.

What vLLM's Responses server does differently from its chat server, and braid with it: a forced
call (``"required"``, a named function) is constrained by the parser's JSON schema, which the
response then repeats as its ``text.format``; the engine is not told whether the prompt ended
the reasoning (chat tells it), only the parser's template kwargs; the prompt is tokenized with
the tokenizer's special tokens.

With the server's store (:attr:`~braid.routes.common.AppState.store`) answers are kept for the
request's owner (``store``), continued (``previous_response_id``), retrieved, deleted, and run in
the background (``background``: in the batch runner's nursery, cancelled by
``POST /v1/responses/{id}/cancel``); the quart routes for those are :mod:`braid.http.storage`'s.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Awaitable, Callable

import attrs
import trio

from braid.errors import BraidError, EngineUnavailable, SchemaError, StoreUnavailable
from braid.routes.body import CompletionStream
from braid.routes.chat import constrain, request_parsers
from braid.routes.common import (
    AppState,
    JsonResponse,
    Route,
    ViewResult,
    admit,
    check_deadline,
    collect,
    error_response,
    open_run,
    plan_request,
)
from braid.store.db import Store
from braid.store.records import ANONYMOUS, StoredResponse
from braid.stream.merge import Phase, ProtocolViolation, ResponseCollector, StreamMerger, usage_of
from braid.stream.parse import ChoiceParsing, ParsingOptions
from braid.stream.plan import Plan
from braid.stream.render import ChoiceRenderer
from braid.stream.run import CompletionRun
from braid.stream.tokenize import render_conversations
from braid.wire.completions_request import TextPrompt, build_request
from braid.wire.openapi import GENERATION_ERRORS, REQUEST_ID, Operation, Outcome, error_outcomes, json_body, ref
from braid.wire.output import HEARTBEAT, encode
from braid.wire.responses_request import (
    ResponseNotFound,
    ResponsesBody,
    ResponsesInvalid,
    ResponsesRequest,
    decode_responses,
    history_of,
    tool_calling_text,
    validate_responses,
)
from braid.wire.responses_response import ResponsesEvents, ResponsesShape, response_object

log = logging.getLogger("braid")


@attrs.define
class ResponsesMerger(StreamMerger):
    """The stream of a Responses plan: chat's merger, ended as the Responses API ends a stream
    (the open item's closing events and ``response.completed``, or an ``error`` event; no usage
    chunk, no ``[DONE]``)."""

    def finish(self) -> bytes:
        self._require_streaming()
        if not self.renderer.all_finished:
            raise ProtocolViolation("the stream ended before every choice finished")
        self.phase = Phase.DONE
        assert isinstance(self.events, ResponsesEvents)
        return self.events.closing(usage_of(self.plan, self.renderer))

    @property
    def completed(self) -> bytes | None:
        """The whole response of a stream that ended with ``response.completed`` (JSON); None
        before, or after an error."""
        assert isinstance(self.events, ResponsesEvents)
        return self.events.completed

    def fail(self, err: BraidError) -> bytes:
        self._require_streaming()
        self.phase = Phase.DONE
        # vLLM's stream has sent response.created and .in_progress before it reads the engine:
        # a request that fails before its first output still opens with them, then the error.
        opening = b""
        if not self._opened:
            self._opened = True
            opening = self.events.opening()
        return opening + self.events.error(err)


@attrs.define
class _EngineFinish(ChoiceParsing):
    """Chat's parsing with the engine's finish reason kept: a Responses ``status`` is
    ``incomplete`` exactly when the engine stopped for length, whatever the parser found (chat
    turns a found call's ``"length"`` into ``"tool_calls"``)."""

    def finish_reason(self, index: int, reason: str) -> str:
        return reason


async def create_response(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    background: bool = False,
    owner: str = ANONYMOUS,
) -> ViewResult:
    """Answer one Responses request as :func:`braid.routes.chat.chat_completions` answers a chat
    request: the same admission, plan, run, errors and cancellation. With the server's store,
    ``store`` (the default) keeps the answer for ``owner`` once it is whole (a stream's before
    its ``response.completed`` is sent), and ``previous_response_id`` continues the owner's
    stored response."""
    try:
        ticket, arrived, deadline = admit(state, content_type, request_id, background)
        try:
            req = await _validate(state, await read_body(), owner)
            plan, parsing, shape = await _prepare(state, req, request_id, deadline)
        except BaseException:
            ticket.close()
            raise
        if req.background:
            plan = attrs.evolve(plan, background=True)  # the background admission class
        run = open_run(state, plan, ticket, arrived, deadline, None if parsing is None else parsing.observer)
        renderer = ChoiceRenderer(plan, state.engine.tokenizer, chat_top=req.chat.top_logprobs, parsing=parsing)
        events = ResponsesEvents(plan.meta, shape, state.new_id)
        keep = _keeper(state, req, owner)
        if plan.stream:
            body = _StoringStream(run, ResponsesMerger(plan, renderer, events), keep)
            weakref.finalize(body, run.discard)  # as braid.routes.common.stream
            if req.background:
                assert keep is not None, "validated: background needs the store"
                return await _start_background(state, owner, events, keep, _run_background_stream, body)
            return body
        if req.background:
            assert keep is not None, "validated: background needs the store"
            collector = ResponseCollector(plan, renderer, events)
            return await _start_background(state, owner, events, keep, _run_background, run, collector)
        answer = await collect(run, request_id, ResponseCollector(plan, renderer, events))
        if keep is not None:
            await keep(plan.meta.id, answer.body)
        return answer
    except BraidError as err:
        return error_response(err)


async def _validate(state: AppState, body: bytes, owner: str) -> ResponsesRequest:
    """The request, with its previous response's history looked up in the owner's store."""
    b = decode_responses(body)
    history = None
    store = state.store
    if b.previous_response_id is not None and store is not None:
        found = await store.get_response(owner, b.previous_response_id, int(state.now()))
        if found is None:
            raise ResponseNotFound(b.previous_response_id)
        history = history_of(found.messages, found.body)
    return validate_responses(
        b,
        state.limits,
        max_model_len=state.engine.info.max_model_len,
        parsers=state.settings.parsers,
        history=history,
        background=store is not None and state.spawn is not None,
    )


@attrs.define(eq=False)
class _Background:
    """A ``background`` response running now: its cancel scope, and a streamed one's events."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    events: EventLog | None = None


async def _start_background(
    state: AppState,
    owner: str,
    events: ResponsesEvents,
    keep: Keep,
    run_fn: Callable[..., Awaitable[None]],
    *args: object,
) -> ViewResult:
    """Store the response as ``queued``, start ``run_fn`` (its run) in the server's background
    work, and answer: the queued response, or a streamed one's events as they come (a reader of
    its :class:`EventLog`: the run goes on when the client goes). The run keeps the request's
    ticket, of the background class; its deadline is the request's."""
    assert state.spawn is not None
    response_id = events.meta.id
    key = (owner, response_id)
    if key in state.background_responses:
        raise ResponsesInvalid(f"A background response {response_id!r} is running already.", param="request_id")
    queued = encode(response_object(events.meta, events.shape, status="queued", output=[], usage=None))
    await keep(response_id, queued)
    streamed = args and isinstance(args[0], CompletionStream)
    bg = _Background(events=EventLog(response_id) if streamed else None)
    state.background_responses[key] = bg
    if not state.spawn(run_fn, state, key, bg, keep, *args, name=f"response {response_id}"):
        del state.background_responses[key]
        raise EngineUnavailable("The server is not running background work now.", retry_after=5)
    if bg.events is not None:
        return bg.events.reader(0, state.settings.heartbeat)
    return JsonResponse(200, queued, (("X-Request-Id", response_id),))


async def _failed(events: ResponsesEvents, keep: Keep, err: BraidError) -> None:
    failed = response_object(events.meta, events.shape, status="failed", output=[], usage=None)
    await keep(events.meta.id, encode({**failed, "error": {"code": err.type, "message": err.message}}))


async def _run_background(
    state: AppState,
    key: tuple[str, str],
    bg: _Background,
    keep: Keep,
    run: CompletionRun,
    collector: ResponseCollector,
) -> None:
    """A background response's run: its whole response stored when it ends (``failed`` on an
    error); nothing stored when it was cancelled (the cancel stored ``cancelled``)."""
    response_id = key[1]
    try:
        with bg.scope:
            answer = await collect(run, response_id, collector)
        if not bg.scope.cancel_called:
            await keep(response_id, answer.body)
    except BraidError as err:
        log.warning("background response %s failed: %s", response_id, err.message)
        if not bg.scope.cancel_called:
            assert isinstance(collector.events, ResponsesEvents)
            await _failed(collector.events, keep, err)
    finally:
        state.background_responses.pop(key, None)


async def _run_background_stream(
    state: AppState, key: tuple[str, str], bg: _Background, keep: Keep, body: _StoringStream
) -> None:
    """A streamed background response's run: its events into its log as they come (the stream
    stores the whole response before its ``response.completed``); ``failed`` stored when it ends
    with an error event, nothing when it was cancelled."""
    assert bg.events is not None
    try:
        with bg.scope:
            async with body:
                async for chunk in body:
                    bg.events.add(chunk)
        merger = body.merger
        if not bg.scope.cancel_called and merger.completed is None and isinstance(merger.events, ResponsesEvents):
            await _failed(merger.events, keep, BraidError("The response failed; see its stream's error event."))
    finally:
        bg.events.end()
        state.background_responses.pop(key, None)


@attrs.define(eq=False)
class EventLog:
    """A streamed background response's events (whole SSE events, heartbeats left out), kept
    while it runs for the streams that read it (the request's own, and ``GET
    /v1/responses/{id}?stream=true``); dropped with the run. Bounded by the response's length."""

    response_id: str
    events: list[bytes] = attrs.Factory(list)
    ended: bool = False
    _changed: trio.Event = attrs.Factory(trio.Event)

    def add(self, chunk: bytes) -> None:
        for block in chunk.split(b"\n\n"):
            if block and not block.startswith(b":"):
                self.events.append(block + b"\n\n")
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, seen: int) -> None:
        """Until there are more than ``seen`` events, or the log has ended."""
        while len(self.events) <= seen and not self.ended:
            await self._changed.wait()

    def reader(self, start: int, heartbeat: float) -> _LogReader:
        return _LogReader(self, start, heartbeat)


class _LogReader(CompletionStream):
    """A stream of an :class:`EventLog` from its event ``start`` (a quart response body; it
    owns no run: leaving it leaves the background run alone). An idle log sends heartbeats."""

    def __init__(self, log: EventLog, start: int, heartbeat: float) -> None:  # no run of its own
        self._log = log
        self._pos = start
        self._period = heartbeat

    async def __aenter__(self) -> _LogReader:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def, override]
        return None

    @property
    def response_id(self) -> str:
        return self._log.response_id

    async def __anext__(self) -> bytes:
        with trio.move_on_after(self._period):
            await self._log.wait(self._pos)
            events = self._log.events
            if self._pos >= len(events):
                raise StopAsyncIteration
            chunk = b"".join(events[self._pos :])
            self._pos = len(events)
            return chunk
        return HEARTBEAT


def stream_background(state: AppState, owner: str, response_id: str, starting_after: int | None) -> _LogReader:
    """``GET /v1/responses/{id}?stream=true``: a running streamed background response's events
    after ``starting_after`` (from the first without it); a 400 naming ``response_id`` for any
    other response (braid keeps no events once the run is over: retrieve the response)."""
    bg = state.background_responses.get((owner, response_id))
    if bg is None or bg.events is None:
        raise ResponsesInvalid(f"Unknown response_id: {response_id}", param="response_id")
    return bg.events.reader(0 if starting_after is None else starting_after + 1, state.settings.heartbeat)


async def cancel_response(state: AppState, store: Store, owner: str, response_id: str, now: int) -> JsonResponse:
    """``POST /v1/responses/{id}/cancel``: a background response still running (``queued`` or
    ``in_progress``) is stored ``cancelled`` and its engine work aborted; vLLM's 400 for any
    other, its 404 for none."""
    found = await store.get_response(owner, response_id, now)
    if found is None:
        return error_response(ResponseNotFound(response_id))
    body = json.loads(found.body)
    if body.get("status") not in ("queued", "in_progress"):
        return error_response(ResponsesInvalid("Cannot cancel a synchronous response.", param="response_id"))
    body["status"] = "cancelled"
    cancelled = encode(body)
    bg = state.background_responses.get((owner, response_id))
    if bg is not None:
        bg.scope.cancel()  # before the store write: the run stores nothing once cancelled
    await store.put_response(
        StoredResponse(response_id, owner, found.created_at, found.expires_at, cancelled, found.messages), now
    )
    return JsonResponse(200, cancelled)


Keep = Callable[[str, bytes], Awaitable[None]]


def _keeper(state: AppState, req: ResponsesRequest, owner: str) -> Keep | None:
    """How the answer is kept (None: it is not: ``store: false``, or no store). A store that
    fails is logged, not answered: the client has its response either way."""
    store = state.store
    if store is None or not req.store:
        return None
    messages = json.dumps(list(req.messages)).encode()
    retention = store.options.response_retention

    async def keep(response_id: str, body: bytes) -> None:
        now = int(state.now())
        record = StoredResponse(response_id, owner, now, now + retention, body, messages)
        try:
            if not await store.put_response(record, now):
                log.warning("the response %s is larger than --max-response-bytes: not stored", response_id)
        except (OSError, StoreUnavailable):
            log.exception("the response %s could not be stored", response_id)

    return keep


class _StoringStream(CompletionStream):
    """A Responses stream that keeps its whole response (when asked) before it sends
    ``response.completed``: a client that retrieves it on that event finds it."""

    def __init__(self, run: CompletionRun, merger: ResponsesMerger, keep: Keep | None) -> None:
        super().__init__(run, merger)
        self._responses = merger
        self._keep = keep

    @property
    def merger(self) -> ResponsesMerger:
        return self._responses

    async def __anext__(self) -> bytes:
        data = await super().__anext__()
        keep, self_merger = self._keep, self._responses
        if keep is not None and self_merger.phase is Phase.DONE:
            self._keep = None
            final = self_merger.completed
            if final is not None:
                await keep(self_merger.plan.meta.id, final)
        return data


async def retrieve_response(store: Store, owner: str, response_id: str, now: int) -> JsonResponse:
    """``GET /v1/responses/{id}``: the owner's stored response, or vLLM's 404."""
    found = await store.get_response(owner, response_id, now)
    if found is None:
        return error_response(ResponseNotFound(response_id))
    return JsonResponse(200, found.body)


async def delete_response(state: AppState, store: Store, owner: str, response_id: str) -> JsonResponse:
    """``DELETE /v1/responses/{id}`` as OpenAI answers it (vLLM has none), or the 404. A
    background response still running is cancelled first, so that its end does not store it
    again."""
    bg = state.background_responses.get((owner, response_id))
    if bg is not None:
        bg.scope.cancel()
    if not await store.delete_response(owner, response_id):
        return error_response(ResponseNotFound(response_id))
    return JsonResponse(200, encode({"id": response_id, "object": "response", "deleted": True}))


async def _prepare(
    state: AppState, req: ResponsesRequest, request_id: str | None, deadline: float
) -> tuple[Plan, ChoiceParsing | None, ResponsesShape]:
    """Render, constrain and plan a validated request: its plan, its parsing (None without
    parsers) and what its response adds."""
    chat = req.chat
    with trio.move_on_at(deadline):
        texts = await render_conversations(chat, state.engine.tokenizer, state.tokenize_limiter)
    check_deadline(deadline, state.settings.request_timeout)
    parsers = request_parsers(state, chat)
    body, structured = chat.body, chat.structured
    text = req.echo.text
    if parsers is not None:
        body, structured = constrain(parsers, chat)
        if structured is not None and structured.source == "tool_choice" and structured.json is not None:
            text = tool_calling_text(structured.json)
    creq = build_request(
        body, tuple(TextPrompt(t) for t in texts), state.limits, structured, max_tokens_param="max_output_tokens"
    )
    plan = await plan_request(state, creq, request_id, deadline, "resp")
    response_id = req.request_id or f"resp_{state.new_id()[:16]}"
    # vLLM's Responses usage always reports the prompt tokens found in the prefix cache.
    plan = attrs.evolve(plan, meta=attrs.evolve(plan.meta, id=response_id), cached_tokens=True)
    parsing = None
    if parsers is not None:
        if state.settings.parsers.reasoning_parser is not None:
            items = []
            for item in plan.items:
                _, kwargs = parsers.engine_reasoning(item.request.prompt_token_ids)
                items.append(attrs.evolve(item, request=attrs.evolve(item.request, reasoning_parser_kwargs=kwargs)))
            plan = attrs.evolve(plan, items=tuple(items))
        options = ParsingOptions(
            chat.tool_choice,
            include_reasoning=chat.include_reasoning,
            count_reasoning=state.settings.parsers.reasoning_parser is not None,
        )
        parsing = _EngineFinish.create(
            options,
            [item.request.prompt_token_ids for item in plan.items],
            plan.n,
            plan.stream,
            parsers.choice,
        )
    shape = ResponsesShape(
        req.echo,
        max_output_tokens=plan.items[0].request.params.max_tokens,
        text=text,
        parsed=parsing is not None,
    )
    return plan, parsing, shape


_RESPONSE_SCHEMA = {"type": "object", "description": "A `response` object (OpenAI's Responses API)."}

ROUTES = (
    Route(
        "/v1/responses",
        create_response,
        Operation(
            "post",
            "/v1/responses",
            "Create a model response (OpenAI's Responses API), as vLLM serves it",
            (
                Outcome(
                    200,
                    "The response; with `stream`, its server-sent events (`response.created` ... "
                    "`response.completed`).",
                    {"application/json": {"schema": _RESPONSE_SCHEMA}, "text/event-stream": {}},
                    ("X-Request-Id",),
                ),
                *GENERATION_ERRORS,
            ),
            request=json_body(
                ref(ResponsesBody), {"example": {"input": "Say this is a test", "max_output_tokens": 16}}
            ),
            parameters=(REQUEST_ID,),
            structs=(ResponsesBody,),
        ),
        reports_load=True,
        owned=True,
    ),
)


_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}

STORED_OPERATIONS = (
    Operation(
        "get",
        "/v1/responses/{response_id}",
        "A stored response (`store: true`); with `stream=true`, a running background response's events",
        (
            Outcome(
                200,
                "The response object; with `stream=true`, its events from `starting_after` on.",
                {"application/json": {"schema": _RESPONSE_SCHEMA}, "text/event-stream": {}},
            ),
            *error_outcomes(StoreUnavailable, ResponsesInvalid, SchemaError, ResponseNotFound),
        ),
        parameters=(
            _RESPONSE_ID,
            {"name": "stream", "in": "query", "required": False, "schema": {"type": "boolean"}},
            {"name": "starting_after", "in": "query", "required": False, "schema": {"type": "integer"}},
        ),
    ),
    Operation(
        "delete",
        "/v1/responses/{response_id}",
        "Delete a stored response (OpenAI's route; vLLM has none); a running background one is cancelled",
        (
            Outcome(200, "`{id, object, deleted}`.", {"application/json": {"schema": {"type": "object"}}}),
            *error_outcomes(StoreUnavailable, ResponseNotFound),
        ),
        parameters=(_RESPONSE_ID,),
    ),
    Operation(
        "post",
        "/v1/responses/{response_id}/cancel",
        "Cancel a background response still running",
        (
            Outcome(200, "The response, cancelled.", {"application/json": {"schema": _RESPONSE_SCHEMA}}),
            *error_outcomes(StoreUnavailable, ResponsesInvalid, ResponseNotFound),
        ),
        parameters=(_RESPONSE_ID,),
    ),
)
"""The stored-response routes' OpenAPI entries (documented when the app has a store)."""


__all__ = [
    "ROUTES",
    "STORED_OPERATIONS",
    "ResponsesMerger",
    "cancel_response",
    "create_response",
    "delete_response",
    "retrieve_response",
    "stream_background",
]
