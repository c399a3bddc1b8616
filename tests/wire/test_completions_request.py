"""parse_request / parse_prompts: the prompt shapes, strict token ids, limits and field checks."""

from __future__ import annotations

import json

import attrs
import msgspec
import pytest

from braid.engine.base import PassThrough, SamplingParams
from braid.errors import InvalidRequest, SchemaError
from braid.wire.completions_request import (
    UNSUPPORTED_COMPLETIONS,
    CompletionBody,
    CompletionRequest,
    TextPrompt,
    TokenPrompt,
    parse_prompts,
    parse_request,
)
from braid.wire.fields import UNSUPPORTED, Limits, decode_body
from braid.wire.structured import GUIDED, Structured

VOCAB = 259  # the scripted engine's vocabulary
LIMITS = Limits(vocab_size=VOCAB)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


_MISSING = _Missing()


def parse(body: dict | None = None, limits: Limits = LIMITS, **fields: object) -> CompletionRequest:
    body = {"prompt": "hello", **(body or {}), **fields}
    body = {k: v for k, v in body.items() if v is not _MISSING}
    return parse_request(json.dumps(body).encode(), limits)


def refuse(body: dict | None = None, limits: Limits = LIMITS, **fields: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(body, limits, **fields)
    err = info.value
    assert err.status == 400
    assert err.body()["error"]["code"] == 400
    assert err.body()["error"]["param"] == err.param
    return err


# --- prompt shapes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", (TextPrompt("text"),)),
        (["a", "b"], (TextPrompt("a"), TextPrompt("b"))),
        ([1, 2, 3], (TokenPrompt((1, 2, 3)),)),
        ([[1, 2], [3]], (TokenPrompt((1, 2)), TokenPrompt((3,)))),
        (["a"], (TextPrompt("a"),)),
        ([[7]], (TokenPrompt((7,)),)),
        ([5], (TokenPrompt((5,)),)),
        (["1", "2"], (TextPrompt("1"), TextPrompt("2"))),  # list[str] wins: two text prompts
        (["", "x"], (TextPrompt(""), TextPrompt("x"))),  # only a bare "" is "empty"
        ([0, VOCAB - 1], (TokenPrompt((0, VOCAB - 1)),)),  # both ends of the vocabulary
    ],
)
def test_prompt_shapes(prompt: object, expected: tuple) -> None:
    assert parse(prompt=prompt).prompts == expected
    assert parse_prompts(prompt, LIMITS) == expected


# (type, param) of vLLM 0.32's answer to each bad prompt, as its server gave them (the parity
# tier checks the same against the live server). Schema errors name pydantic's location of the
# first failing union member (list[int]): the first element that is not a non-negative integer.
BAD_PROMPTS: list[tuple[object, str, str | None]] = [
    ("", "BadRequestError", "prompt"),
    (None, "BadRequestError", "prompt"),
    (_MISSING, "BadRequestError", "prompt"),
    ([], "BadRequestError", None),
    ([[]], "BadRequestError", None),
    ([[1], []], "BadRequestError", None),
    ([VOCAB], "BadRequestError", None),
    ([[1], [VOCAB]], "BadRequestError", None),
    ([1, "a"], "Bad Request", "body.prompt.1"),
    ([[1], "a"], "Bad Request", "body.prompt.0"),
    ([["a"]], "Bad Request", "body.prompt.0"),
    (["a", 1], "Bad Request", "body.prompt.0"),
    (["a", ["b"]], "Bad Request", "body.prompt.0"),
    ([1, [2]], "Bad Request", "body.prompt.1"),
    ([[1], [2, [3]]], "Bad Request", "body.prompt.0"),
    ([{"x": 1}], "Bad Request", "body.prompt.0"),
    ([None], "Bad Request", "body.prompt.0"),
    ([[None]], "Bad Request", "body.prompt.0"),
    ([-1], "Bad Request", "body.prompt.0"),
    ([[5], [-1]], "Bad Request", "body.prompt.0"),
    ([3, -1], "Bad Request", "body.prompt.1"),
    ({"x": 1}, "Bad Request", "body.prompt"),
    (3, "Bad Request", "body.prompt"),
    (2.5, "Bad Request", "body.prompt"),
    (True, "Bad Request", "body.prompt"),
    (["x"] * 1025, "BadRequestError", "prompt"),
]


@pytest.mark.parametrize(("prompt", "type_", "param"), BAD_PROMPTS, ids=lambda p: repr(p)[:30])
def test_bad_prompts_get_vllms_error_type_and_param(prompt: object, type_: str, param: str | None) -> None:
    err = refuse(prompt=prompt)
    assert err.status == 400
    assert (err.body()["error"]["type"], err.param) == (type_, param)


@pytest.mark.parametrize("prompt", ["", None, _MISSING], ids=repr)
def test_empty_prompt_message(prompt: object) -> None:
    assert refuse(prompt=prompt).message == "Either prompt or prompt_embeds must be provided and non-empty."


def test_empty_prompt_list_message() -> None:
    assert refuse(prompt=[]).message == "You must pass at least one prompt"


def test_empty_inner_list_names_its_index() -> None:
    assert "prompt[1]" in refuse(prompt=[[1], []]).message
    assert "prompt[0]" in refuse(prompt=[[]]).message


# The message names braid's own position of the fault (prompt[i][j]); param is vLLM's: the
# pydantic location of the first prompt element that is not a non-negative int for a schema
# error, None for an out-of-vocabulary id (the engine's VLLMValidationError has no parameter).
@pytest.mark.parametrize(
    ("prompt", "where", "shown", "type_", "param"),
    [
        ([[1, 2], [3, 4, 5, True]], "prompt[1][3]", "true", "Bad Request", "body.prompt.0"),
        ([[1, 2], [3, 4, 5, False]], "prompt[1][3]", "false", "Bad Request", "body.prompt.0"),
        ([[1, 2], [3, 4, 5, 2.0]], "prompt[1][3]", "2.0", "Bad Request", "body.prompt.0"),
        ([[1, 2], [3, 4, 5, "3"]], "prompt[1][3]", "'3'", "Bad Request", "body.prompt.0"),
        ([[1, 2], [3, 4, 5, -1]], "prompt[1][3]", "-1", "Bad Request", "body.prompt.0"),
        ([[1, 2], [3, 4, 5, VOCAB]], "prompt[1][3]", str(VOCAB), "BadRequestError", None),
        ([[1, 2], [3, 4, 5, 2**70]], "prompt[1][3]", str(2**70), "BadRequestError", None),
        ([[True]], "prompt[0][0]", "true", "Bad Request", "body.prompt.0"),
        ([1, 2, True], "prompt[2]", "true", "Bad Request", "body.prompt.2"),
        ([1, 2.0], "prompt[1]", "2.0", "Bad Request", "body.prompt.1"),
        ([1, "3"], "prompt[1]", "'3'", "Bad Request", "body.prompt.1"),
        ([7, 8, -1], "prompt[2]", "-1", "Bad Request", "body.prompt.2"),
        ([7, VOCAB], "prompt[1]", str(VOCAB), "BadRequestError", None),
        ([True, 1], "prompt[0]", "true", "Bad Request", "body.prompt.0"),
        # the first bad element is named, whatever comes after it (the whole-list check fails
        # and the element-by-element one decides)
        ([VOCAB, "3"], "prompt[0]", str(VOCAB), "BadRequestError", None),
        ([1, -1, [2]], "prompt[1]", "-1", "Bad Request", "body.prompt.1"),
        ([[1], [VOCAB, [2]]], "prompt[1][1]", "list", "Bad Request", "body.prompt.0"),
    ],
    ids=repr,
)
def test_strict_token_ids_name_prompt_and_position(
    prompt: object, where: str, shown: str, type_: str, param: str | None
) -> None:
    err = refuse(prompt=prompt)
    assert (err.type, err.param) == (type_, param)
    assert err.message.startswith(where + ":"), err.message
    assert shown in err.message


def test_token_id_bound_follows_the_vocabulary_limit() -> None:
    assert parse(prompt=[[300]], limits=Limits(vocab_size=301)).prompts == (TokenPrompt((300,)),)
    err = refuse(prompt=[[300]], limits=Limits(vocab_size=300))
    assert (err.type, err.param) == ("BadRequestError", None)
    assert err.message == "prompt[0][0]: token id 300 is out of vocabulary (vocabulary size 300)."


# --- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("many", [["x"] * 1025, [[1]] * 1025])
def test_more_prompts_than_the_limit_is_400(many: list) -> None:
    err = refuse(prompt=many, limits=Limits(max_prompts=1024, vocab_size=VOCAB))
    assert (err.type, err.param) == ("BadRequestError", "prompt")
    assert "1025" in err.message and "1024" in err.message


@pytest.mark.parametrize("many", [["x"] * 1024, [[1]] * 1024])
def test_prompt_count_at_the_limit_is_fine(many: list) -> None:
    assert len(parse(prompt=many, limits=Limits(max_prompts=1024, vocab_size=VOCAB)).prompts) == 1024


def test_a_flat_token_list_longer_than_the_prompt_limit_is_one_prompt() -> None:
    req = parse(prompt=[5] * 3000, limits=Limits(max_prompts=1024, vocab_size=VOCAB))
    assert req.prompts == (TokenPrompt((5,) * 3000),)


def test_prompt_limit_is_configurable() -> None:
    limits = Limits(max_prompts=2, vocab_size=VOCAB)
    assert len(parse(prompt=["a", "b"], limits=limits).prompts) == 2
    err = refuse(prompt=["a", "b", "c"], limits=limits)
    assert (err.type, err.param) == ("BadRequestError", "prompt")
    assert err.message == "prompt list length 3 exceeds the maximum allowed count of 2."


def test_prompts_times_n_over_max_choices_is_400() -> None:
    limits = Limits(max_choices=8, vocab_size=VOCAB)
    err = refuse(prompt=["a", "b", "c"], n=3, limits=limits)
    assert err.param == "n" and "9" in err.message
    assert len(parse(prompt=["a", "b", "c", "d"], n=2, limits=limits).prompts) == 4  # exactly 8
    assert parse(prompt=[1, 2, 3, 4, 5, 6, 7, 8, 9], n=8, limits=limits).sampling.n == 8  # one token prompt


def test_default_max_choices_counts_prompts_times_n() -> None:
    assert refuse(prompt=["x"] * 1024, n=5).param == "n"  # 5120 > 4096
    assert parse(prompt=["x"] * 1024, n=4).sampling.n == 4  # 4096


# --- field checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, None),
        ({"n": -1}, None),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 0, "echo": False}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, "max_tokens"),
        ({"temperature": -0.01}, "temperature"),
        ({"temperature": 2.01}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": -1, "stream": True}, "prompt_logprobs"),
        ({"stop": ""}, None),
        ({"stop": ["a", ""]}, None),
        ({"use_beam_search": True}, "use_beam_search"),
    ],
    ids=repr,
)
def test_field_checks(fields: dict, param: str | None) -> None:
    err = refuse(**fields)
    assert (err.type, err.param) == ("BadRequestError", param)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 0, "echo": True},
        {"temperature": 0},
        {"temperature": 2},
        {"temperature": 0, "n": 1},
        {"logprobs": 20},
        {"logprobs": 0},
        {"prompt_logprobs": 20},
        {"prompt_logprobs": 1},
        {"prompt_logprobs": 0, "stream": True},
        {"stop": ["a", "b"]},
        {"stop": "a"},
        {"use_beam_search": False},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream_options": {}},
        {"stream_options": None},
        {"echo": True, "logprobs": 2, "stream": True},
    ],
    ids=repr,
)
def test_valid_fields_are_accepted(fields: dict) -> None:
    req = parse(**fields)
    for key in ("n", "temperature", "logprobs"):
        if key in fields:
            assert getattr(req.sampling, key) == fields[key]
    if "max_tokens" in fields:
        assert req.max_tokens == fields["max_tokens"]


def test_n_is_bounded_by_max_n() -> None:
    limits = Limits(max_n=4, vocab_size=VOCAB)
    assert parse(n=4, limits=limits).sampling.n == 4
    err = refuse(n=5, limits=limits)
    assert (err.type, err.param) == ("BadRequestError", "n")
    assert err.message == "n must be between 1 and 4, got 5."


# braid's own caps (Limits): over the cap a 400 naming the field; at the cap accepted.
WIDE = Limits(vocab_size=4096)
CAPS = [
    ({"stop": "x" * 1025}, {"stop": "x" * 1024}, "stop"),
    ({"stop": ["a", "x" * 1025]}, {"stop": ["a", "x" * 1024]}, "stop"),
    ({"stop_token_ids": [1] * 1025}, {"stop_token_ids": [1] * 1024}, "stop_token_ids"),
    (
        {"logit_bias": {str(i): 1.0 for i in range(1025)}},
        {"logit_bias": {str(i): 1.0 for i in range(1024)}},
        "logit_bias",
    ),
    ({"bad_words": ["w"] * 129}, {"bad_words": ["w"] * 128}, "bad_words"),
    ({"bad_words": ["x" * 1025]}, {"bad_words": ["x" * 1024]}, "bad_words"),
    ({"request_id": "r" * 257}, {"request_id": "r" * 256}, "request_id"),
    ({"n": 257}, {"n": 256}, "n"),
    ({"top_k": 2**63}, {"top_k": 2**63 - 1}, "top_k"),
]


@pytest.mark.parametrize(("over", "at", "param"), CAPS, ids=lambda v: repr(v)[:40])
def test_each_cap_is_a_400_naming_its_field(over: dict, at: dict, param: str) -> None:
    err = refuse(limits=WIDE, **over)
    assert (err.type, err.param) == ("BadRequestError", param)
    assert param in err.message
    parse(limits=WIDE, **at)


def test_caps_are_checked_before_the_entries() -> None:
    """A long list is refused by its length, before each entry is checked (out of vocabulary here)."""
    err = refuse(stop_token_ids=[VOCAB] * 1025)
    assert err.message == "stop_token_ids may hold at most 1024 entries, got 1025."
    err = refuse(logit_bias={str(VOCAB + i): 1.0 for i in range(1025)})
    assert err.message == "logit_bias may hold at most 1024 entries, got 1025."


def test_caps_come_from_the_limits() -> None:
    limits = Limits(vocab_size=VOCAB, max_word_chars=3, max_stop_token_ids=2, max_logit_bias=1, max_bad_words=1)
    assert refuse(stop=["abc", "abcd"], limits=limits).message == "stop[1] has 4 characters; at most 3 are allowed."
    assert refuse(stop_token_ids=[1, 2, 3], limits=limits).param == "stop_token_ids"
    assert refuse(logit_bias={"1": 1, "2": 1}, limits=limits).param == "logit_bias"
    assert refuse(bad_words=["a", "b"], limits=limits).param == "bad_words"
    assert parse(stop="abc", stop_token_ids=[1, 2], logit_bias={"1": 1}, bad_words=["abc"], limits=limits)


def test_echo_with_max_tokens_zero_keeps_zero() -> None:
    req = parse(max_tokens=0, echo=True)
    assert req.max_tokens == 0 and req.echo


def test_greedy_sampling_with_n_above_one() -> None:
    err = refuse(temperature=0, n=2)
    assert err.message == "n must be 1 when using greedy sampling, got 2."
    assert err.param is None
    assert parse(temperature=0.5, n=2).sampling.n == 2


def test_prompt_logprobs_with_stream_is_a_bad_request_error() -> None:
    """vLLM raises these in a model validator (VLLMValidationError): BadRequestError, not pydantic's "Bad Request"."""
    err = refuse(prompt_logprobs=1, stream=True)
    assert not isinstance(err, SchemaError)
    assert (err.type, err.param) == ("BadRequestError", "prompt_logprobs")
    assert err.message == "`prompt_logprobs` are not available when `stream=True`."


def test_stream_options_without_stream_is_a_bad_request_error() -> None:
    for fields in ({"stream": False}, {}):
        err = refuse(fields, stream_options={"include_usage": True})
        assert not isinstance(err, SchemaError)
        assert (err.type, err.param) == ("BadRequestError", "stream_options")
        assert err.message == "Stream options can only be defined when `stream=True`."


def test_suffix_is_refused() -> None:
    err = refuse(suffix="tail")
    assert err.message == "suffix is not currently supported"
    assert (err.type, err.param) == ("BadRequestError", "suffix")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": "two"}, "body.n"),
        ({"n": 2.0}, "body.n"),
        ({"n": True}, "body.n"),
        ({"max_tokens": "5"}, "body.max_tokens"),
        ({"max_tokens": 5.0}, "body.max_tokens"),
        ({"temperature": "0.5"}, "body.temperature"),
        ({"stream": "yes"}, "body.stream"),
        ({"echo": 1}, "body.echo"),
        ({"logprobs": True}, "body.logprobs"),
        ({"seed": 1.5}, "body.seed"),
        ({"stop": 5}, "body.stop"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "body.stream_options.include_usage"),
        ({"stream": True, "stream_options": 5}, "body.stream_options"),
        # a dict value: pydantic's location is the key ("body.logit_bias.1", checked against
        # vLLM 0.32's own CompletionRequest model and validation handler)
        ({"logit_bias": {"1": "a"}}, "body.logit_bias.1"),
        ({"truncation_side": "middle"}, "body.truncation_side"),
        ({"truncation_side": 1}, "body.truncation_side"),
    ],
    ids=repr,
)
def test_wrong_json_types_are_schema_errors_naming_the_field(fields: dict, param: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse(**fields)
    err = info.value
    assert err.param == param
    assert err.status == 400 and err.type == "Bad Request"
    assert err.body()["error"]["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop_token_ids": [1, "a"]}, "body.stop_token_ids.1"),
        ({"allowed_token_ids": [1, 2, 3.5]}, "body.allowed_token_ids.2"),
        ({"bad_words": [7]}, "body.bad_words.0"),
        # stop is a union (str | list[str]): pydantic reports the str member first, at the field
        # itself, so vLLM answers "body.stop", not the element (checked against vLLM 0.32's own
        # CompletionRequest model and validation handler)
        ({"stop": ["a", 5]}, "body.stop"),
    ],
    ids=repr,
)
def test_wrong_type_inside_a_list_names_the_field(fields: dict, param: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse(**fields)
    assert info.value.param == param
    assert info.value.type == "Bad Request"


# FastAPI names a JSON syntax error ("body", pos) with Python's json.JSONDecodeError.pos, a
# character offset; an empty body is not parsed at all and is a missing body, ("body",).
@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", "body"),
        (b"{", "body.1"),
        (b"{'prompt': 'x'}", "body.1"),
        (b'{"prompt": "x",}', "body.15"),
        (b'{"prompt": "x",', "body.15"),
        (b"nope", "body.0"),
        (b'{"prompt": ', "body.11"),
        (
            '{"prompt": "\u00e9\u00e9", }'.encode(),
            "body.17",
        ),  # 2-byte characters: a character offset (the byte offset is 19)
    ],
    ids=repr,
)
def test_invalid_json_is_a_schema_error_at_the_character_offset(body: bytes, param: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse_request(body, LIMITS)
    err = info.value
    assert (err.status, err.type, err.param) == (400, "Bad Request", param)
    assert err.message.startswith("The request body is not valid JSON: ")


@pytest.mark.parametrize("body", [b"[]", b'["x"]', b'"x"', b"3", b"null", b"true"])
def test_a_non_object_body_is_a_schema_error(body: bytes) -> None:
    with pytest.raises(SchemaError) as info:
        parse_request(body, LIMITS)
    assert (info.value.status, info.value.type, info.value.param) == (400, "Bad Request", "body")


# The body fields that are not sampling parameters: the request's own, and the refused ones.
NOT_SAMPLING = {
    "model", "prompt", "stream", "stream_options", "echo", "return_token_ids", "return_tokens_as_token_ids",
    "add_special_tokens", "truncate_prompt_tokens", "truncation_side", "request_id", "user", "priority",
    "service_tier",
    "best_of", *UNSUPPORTED, *UNSUPPORTED_COMPLETIONS,
    # Structured output: read with structured_outputs into SamplingParams.structured_outputs.
    "response_format", *GUIDED,
}  # fmt: skip
PASSTHROUGH = set(PassThrough.__struct_fields__)
SAMPLING = {field.name for field in attrs.fields(SamplingParams)} - {"passthrough"}


def test_every_body_field_is_a_sampling_parameter_or_the_requests_own() -> None:
    body = set(CompletionBody.__struct_fields__)
    assert SAMPLING | PASSTHROUGH <= body
    assert not SAMPLING & PASSTHROUGH
    assert body - SAMPLING - PASSTHROUGH == NOT_SAMPLING


def test_every_sampling_field_of_the_body_reaches_the_engine_params() -> None:
    sent = {
        "max_tokens": 5, "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "min_p": 0.1, "seed": 7,
        "stop": ["x", "y"], "stop_token_ids": [4], "include_stop_str_in_output": True, "ignore_eos": True,
        "min_tokens": 1, "logprobs": 2, "prompt_logprobs": 1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.5, "skip_special_tokens": False, "spaces_between_special_tokens": False,
        "logit_bias": {"5": 1.0, "6": -2.0}, "allowed_token_ids": [5, 6], "bad_words": ["no"],
        "structured_outputs": {"choice": ["yes", "no"]}, "kv_transfer_params": {"do_remote_prefill": True},
        "stream_interval": 4,
    }  # fmt: skip
    assert set(sent) == SAMPLING | PASSTHROUGH
    got = parse(sent).sampling
    converted = {"logit_bias": ((5, 1.0), (6, -2.0)), "structured_outputs": Structured(choice=("yes", "no"))}

    def expected(names: set[str]) -> dict[str, object]:
        return {name: converted.get(name, tuple(v) if isinstance(v := sent[name], list) else v) for name in names}

    assert {k: v for k, v in attrs.asdict(got, recurse=False).items() if k != "passthrough"} == expected(SAMPLING)
    assert msgspec.structs.asdict(got.passthrough) == expected(PASSTHROUGH)


def test_pass_through_fields_left_out_stay_none_for_the_engines_default() -> None:
    assert parse().sampling.passthrough == PassThrough()
    assert parse(top_k=None, min_p=None, bad_words=None).sampling.passthrough == PassThrough()
    assert [name for name, value in msgspec.structs.asdict(PassThrough()).items() if value is not None] == [
        "skip_special_tokens",  # vLLM's server takes no null for these two: their defaults are vLLM's
        "spaces_between_special_tokens",
    ]


def test_unknown_fields_are_ignored() -> None:
    plain = parse(prompt=["a", "b"], n=2, max_tokens=3)
    extra = parse(prompt=["a", "b"], n=2, max_tokens=3, frobnicate=1, nested={"deep": [1, {"x": None}]}, cache_salt="s")
    assert extra == plain


def test_defaults() -> None:
    req = parse()
    assert req.max_tokens == 16 and req.sampling == SamplingParams(max_tokens=16)
    assert not req.stream and not req.include_usage and not req.continuous_usage
    assert parse(max_tokens=None).max_tokens == 16


@pytest.mark.parametrize(
    ("fields", "prompt_logprobs"),
    [
        ({"echo": True, "logprobs": 2}, 2),
        ({"echo": True, "logprobs": 0}, 0),
        ({"echo": True, "logprobs": 2, "stream": True}, 2),
        ({"echo": False, "logprobs": 2}, None),
        ({"logprobs": 2}, None),
        ({"echo": True}, None),
        ({"echo": True, "logprobs": 2, "prompt_logprobs": 1}, 1),
        ({"prompt_logprobs": 3}, 3),
    ],
    ids=repr,
)
def test_echo_with_logprobs_requests_prompt_logprobs(fields: dict, prompt_logprobs: int | None) -> None:
    req = parse(**fields)
    assert req.sampling.prompt_logprobs == prompt_logprobs
    assert req.sampling.logprobs == fields.get("logprobs")


@pytest.mark.parametrize(
    ("stream_options", "include", "continuous"),
    [
        (None, False, False),
        ({}, False, False),
        ({"include_usage": True}, True, False),
        ({"include_usage": False}, False, False),
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
        ({"continuous_usage_stats": True}, False, False),
    ],
    ids=repr,
)
def test_stream_usage_options(stream_options: dict | None, include: bool, continuous: bool) -> None:
    req = parse(stream=True, stream_options=stream_options)
    assert (req.include_usage, req.continuous_usage) == (include, continuous)


class _Inner(msgspec.Struct):
    name: str


class _Outer(msgspec.Struct):
    tokens: list[int]
    inner: list[_Inner] = []


def test_a_missing_required_field_is_named_by_its_own_location() -> None:
    decoder = msgspec.json.Decoder(_Outer)
    for body, param in ((b"{}", "body.tokens"), (b'{"tokens": [], "inner": [{}]}', "body.inner.0.name")):
        with pytest.raises(SchemaError) as info:
            decode_body(body, decoder)
        assert info.value.param == param  # as pydantic locates a missing field


@pytest.mark.parametrize(
    ("seed", "words"),
    [
        (2**63, "less than or equal to 9223372036854775807 (less_than_equal)"),
        (-(2**63) - 1, "greater than or equal to -9223372036854775808 (greater_than_equal)"),
    ],
)
def test_a_seed_out_of_range_names_vllms_bound(seed: int, words: str) -> None:
    err = refuse(seed=seed)
    assert err.param == "body.seed" and err.type == "Bad Request"
    assert err.message == f"seed: Input should be {words}, got {seed}."
    assert parse(seed=2**63 - 1) and parse(seed=-(2**63))


def test_logit_bias_names_every_bad_key() -> None:
    err = refuse(logit_bias={"a": 1.0, "7": 1.0, "b": 2.0, str(VOCAB): 1.0})
    assert err.param == "logit_bias"
    # vLLM's first check: keys that are not integers, all of them (the ids are checked after)
    assert err.message == "logit_bias contains key(s) that cannot be converted to integer token IDs: ['a', 'b']"
    err = refuse(logit_bias={str(VOCAB + 1): 1.0, "7": 1.0, "-1": 2.0})
    assert err.message == (
        f"token_id(s) [{VOCAB + 1}, -1] in logit_bias contain out-of-vocab token ids. Vocabulary size: {VOCAB}"
    )
