"""The Responses event stream and body, driven with choice chunks as the renderer makes them."""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.engine.tool_calls import ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta
from braid.errors import DeadlineExceeded
from braid.wire.output import ChoiceChunk, CollectedChoice, ResponseMeta, Usage
from braid.wire.responses_request import ResponsesEcho
from braid.wire.responses_response import ResponsesEvents, ResponsesShape
from tests.parity.responses_compare import parse_event_stream

ECHO = ResponsesEcho(
    instructions=None,
    metadata=None,
    tools=(),
    tool_choice="auto",
    text=None,
    reasoning=None,
    parallel_tool_calls=True,
    temperature=0.0,
    top_p=1.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    service_tier="auto",
    truncation="disabled",
    user=None,
    max_tool_calls=None,
    top_logprobs=None,
)


def _events() -> ResponsesEvents:
    counter = itertools.count()
    return ResponsesEvents(
        ResponseMeta("resp_1", 7, "m"),
        ResponsesShape(ECHO, max_output_tokens=50, parsed=True),
        lambda: f"{next(counter):016x}",
    )


def _chunk(parsed: ParsedDelta | None = None, text: str = "", finish: str | None = None) -> ChoiceChunk:
    return ChoiceChunk(0, 0, text, None, finish, None, None, None, None, 1, parsed=parsed)


def _parse(raw: bytes) -> list[tuple[str | None, Any]]:
    return parse_event_stream(raw)


def test_a_mixed_stream_opens_and_closes_every_item_in_order() -> None:
    ev = _events()
    raw = ev.opening()
    raw += ev.chunk(_chunk(ParsedDelta(reasoning="Think")), None)
    # one delta with every part: reasoning, then content, then the calls by index
    raw += ev.chunk(
        _chunk(
            ParsedDelta(
                reasoning=" more",
                content="Hi",
                tool_calls=(ToolCallDelta(0, "call_a", "f", '{"x"'), ToolCallDelta(1, "call_b", "g", "{}")),
            )
        ),
        None,
    )
    raw += ev.chunk(_chunk(ParsedDelta(tool_calls=(ToolCallDelta(1, arguments=""),)), finish="stop"), None)
    raw += ev.closing(Usage(3, 5, reasoning_tokens=2))
    events = _parse(raw)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(name == d["type"] for name, d in events)
    added = [d for n, d in events if n == "response.output_item.added"]
    done = [d for n, d in events if n == "response.output_item.done"]
    assert [d["item"]["type"] for d in added] == ["reasoning", "message", "function_call", "function_call"]
    assert [d["item"]["id"] for d in added] == [d["item"]["id"] for d in done]  # every item closed
    assert [d["output_index"] for d in done] == [0, 1, 2, 3]
    # an item is closed before the next opens
    order = [(n, d["output_index"]) for n, d in events if (n or "").startswith("response.output_item")]
    assert order == [(k, i) for i in range(4) for k in ("response.output_item.added", "response.output_item.done")]
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and final["status"] == "completed"
    assert final["output"] == [d["item"] for d in done]
    assert final["output"][0]["content"] == [{"text": "Think more", "type": "reasoning_text"}]
    assert final["output"][1]["content"][0]["text"] == "Hi"
    assert [(o["call_id"], o["name"], o["arguments"]) for o in final["output"][2:]] == [
        ("call_a", "f", '{"x"'),
        ("call_b", "g", "{}"),
    ]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    assert b"[DONE]" not in raw


def test_a_length_cut_is_incomplete() -> None:
    ev = _events()
    raw = ev.opening() + ev.chunk(_chunk(ParsedDelta(content="ab"), finish="length"), None) + ev.closing(Usage(1, 2))
    final = _parse(raw)[-1][1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_error_ends_the_stream_with_an_error_event() -> None:
    ev = _events()
    raw = ev.opening() + ev.chunk(_chunk(ParsedDelta(content="ab")), None)
    raw += ev.error(DeadlineExceeded("too slow"))
    name, data = _parse(raw)[-1]
    assert name == "error" and data["message"] == "too slow" and data["code"] == DeadlineExceeded.type
    assert data["sequence_number"] == len(_parse(raw)) - 1


def test_empty_parsed_deltas_open_nothing() -> None:
    ev = _events()
    raw = ev.opening() + ev.chunk(_chunk(ParsedDelta()), None) + ev.closing(Usage(1, 0))
    assert [n for n, _ in _parse(raw)] == ["response.created", "response.in_progress", "response.completed"]


def test_the_whole_body_lists_reasoning_message_and_calls() -> None:
    ev = _events()
    choice = CollectedChoice()
    choice.add(
        ChoiceChunk(
            0,
            0,
            "raw",
            None,
            "stop",
            None,
            None,
            None,
            None,
            4,
            whole=ParsedOutput(content="Hi", reasoning="Think", tool_calls=(ToolCall("call_a", "f", "{}"),)),
        )
    )
    body = json.loads(ev.body([choice], Usage(3, 4)))
    assert [o["type"] for o in body["output"]] == ["reasoning", "message", "function_call"]
    assert body["output"][0]["status"] is None  # as vLLM: a whole reasoning item has no status
    assert body["status"] == "completed" and body["usage"]["total_tokens"] == 7


def test_an_unparsed_empty_answer_is_a_message_without_content() -> None:
    ev = _events()
    choice = CollectedChoice()
    choice.add(_chunk(text="", finish="stop"))
    body = json.loads(ev.body([choice], Usage(3, 1)))
    assert body["output"][0]["type"] == "message" and body["output"][0]["content"] == []


# -- the framing invariants, over any sequence of parsed deltas ---------------------------------

_TEXT = st.text(alphabet="ab \n{}", min_size=0, max_size=4)


@st.composite
def _deltas(draw: st.DrawFn) -> list[ParsedDelta]:
    """Parsed deltas as a parser makes them: reasoning, content and call pieces, a call's first
    piece naming it and its later pieces following it directly (a call is not interrupted). Steps
    are joined into one delta when they come in the order a delta is split in (reasoning,
    content, calls), as a parser's delta for several engine steps is."""
    rank = {"reasoning": 0, "content": 1, "call": 2}
    steps: list[tuple[str, Any]] = []
    call = -1
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["reasoning", "content", "call", "more"]))
        if kind == "more" and steps and steps[-1][0] == "call":
            steps.append(("call", ToolCallDelta(call, arguments=draw(_TEXT))))
        elif kind in ("call", "more"):
            call += 1
            steps.append(("call", ToolCallDelta(call, f"call_{call}", f"f{call}", draw(_TEXT))))
        else:
            steps.append((kind, draw(_TEXT.filter(bool))))
    out: list[ParsedDelta] = []
    group: list[tuple[str, Any]] = []
    for step in steps:
        joined = group and rank[step[0]] >= rank[group[-1][0]] and (step[0] == "call" or step[0] != group[-1][0])
        if group and not (joined and draw(st.booleans())):
            out.append(_join(group))
            group = []
        group.append(step)
    if group:
        out.append(_join(group))
    return out


def _join(group: list[tuple[str, Any]]) -> ParsedDelta:
    return ParsedDelta(
        reasoning="".join(v for k, v in group if k == "reasoning"),
        content="".join(v for k, v in group if k == "content"),
        tool_calls=tuple(v for k, v in group if k == "call"),
    )


@settings(max_examples=300, derandomize=True, database=None)
@given(deltas=_deltas(), finish=st.sampled_from(["stop", "length"]), fail_at=st.none() | st.integers(0, 12))
def test_any_stream_is_framed(deltas: list[ParsedDelta], finish: str, fail_at: int | None) -> None:
    ev = _events()
    raw = ev.opening()
    failed = False
    for i, d in enumerate(deltas):
        if fail_at == i:
            raw += ev.error(DeadlineExceeded("late"))
            failed = True
            break
        raw += ev.chunk(_chunk(d, finish=finish if i == len(deltas) - 1 else None), None)
    if not failed:
        raw += ev.closing(Usage(1, len(deltas)))
    events = _parse(raw)
    names = [n for n, _ in events]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(n == d["type"] for n, d in events)
    assert names[:2] == ["response.created", "response.in_progress"]
    terminal = [n for n in names if n in ("response.completed", "error")]
    assert terminal == [names[-1]]  # exactly one, and last
    assert (names[-1] == "error") == failed
    # items: opened and closed one at a time, numbered in order, ids kept
    open_item: dict[str, Any] | None = None
    closed: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    for n, d in events:
        if n == "response.output_item.added":
            assert open_item is None and d["output_index"] == len(closed)
            open_item = d["item"]
        elif n == "response.output_item.done":
            assert open_item is not None and d["item"]["id"] == open_item["id"]
            closed.append(d["item"])
            open_item = None
        elif n is not None and n.endswith(".delta"):
            assert open_item is not None and d["item_id"] == open_item["id"]
            texts[d["item_id"]] = texts.get(d["item_id"], "") + d["delta"]
    if failed:
        return
    assert open_item is None  # every opened item closed
    final = events[-1][1]["response"]
    assert final["output"] == closed
    assert final["status"] == ("incomplete" if finish == "length" and deltas else "completed")
    # what the items hold is what was streamed, and all of it
    for item in closed:
        if item["type"] == "function_call":
            assert item["arguments"] == texts.get(item["id"], "")
        elif item["type"] == "message":
            assert item["content"][0]["text"] == texts[item["id"]]
        else:
            assert item["content"][0]["text"] == texts[item["id"]]
    kinds = {"message": "content", "reasoning": "reasoning"}
    for kind, field in kinds.items():
        streamed = "".join(texts[i["id"]] for i in closed if i["type"] == kind)
        assert streamed == "".join(getattr(d, field) for d in deltas)
    calls = [i for i in closed if i["type"] == "function_call"]
    expected: dict[int, str] = {}
    for d in deltas:
        for p in d.tool_calls:
            expected[p.index] = expected.get(p.index, "") + p.arguments
    assert {int(c["call_id"].split("_")[1]): c["arguments"] for c in calls} == expected


def test_logprobs_of_held_back_tokens_go_with_the_content_they_become() -> None:
    ev = _events()
    lp = ({"token": "<", "logprob": -1.0, "bytes": [60], "top_logprobs": []},)
    lp2 = ({"token": "a", "logprob": -2.0, "bytes": [97], "top_logprobs": []},)
    raw = ev.opening()
    raw += ev.chunk(attrs.evolve(_chunk(ParsedDelta()), logprobs=lp), None)  # the parser holds "<" back
    raw += ev.chunk(attrs.evolve(_chunk(ParsedDelta(content="<a"), finish="stop"), logprobs=lp2), None)
    raw += ev.closing(Usage(1, 2))
    deltas = [d for n, d in _parse(raw) if n == "response.output_text.delta"]
    assert [e["token"] for e in deltas[0]["logprobs"]] == ["<", "a"]


def _lp(token: str, logprob: float) -> tuple[dict[str, Any], ...]:
    return ({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []},)


def test_logprobs_of_tokens_without_text_go_with_the_next_text_or_close_the_message() -> None:
    ev = _events()
    raw = ev.opening()
    raw += ev.chunk(attrs.evolve(_chunk(text="a"), logprobs=_lp("a", -1.0)), None)
    # part of a character: no text yet, its logprob waits for the text it becomes
    raw += ev.chunk(attrs.evolve(_chunk(text=""), logprobs=_lp("\ufffd", -2.0)), None)
    raw += ev.chunk(attrs.evolve(_chunk(text="é"), logprobs=_lp("\ufffd", -3.0)), None)
    # a last token with no text at all (a special token skipped)
    raw += ev.chunk(attrs.evolve(_chunk(text="", finish="stop"), logprobs=_lp("</s>", -4.0)), None)
    raw += ev.closing(Usage(1, 4))
    events = _parse(raw)
    deltas = [d for n, d in events if n == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["a", "é"]
    assert [[e["logprob"] for e in d["logprobs"]] for d in deltas] == [[-1.0], [-2.0, -3.0]]
    completed = next(d for n, d in events if n == "response.completed")
    (part,) = completed["response"]["output"][0]["content"]
    assert part["text"] == "aé"
    assert [e["logprob"] for e in part["logprobs"]] == [-1.0, -2.0, -3.0, -4.0]  # every token's
