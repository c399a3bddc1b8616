"""model.dialects: the Responses and Messages framing rules on hand-built streams: a well-formed
stream of each passes, and each rule catches the defect it names (every rule can fail)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from model.dialects import (
    check_messages,
    check_responses,
    messages_view,
    parse_named_sse,
    responses_view,
)

MESSAGE = {"type": "message", "id": "m", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}  # fmt: skip
CALL = {
    "type": "function_call",
    "id": "f",
    "call_id": "c",
    "name": "get",
    "arguments": '{"a": 1}',
    "status": "completed",
}


def _responses() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"output": []}},
        {"type": "response.in_progress", "response": {"output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**MESSAGE, "content": []}},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0, "part": {}},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hel"},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "lo"},
        {"type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": "Hello"},
        {"type": "response.content_part.done", "output_index": 0, "content_index": 0, "part": {}},
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
        {"type": "response.output_item.added", "output_index": 1, "item": {**CALL, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"a": '},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "1}"},
        {"type": "response.function_call_arguments.done", "output_index": 1, "arguments": '{"a": 1}'},
        {"type": "response.output_item.done", "output_index": 1, "item": CALL},
        {"type": "response.completed", "response": {"output": [MESSAGE, CALL], "usage": {"output_tokens": 7}}},
    ]
    for i, e in enumerate(events):
        e["sequence_number"] = i
    return events


def _messages() -> list[dict[str, Any]]:
    return [
        {"type": "message_start", "message": {"id": "msg", "content": [], "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "name": "get", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a"'}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ": 1}"}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]


def _sse(datas: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {d['type']}\ndata: {json.dumps(d)}\n\n".encode() for d in datas)


def test_well_formed_streams_pass_and_show_their_choice() -> None:
    responses = parse_named_sse(_sse(_responses()))
    assert check_responses(responses) == []
    seen = responses_view(responses)
    assert (seen.content, seen.tool_calls, seen.end, seen.usage) == (
        "Hello",
        [("get", '{"a": 1}')],
        "response.completed",
        {"output_tokens": 7},
    )
    messages = parse_named_sse(b": comment\n\n" + _sse(_messages()))
    assert check_messages(messages) == []
    shown = messages_view(messages)
    assert (shown.reasoning, shown.content, shown.tool_calls, shown.end) == (
        "hmm",
        "Hi",
        [("get", '{"a": 1}')],
        "tool_use",
    )


def _drop(i: int) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    return lambda evs: evs[:i] + evs[i + 1 :]


def _renumber(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, e in enumerate(evs):
        e["sequence_number"] = i
    return evs


def _set(i: int, key: str, value: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def edit(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        evs[i][key] = value
        return evs

    return edit


RESPONSE_DEFECTS: dict[str, tuple[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]]] = {
    "a repeated sequence number": ("R2", _set(5, "sequence_number", 4)),
    "no response.created": ("R3", lambda evs: _renumber(evs[1:])),
    "two terminal events": ("R3", lambda evs: _renumber([*evs, copy.deepcopy(evs[-1])])),
    "an event after the end": ("R3", lambda evs: _renumber([*evs[:-1], evs[-1], copy.deepcopy(evs[4])])),
    "an item never closed": ("R4", lambda evs: _renumber(_drop(13)(evs))),
    "a delta after its item closed": ("R4", lambda evs: _renumber([*evs[:9], copy.deepcopy(evs[4]), *evs[9:]])),
    "items out of order": ("R4", _set(9, "output_index", 2)),
    "a lost delta": ("R5", lambda evs: _renumber(_drop(5)(evs))),
    "arguments differ from their deltas": ("R5", _set(12, "arguments", '{"a": 2}')),
    "the final output misses an item": ("R6", lambda evs: _set(14, "response", {"output": [MESSAGE]})(evs)),
}


@pytest.mark.parametrize("defect", sorted(RESPONSE_DEFECTS))
def test_each_responses_rule_catches_its_defect(defect: str) -> None:
    rule, edit = RESPONSE_DEFECTS[defect]
    broken = check_responses(parse_named_sse(_sse(edit(_responses()))))
    assert any(v.startswith(rule) for v in broken), broken


def test_a_misnamed_block_and_done_break_r1() -> None:
    events = parse_named_sse(_sse(_responses()) + b"data: [DONE]\n\n")
    assert any(v.startswith("R1") for v in check_responses(events))
    events = parse_named_sse(b"event: response.created\ndata: " + json.dumps(_responses()[1]).encode() + b"\n\n")
    assert any(v.startswith("R1") for v in check_responses(events))


def test_an_error_event_may_end_a_responses_stream() -> None:
    evs = _renumber([*_responses()[:6], {"type": "error", "code": "x", "message": "engine failed"}])
    events = parse_named_sse(_sse(evs))
    assert check_responses(events) == []
    assert responses_view(events).error is not None and responses_view(events).end is None


MESSAGE_DEFECTS: dict[str, tuple[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]]] = {
    "no message_start": ("M2", _drop(0)),
    "no message_stop": ("M2", lambda evs: evs[:-1]),
    "two message_delta": ("M2", lambda evs: [*evs[:-1], copy.deepcopy(evs[-2]), evs[-1]]),
    "an event after message_stop": ("M2", lambda evs: [*evs, {"type": "message_delta", "delta": {}}]),
    "a block never closed": ("M3", _drop(11)),
    "two blocks open": ("M3", _drop(3)),
    "a block index skipped": ("M3", lambda evs: [{**e, "index": 3} if e.get("index") == 2 else e for e in evs]),
    "a text delta in a tool block": (
        "M3",
        lambda evs: [
            *evs[:9],
            {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "x"}},
            *evs[9:],
        ],
    ),
    "a lost json piece": ("M4", _drop(10)),
}


@pytest.mark.parametrize("defect", sorted(MESSAGE_DEFECTS))
def test_each_messages_rule_catches_its_defect(defect: str) -> None:
    rule, edit = MESSAGE_DEFECTS[defect]
    broken = check_messages(parse_named_sse(_sse(edit(_messages()))))
    assert any(v.startswith(rule) for v in broken), broken


def test_an_error_event_ends_a_messages_stream() -> None:
    evs = [*_messages()[:3], {"type": "error", "error": {"type": "api_error", "message": "x"}}]
    assert check_messages(parse_named_sse(_sse(evs))) == []
    broken = [*evs, {"type": "message_stop"}]
    assert any(v.startswith("M2") for v in check_messages(parse_named_sse(_sse(broken))))
    misnamed = b'event: message_stop\ndata: {"type": "message_start"}\n\n'
    assert any(v.startswith("M1") for v in check_messages(parse_named_sse(misnamed)))
