"""What every route's view shares, without quart: the app's state, the steps of the data path
that do not depend on the route, and the declaration of a route.

A generating route's view (:mod:`braid.routes.completions`, :mod:`braid.routes.chat`) is its data
path in order: :func:`admit` (before the body is read), validate (its ``braid.wire`` request
module), :func:`plan` (tokenize and plan), :func:`open_run`, then :func:`stream` or :func:`collect`
with the route's merger (:mod:`braid.stream.merge` over its ``braid.wire`` output module). The
quart route in :mod:`braid.http.app` only reads the body, calls the view, and wraps what it
returns; the property suite (``property_tests/harness.py``) calls the same views on a virtual
clock, so the suite tests the code that serves.

:class:`AppState` (what every request shares) lives here, so that nothing on this path imports
the quart app. :class:`Route` is what a route module declares: its path, its view and its
OpenAPI operation; the app serves, counts and documents exactly the routes it is given.
"""

from __future__ import annotations

import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
import trio

from braid.engine.base import Engine, Observe, check_structured, select_model
from braid.errors import (
    ENGINE_DOWN,
    BraidError,
    DeadlineExceeded,
    EngineUnavailable,
    InvalidRequest,
    SchemaError,
)
from braid.metrics import Metrics
from braid.routes.body import CompletionStream
from braid.settings import ServingOptions, Settings
from braid.stream.admit import Admission, Ticket, admission_for
from braid.stream.merge import ResponseCollector, StreamMerger
from braid.stream.plan import Arrival, Plan, check_limits, make_plan
from braid.stream.render import ChoiceRenderer
from braid.stream.run import CompletionRun
from braid.stream.tokenize import encode_prompts
from braid.wire.completions_request import CompletionRequest
from braid.wire.fields import Limits
from braid.wire.openapi import Operation
from braid.wire.output import ChoiceEvents, error_body

if TYPE_CHECKING:
    from braid.engine.vllm_parsers import Parsers  # imports vLLM: only a server with parser flags loads it
    from braid.store.db import Store

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
    parsers: Parsers | None = None
    """The server's tool-call and reasoning parsers (``--tool-call-parser``, ``--reasoning-parser``);
    None when no flag names one, and then no request pays for them."""
    store: Store | None = None
    """The server's store (``braid serve`` opens one): stored ``/v1/responses`` answers."""
    spawn: Callable[..., bool] | None = None
    """Starts server-lifetime background work (``spawn(fn, *args, name=...)``, False when it
    cannot): the batch runner's nursery, on a server with a store. ``background`` responses run
    there."""
    background_responses: dict[tuple[str, str], Any] = attrs.Factory(dict)
    """The ``background`` responses running now, by (owner, id): what a cancel cancels and a
    ``GET ...?stream=true`` reads (:mod:`braid.routes.responses`). Bounded by admission (each
    holds a ticket of the background class)."""
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


ViewResult = JsonResponse | CompletionStream
"""A view's answer: a whole JSON response, or a stream to send as a 200 (not yet started)."""


class View(Protocol):
    """A route's view: the request's body (read only when the view asks), its ``Content-Type``
    and ``X-Request-Id`` headers (None when absent) -> its answer. Every
    :class:`~braid.errors.BraidError` comes back as its JSON error; cancellation propagates.
    ``background``: the request's API key runs its requests in the background class
    (``braid.http.auth``); a view that takes no engine slots ignores it."""

    def __call__(
        self,
        state: AppState,
        read_body: Callable[[], Awaitable[bytes]],
        *,
        content_type: str | None,
        request_id: str | None,
        background: bool = False,
    ) -> Awaitable[ViewResult]: ...


@attrs.frozen
class Prepared:
    """A request validated and planned, not yet admitted to run: what a route's ``prepare`` step
    gives (:func:`braid.routes.completions.prepare`, :func:`braid.routes.chat.prepare`). Its view
    runs it under the request's own ticket; the batch runner runs several lines' under one
    (:mod:`braid.batch.group`). Made once per request: the renderer keeps the choices' state."""

    plan: Plan
    renderer: ChoiceRenderer
    events: ChoiceEvents
    observe: Callable[[int], Observe | None] | None = None
    """The engine's ``observe`` hook per prompt index (a parsed chat's), or None."""

    def merger(self) -> StreamMerger:
        return StreamMerger(self.plan, self.renderer, self.events)

    def collector(self) -> ResponseCollector:
        return ResponseCollector(self.plan, self.renderer, self.events)


class Prepare(Protocol):
    """A route's steps between admission and the run: its body (read) -> :class:`Prepared`, or
    the :class:`~braid.errors.BraidError` the route answers; within ``deadline`` (Trio's clock).
    ``request_id``: the request's ``X-Request-Id`` header (None when absent)."""

    def __call__(
        self, state: AppState, body: bytes, request_id: str | None, deadline: float
    ) -> Awaitable[Prepared]: ...


@attrs.frozen
class Route:
    """One POST route of the API: what the app serves at ``path``, and how it is documented."""

    path: str
    view: View
    operation: Operation
    reports_load: bool = False
    """Its whole 200 answers carry vLLM's ORCA load report when the request asks for one
    (``endpoint-load-metrics-format``: :mod:`braid.http.orca`), as vLLM's completions and chat
    routes do."""
    owned: bool = False
    """Its view takes the request's ``owner`` too (the API key's owner id, or the anonymous
    owner: :mod:`braid.store.records`), for what it keeps in the store."""
    adapt_body: Callable[[bytes, Callable[[str], str | None]], bytes] | None = None
    """Rewrites the body from the request's headers (given as a lookup by name) before the view
    reads it (``/invocations``: SageMaker's adapter header sets ``model``)."""

    def __attrs_post_init__(self) -> None:
        if (self.operation.method, self.operation.path) != ("post", self.path):
            raise ValueError(
                f"the operation of POST {self.path} documents {self.operation.method} {self.operation.path}"
            )


def admit(
    state: AppState, content_type: str | None, request_id: str | None, background: bool = False
) -> tuple[Ticket, float, float]:
    """The checks that need no body, then admission: the request's ticket (of the background
    class when its key is a background key), its arrival (where the latency histograms start)
    and its deadline, on Trio's clock."""
    timeout = state.settings.request_timeout
    arrived = trio.current_time()
    deadline = arrived + timeout if timeout is not None else math.inf
    require_json(content_type)
    if state.draining or not state.engine.healthy:
        raise EngineUnavailable(
            "The server is shutting down." if state.draining else ENGINE_DOWN,
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
        return state.admission.admit(background=background), arrived, deadline
    except BraidError:
        state.metrics.rejected.inc()
        raise


def require_json(content_type: str | None) -> None:
    """A POST body must be declared JSON: vLLM's 400 (its pydantic layer's "Bad Request") otherwise."""
    if (content_type or "").partition(";")[0].strip().lower() != "application/json":
        raise SchemaError("Unsupported Media Type: Only 'application/json' is allowed")


def check_deadline(deadline: float, timeout: float | None) -> None:
    if trio.current_time() >= deadline:
        raise DeadlineExceeded(f"The request did not finish within its {timeout:g} s timeout.")


async def plan_request(
    state: AppState, req: CompletionRequest, request_id: str | None, deadline: float, prefix: str
) -> Plan:
    """Tokenize and plan a validated request (ids ``{prefix}-...``), within its deadline."""
    engine, settings, info = state.engine, state.settings, state.engine.info
    req = server_defaults(req, settings.serving)
    select_model(info, req.model)  # an unknown model or adapter: vLLM's 404, before any work
    check_structured(engine, req.sampling)  # a constraint the engine cannot compile: 400, not a stream
    state.admission.check_cost(req.sampling.n)
    rid = request_id or req.request_id
    # The response id may be the client's own; the engine's ids must be unique, because a
    # batch abort names the requests to drop by them (two clients may send the same id).
    unique = state.new_id()
    check_limits(req, info, engine.tokenizer)  # before tokenizing: an over-long text costs nothing
    with trio.move_on_at(deadline):
        encoded = await encode_prompts(req, engine.tokenizer, state.tokenize_limiter)
    check_deadline(deadline, settings.request_timeout)
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


def server_defaults(req: CompletionRequest, serving: ServingOptions) -> CompletionRequest:
    """The request with what the server's options decide for it, as vLLM's serving layer
    decides it: ``--enable-force-include-usage`` turns on a stream's usage chunk and its
    continuous usage whatever ``stream_options`` says (vLLM's ``should_include_usage``), and
    ``--return-tokens-as-token-ids`` is the default of a request that leaves the field unset."""
    if serving.force_include_usage and req.stream:
        req = attrs.evolve(req, include_usage=True, continuous_usage=True)
    if serving.return_tokens_as_token_ids and req.return_tokens_as_token_ids is None:
        req = attrs.evolve(req, return_tokens_as_token_ids=True)  # unset without the option plans as false
    return req


def open_run(
    state: AppState,
    plan: Plan,
    ticket: Ticket,
    arrived: float,
    deadline: float,
    observe: Callable[[int], Observe | None] | None = None,
) -> CompletionRun:
    """The run of a plan. ``observe(prompt_idx)``: the engine's ``observe`` hook for a prompt's
    request (a parsed chat stream's: :meth:`braid.stream.parse.ChoiceParsing.observer`).

    The ticket learns the plan's priority and class first; when its class refuses it (a full
    background queue, an ``n`` the background class can never hold), the ticket is closed and
    the error raised."""
    try:
        ticket.classify(plan.priority, background=plan.background, cost=plan.n)
    except BraidError:
        ticket.close()
        raise
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
        observe=observe,
    )


def stream(run: CompletionRun, merger: StreamMerger) -> CompletionStream:
    """The response body of a streaming run, not yet started."""
    stream = CompletionStream(run, merger)
    # The run closes the ticket when it ends; a stream that is never started (its client
    # went away before quart sent it) must not keep its place in the queue, and its prompts
    # are counted as dropped.
    weakref.finalize(stream, run.discard)
    return stream


async def collect(run: CompletionRun, request_id: str | None, collector: ResponseCollector) -> JsonResponse:
    """Run a non-streaming request to the end: 200 with the whole body, or the run's error raised
    as itself (the caller answers it as its JSON error)."""
    plan = run.plan
    async with run:
        while True:
            try:
                # A non-streaming run has no heartbeat, so its batches hold no ticks.
                collector.feed(cast("list[Arrival]", await run.receive_ready()))
            except trio.EndOfChannel:
                break
    return JsonResponse(200, collector.body(), (("X-Request-Id", request_id or plan.meta.id),))


def error_response(err: BraidError) -> JsonResponse:
    return JsonResponse(err.status, error_body(err), error_headers(err))


def error_headers(err: BraidError) -> tuple[tuple[str, str], ...]:
    """The headers an error is answered with: ``Retry-After`` when the error names one."""
    return (("Retry-After", str(err.retry_after)),) if err.retry_after is not None else ()


__all__ = [
    "AppState",
    "JsonResponse",
    "Prepare",
    "Prepared",
    "Route",
    "View",
    "ViewResult",
    "admit",
    "check_deadline",
    "collect",
    "error_headers",
    "error_response",
    "open_run",
    "plan_request",
    "require_json",
    "server_defaults",
    "stream",
]
