"""Anthropic's event stream as a view of parsed choice deltas (src/braid/wire/anthropic_response.py):
pure, no engine."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from braid.engine.tool_calls import ParsedDelta, ToolCallDelta
from braid.wire.anthropic_response import AnthropicEvents, stop_reason
from braid.wire.output import ChoiceChunk, ResponseMeta, Usage
from tests.anthropic_sse import check_framing, parse_anthropic_sse, rebuild


def chunk(parsed: ParsedDelta, finish: str | None = None, stop: str | int | None = None) -> ChoiceChunk:
    return ChoiceChunk(0, 0, "", None, finish, stop, None, None, None, 0, parsed=parsed)


def test_blocks_switch_and_text_during_a_call_is_held_for_after_it() -> None:
    events = AnthropicEvents(ResponseMeta("chatcmpl-x", 0, "m"), prompt_tokens=3)
    raw = events.opening()
    for parsed in (
        ParsedDelta(reasoning="think"),
        ParsedDelta(content="Look"),
        ParsedDelta(tool_calls=(ToolCallDelta(0, "call-a", "f", '{"k"'),)),
        ParsedDelta(content=" late"),  # arrives while f's block is open
        ParsedDelta(tool_calls=(ToolCallDelta(0, arguments=": 1}"),)),
        ParsedDelta(tool_calls=(ToolCallDelta(1, "call-b", "g", "{}"),)),
    ):
        raw += events.chunk(chunk(parsed), None)
    raw += events.chunk(chunk(ParsedDelta(), "tool_calls"), None)
    raw += events.usage(Usage(3, 9))
    parsed_events = parse_anthropic_sse(raw)
    check_framing(parsed_events)
    assert rebuild(parsed_events) == [
        {"type": "thinking", "thinking": "think"},
        {"type": "text", "text": "Look"},
        {"type": "tool_use", "id": "call-a", "name": "f", "input": {"k": 1}},
        {"type": "text", "text": " late"},
        {"type": "tool_use", "id": "call-b", "name": "g", "input": {}},
    ]
    kinds = [(k, d.get("delta", {}).get("type")) for k, d in parsed_events]
    # the thinking block is signed as it closes
    assert kinds[1:5] == [
        ("content_block_start", None),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    assert parsed_events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 3, "output_tokens": 9},
    }


def test_stop_reasons_as_vllm_maps_them() -> None:
    assert stop_reason("length", None, tool_used=True, tool_complete=True) == ("max_tokens", None)
    assert stop_reason("stop", "\n", tool_used=False, tool_complete=False) == ("stop_sequence", "\n")
    # a stop string that cut a call short: the call must not run
    assert stop_reason("stop", "}", tool_used=True, tool_complete=False) == ("stop_sequence", "}")
    assert stop_reason("stop", "}", tool_used=True, tool_complete=True) == ("tool_use", None)
    assert stop_reason("stop", None, tool_used=True, tool_complete=False) == ("tool_use", None)  # a forced call
    assert stop_reason("stop", 2, tool_used=False, tool_complete=False) == ("end_turn", None)  # a stop token
    assert stop_reason("abort", None, tool_used=False, tool_complete=False) == (None, None)


def test_cached_tokens_are_read_from_the_cache_not_input() -> None:
    events = AnthropicEvents(ResponseMeta("chatcmpl-x", 0, "m"), prompt_tokens=10)
    raw = events.usage(Usage(10, 2, cached_tokens=8))
    (delta, _) = parse_anthropic_sse(raw)
    assert delta[1]["usage"] == {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 8}


_TEXT = st.text(alphabet="ab {}\n", min_size=1, max_size=4)
_STEP = st.one_of(
    st.tuples(st.just("reasoning"), _TEXT),
    st.tuples(st.just("content"), _TEXT),
    st.tuples(st.just("call"), st.sampled_from(["f", "g"])),
    st.tuples(st.just("arguments"), _TEXT),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=30), st.booleans())
def test_any_delta_sequence_keeps_every_character_and_the_framing(steps: list[tuple[str, str]], cut: bool) -> None:
    """Whatever order reasoning, content and call pieces come in: the framing holds, and each
    kind's text arrives whole and once (text held during a call comes after it, but all of it),
    each call with its own arguments in order."""
    events = AnthropicEvents(ResponseMeta("chatcmpl-x", 0, "m"), prompt_tokens=1)
    raw = events.opening()
    calls: list[tuple[str, str, str]] = []  # (id, name, arguments sent)
    open_call = False  # a parser sends a call's arguments right after it, text aside, not after reasoning
    for kind, value in steps:
        if kind == "reasoning":
            parsed = ParsedDelta(reasoning=value)
            open_call = False
        elif kind == "content":
            parsed = ParsedDelta(content=value)
        elif kind == "call":
            calls.append((f"call-{len(calls)}", value, ""))
            parsed = ParsedDelta(tool_calls=(ToolCallDelta(len(calls) - 1, calls[-1][0], value),))
            open_call = True
        elif open_call:
            call_id, name, sent = calls[-1]
            calls[-1] = (call_id, name, sent + value)
            parsed = ParsedDelta(tool_calls=(ToolCallDelta(len(calls) - 1, arguments=value),))
        else:
            continue  # arguments with no call open: a parser never sends them
        raw += events.chunk(chunk(parsed), None)
    raw += events.chunk(chunk(ParsedDelta(), "length" if cut else "stop"), None)
    raw += events.usage(Usage(1, len(steps)))
    parsed_events = parse_anthropic_sse(raw)
    check_framing(parsed_events)
    starts = [d["content_block"] for k, d in parsed_events if k == "content_block_start"]
    deltas = [(d["index"], d["delta"]) for k, d in parsed_events if k == "content_block_delta"]

    def joined(kind: str, field: str) -> str:
        return "".join(d[field] for _, d in deltas if d["type"] == kind)

    assert joined("text_delta", "text") == "".join(v for k, v in steps if k == "content")
    assert joined("thinking_delta", "thinking") == "".join(v for k, v in steps if k == "reasoning")
    tool_blocks = [(i, b) for i, b in enumerate(starts) if b["type"] == "tool_use"]
    assert [(b["id"], b["name"]) for _, b in tool_blocks] == [(c[0], c[1]) for c in calls]
    for (index, _), (_, _, sent) in zip(tool_blocks, calls, strict=True):
        assert "".join(d["partial_json"] for i, d in deltas if i == index) == sent
    # no stop string here: any call is tool_use, whole or not; max_tokens wins
    expected = {"stop_reason": "max_tokens" if cut else "tool_use" if calls else "end_turn", "stop_sequence": None}
    assert parsed_events[-2][1]["delta"] == expected
