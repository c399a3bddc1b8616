"""The model's own tables (model/machine.py, model/stream.py): complete, and saying what they mean.

No server here: these pin the shape of the specification the other properties check against.
"""

from __future__ import annotations

import pytest

from model import (
    CHOICE_TRANSITIONS,
    INVARIANTS,
    PREFIX_SAFE,
    TRANSITIONS,
    ChoiceEvent,
    ChoiceState,
    Event,
    IllegalEvent,
    RequestMachine,
    RequestState,
)
from model.machine import FINAL_STATES, KIND_EVENTS, RULES, next_state


def test_prefix_safe_names_invariants_and_leaves_out_those_of_an_ended_request() -> None:
    names = {i.name for i in INVARIANTS}
    assert names >= PREFIX_SAFE
    assert names - PREFIX_SAFE == {"transitions", "engine_cleanup", "all_or_nothing", "liveness"}


def test_every_live_state_takes_every_event_and_a_final_state_only_end() -> None:
    assert set(TRANSITIONS) == set(RequestState)
    for state, row in TRANSITIONS.items():
        assert set(row) == ({Event.END} if state in FINAL_STATES else set(Event)), state
        assert row[Event.END] in FINAL_STATES, state


def test_every_event_has_a_rule_and_a_record_kind() -> None:
    assert set(RULES) == set(Event)
    by_fields = {Event.ENGINE_CLOSE, Event.ENGINE_CLOSE_FAILED, Event.SSE, Event.SSE_DONE}  # event_of decides
    assert set(KIND_EVENTS.values()) | by_fields == set(Event)


def test_every_choice_state_takes_the_end() -> None:
    assert set(CHOICE_TRANSITIONS) == set(ChoiceState)
    assert all(ChoiceEvent.END in row for row in CHOICE_TRANSITIONS.values())


FINAL_IN_ORDER = sorted(FINAL_STATES, key=lambda s: s.value)  # a stable order of test ids


@pytest.mark.parametrize("state", FINAL_IN_ORDER)
def test_an_event_a_state_lacks_is_illegal(state: RequestState) -> None:
    with pytest.raises(IllegalEvent, match=f"^sse in state {state.value}$"):
        next_state(TRANSITIONS, state, Event.SSE)


def test_a_replay_skips_an_illegal_or_unknown_record_and_reports_it() -> None:
    m = RequestMachine(n=1, prompts=1)
    for seq, kind in enumerate(["end", "json", "heartbeat"]):
        m.apply({"seq": seq, "kind": kind})
    assert m.state is RequestState.DONE
    assert m.errors == ["seq 1: json in state done", "seq 2: unknown record kind 'heartbeat'"]
