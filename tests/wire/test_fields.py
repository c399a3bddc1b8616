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


# --- kv_transfer_params: passed to the engine as vLLM passes it (braid.wire.kv_transfer on chat) ---


@pytest.mark.parametrize(
    "params",
    [{"prompt_token_ids": [5, 6, 7]}, {"do_remote_prefill": True, "remote_prefill_cached_tokens": 3}],
    ids=repr,
)
def test_completions_pass_kv_transfer_params_to_the_engine_as_sent(params: dict) -> None:
    req = completions(kv_transfer_params=params)
    assert req.sampling.kv_transfer_params == params  # type: ignore[attr-defined]


def test_empty_kv_transfer_params_reaches_no_engine() -> None:
    vllm = pytest.importorskip("vllm")
    from braid.engine.vllm_common import vllm_sampling_params

    params: dict[str, object] | None
    for params in ({}, None):
        p = completions(kv_transfer_params=params).sampling  # type: ignore[attr-defined]
        assert vllm_sampling_params(vllm.SamplingParams, vllm.sampling_params.RequestOutputKind, p).extra_args is None


def test_chat_takes_prompt_token_ids_as_the_prompt_and_passes_the_rest() -> None:
    req = chat(kv_transfer_params={"prompt_token_ids": [5, 6, 7], "do_remote_prefill": True})
    assert req.reused_prompt == (5, 6, 7)  # type: ignore[attr-defined]
    assert req.body.kv_transfer_params == {"do_remote_prefill": True}  # type: ignore[attr-defined]


def test_chat_with_echo_renders_the_messages_and_drops_the_ids() -> None:
    req = chat(echo=True, kv_transfer_params={"prompt_token_ids": [5, 6, 7]})
    assert req.reused_prompt is None  # type: ignore[attr-defined]
    assert req.body.kv_transfer_params == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("ids", [[], [5, -1], [5, True], "5 6", [5, 2.0], [259]], ids=repr)
def test_chat_refuses_prompt_token_ids_that_are_not_a_prompt(ids: object) -> None:
    err = refuse(chat, kv_transfer_params={"prompt_token_ids": ids})
    assert (err.status, err.type, err.param) == (400, "BadRequestError", "kv_transfer_params.prompt_token_ids")


def test_batch_chat_refuses_prompt_token_ids() -> None:
    err = refuse(batch_chat, kv_transfer_params={"prompt_token_ids": [5]})
    assert (err.status, err.param) == (400, "kv_transfer_params.prompt_token_ids")
    assert "cannot serve several conversations" in err.message
    assert batch_chat(kv_transfer_params={"do_remote_prefill": False}).reused_prompt is None  # type: ignore[attr-defined]


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
