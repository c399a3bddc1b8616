"""The completions view, without quart: request bytes and headers in, a response to send out.

:func:`completions` is the whole data path of ``POST /v1/completions`` in order: validate
(:mod:`braid.wire.completions_request`), tokenize (:mod:`braid.stream.tokenize`), plan (:mod:`braid.stream.plan`), run
(:mod:`braid.stream.run`), merge (:mod:`braid.stream.merge`), encode (:mod:`braid.wire.completions_response`). The quart route in
:mod:`braid.http.app` only reads the body, calls it, and wraps what it returns; the property suite
(``property_tests/harness.py``) calls the same function on a virtual clock, so the suite tests the
code that serves.

:class:`AppState` (what every request shares) lives here too, so that nothing on this path
imports the quart app.
"""

from __future__ import annotations

import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import cast

import attrs
import trio

from braid.engine.base import Engine, check_structured
from braid.errors import (
    BraidError,
    DeadlineExceeded,
    EngineUnavailable,
    InvalidRequest,
    ModelNotFound,
    SchemaError,
)
from braid.http.body import CompletionStream
from braid.metrics import Metrics
from braid.settings import Settings
from braid.stream.admit import Admission, Ticket, admission_for
from braid.stream.chat_merge import ChatResponseCollector, ChatShape, ChatStreamMerger
from braid.stream.merge import ResponseCollector, StreamMerger
from braid.stream.plan import Plan, check_limits, make_plan
from braid.stream.run import Arrival, CompletionRun
from braid.stream.tokenize import encode_prompts, render_conversations
from braid.wire.chat_request import parse_chat
from braid.wire.completions_request import CompletionRequest, Limits, TextPrompt, build_request, parse_request
from braid.wire.completions_response import error_body
from braid.wire.messages import echo_text, response_role

DRAINING_RETRY_AFTER = 5
"""Seconds a client of a draining server is told to wait: behind a proxy its retry reaches a
replica that is not draining, and a restarted server is back within seconds."""
DEAD_ENGINE_RETRY_AFTER = 30
"""Seconds a client is told to wait when the engine has died: a supervisor restarts the process."""


def _limits(state: AppState) -> Limits:
    info = state.engine.info
    return Limits(
        max_prompts=state.settings.max_prompts,
        max_choices=state.settings.max_choices,
        max_logprobs=info.max_logprobs,
        vocab_size=info.vocab_size,
    )


@attrs.define(eq=False)
class AppState:
    """What every request of one app shares. ``limits`` defaults to the settings' and the model's."""

    engine: Engine
    settings: Settings
    metrics: Metrics
    limits: Limits = attrs.field(default=attrs.Factory(_limits, takes_self=True))
    admission: Admission = attrs.field(
        default=attrs.Factory(lambda self: admission_for(self.settings, self.engine.info), takes_self=True)
    )
    draining: bool = False
    runs: set[CompletionRun] = attrs.Factory(set)
    """The runs open now (each adds itself on entry and leaves on exit; see :meth:`end_runs`)."""
    # One large batch tokenizes on a worker thread at a time (the tokenizer's worker copy is
    # not shared between threads; see braid.stream.tokenize).
    tokenize_limiter: trio.CapacityLimiter = attrs.Factory(lambda: trio.CapacityLimiter(1))
    # Where response ids and creation times come from; tests pass fixed ones.
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex
    now: Callable[[], float] = time.time

    def end_runs(self, error: BraidError) -> int:
        """Fail every open run with ``error`` now (a drain out of time); return how many.

        Each run aborts its engine requests and drops its queued prompts at once; its response
        still ends as an error does (a stream: an error event and ``[DONE]``; otherwise the
        error's JSON), so a client learns why instead of seeing its connection cut.
        """
        runs = list(self.runs)
        for run in runs:
            run.abort_all(error)
        return len(runs)


@attrs.frozen
class JsonResponse:
    """A complete ``application/json`` response."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


async def completions(
    state: AppState, read_body: Callable[[], Awaitable[bytes]], *, content_type: str | None, request_id: str | None
) -> JsonResponse | CompletionStream:
    """Answer one completions request: a JSON response, or the stream to send as a 200.

    ``content_type`` and ``request_id`` are the request's ``Content-Type`` and ``X-Request-Id``
    headers (``None`` when absent). ``read_body()`` reads the request body; it is called only
    after the checks that need no body (the content type, a draining server, a dead engine), so a
    request refused by them costs no read.

    * Every :class:`~braid.errors.BraidError` before a response is committed comes back as its
      JSON error (status and vLLM's body): a body that is not JSON, an invalid or over-long
      request (400), an unknown model (404), a full admission queue (429, decided before the
      body is read), a draining server or dead engine (503), a request that used up its
      ``request_timeout`` before its run (408). 429 and 503 carry ``Retry-After``. No engine
      request has been opened by then, and the request's admission ticket is closed.
    * A streaming request returns a :class:`CompletionStream`, not yet started: the caller sends
      it as quart sends a ``ResponseBody`` (``async with stream: async for data in stream:``),
      and its run opens in ``__aenter__``. Errors after that are SSE error events.
    * A non-streaming request runs here, to the end (all or nothing): 200 with the body, or the
      run's error (engine failure 500, late rejection 400) as its JSON error (leaving the run
      raises the error itself, not a group around it).
    * Cancellation (client gone, drain deadline) propagates after the run has aborted every
      engine request it opened; it is never turned into a response.
    * Anything else is a bug, raised as it is; the app answers it with a 500.
    """
    try:
        return await _completions(state, read_body, content_type, request_id)
    except BraidError as err:
        return _error(err)


async def _completions(
    state: AppState, read_body: Callable[[], Awaitable[bytes]], content_type: str | None, request_id: str | None
) -> JsonResponse | CompletionStream:
    ticket, arrived, deadline = _admit(state, content_type, request_id)
    try:
        req = parse_request(await read_body(), state.limits)
        plan = await _plan(state, req, request_id, deadline, "cmpl")
    except BaseException:
        ticket.close()
        raise
    tokenizer = state.engine.tokenizer
    if plan.stream:
        return _stream(_run(state, plan, ticket, arrived, deadline), StreamMerger(plan, tokenizer))
    return await _collect(_run(state, plan, ticket, arrived, deadline), request_id, ResponseCollector(plan, tokenizer))


async def chat_completions(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    batch: bool,
) -> JsonResponse | CompletionStream:
    """Answer one chat request (``batch``: the batch route, a list of conversations), as
    :func:`completions` answers its requests: the same admission, plan, run and errors; only
    the prompts (rendered from messages by the model's chat template) and the response's shape
    (:mod:`braid.stream.chat_merge`) differ."""
    try:
        return await _chat(state, read_body, content_type, request_id, batch)
    except BraidError as err:
        return _error(err)


async def _chat(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    content_type: str | None,
    request_id: str | None,
    batch: bool,
) -> JsonResponse | CompletionStream:
    ticket, arrived, deadline = _admit(state, content_type, request_id)
    try:
        chat = parse_chat(
            await read_body(),
            state.limits,
            max_model_len=state.engine.info.max_model_len,
            batch=batch,
            trust_template=state.settings.trust_request_chat_template,
        )
        with trio.move_on_at(deadline):
            texts = await render_conversations(chat, state.engine.tokenizer, state.tokenize_limiter)
        _check_deadline(deadline, state.settings.request_timeout)
        req = build_request(chat.body, tuple(TextPrompt(t) for t in texts), state.limits, chat.structured)
        try:
            plan = await _plan(state, req, request_id, deadline, "chatcmpl")
        except InvalidRequest as err:
            if err.param == "max_tokens":  # chat's name for it, whichever of the two was sent
                err.param = "max_completion_tokens"
            raise
        roles = tuple(response_role(c, chat.template) for c in chat.conversations)
        shape = ChatShape(
            roles=roles,
            echo=tuple(echo_text(c, r) if chat.echo else "" for c, r in zip(chat.conversations, roles, strict=True)),
            top_logprobs=chat.top_logprobs if chat.logprobs else None,
        )
    except BaseException:
        ticket.close()
        raise
    tokenizer = state.engine.tokenizer
    if plan.stream:
        return _stream(_run(state, plan, ticket, arrived, deadline), ChatStreamMerger(plan, tokenizer, shape=shape))
    run = _run(state, plan, ticket, arrived, deadline)
    return await _collect(run, request_id, ChatResponseCollector(plan, tokenizer, shape))


def _admit(state: AppState, content_type: str | None, request_id: str | None) -> tuple[Ticket, float, float]:
    """The checks that need no body, then admission: the request's ticket, its arrival (where
    the latency histograms start) and its deadline, on Trio's clock."""
    timeout = state.settings.request_timeout
    arrived = trio.current_time()
    deadline = arrived + timeout if timeout is not None else math.inf
    require_json(content_type)
    if state.draining or not state.engine.healthy:
        raise EngineUnavailable(
            "The server is shutting down." if state.draining else "The engine is not running.",
            retry_after=DRAINING_RETRY_AFTER if state.draining else DEAD_ENGINE_RETRY_AFTER,
        )
    if request_id is not None and len(request_id) > state.limits.max_request_id_chars:
        # Repeated in every event of a stream, like the body's request_id, and capped alike.
        raise InvalidRequest(
            f"X-Request-Id may have at most {state.limits.max_request_id_chars} characters, got {len(request_id)}."
        )
    try:
        # Before the body is read or tokenized: a refused request costs nothing (vLLM counts its
        # queue only after rendering the prompts).
        return state.admission.admit(), arrived, deadline
    except BraidError:
        state.metrics.rejected.inc()
        raise


def require_json(content_type: str | None) -> None:
    """A POST body must be declared JSON: vLLM's 400 (its pydantic layer's "Bad Request") otherwise."""
    if (content_type or "").partition(";")[0].strip().lower() != "application/json":
        raise SchemaError("Unsupported Media Type: Only 'application/json' is allowed")


def _check_deadline(deadline: float, timeout: float | None) -> None:
    if trio.current_time() >= deadline:
        raise DeadlineExceeded(f"The request did not finish within its {timeout:g} s timeout.")


async def _plan(state: AppState, req: CompletionRequest, request_id: str | None, deadline: float, prefix: str) -> Plan:
    """Tokenize and plan a validated request (ids ``{prefix}-...``), within its deadline."""
    engine, settings, info = state.engine, state.settings, state.engine.info
    if req.model is not None and req.model != info.name:
        raise ModelNotFound(f"The model `{req.model}` does not exist.", param="model")
    check_structured(engine, req.sampling)  # a constraint the engine cannot compile: 400, not a stream
    state.admission.check_cost(req.sampling.n)
    rid = request_id or req.request_id
    # The response id may be the client's own; the engine's ids must be unique, because a
    # batch abort names the requests to drop by them (two clients may send the same id).
    unique = state.new_id()
    check_limits(req, info, engine.tokenizer)  # before tokenizing: an over-long text costs nothing
    with trio.move_on_at(deadline):
        encoded = await encode_prompts(req, engine.tokenizer, state.tokenize_limiter)
    _check_deadline(deadline, settings.request_timeout)
    return make_plan(
        req,
        info,
        engine.tokenizer,
        request_id=f"{prefix}-{rid or unique}",
        created=int(state.now()),
        engine_request_id=f"{prefix}-{rid}-{unique[:8]}" if rid else None,
        encoded=encoded,
        cached_tokens=settings.prompt_tokens_details,
    )


def _run(state: AppState, plan: Plan, ticket: Ticket, arrived: float, deadline: float) -> CompletionRun:
    state.metrics.prompts.observe(len(plan.items))
    return CompletionRun(
        state.engine,
        plan,
        state.metrics,
        state.settings,
        ticket=ticket,
        deadline=deadline,
        arrived=arrived,
        draining=lambda: state.draining,
        live=state.runs,
    )


def _stream(run: CompletionRun, merger: StreamMerger | ChatStreamMerger) -> CompletionStream:
    stream = CompletionStream(run, merger)
    # The run closes the ticket when it ends; a stream that is never started (its client
    # went away before quart sent it) must not keep its place in the queue, and its prompts
    # are counted as dropped.
    weakref.finalize(stream, run.discard)
    return stream


async def _collect(
    run: CompletionRun, request_id: str | None, collector: ResponseCollector | ChatResponseCollector
) -> JsonResponse:
    plan = run.plan
    async with run:
        while True:
            try:
                # A non-streaming run has no heartbeat, so its batches hold no ticks.
                collector.feed(cast("list[Arrival]", await run.receive_ready()))
            except trio.EndOfChannel:
                break
    return JsonResponse(200, collector.body(), (("X-Request-Id", request_id or plan.meta.id),))


def _error(err: BraidError) -> JsonResponse:
    return JsonResponse(err.status, error_body(err), error_headers(err))


def error_headers(err: BraidError) -> tuple[tuple[str, str], ...]:
    """The headers an error is answered with: ``Retry-After`` when the error names one."""
    return (("Retry-After", str(err.retry_after)),) if err.retry_after is not None else ()


__all__ = ["AppState", "JsonResponse", "chat_completions", "completions", "error_headers", "require_json"]
