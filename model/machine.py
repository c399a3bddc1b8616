"""The state machine of one request, as data: every rule that moves it lives in this module.

In the style of h11's ``_state.py``: a trace record is first classified as an :class:`Event`
(:func:`event_of`), then :data:`TRANSITIONS` says which events each :class:`RequestState` allows
and the state each one leads to; an event missing from a state's row is illegal there
(:func:`next_state` raises :class:`IllegalEvent`). What an event does besides moving the state
(to the engine requests, the choices and the output) is in :data:`RULES`, :data:`OUTPUTS` and
:data:`ENDS_OUTPUT`; each choice has a machine of its own, :data:`CHOICE_TRANSITIONS`. The
tables hold no guards: whatever decides between two outcomes is a distinct event, decided in
:func:`event_of` (an ``engine_close`` with a failure, an ``sse`` record holding ``[DONE]``).

::

    VALIDATING --invalid body: json--> REJECTED (JSON 4xx)
    VALIDATING --engine_open--> STREAMING
    STREAMING  --delta/finish--> STREAMING          choice PENDING->GENERATING->FINISHED
    STREAMING  --error|stall--> DRAINING            (error event + [DONE], or a JSON error);
                                                    an error is the engine's report (engine_failure)
    STREAMING  --disconnect|drain--> DRAINING       (connection closed: no more output)
    STREAMING  --[DONE] / JSON, handler returns--> DONE
    DRAINING   --handler returns, no engine request open--> DONE   unfinished choices -> ABORTED

:class:`RequestMachine` replays a trace through these tables; :func:`model.stream.transitions`
(invariant 0) reports its errors. Nothing here reads more of a trace than its records.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

Record = dict[str, Any]

#: The status of each failure the server reports (the "first failure wins").
ERROR_STATUS = {"EngineError": 500, "EngineRejected": 400, "StreamStalled": 408}


# --------------------------------------------------------------------------------------------
# States and events


class RequestState(enum.Enum):
    VALIDATING = "validating"  # the body is being validated; nothing is committed
    REJECTED = "rejected"  # validation failed: one JSON 4xx, no engine work (terminal)
    STREAMING = "streaming"  # engine requests run; deltas become output
    DRAINING = "draining"  # an error, disconnect, stall or drain happened: aborting the batch
    DONE = "done"  # every engine request closed and the output ended (terminal)


class ChoiceState(enum.Enum):
    PENDING = "pending"  # no delta yet
    GENERATING = "generating"  # some deltas, no finish_reason
    FINISHED = "finished"  # the delta with the finish_reason arrived
    ABORTED = "aborted"  # the request ended before it finished


class Event(enum.Enum):
    """What a trace record is to the request's machine (:func:`event_of`); the value names the
    record kind in error messages."""

    ENGINE_OPEN = "engine_open"
    ENGINE_OUTPUT = "engine_output"
    ENGINE_FAILURE = "engine_failure"  # the engine's report of a failure, when it knows
    ENGINE_CLOSE = "engine_close"  # finished, aborted, or an error the client is not told of
    ENGINE_CLOSE_FAILED = "engine_close (failed)"  # closed with an error of ERROR_STATUS
    DISCONNECT = "disconnect"
    DRAIN = "drain"
    SLOT = "slot_*"  # admission's records, judged by I16 and check_server, not by the machine
    SSE = "sse"  # any SSE event but [DONE]
    SSE_DONE = "sse [DONE]"
    SSE_MALFORMED = "sse_malformed"  # a write that is not SSE: I1 judges it
    JSON = "json"
    END = "end"  # the handler returned


class ChoiceEvent(enum.Enum):
    """What happens to one choice: an engine delta for it, or the request's end."""

    DELTA = "engine delta"
    FINISH = "engine delta with a finish_reason"
    END = "end"


#: The record kinds whose event does not depend on the record's fields (see :func:`event_of`).
KIND_EVENTS: Mapping[str, Event] = {
    "engine_open": Event.ENGINE_OPEN,
    "engine_output": Event.ENGINE_OUTPUT,
    "engine_failure": Event.ENGINE_FAILURE,
    "disconnect": Event.DISCONNECT,
    "drain": Event.DRAIN,
    "slot_ask": Event.SLOT,
    "slot_grant": Event.SLOT,
    "slot_cancel": Event.SLOT,
    "slot_release": Event.SLOT,
    # The engine's word that a request is near its end matters to admission only (its slots
    # may be handed on): a slot event for the machine, judged by invariant 16.
    "engine_ending": Event.SLOT,
    "sse_malformed": Event.SSE_MALFORMED,
    "json": Event.JSON,
    "end": Event.END,
}


# --------------------------------------------------------------------------------------------
# The tables

#: state -> {event -> the state it leads to}. An event missing from a state's row is illegal there.
#: Every live state allows the engine's events: their rules (:data:`RULES`) judge them against the
#: engine requests open; only the final states refuse them.
TRANSITIONS: Mapping[RequestState, Mapping[Event, RequestState]] = {
    RequestState.VALIDATING: {
        Event.ENGINE_OPEN: RequestState.STREAMING,
        Event.ENGINE_OUTPUT: RequestState.VALIDATING,
        Event.ENGINE_FAILURE: RequestState.VALIDATING,
        Event.ENGINE_CLOSE: RequestState.VALIDATING,
        Event.ENGINE_CLOSE_FAILED: RequestState.VALIDATING,
        Event.DISCONNECT: RequestState.DRAINING,
        Event.DRAIN: RequestState.DRAINING,
        Event.SLOT: RequestState.VALIDATING,
        Event.SSE: RequestState.VALIDATING,
        Event.SSE_DONE: RequestState.VALIDATING,
        Event.SSE_MALFORMED: RequestState.VALIDATING,
        Event.JSON: RequestState.REJECTED,  # a JSON response before any engine work is the rejection
        Event.END: RequestState.DONE,
    },
    RequestState.STREAMING: {
        Event.ENGINE_OPEN: RequestState.STREAMING,
        Event.ENGINE_OUTPUT: RequestState.STREAMING,
        Event.ENGINE_FAILURE: RequestState.DRAINING,
        Event.ENGINE_CLOSE: RequestState.STREAMING,
        Event.ENGINE_CLOSE_FAILED: RequestState.DRAINING,  # a stall, or a failure reported only when read
        Event.DISCONNECT: RequestState.DRAINING,
        Event.DRAIN: RequestState.DRAINING,
        Event.SLOT: RequestState.STREAMING,
        Event.SSE: RequestState.STREAMING,
        Event.SSE_DONE: RequestState.STREAMING,
        Event.SSE_MALFORMED: RequestState.STREAMING,
        Event.JSON: RequestState.STREAMING,
        Event.END: RequestState.DONE,
    },
    RequestState.DRAINING: {
        # A driver that had not reached its first checkpoint may still open its engine request
        # (invariant 10 bounds how long it lives).
        Event.ENGINE_OPEN: RequestState.DRAINING,
        Event.ENGINE_OUTPUT: RequestState.DRAINING,
        Event.ENGINE_FAILURE: RequestState.DRAINING,
        Event.ENGINE_CLOSE: RequestState.DRAINING,
        Event.ENGINE_CLOSE_FAILED: RequestState.DRAINING,
        Event.DISCONNECT: RequestState.DRAINING,
        Event.DRAIN: RequestState.DRAINING,
        Event.SLOT: RequestState.DRAINING,
        Event.SSE: RequestState.DRAINING,
        Event.SSE_DONE: RequestState.DRAINING,
        Event.SSE_MALFORMED: RequestState.DRAINING,
        Event.JSON: RequestState.DRAINING,
        Event.END: RequestState.DONE,
    },
    # The handler returns after its last write: ``end`` is the one record a final state takes.
    RequestState.REJECTED: {Event.END: RequestState.REJECTED},
    RequestState.DONE: {Event.END: RequestState.DONE},
}

#: The states a request must end in (:meth:`RequestMachine.finish`).
FINAL_STATES = frozenset({RequestState.REJECTED, RequestState.DONE})

#: Events that write to the client: an error when the output has ended.
OUTPUTS = frozenset({Event.SSE, Event.SSE_DONE, Event.JSON})

#: Events after which nothing more may be written.
ENDS_OUTPUT = frozenset({Event.SSE_DONE, Event.JSON, Event.DISCONNECT, Event.DRAIN, Event.END})

#: choice state -> {choice event -> the state it leads to}. A delta for a finished choice is illegal.
CHOICE_TRANSITIONS: Mapping[ChoiceState, Mapping[ChoiceEvent, ChoiceState]] = {
    ChoiceState.PENDING: {
        ChoiceEvent.DELTA: ChoiceState.GENERATING,
        ChoiceEvent.FINISH: ChoiceState.FINISHED,
        ChoiceEvent.END: ChoiceState.ABORTED,
    },
    ChoiceState.GENERATING: {
        ChoiceEvent.DELTA: ChoiceState.GENERATING,
        ChoiceEvent.FINISH: ChoiceState.FINISHED,
        ChoiceEvent.END: ChoiceState.ABORTED,
    },
    ChoiceState.FINISHED: {ChoiceEvent.END: ChoiceState.FINISHED},
    ChoiceState.ABORTED: {ChoiceEvent.END: ChoiceState.ABORTED},
}


class IllegalEvent(ValueError):
    """A record the machine cannot take: an unknown kind, or an event its state's row lacks."""


def event_of(r: Record) -> Event:
    """The event record ``r`` is to the machine; raises :class:`IllegalEvent` for an unknown kind."""
    kind = r["kind"]
    if kind == "engine_close":
        return Event.ENGINE_CLOSE_FAILED if r["error"] in ERROR_STATUS else Event.ENGINE_CLOSE
    if kind == "sse":
        return Event.SSE_DONE if r["event"]["type"] == "done" else Event.SSE
    try:
        return KIND_EVENTS[kind]
    except KeyError:
        raise IllegalEvent(f"unknown record kind {kind!r}") from None


_State = TypeVar("_State", bound=enum.Enum)
_Event = TypeVar("_Event", bound=enum.Enum)


def next_state(table: Mapping[_State, Mapping[_Event, _State]], state: _State, event: _Event) -> _State:
    """The state ``event`` leads to from ``state`` in ``table`` (:data:`TRANSITIONS` or
    :data:`CHOICE_TRANSITIONS`); raises :class:`IllegalEvent` if the state's row lacks the event."""
    try:
        return table[state][event]
    except KeyError:
        raise IllegalEvent(f"{event.value} in state {state.value}") from None


# --------------------------------------------------------------------------------------------
# The rules: what an event does besides moving the request's state

Rule = Callable[["RequestMachine", Record], None]


def _engine_open(m: RequestMachine, r: Record) -> None:
    m.open_engine.add(r["prompt"])


def _engine_failure(m: RequestMachine, r: Record) -> None:
    if r["prompt"] not in m.open_engine:
        m.errors.append(f"seq {r['seq']}: failure of prompt {r['prompt']} whose engine request is not open")
    m.failed.add(r["prompt"])


def _engine_output(m: RequestMachine, r: Record) -> None:
    seq, p = r["seq"], r["prompt"]
    if p not in m.open_engine:
        m.errors.append(f"seq {seq}: output of prompt {p} whose engine request is not open")
    if p in m.failed:
        m.errors.append(f"seq {seq}: output of prompt {p} after the engine reported its failure")
    for k, _text, _ntok, finish in r["deltas"]:
        j = p * m.n + k
        if not 0 <= j < len(m.choices) or not 0 <= k < m.n:
            m.errors.append(f"seq {seq}: delta for a choice k={k} that does not exist")
            continue
        event = ChoiceEvent.DELTA if finish is None else ChoiceEvent.FINISH
        try:
            m.choices[j] = next_state(CHOICE_TRANSITIONS, m.choices[j], event)
        except IllegalEvent as e:
            m.errors.append(f"seq {seq}: choice {j}: {e}")


def _engine_close(m: RequestMachine, r: Record) -> None:
    m.open_engine.discard(r["prompt"])


def _end(m: RequestMachine, r: Record) -> None:
    """The handler returned: choices not finished were aborted."""
    if m.open_engine:
        m.errors.append(f"seq {r['seq']}: the request ended with engine requests {sorted(m.open_engine)} open")
    m.choices = [next_state(CHOICE_TRANSITIONS, c, ChoiceEvent.END) for c in m.choices]


def _nothing(m: RequestMachine, r: Record) -> None:
    pass


#: event -> its rule (every event has one, so a new event must decide what it does).
RULES: Mapping[Event, Rule] = {
    Event.ENGINE_OPEN: _engine_open,
    Event.ENGINE_OUTPUT: _engine_output,
    Event.ENGINE_FAILURE: _engine_failure,
    Event.ENGINE_CLOSE: _engine_close,
    Event.ENGINE_CLOSE_FAILED: _engine_close,
    Event.DISCONNECT: _nothing,
    Event.DRAIN: _nothing,
    Event.SLOT: _nothing,
    Event.SSE: _nothing,
    Event.SSE_DONE: _nothing,
    Event.SSE_MALFORMED: _nothing,
    Event.JSON: _nothing,
    Event.END: _end,
}


# --------------------------------------------------------------------------------------------
# The machine


@dataclass
class RequestMachine:
    """Replays a trace's records through the tables above; :attr:`errors` lists the illegal steps.

    A record whose event its state does not allow is skipped (its error is recorded and the
    machine stays where it was), so one replay reports every illegal step of a trace.
    """

    n: int
    prompts: int
    state: RequestState = RequestState.VALIDATING
    choices: list[ChoiceState] = field(default_factory=list)
    open_engine: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)  # prompts whose failure the engine reported
    output_ended: bool = False
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.choices = [ChoiceState.PENDING] * (self.n * self.prompts)

    def apply(self, r: Record) -> None:
        """Take one record: look its event up in :data:`TRANSITIONS`, run its rule, move on."""
        try:
            event = event_of(r)
            state = next_state(TRANSITIONS, self.state, event)
        except IllegalEvent as e:
            self.errors.append(f"seq {r['seq']}: {e}")
            return
        if event in OUTPUTS and self.output_ended:
            self.errors.append(f"seq {r['seq']}: {r['kind']} after the output ended")
        self.output_ended = self.output_ended or event in ENDS_OUTPUT
        RULES[event](self, r)
        self.state = state

    def finish(self) -> None:
        """The trace is over: the request must be in a final state."""
        if self.state not in FINAL_STATES:
            self.errors.append(
                f"the request ended in state {self.state.value} "
                f"(engine requests still open: {sorted(self.open_engine)})"
            )
