"""The parity comparison must see real differences and ignore only what it says it ignores."""

from __future__ import annotations

import json

from tests.helpers import parse_sse
from tests.parity.compare import Reply, diff, make_reply, summarize_stream, view


def _chunk(index: int, text: str, finish: str | None = None, **extra: object) -> bytes:
    choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    body = {"id": "cmpl-a", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _stream(*parts: bytes) -> Reply:
    return make_reply(200, "text/event-stream; charset=utf-8", b"".join(parts))


def test_ids_created_fingerprint_and_key_order_are_ignored() -> None:
    a = {"id": "cmpl-1", "created": 1, "system_fingerprint": "x", "choices": [{"index": 0, "text": "a"}], "model": "m"}
    b = {"model": "m", "choices": [{"text": "a", "index": 0}], "id": "cmpl-2", "created": 2}
    assert diff(view(Reply(200, "application/json", a)), view(Reply(200, "application/json", b))) == []


def test_text_difference_is_reported_with_its_path() -> None:
    a = {"choices": [{"index": 0, "text": "a"}]}
    b = {"choices": [{"index": 0, "text": "b"}]}
    (line,) = diff(view(Reply(200, "application/json", a)), view(Reply(200, "application/json", b)))
    assert "$.body.choices[0].text" in line


def test_missing_null_field_is_a_difference() -> None:
    a = {"choices": [], "service_tier": None}
    assert diff(view(Reply(200, "", a)), view(Reply(200, "", {"choices": []})))


def test_floats_within_tolerance_match_and_beyond_do_not() -> None:
    assert diff({"x": -1.2345678}, {"x": -1.2345601}) == []
    assert diff({"x": -1.2}, {"x": -1.3})
    assert diff({"x": 1}, {"x": 2})
    assert diff({"x": True}, {"x": 1})  # a bool is not a number here


def test_errors_compare_type_param_code_not_message() -> None:
    def err(msg: str, param: str | None) -> Reply:
        return Reply(
            400, "application/json", {"error": {"message": msg, "type": "BadRequestError", "param": param, "code": 400}}
        )

    assert diff(view(err("one wording", "n")), view(err("another", "n"))) == []
    assert diff(view(err("same", "n")), view(err("same", "prompt")))
    assert diff(view(err("same", "n")), view(Reply(422, "application/json", err("same", "n").body)))


def test_streams_compare_per_index_concatenation_not_chunk_boundaries() -> None:
    a = _stream(
        _chunk(0, "he"), _chunk(1, "x"), _chunk(0, "llo", "length"), _chunk(1, "y", "stop"), b"data: [DONE]\n\n"
    )
    b = _stream(_chunk(1, "xy", "stop"), _chunk(0, "hello", "length"), b"data: [DONE]\n\n")
    assert diff(view(a), view(b)) == []
    c = _stream(_chunk(1, "xy", "stop"), _chunk(0, "hello", "length"), b"data: [DONE]\n\n", b"data: [DONE]\n\n")
    assert any("done" in line for line in diff(view(a), view(c)))


def test_stream_finish_reasons_and_usage_and_errors_are_compared() -> None:
    base = _stream(_chunk(0, "a", "stop"), b"data: [DONE]\n\n")
    twice = _stream(_chunk(0, "a", "stop"), _chunk(0, "", "stop"), b"data: [DONE]\n\n")
    assert any("finish_reasons" in line for line in diff(view(base), view(twice)))
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}\n\n'
    with_usage = _stream(_chunk(0, "a", "stop"), usage, b"data: [DONE]\n\n")
    assert any("usage_chunks" in line for line in diff(view(base), view(with_usage)))
    err = b'data: {"error": {"message": "m", "type": "BadRequestError", "param": null, "code": 400}}\n\n'
    with_err = _stream(_chunk(0, "a", "stop"), err, b"data: [DONE]\n\n")
    assert any("errors" in line for line in diff(view(base), view(with_err)))


def test_continuous_usage_is_compared_per_choice() -> None:
    u1 = {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    u2 = {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    a = _stream(_chunk(0, "a", usage=u1), _chunk(0, "b", "length", usage=u2), b"data: [DONE]\n\n")
    b = _stream(_chunk(0, "ab", "length", usage=u2), b"data: [DONE]\n\n")
    assert diff(view(a), view(b)) == []
    c = _stream(_chunk(0, "ab", "length", usage=u1), b"data: [DONE]\n\n")
    assert diff(view(a), view(c))
    d = _stream(_chunk(0, "a"), _chunk(0, "b", "length", usage=u2), b"data: [DONE]\n\n")
    assert any("content_chunks_without_usage" in line for line in diff(view(a), view(d)))


def test_summary_counts_events_after_done() -> None:
    events = parse_sse(_chunk(0, "a", "stop") + b"data: [DONE]\n\n" + _chunk(0, "b"))
    assert summarize_stream(events)["events_after_done"] == 1


def test_non_sse_framing_is_rejected() -> None:
    try:
        parse_sse(b"event: x\ndata: 1\n\n")
    except ValueError:
        return
    raise AssertionError("multi-line event accepted")
