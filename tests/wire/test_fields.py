"""braid.wire.fields: the validation the completions and chat routes share, through both routes'
parsers (the completions-only checks: test_completions_request.py; chat's: test_messages.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec
import pytest

from braid.errors import InvalidRequest, SchemaError
from braid.wire.chat_request import parse_chat
from braid.wire.completions_request import parse_request
from braid.wire.fields import UNSUPPORTED, Limits, SamplingBody, check_fields, decode_body

LIMITS = Limits(vocab_size=259)
USER = [{"role": "user", "content": "Hi"}]


def completions(**fields: object) -> object:
    return parse_request(json.dumps({"prompt": "hello", **fields}).encode(), LIMITS)


def chat(**fields: object) -> object:
    return parse_chat(json.dumps({"messages": USER, **fields}).encode(), LIMITS, max_model_len=2048, batch=False)


def batch_chat(**fields: object) -> object:
    return parse_chat(json.dumps({"messages": [USER], **fields}).encode(), LIMITS, max_model_len=2048, batch=True)


ROUTES = pytest.mark.parametrize("parse", [completions, chat, batch_chat], ids=["completions", "chat", "batch"])


def refuse(parse: Callable[..., object], **fields: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(**fields)
    return info.value


# --- stream_options without stream: vLLM refuses any non-empty object (its truthiness) ----------


@ROUTES
@pytest.mark.parametrize(
    "options",
    [
        {"include_usage": None},
        {"continuous_usage_stats": None},
        {"include_usage": False},
        {"include_usage": True},
        {"include_usage": None, "continuous_usage_stats": False},
    ],
    ids=repr,
)
@pytest.mark.parametrize("stream", [False, None, "absent"], ids=lambda s: f"stream={s}")
def test_stream_options_with_any_key_without_stream_is_vllms_400(
    parse: Callable[..., object], options: dict, stream: object
) -> None:
    fields = {} if stream == "absent" else {"stream": stream}
    err = refuse(parse, stream_options=options, **fields)
    assert not isinstance(err, SchemaError)
    assert (err.status, err.type, err.param) == (400, "BadRequestError", "stream_options")
    assert err.message == "Stream options can only be defined when `stream=True`."  # vLLM 0.32's


@ROUTES
@pytest.mark.parametrize("options", [{}, None], ids=repr)
def test_an_empty_or_null_stream_options_without_stream_is_accepted(
    parse: Callable[..., object], options: object
) -> None:
    parse(stream=False, stream_options=options)


@pytest.mark.parametrize(
    ("options", "include", "continuous"),
    [
        ({"include_usage": None}, False, False),
        ({"include_usage": None, "continuous_usage_stats": True}, False, False),
        ({"include_usage": True, "continuous_usage_stats": None}, True, False),
    ],
    ids=repr,
)
def test_a_null_stream_option_is_off(options: dict, include: bool, continuous: bool) -> None:
    req = completions(stream=True, stream_options=options)
    assert (req.include_usage, req.continuous_usage) == (include, continuous)  # type: ignore[attr-defined]


# --- kv_transfer_params: refused, never ignored --------------------------------------------------


@ROUTES
@pytest.mark.parametrize(
    "params",
    [{"prompt_token_ids": [5, 6, 7]}, {"do_remote_prefill": True, "remote_prefill_cached_tokens": 3}, {}],
    ids=repr,
)
def test_kv_transfer_params_is_a_400_naming_it(parse: Callable[..., object], params: dict) -> None:
    err = refuse(parse, kv_transfer_params=params)
    assert not isinstance(err, SchemaError)
    assert (err.status, err.type, err.param) == (400, "BadRequestError", "kv_transfer_params")
    assert "kv_transfer_params is not supported by braid yet" in err.message


@ROUTES
def test_kv_transfer_params_null_is_absent(parse: Callable[..., object]) -> None:
    parse(kv_transfer_params=None)


@ROUTES
def test_kv_transfer_params_must_be_an_object_as_in_vllms_schema(parse: Callable[..., object]) -> None:
    with pytest.raises(SchemaError) as info:
        parse(kv_transfer_params=[1, 2])
    assert (info.value.type, info.value.param) == ("Bad Request", "body.kv_transfer_params")


# --- the shared layer on its own ------------------------------------------------------------------


def test_every_refused_field_is_a_shared_body_field() -> None:
    assert set(UNSUPPORTED) <= set(SamplingBody.__struct_fields__)


def test_check_fields_takes_echo_and_logprobs_from_the_caller() -> None:
    decoder = msgspec.json.Decoder(SamplingBody)
    zero = decode_body(b'{"max_tokens": 0}', decoder)
    check_fields(zero, LIMITS, echo=True)
    with pytest.raises(InvalidRequest) as info:
        check_fields(zero, LIMITS)
    assert info.value.param == "max_tokens"
    plain = decode_body(b"{}", decoder)
    with pytest.raises(InvalidRequest) as info:
        check_fields(plain, LIMITS, logprobs=21)
    assert info.value.param == "logprobs"
