"""Drive the real server code with a scenario and record a trace for the model (model/stream.py).

What is real: the completions view the app serves (``braid.routes.completions.completions``: validation,
limits, tokenizing, planning, ids) or its chat view (``braid.routes.chat.chat_completions``, on the
single or the batch route: chat validation and the chat template, then the same path), the
nursery run (``CompletionRun``), the merger (``StreamMerger`` / ``ResponseCollector``, with the
route's own events), the SSE body (``CompletionStream``, driven exactly as
quart drives a ``ResponseBody``: ``async with body: async for data in body: await send(data)``)
and the scripted engine, which generates on its own clock when its token delay is above zero.
What is simulated: the client (reads with a delay, pauses, disconnects = cancellation of the
request task, as quart-trio does on ``http.disconnect``), the drain (cancellation at the drain
deadline, as hypercorn does after ``graceful_timeout``) and per-prompt delays in handing outputs
on (a thin wrapper around the scripted engine that sleeps before handing each output to its
driver and records what it handed on, and records the engine's failure reports when they come).

Everything runs on Trio's virtual clock, so a scenario's trace is a pure function of the scenario.
"""

from __future__ import annotations

import contextvars
import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

from braid.engine.base import Deliver, Ending, EngineOutput, EngineRequest, FailureHandler, Observe
from braid.engine.scripted import ScriptedEngine
from braid.errors import BraidError, EngineError, EngineRejected
from braid.metrics import Metrics
from braid.routes.chat import chat_completions
from braid.routes.common import AppState, JsonResponse
from braid.routes.completions import completions
from braid.settings import ParserOptions, Settings
from braid.stream.admit import Admission, Ticket
from braid.wire.output import error_body
from model.stream import parse_sse

if TYPE_CHECKING:
    from braid.engine.vllm_parsers import Parsers

METRICS = Metrics()  # values are irrelevant here; one registry avoids re-registering per example
WATCHDOG = 100_000.0  # virtual seconds: a request still running then is hung
ABORT_BOUND = 0.0  # the scripted engine aborts at once, so every abort is due at its trigger's instant

INVALID_BODIES: dict[str, dict[str, Any]] = {
    "n=0": {"n": 0},
    "max_tokens=-1": {"max_tokens": -1},
    "stream_options without stream": {"stream": False, "stream_options": {"include_usage": True}},
    "logprobs=21": {"logprobs": 21},
    "temperature=3": {"temperature": 3.0},
}

CHAT_INVALID_BODIES: dict[str, dict[str, Any]] = {
    "n=0": {"n": 0},
    "max_tokens=0": {"max_tokens": 0},
    "stream_options without stream": {"stream": False, "stream_options": {"include_usage": True}},
    "top_logprobs=21": {"logprobs": True, "top_logprobs": 21},
    "top_logprobs without logprobs": {"logprobs": False, "top_logprobs": 2},
    "temperature=3": {"temperature": 3.0},
    "no messages": {"messages": []},
    "a message without a role": {"messages": [{"content": "hi"}]},
    "tool_choice auto": {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
    "generation prompt and continued message": {"add_generation_prompt": True, "continue_final_message": True},
}
"""Chat bodies that break the API (merged into a valid chat body; ``messages`` replaces every
conversation, so the batch route gets a list that is not one of conversations or is empty)."""

PARSERS: dict[str, ParserOptions] = {
    "hermes": ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes"),
    "pythonic": ParserOptions(enable_auto_tool_choice=True, tool_call_parser="pythonic"),
    "qwen3_coder": ParserOptions(enable_auto_tool_choice=True, tool_call_parser="qwen3_coder"),
    # vLLM's xlam streams calls right only one token per delta: with several it doubles an
    # argument or loses a call (the bug class of vLLM #55082): braid must feed it engine steps.
    "xlam": ParserOptions(enable_auto_tool_choice=True, tool_call_parser="xlam"),
    "hermes+qwen3": ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3"),
}
"""The servers a parsing scenario may run on: their tool-call and reasoning parser flags."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


@cache
def server_parsers(name: str) -> Parsers:
    """The named server's parsers, loaded on the scripted engine's tokenizer (vLLM's, imported
    only when a scenario parses)."""
    from braid.engine.vllm_parsers import load_parsers

    engine = ScriptedEngine()
    parsers = load_parsers(PARSERS[name], engine.tokenizer.parser_tokenizer(), engine.info.name)
    assert parsers is not None
    return parsers


@attrs.frozen
class Scenario:
    prompts: tuple[str, ...]
    """Completions: the prompts. Chat: each conversation's user message (see :attr:`conversations`)."""
    chat: str | None = None
    """None: ``/v1/completions``; ``"single"``: ``/v1/chat/completions`` (one conversation);
    ``"batch"``: ``/v1/chat/completions/batch`` (one conversation per prompt)."""
    tails: tuple[str | None, ...] = (None,)
    """Chat: what follows conversation i's user message: pattern i % len, None for nothing, else
    the text of an assistant message that ends the conversation (what ``echo`` repeats)."""
    add_generation_prompt: bool = True
    """Chat: False continues the final message instead (``continue_final_message``): the reply
    takes the last message's role."""
    n: int = 1
    max_tokens: int = 4
    stream: bool = True
    include_usage: bool = False
    continuous_usage: bool = False
    echo: bool = False
    logprobs: int | None = None
    ignore_eos: bool = False
    seed: int | None = None
    invalid: str | None = None
    # chat through tool-call and reasoning parsers
    parser: str | None = None
    """A key of :data:`PARSERS`: the server's parser flags, and the request sends :data:`TOOLS`."""
    says: tuple[str, ...] = ()
    """What the engine writes (``<braid:say>``, added to every user message): choice k says k % len."""
    tool_choice: str = "auto"
    parallel: bool = True
    include_reasoning: bool = True
    # engine timing
    token_delay: float = 0.0
    step_delays: tuple[tuple[float, ...], ...] = ((),)
    """Extra delay before each engine step: prompt i uses pattern i % len, step s its s % len entry."""
    # client and server behaviour
    read_delay: float = 0.0
    pause: tuple[float, float] | None = None
    """(at, length): the client reads nothing in [at, at + length)."""
    disconnect_at: float | None = None
    drain: tuple[float, float] | None = None
    """(at, grace): the server starts draining at ``at`` and cancels the request ``grace`` later."""
    heartbeat: float = 15.0
    stall_timeout: float = 30.0
    buffer: int = 64
    # admission (one request alone; the stateful test shares one admission between requests)
    priority: int = 0
    """vLLM's ``priority`` (lower is earlier): the request's place in admission's order."""
    background: bool = False
    """``service_tier: "flex"``: the request is of admission's background class."""
    max_in_flight: int = 0
    reserve: int = 0

    @property
    def conversations(self) -> list[list[dict[str, str]]]:
        """Chat: the conversations the body sends, one per prompt."""
        out = []
        said = "".join(f"<braid:say>{text}</braid:say>" for text in self.says)
        for i, p in enumerate(self.prompts):
            tail = self.tails[i % len(self.tails)]
            conv = [{"role": "user", "content": p + said}]
            if tail is not None:
                conv.append({"role": "assistant", "content": tail})
            out.append(conv)
        return out

    def body(self) -> bytes:
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "n": self.n,
            "stream": self.stream,
            "echo": self.echo,
            "ignore_eos": self.ignore_eos,
        }
        if self.chat is None:
            body["prompt"] = list(self.prompts)
        else:
            convs = self.conversations
            body["messages"] = convs if self.chat == "batch" else convs[0]
            if not self.add_generation_prompt:
                body.update(add_generation_prompt=False, continue_final_message=True)
        if self.stream and self.include_usage:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": self.continuous_usage}
        if self.logprobs is not None and self.chat is None:
            body["logprobs"] = self.logprobs
        elif self.logprobs is not None:
            body.update(logprobs=True, top_logprobs=self.logprobs)
        if self.seed is not None:
            body["seed"] = self.seed
        if self.priority:
            body["priority"] = self.priority
        if self.background:
            body["service_tier"] = "flex"
        if self.parser is not None:
            body.update(tools=TOOLS, tool_choice=self.tool_choice)
            if not self.parallel:
                body["parallel_tool_calls"] = False
            if not self.include_reasoning:
                body["include_reasoning"] = False
        if self.invalid is not None:
            body.update((CHAT_INVALID_BODIES if self.chat else INVALID_BODIES)[self.invalid])
        return json.dumps(body).encode()

    def model_request(self) -> dict[str, Any]:
        """The request as the model sees it (plain data; the API's meaning of the scenario)."""
        req: dict[str, Any] = {
            "kind": "completions" if self.chat is None else "chat",
            "valid": self.invalid is None,
            "stream": self.stream,
            "n": self.n,
            "prompts": list(self.prompts),
            "echo": self.echo,
            "hide_completion": self.chat is None and self.echo and self.max_tokens == 0,
            "logprobs": self.logprobs,
            "include_usage": self.stream and self.include_usage,
            "continuous_usage": self.stream and self.include_usage and self.continuous_usage,
            "priority": self.priority,
            "background": self.background,
        }
        if self.chat is not None:
            req["conversations"] = self.conversations if self.chat == "batch" else self.conversations[:1]
            req["add_generation_prompt"] = self.add_generation_prompt
            if self.parses:
                req["parsing"] = {
                    "tool_choice": self.tool_choice,
                    "parallel": self.parallel,
                    "include_reasoning": self.include_reasoning,
                }
        return req

    @property
    def parses(self) -> bool:
        """The request goes through parsers: it may call tools, or the server has a reasoning parser
        (vLLM's rule: under ``tool_choice`` none the tool parser does not run)."""
        if self.chat is None or self.parser is None:
            return False
        return self.tool_choice != "none" or PARSERS[self.parser].reasoning_parser is not None

    def whole_parse(self, prompt_ids: list[int], text: str, token_ids: list[int]) -> dict[str, Any]:
        """The oracle of a choice (the model's ``parses``): vLLM's ``parse()`` of its whole engine
        text, through a fresh parser of this request's kind (braid's adapter, its one face of vLLM)."""
        assert self.parser is not None
        parsers = server_parsers(self.parser).for_request(
            tools=TOOLS,
            tool_choice=self.tool_choice,
            parallel_tool_calls=None if self.parallel else False,
            chat_template_kwargs=None,
            include_reasoning=True,
        )
        out = parsers.choice(prompt_ids).parse(text, token_ids)
        return {
            "content": out.content,
            "reasoning": out.reasoning,
            "tool_calls": [[c.name, c.arguments] for c in out.tool_calls],
        }

    @property
    def request_id(self) -> str:
        """The id prefix of the response and of its engine requests (the view's, per route)."""
        return "cmpl-prop" if self.chat is None else "chatcmpl-prop"


@attrs.define(eq=False)
class Recorder:
    """The trace of one request: ``records`` in the model's format."""

    scenario: Scenario
    seq: itertools.count  # shared by every recorder of one trio run: one total order
    records: list[dict[str, Any]] = attrs.Factory(list)
    open_engine: set[int] = attrs.Factory(set)
    left_running: int = 0
    max_in_flight: int = 0  # the slots of the admission this request runs under
    prompt_ids: dict[int, list[int]] = attrs.Factory(dict)
    generated: dict[tuple[int, int], tuple[list[str], list[int]]] = attrs.Factory(dict)
    """Each choice's engine text and tokens ((prompt, k) -> texts, token ids): the oracle's input."""

    def add(self, kind: str, **fields: Any) -> dict[str, Any]:
        r = {"seq": next(self.seq), "t": trio.current_time(), "kind": kind, **fields}
        self.records.append(r)
        return r

    def parses(self) -> list[dict[str, Any] | None]:
        """The model's ``parses``: each choice's whole engine text parsed (None: it generated nothing)."""
        s, n = self.scenario, self.scenario.n
        out: list[dict[str, Any] | None] = []
        for j in range(len(s.model_request()["conversations"]) * n):
            got = self.generated.get(divmod(j, n))
            out.append(None if got is None else s.whole_parse(self.prompt_ids[j // n], "".join(got[0]), got[1]))
        return out

    def trace(self) -> dict[str, Any]:
        parses = self.parses() if self.scenario.parses else None
        return {
            "parses": parses,
            "request": self.scenario.model_request(),
            "limits": {
                "heartbeat": self.scenario.heartbeat,
                "abort_bound": ABORT_BOUND,
                "max_in_flight": self.max_in_flight,
                "handover_tokens": Settings().handover_tokens,
            },
            "left_running": self.left_running,
            "records": list(self.records),
        }


CURRENT: contextvars.ContextVar[Recorder] = contextvars.ContextVar("braid_property_recorder")
"""The recorder of the request whose task this is (set by :func:`run_request`)."""


@attrs.define(eq=False)
class RecordingAdmission(Admission):
    """The production admission, recording each ask, grant and release in the trace of the
    request whose ticket it is, at the moment it happens (a grant happens in whichever task
    released the slot, so the owner is bound when the ticket is issued)."""

    owners: dict[int, Recorder] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self.observer = self._observe

    def admit(self, *, background: bool = False) -> Ticket:
        ticket = super().admit(background=background)
        rec = CURRENT.get()
        rec.max_in_flight = self.slots
        self.owners[id(ticket)] = rec
        return ticket

    def _observe(self, kind: str, ticket: Ticket, slots: int) -> None:
        self.owners[id(ticket)].add(f"slot_{kind}", slots=slots)


@attrs.define(eq=False)
class RecordingEngine:
    """The scripted engine with per-prompt step timing, recording each engine request's life."""

    inner: ScriptedEngine
    requests: dict[str, tuple[Recorder, tuple[tuple[float, ...], ...]]] = attrs.Factory(dict)

    @property
    def info(self):  # type: ignore[no-untyped-def]
        return self.inner.info

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.inner.tokenizer

    @property
    def healthy(self) -> bool:
        return self.inner.healthy

    def unfinished_requests(self) -> int:
        return self.inner.unfinished_requests()

    def abort_requests(self, request_ids):  # type: ignore[no-untyped-def]
        # The model judges each request's own abort (its recorder); the batch call only hurries it.
        pass

    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,
        observe: Observe | None = None,
        ending: Ending | None = None,
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        base, _, idx = request.request_id.rpartition("-")
        rec, patterns = self.requests[base]
        prompt = int(idx)
        pattern = patterns[prompt % len(patterns)]
        error: str | None = None
        reported: list[str] = []

        def recorded_deliver(out: EngineOutput) -> bool:
            assert deliver is not None
            taken = deliver(out)
            if taken:
                _record_output(rec, prompt, out)
            return taken

        # Without step delays the engine's own hand-over is exercised too (with them, an output
        # delivered during a delay would overtake the one being delayed).
        direct = recorded_deliver if deliver is not None and not any(pattern) else None

        def failed(err: BraidError) -> None:
            # The engine's report, at the moment it knows: the abort bound runs from here.
            reported.append(type(err).__name__)
            rec.add("engine_failure", prompt=prompt, error=type(err).__name__)
            if on_failure is not None:
                on_failure(err)

        rec.open_engine.add(prompt)
        rec.prompt_ids[prompt] = list(request.prompt_token_ids)
        rec.add("engine_open", prompt=prompt, prompt_tokens=len(request.prompt_token_ids))
        try:
            told, seen = None, observe
            if ending is not None:
                # The tokens the engine has made, counted as it makes them (observe comes first),
                # so the record says how many are really left, not what the run asked for.
                made = 0
                call, max_tokens = ending.call, request.params.max_tokens

                def seen(out: EngineOutput) -> None:
                    nonlocal made
                    made += sum(len(d.token_ids) for d in out.choices)
                    if observe is not None:
                        observe(out)

                def near() -> None:
                    # Recorded before the call, whose release the admission records next.
                    rec.add("engine_ending", prompt=prompt, tokens_left=max_tokens - made)
                    call()

                told = Ending(ending.after, near)
            async with self.inner.open_request(request, failed, direct, observe=seen, ending=told) as outputs:
                timed = self._timed(outputs, rec, prompt, pattern)
                try:
                    yield timed
                finally:
                    await timed.aclose()
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            rec.open_engine.discard(prompt)
            aborts = self.inner.aborted_ids.count(request.request_id)
            if aborts:
                outcome = "aborted"
            elif reported:
                outcome, error = "failed", reported[0]  # its driver may have been cancelled since
            elif error in (EngineError.__name__, EngineRejected.__name__):
                outcome = "failed"
            else:
                outcome = "finished"
            rec.add("engine_close", prompt=prompt, outcome=outcome, error=error, aborts=aborts)

    @staticmethod
    async def _timed(
        outputs: AsyncIterator[EngineOutput], rec: Recorder, prompt: int, pattern: tuple[float, ...]
    ) -> AsyncGenerator[EngineOutput, None]:
        step = 0
        async for out in outputs:
            extra = pattern[step % len(pattern)] if pattern else 0.0
            step += 1
            if extra > 0:
                await trio.sleep(extra)
            _record_output(rec, prompt, out)
            yield out


def _record_output(rec: Recorder, prompt: int, out: EngineOutput) -> None:
    for d in out.choices:
        texts, ids = rec.generated.setdefault((prompt, d.index), ([], []))
        texts.append(d.text)
        ids.extend(d.token_ids)
    rec.add(
        "engine_output",
        prompt=prompt,
        deltas=[[d.index, d.text, len(d.token_ids), d.finish_reason] for d in out.choices],
    )


async def _client_send(rec: Recorder, data: bytes, wait: float) -> None:
    """The transport: a send is a checkpoint (a cancelled send delivers nothing), then the client reads."""
    await trio.lowlevel.checkpoint()
    try:
        events = parse_sse(data)
    except (ValueError, UnicodeDecodeError) as exc:
        rec.add("sse_malformed", detail=f"{exc}: {data[:80]!r}")
        events = []
    for ev in events:
        rec.add("sse", event=ev, wait=wait)
    s = rec.scenario
    if s.read_delay > 0:
        await trio.sleep(s.read_delay)
    if s.pause is not None:
        at, length = s.pause
        if at <= trio.current_time() < at + length:
            await trio.sleep_until(at + length)


def _read(data: bytes) -> Callable[[], Awaitable[bytes]]:
    async def read_body() -> bytes:
        return data

    return read_body


def _error_response(exc: BaseException) -> JsonResponse:
    """What the app answers for an exception escaping the view (which answers BraidErrors itself).

    braid has a handler for BraidError and a catch-all 500 for any other Exception (quart-trio
    tries them on each member of an exception group in turn, so the first member decides).
    """
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, BraidError):
        return JsonResponse(exc.status, error_body(exc))
    if isinstance(exc, Exception):
        return JsonResponse(500, error_body(BraidError("Internal server error")))
    raise exc


async def _respond(engine: RecordingEngine, rec: Recorder, rid: str, admission: Admission) -> None:
    """The app's completions or chat route, from the body bytes to the last byte of the response.

    The view is the production one (:func:`braid.routes.completions.completions`, or
    :func:`braid.routes.chat.chat_completions` for a chat scenario, on its single or batch route);
    its ids come from ``rid`` (``cmpl-...`` or ``chatcmpl-...``), the prefix of the engine request
    ids that ``engine`` records under.
    """
    s = rec.scenario
    settings = Settings(
        buffer=s.buffer,
        stall_timeout=s.stall_timeout,
        heartbeat=s.heartbeat,
        parsers=PARSERS[s.parser] if s.parser is not None else ParserOptions(),
    )
    state = AppState(
        engine,
        settings,
        METRICS,
        new_id=lambda: rid.partition("-")[2],
        now=lambda: 0.0,
        admission=admission,
        parsers=server_parsers(s.parser) if s.parser is not None else None,
    )
    try:
        try:
            if s.chat is None:
                response = await completions(state, _read(s.body()), content_type="application/json", request_id=None)
            else:
                response = await chat_completions(
                    state,
                    _read(s.body()),
                    content_type="application/json",
                    request_id=None,
                    batch=s.chat == "batch",
                )
        except Exception as exc:  # noqa: BLE001 - the app's error handlers
            response = _error_response(exc)
        if isinstance(response, JsonResponse):
            await trio.lowlevel.checkpoint()  # the send
            rec.add("json", status=response.status, body=json.loads(response.body))
            return
        async with response as body:  # exactly quart's ASGIHTTPConnection._send_response
            last = trio.current_time()
            async for data in body:
                await _client_send(rec, data, trio.current_time() - last)
                last = trio.current_time()
    finally:
        rec.left_running = len(rec.open_engine)


@attrs.define(eq=False)
class Stop:
    """An external stop for a running request (the stateful test's disconnect and drain)."""

    event: trio.Event = attrs.Factory(trio.Event)
    kind: str = "disconnect"

    def set(self, kind: str) -> None:
        if not self.event.is_set():
            self.kind = kind
            self.event.set()


async def run_request(
    engine: RecordingEngine,
    rec: Recorder,
    rid: str,
    *,
    t0: float = 0.0,
    stop: Stop | None = None,
    admission: Admission | None = None,
) -> None:
    """One request with its client and server events; adds the ``end`` record. Never raises.

    ``admission``: the server's, shared with other requests (a :class:`RecordingAdmission`);
    by default one of the scenario's own."""
    s = rec.scenario
    CURRENT.set(rec)
    if admission is None:
        admission = RecordingAdmission(slots=s.max_in_flight, reserve=s.reserve)
    stop = stop or Stop()
    how, detail = "complete", None
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def control() -> None:
                nonlocal how
                times = [(t0 + WATCHDOG, "watchdog")]
                if s.disconnect_at is not None:
                    times.append((t0 + s.disconnect_at, "disconnect"))
                if s.drain is not None:
                    times.append((t0 + s.drain[0] + s.drain[1], "drain"))
                at, kind = min(times)
                with trio.move_on_at(at):
                    await stop.event.wait()
                    kind = stop.kind
                how = kind
                if kind != "watchdog":
                    rec.add(kind)
                scope.cancel()

            nursery.start_soon(control)
            try:
                await _respond(engine, rec, rid, admission)
            except Exception as exc:  # noqa: BLE001 - a crash is an observation, checked by the model
                how, detail = "crash", repr(exc)
            nursery.cancel_scope.cancel()
    rec.add("end", how=how, detail=detail)


def run_scenario(s: Scenario) -> tuple[dict[str, Any], ScriptedEngine]:
    """One scenario in a fresh trio run on a virtual clock: its trace, and the engine afterwards."""
    engine = RecordingEngine(ScriptedEngine(token_delay=s.token_delay))
    rec = Recorder(s, itertools.count())
    rid = s.request_id
    engine.requests[rid] = (rec, s.step_delays)
    trio.run(run_request, engine, rec, rid, clock=trio.testing.MockClock(autojump_threshold=0))
    trace = rec.trace()
    trace["left_running"] = max(trace["left_running"], engine.inner.in_flight)
    return trace, engine.inner
