"""The parity comparison must see real differences and ignore only what it says it ignores."""

from __future__ import annotations

import json

from tests.helpers import parse_sse
from tests.parity.compare import Reply, diff, make_reply, summarize_stream, view
from tests.parity.deviations import DEVIATIONS


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
    a: dict[str, object] = {"choices": [], "service_tier": None}
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


# --- chat streams -----------------------------------------------------------------------------


def _chat_chunk(
    index: int,
    delta: dict[str, object],
    finish: str | None = None,
    logprobs: object = None,
    **extra: object,
) -> bytes:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    body = {"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(body | extra).encode() + b"\n\n"


def _role(index: int) -> bytes:
    return _chat_chunk(index, {"role": "assistant", "content": ""})


DONE = b"data: [DONE]\n\n"


def test_chat_streams_compare_per_index_content_not_chunk_boundaries() -> None:
    a = _stream(
        _role(0),
        _role(1),
        _chat_chunk(0, {"content": "he"}),
        _chat_chunk(1, {"content": "x"}),
        _chat_chunk(0, {"content": "llo"}, "length"),
        _chat_chunk(1, {"content": "y"}, "stop"),
        DONE,
    )
    b = _stream(
        _role(1),
        _chat_chunk(1, {"content": "xy"}, "stop"),
        _role(0),
        _chat_chunk(0, {"content": "hello"}, "length"),
        DONE,
    )
    assert diff(view(a), view(b)) == []
    summary = view(a)["stream"]
    assert summary["choices"][0]["content"] == "hello" and summary["choices"][1]["roles"] == ["assistant"]
    c = _stream(
        _role(1),
        _chat_chunk(1, {"content": "xz"}, "stop"),
        _role(0),
        _chat_chunk(0, {"content": "hello"}, "length"),
        DONE,
    )
    assert any("content" in line for line in diff(view(a), view(c)))


def test_chat_stream_missing_role_chunk_is_a_difference() -> None:
    a = _stream(_role(0), _chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    b = _stream(_chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    lines = diff(view(a), view(b))
    assert any("roles" in line for line in lines) and any("first_chunk_has_role" in line for line in lines)


def test_chat_stream_role_chunk_after_content_is_a_difference() -> None:
    a = _stream(_role(0), _chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    b = _stream(_chat_chunk(0, {"content": "hi"}), _role(0), _chat_chunk(0, {"content": ""}, "stop"), DONE)
    assert any("first_chunk_has_role" in line for line in diff(view(a), view(b)))


def test_chat_stream_role_value_and_repeats_are_compared() -> None:
    a = _stream(_role(0), _chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    user = _stream(_chat_chunk(0, {"role": "user", "content": ""}), _chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    twice = _stream(_role(0), _role(0), _chat_chunk(0, {"content": "hi"}, "stop"), DONE)
    assert any("roles" in line for line in diff(view(a), view(user)))
    assert any("roles" in line for line in diff(view(a), view(twice)))


def test_chat_stream_logprobs_content_is_concatenated() -> None:
    def lp(token: str, value: float) -> dict[str, object]:
        return {"content": [{"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []}]}

    a = _stream(
        _role(0),
        _chat_chunk(0, {"content": "a"}, logprobs=lp("a", -1.0)),
        _chat_chunk(0, {"content": "b"}, "length", logprobs=lp("b", -2.0)),
        DONE,
    )
    merged = {"content": lp("a", -1.0)["content"] + lp("b", -2.0)["content"]}  # type: ignore[operator]
    b = _stream(_role(0), _chat_chunk(0, {"content": "ab"}, "length", logprobs=merged), DONE)
    assert diff(view(a), view(b)) == []
    c = _stream(
        _role(0),
        _chat_chunk(0, {"content": "a"}, logprobs=lp("a", -1.0)),
        _chat_chunk(0, {"content": "b"}, "length", logprobs=lp("b", -2.5)),
        DONE,
    )
    assert any("logprobs.content" in line for line in diff(view(a), view(c)))


def test_chat_stream_usage_done_errors_and_keys_are_compared() -> None:
    base = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop"), DONE)
    usage = b'data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}\n\n'
    with_usage = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop"), usage, DONE)
    assert any("usage_chunks" in line for line in diff(view(base), view(with_usage)))
    no_done = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop"))
    assert any("done" in line for line in diff(view(base), view(no_done)))
    err = b'data: {"error": {"message": "m", "type": "BadRequestError", "param": null, "code": 400}}\n\n'
    with_err = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop"), err, DONE)
    assert any("errors" in line for line in diff(view(base), view(with_err)))
    # a field vLLM sends as null must be there; a delta field it never sends must not
    extra_key = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop", prompt_token_ids=None), DONE)
    assert any("chunk_keys" in line for line in diff(view(base), view(extra_key)))
    reasoning = _stream(_role(0), _chat_chunk(0, {"content": "a", "reasoning": None}, "stop"), DONE)
    assert any("delta_keys" in line for line in diff(view(base), view(reasoning)))
    wrong_object = _stream(_role(0), _chat_chunk(0, {"content": "a"}, "stop", object="text_completion"), DONE)
    assert any("objects" in line for line in diff(view(base), view(wrong_object)))


def test_chat_stream_prompt_token_ids_are_per_index() -> None:
    a = _stream(
        _chat_chunk(0, {"role": "assistant", "content": ""}, prompt_token_ids=[1, 2]),
        _chat_chunk(0, {"content": "a"}, "stop", token_ids=[7]),
        DONE,
    )
    assert view(a)["stream"]["choices"][0]["prompt_token_ids"] == [1, 2]


def test_chat_bodies_ignore_ids_but_not_content() -> None:
    def body(content: str, rid: str) -> Reply:
        msg = {"role": "assistant", "content": content, "tool_calls": [{"id": rid, "type": "function"}]}
        return Reply(
            200, "application/json", {"id": rid, "object": "chat.completion", "choices": [{"index": 0, "message": msg}]}
        )

    assert diff(view(body("a", "chatcmpl-1")), view(body("a", "chatcmpl-2"))) == []
    assert diff(view(body("a", "chatcmpl-1")), view(body("b", "chatcmpl-1")))


# --- the batched-chat deviations ----------------------------------------------------------------


def _batch_body(n: int = 1, **extra: object) -> dict[str, object]:
    return {"messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], "n": n} | extra


def _chat_completion(indexes: list[int]) -> Reply:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"} for i in indexes
    ]
    usage = {"prompt_tokens": 4, "completion_tokens": len(indexes), "total_tokens": 4 + len(indexes)}
    return Reply(
        200, "application/json", {"id": "chatcmpl-1", "object": "chat.completion", "choices": choices, "usage": usage}
    )


def _refused_n() -> Reply:
    return Reply(
        400, "application/json", {"error": {"message": "m", "type": "BadRequestError", "param": "n", "code": 400}}
    )


def test_batch_chat_n_deviation() -> None:
    check = DEVIATIONS["batch_chat_n"].check
    assert check(_chat_completion([0, 1, 2, 3]), _refused_n(), _batch_body(n=2)) == []
    assert check(_chat_completion([0, 1]), _refused_n(), _batch_body(n=2))  # n ignored
    assert check(_chat_completion([0, 1, 2, 3]), _chat_completion([0, 1, 2, 3]), _batch_body(n=2))  # vLLM took it


def test_batch_chat_stream_deviation() -> None:
    check = DEVIATIONS["batch_chat_stream"].check
    good = _stream(
        _role(0), _role(1), _chat_chunk(0, {"content": "a"}, "length"), _chat_chunk(1, {"content": "b"}, "stop"), DONE
    )
    assert check(good, _chat_completion([0, 1]), _batch_body(stream=True)) == []
    no_role = _stream(
        _role(0), _chat_chunk(0, {"content": "a"}, "length"), _chat_chunk(1, {"content": "b"}, "stop"), DONE
    )
    assert check(no_role, _chat_completion([0, 1]), _batch_body(stream=True))
    assert check(_chat_completion([0, 1]), _chat_completion([0, 1]), _batch_body(stream=True))  # braid did not stream
    assert check(good, _refused_n(), _batch_body(stream=True))  # vLLM changed: it refuses now
    four = _stream(*(_role(i) for i in range(4)), *(_chat_chunk(i, {"content": "a"}, "stop") for i in range(4)), DONE)
    assert check(four, _refused_n(), _batch_body(n=2, stream=True)) == []
    assert check(good, _refused_n(), _batch_body(n=2, stream=True))  # two choices where four are due


def _with_header(name: str, value: str | None) -> Reply:
    return make_reply(200, "application/json", b"{}", ((name, value),))


def test_a_load_report_compares_on_its_format_and_names_not_its_figures() -> None:
    text = _with_header("endpoint-load-metrics", "TEXT named_metrics.a=0.0, named_metrics.b=0.5")
    same = _with_header("endpoint-load-metrics", "TEXT named_metrics.a=3.0, named_metrics.b=0.0")
    assert diff(view(text), view(same)) == []
    for other in (
        "TEXT named_metrics.b=0.0, named_metrics.a=0.5",  # another order
        "TEXT named_metrics.a=0.0",  # a figure missing
        "TEXT named_metrics.a=0, named_metrics.b=0.5",  # an integer
        'JSON {"named_metrics": {"a": 0.0, "b": 0.5}}',  # another format
    ):
        assert diff(view(text), view(_with_header("endpoint-load-metrics", other))), other
    assert diff(view(text), view(_with_header("endpoint-load-metrics", None)))
    json_report = _with_header("endpoint-load-metrics", 'JSON {"named_metrics": {"a": 1.0}}')
    assert view(json_report)["headers"] == {"endpoint-load-metrics": {"format": "JSON", "names": ["a"], "floats": True}}


def test_a_server_made_request_id_compares_on_its_shape_a_client_s_on_its_value() -> None:
    a = _with_header("x-request-id", "0" * 32)
    b = _with_header("x-request-id", "f" * 32)
    assert diff(view(a), view(b)) == []
    assert diff(view(a), view(_with_header("x-request-id", "cmpl-" + "0" * 32)))
    assert diff(view(_with_header("x-request-id", "c-1")), view(_with_header("x-request-id", "c-2")))
