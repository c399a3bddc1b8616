"""The stream model's chat rules on hand-written traces (model/stream.py; no server involved).

One clean chat stream passes every invariant; each defect the chat mutants put into braid
(tools/mutants.py) breaks the invariant named for it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from model import check_trace


def _chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"type": "chunk", "data": {"object": "chat.completion.chunk", "choices": [choice]}}


def _trace(*, echo: bool = True, n: int = 2, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One conversation ending in an assistant message "ab" (what echo repeats), n choices, one
    engine output with every choice's one token, the usage chunk and [DONE]."""
    records: list[dict[str, Any]] = [
        {"kind": "slot_ask", "slots": n},
        {"kind": "slot_grant", "slots": n},
        {"kind": "engine_open", "prompt": 0, "prompt_tokens": 7},
        {"kind": "engine_output", "prompt": 0, "deltas": [[k, "x", 1, "length"] for k in range(n)]},
        {"kind": "engine_close", "prompt": 0, "outcome": "finished", "error": None, "aborts": 0},
        {"kind": "slot_release", "slots": n},
    ]
    if events is None:
        events = [_chunk(k, {"role": "assistant", "content": ""}) for k in range(n)]
        if echo:
            events += [_chunk(k, {"content": "ab"}) for k in range(n)]
        events += [_chunk(k, {"content": "x"}, "length") for k in range(n)]
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        events += [
            {"type": "usage", "data": {"object": "chat.completion.chunk", "choices": [], "usage": usage}},
            {"type": "done"},
        ]
    records += [{"kind": "sse", "event": ev, "wait": 0.0} for ev in events]
    records.append({"kind": "end", "how": "complete", "detail": None})
    for seq, r in enumerate(records):
        r.update(seq=seq, t=0.0)
    return {
        "request": {
            "kind": "chat",
            "valid": True,
            "stream": True,
            "n": n,
            "prompts": ["hi"],
            "conversations": [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"}]],
            "add_generation_prompt": True,
            "echo": echo,
            "hide_completion": False,
            "logprobs": None,
            "include_usage": True,
            "continuous_usage": False,
        },
        "limits": {"heartbeat": 15.0, "abort_bound": 0.0, "max_in_flight": 0},
        "left_running": 0,
        "records": records,
    }


def _events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["event"] for r in trace["records"] if r["kind"] == "sse"]


def _with_events(trace: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    return _trace(echo=trace["request"]["echo"], n=trace["request"]["n"], events=copy.deepcopy(events))


def _names(trace: dict[str, Any]) -> set[str]:
    return {v.name for v in check_trace(trace)}


@pytest.mark.parametrize("echo", [True, False])
def test_a_clean_chat_stream_follows_the_model(echo: bool) -> None:
    assert check_trace(_trace(echo=echo)) == []


def test_a_missing_role_chunk_breaks_chat_role() -> None:
    t = _trace(echo=False)
    assert "chat_role" in _names(_with_events(t, _events(t)[1:]))


def test_a_repeated_role_chunk_breaks_chat_role() -> None:
    t = _trace(echo=False)
    ev = _events(t)
    assert "chat_role" in _names(_with_events(t, ev[:2] + ev[:1] + ev[2:]))


def test_a_role_after_content_breaks_chat_role() -> None:
    t = _trace(echo=False)
    ev = _events(t)  # role 0, role 1, content 0, content 1, usage, done
    assert "chat_role" in _names(_with_events(t, [ev[2], ev[0], ev[1], ev[3], *ev[4:]]))


def test_the_wrong_role_breaks_chat_role() -> None:
    t = _trace(echo=False)
    ev = _events(t)
    ev[0]["data"]["choices"][0]["delta"]["role"] = "user"
    assert "chat_role" in _names(_with_events(t, ev))


def test_an_echo_after_content_breaks_chat_echo() -> None:
    t = _trace(echo=True)
    ev = _events(t)  # roles 0-1, echoes 2-3, contents 4-5, usage, done
    assert "chat_echo" in _names(_with_events(t, [ev[0], ev[1], ev[4], ev[2], ev[5], ev[3], *ev[6:]]))


def test_a_missing_echo_breaks_chat_echo() -> None:
    t = _trace(echo=True)
    ev = _events(t)
    assert "chat_echo" in _names(_with_events(t, ev[:2] + ev[4:]))


def test_prompt_tokens_counted_per_choice_break_usage_totals() -> None:
    t = _trace(echo=False)
    ev = _events(t)
    ev[-2]["data"]["usage"].update(prompt_tokens=14, total_tokens=16)
    assert "usage_totals" in _names(_with_events(t, ev))


def test_a_chat_chunk_with_two_choices_breaks_framing() -> None:
    t = _trace(echo=False)
    ev = _events(t)
    ev[2]["data"]["choices"].append(ev[3]["data"]["choices"][0])
    assert "framing" in _names(_with_events(t, ev[:3] + ev[4:]))
