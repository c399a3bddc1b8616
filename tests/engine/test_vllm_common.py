"""vllm_sampling_params: braid's SamplingParams -> vLLM's, one field at a time; check_engine_args."""

from __future__ import annotations

import dataclasses
import enum
import json

import attrs
import msgspec
import pytest

from braid.engine.base import LoraAdapter, PassThrough, SamplingParams
from braid.engine.vllm_common import (
    check_engine_args,
    lora_adapters,
    map_error,
    vllm_lora_request,
    vllm_sampling_params,
    vllm_structured,
)
from braid.errors import EngineRejected
from braid.wire.completions_request import UNSUPPORTED_COMPLETIONS, CompletionBody, parse_request
from braid.wire.fields import UNSUPPORTED, Limits
from braid.wire.structured import GUIDED, KINDS, Structured

NAMES = {field.name for field in attrs.fields(SamplingParams)} - {"passthrough"}
PASSTHROUGH = set(PassThrough.__struct_fields__)
SET = SamplingParams(
    max_tokens=5,
    n=2,
    temperature=0.5,
    seed=7,
    stop=("x", "y"),
    stop_token_ids=(4,),
    include_stop_str_in_output=True,
    ignore_eos=True,
    min_tokens=1,
    logprobs=2,
    prompt_logprobs=1,
    logit_bias=((5, 1.0), (6, -2.0)),
    structured_outputs=Structured(choice=("yes", "no"), disable_any_whitespace=True),
    kv_transfer_params={"do_remote_prefill": True},
    passthrough=PassThrough(
        top_p=0.9,
        top_k=3,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.5,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        allowed_token_ids=(5, 6),
        bad_words=("no",),
        stream_interval=4,
    ),
)


class Kind(enum.Enum):
    DELTA = 0
    FINAL_ONLY = 2


def record(p: SamplingParams, *, final_only: bool = False) -> dict[str, object]:
    recorded: dict[str, object] = {}
    vllm_sampling_params(lambda **kwargs: recorded.update(kwargs), Kind, p, final_only=final_only)
    return recorded


def test_every_field_is_set_apart_from_its_default() -> None:
    default = SamplingParams(max_tokens=16)
    assert [name for name in NAMES if getattr(SET, name) == getattr(default, name)] == []
    assert [name for name in PASSTHROUGH if getattr(SET.passthrough, name) == getattr(default.passthrough, name)] == []


def test_every_field_reaches_vllm_under_its_own_name() -> None:
    sampling_params = pytest.importorskip("vllm.sampling_params")  # for StructuredOutputsParams
    assert record(SET) == {
        **{k: v for k, v in attrs.asdict(SET, recurse=False).items() if k not in {"passthrough", *ELSEWHERE}},
        "extra_args": {"kv_transfer_params": {"do_remote_prefill": True}},
        **msgspec.structs.asdict(SET.passthrough),
        "structured_outputs": sampling_params.StructuredOutputsParams(
            choice=["yes", "no"], disable_any_whitespace=True
        ),
        "stop": ["x", "y"],
        "stop_token_ids": [4],
        "logit_bias": {5: 1.0, 6: -2.0},
        "allowed_token_ids": [5, 6],
        "bad_words": ["no"],
        "output_kind": Kind.DELTA,
        "skip_clone": True,  # as vLLM's server: made for one engine request
    }


def test_absent_fields_are_none_or_vllms_default() -> None:
    sent = record(SamplingParams(max_tokens=1))
    assert sent["logit_bias"] is None
    assert sent["structured_outputs"] is None
    assert (sent["stop"], sent["stop_token_ids"]) == ([], [])
    # a pass-through field left out (None) is not sent at all: vLLM's default applies
    assert PASSTHROUGH & set(sent) == {"skip_special_tokens", "spaces_between_special_tokens"}
    assert (sent["skip_special_tokens"], sent["spaces_between_special_tokens"]) == (True, True)


# The body fields that are not sampling parameters: the request's own, those read into another
# field (structured output), and the refused ones. A new body field must be listed here or reach
# vLLM's SamplingParams (the next test).
NOT_SAMPLING = {
    "model", "prompt", "stream", "stream_options", "echo", "return_token_ids", "return_tokens_as_token_ids",
    "add_special_tokens", "truncate_prompt_tokens", "truncation_side", "request_id", "user", "priority",
    "service_tier",
    "best_of", *UNSUPPORTED, *UNSUPPORTED_COMPLETIONS, "response_format", *GUIDED,
}  # fmt: skip
# The one field vLLM takes under another name, as its server passes it (in extra_args).
ELSEWHERE = {"kv_transfer_params"}


def test_every_sampling_field_of_the_body_reaches_vllms_sampling_params() -> None:
    """A field declared in the body reaches vLLM's SamplingParams under its name, or is one of
    NOT_SAMPLING: by name, and with a value sent (every field set apart from its default)."""
    vllm = pytest.importorskip("vllm")
    sampling = set(CompletionBody.__struct_fields__) - NOT_SAMPLING
    assert sampling == NAMES | PASSTHROUGH
    assert sampling - ELSEWHERE <= set(vllm.SamplingParams.__struct_fields__)
    body = {
        "prompt": "x", "max_tokens": 5, "n": 2, "temperature": 0.5, "seed": 7, "stop": ["x", "y"],
        "stop_token_ids": [4], "include_stop_str_in_output": True, "ignore_eos": True, "min_tokens": 1,
        "logprobs": 2, "prompt_logprobs": 1, "logit_bias": {"5": 1.0},
        "structured_outputs": {"choice": ["yes", "no"]}, "top_p": 0.9, "top_k": 3, "min_p": 0.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.5,
        "skip_special_tokens": False, "spaces_between_special_tokens": False, "allowed_token_ids": [5, 6],
        "bad_words": ["no"], "kv_transfer_params": {"do_remote_prefill": True}, "stream_interval": 4,
    }  # fmt: skip
    assert set(body) - {"prompt"} == sampling
    p = parse_request(json.dumps(body).encode(), Limits(vocab_size=259)).sampling
    got = vllm_sampling_params(vllm.SamplingParams, vllm.sampling_params.RequestOutputKind, p)
    default = vllm.SamplingParams()
    assert [name for name in sampling - ELSEWHERE if getattr(got, name) == getattr(default, name)] == []
    for name in sampling - {"stop", "logit_bias", "structured_outputs", *ELSEWHERE}:
        sent = body[name]
        assert getattr(got, name) == sent, name
    assert got.extra_args == {"kv_transfer_params": body["kv_transfer_params"]}


def test_a_non_streaming_request_asks_for_the_final_output_only() -> None:
    assert record(SET, final_only=True)["output_kind"] is Kind.FINAL_ONLY


def test_vllm_takes_every_field() -> None:
    sampling_params = pytest.importorskip("vllm.sampling_params")
    assert (NAMES - ELSEWHERE) | PASSTHROUGH <= set(sampling_params.SamplingParams.__struct_fields__)
    params = vllm_sampling_params(sampling_params.SamplingParams, sampling_params.RequestOutputKind, SET)
    assert (params.n, params.max_tokens, params.stop, params.bad_words) == (2, 5, ["x", "y"], ["no"])


@pytest.mark.parametrize(
    "structured",
    [
        Structured(json='{"type":"object"}'),
        Structured(regex="[a-c]{3}", whitespace_pattern=" "),
        Structured(choice=("a", "b")),
        Structured(grammar='root ::= "a"', disable_additional_properties=True),
        Structured(json_object=True),
        Structured(structural_tag='{"type":"structural_tag","format":{"type":"const_string","value":"x"}}'),
    ],
    ids=lambda s: s.kind,
)
def test_each_constraint_becomes_vllms_under_the_same_names(structured: Structured) -> None:
    sampling_params = pytest.importorskip("vllm.sampling_params")
    got = vllm_structured(structured)
    assert isinstance(got, sampling_params.StructuredOutputsParams)
    for kind in KINDS:
        want = structured.value_of(kind)
        assert getattr(got, kind) == (list(want) if isinstance(want, tuple) else want)
    for option in ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"):
        assert getattr(got, option) == getattr(structured, option)


# --- engine arguments braid would not honour ------------------------------------------------------

ADMISSION = ("max_num_queued_reqs", "max_num_queued_tokens")


@pytest.mark.parametrize("name", ADMISSION)
def test_vllms_admission_caps_are_refused_for_braids_own(name: str) -> None:
    with pytest.raises(ValueError, match=name) as info:
        check_engine_args({"max_num_seqs": 8, name: 5})
    assert "--max-in-flight-requests" in str(info.value) and "--max-queued-requests" in str(info.value)


def test_data_parallelism_is_refused() -> None:
    with pytest.raises(ValueError, match="data_parallel_size=2") as info:
        check_engine_args({"data_parallel_size": 2})
    assert "rank 0" in str(info.value)
    assert "docs/deploy.md" in str(info.value)


def test_every_refusal_is_named_at_once() -> None:
    with pytest.raises(ValueError) as info:
        check_engine_args({"max_num_queued_reqs": 1, "max_num_queued_tokens": 1, "data_parallel_size": 4})
    assert len(str(info.value).splitlines()) == 3


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"max_num_queued_reqs": None, "max_num_queued_tokens": None}, {"data_parallel_size": 1}, {"seed": 3}],
    ids=repr,
)
def test_what_braid_honours_passes(kwargs: dict) -> None:
    check_engine_args(kwargs)


def test_the_refused_names_are_vllms() -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    fields = {field.name for field in dataclasses.fields(arg_utils.AsyncEngineArgs)}
    assert {*ADMISSION, "data_parallel_size"} <= fields


def test_vllms_validation_error_is_a_rejection() -> None:
    exceptions = pytest.importorskip("vllm.exceptions")
    err = map_error(exceptions.VLLMValidationError("bad grammar", parameter="structured_outputs"))
    assert isinstance(err, EngineRejected) and (err.status, err.param) == (400, "structured_outputs")
    assert err.message.startswith("bad grammar")


def test_lora_modules_become_adapters_numbered_from_1_in_order() -> None:
    adapters = lora_adapters([("a", "/p/a"), ("b", "/p/b")], "base")
    assert adapters == (LoraAdapter("a", 1, "/p/a", "base"), LoraAdapter("b", 2, "/p/b", "base"))
    assert lora_adapters([], "base") == ()


@pytest.mark.parametrize(
    ("modules", "named"),
    [([("a", "/1"), ("a", "/2")], "'a'"), ([("base", "/1")], "'base'"), ([("a", "/1"), ("", "/2")], "''")],
    ids=["twice", "the model's name", "empty"],
)
def test_a_lora_module_a_request_could_not_select_is_refused(modules: list[tuple[str, str]], named: str) -> None:
    with pytest.raises(ValueError, match="--lora-modules") as info:
        lora_adapters(modules, "base")
    assert str(info.value).endswith(f"not {named}")


def test_an_adapter_is_vllms_lora_request_and_none_the_model() -> None:
    request = pytest.importorskip("vllm.lora.request")
    assert vllm_lora_request(None) is None
    converted = vllm_lora_request(LoraAdapter("a", 3, "/p/a", "base"))
    assert isinstance(converted, request.LoRARequest)
    assert (converted.lora_name, converted.lora_int_id, converted.lora_path) == ("a", 3, "/p/a")
