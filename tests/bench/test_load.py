"""bench.load: its stream checks, its roles, and a short run of it against ``braid serve``."""

from __future__ import annotations

import json

import pytest

from bench.load import Failed, LoadConfig, _dechunk, check_stream, roles, run_server


def sse(*events: object) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n" for e in events
    )


TOKEN = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}


def test_a_whole_stream_passes() -> None:
    check_stream(sse(TOKEN, LAST, "[DONE]"))
    check_stream(b": ping\n\n" + sse(TOKEN, LAST, "[DONE]"))


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (sse(TOKEN, LAST), "malformed"),  # no [DONE]
        (sse(TOKEN, LAST, "[DONE]", "[DONE]"), "malformed"),
        (sse(TOKEN, "[DONE]", LAST), "malformed"),  # [DONE] not last
        (sse(TOKEN, "[DONE]"), "malformed"),  # cut before the choice finished
        (sse(TOKEN, {"error": {"message": "x"}}, "[DONE]"), "error_event"),
        (b"event: x\n\n" + sse(LAST, "[DONE]"), "malformed"),
    ],
)
def test_a_broken_stream_is_caught(raw: bytes, kind: str) -> None:
    with pytest.raises(Failed) as caught:
        check_stream(raw)
    assert caught.value.kind == kind


def test_dechunk() -> None:
    assert _dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n") == b"abcde"
    with pytest.raises(ValueError):
        _dechunk(b"3\r\nabcX\r\n0\r\n\r\n")


def test_roles_spread_the_hang_ups_and_alternate_rst_and_fin() -> None:
    r = roles(8, 0.5)
    assert r.count("read") == 4 and r.count("rst") == 2 and r.count("fin") == 2
    assert roles(4, 0.0) == ["read"] * 4 and set(roles(4, 1.0)) == {"rst", "fin"}


def test_a_short_run_against_braid_serve() -> None:
    """The bench's load, short: 50 clients for 5 s, half hanging up, 16 engine slots. Every request
    ends as planned; nothing is left in flight, queued or holding a slot, and no socket stays open
    (about 8 s in all)."""
    cfg = LoadConfig(clients=50, seconds=5)
    # Admission on, with fewer slots than clients: requests queue, and must leave nothing behind.
    (result,) = run_server("ci", cfg, ["--max-in-flight-requests", "16"])
    t = result.tally
    assert t.failures == 0, (t.outcomes, t.examples)
    assert t.outcomes["ok"] and t.outcomes["ok_rst"] and t.outcomes["ok_fin"]
    assert result.in_flight_after == 0
    # Every connection closed: the clients closed theirs (braid.http.patches.client_close).
    assert result.fds_after <= result.fds_before + 2, (result.fds_before, result.fds_after)
