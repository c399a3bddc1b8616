"""Validate: a raw ``/v1/completions`` body -> :class:`CompletionRequest`, or an InvalidRequest.

Pure: no I/O, no engine. Everything that can be checked without tokenizing is checked here, so a bad
request is refused before any engine work and before a 200 is committed.

The body's field types are decoded by msgspec in strict mode, which rejects ``2.0`` or ``true``
for an integer field and ``"2"`` for a number, and names the field's JSON path in its message.
``prompt`` is a union of four list shapes that no schema library decodes with a useful message,
so :func:`parse_prompts` checks it by hand and names the prompt index and position of the fault.
Unknown fields are ignored, as vLLM does; fields that would change the output but that braid
cannot honour are refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence, Sized
from typing import Annotated, Any, Literal

import attrs
import msgspec

from braid.engine.base import SamplingParams
from braid.errors import InvalidRequest, SchemaError
from braid.wire.structured import (
    GUIDED,
    GUIDED_SCHEMAS,
    RESPONSE_FORMAT_SCHEMA,
    STRUCTURED_OUTPUTS_SCHEMA,
    Structured,
    structured_from,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@attrs.frozen
class TextPrompt:
    text: str


@attrs.frozen
class TokenPrompt:
    token_ids: tuple[int, ...]


Prompt = TextPrompt | TokenPrompt


@attrs.frozen
class Limits:
    """What one request may ask for; a field over its cap is a 400 naming the field.

    The view builds them from the settings (``max_prompts``, ``max_choices``) and the model
    (``max_logprobs``, ``vocab_size``). The caps beyond vLLM's own checks each bound work that one
    request could otherwise make the engine or braid's thread do, at every step or as it is
    added, and each sits far above what a real client sends.
    """

    max_prompts: int = 1024
    max_choices: int = 4096
    max_n: int = 256
    max_stop: int = 64
    # Every step searches the new text for each stop string, and a stream holds back the last
    # len(stop) - 1 characters until it knows they are not a stop: a long one delays the stream.
    # vLLM tokenizes each bad word (twice) as the request is added, on braid's Trio thread.
    max_word_chars: int = 1024
    """Characters in one stop string or bad word."""
    max_stop_token_ids: int = 1024
    max_logit_bias: int = 1024
    """Entries of ``logit_bias``: each is applied at every step."""
    max_bad_words: int = 128
    """vLLM's ``VLLM_MAX_NUM_BAD_WORDS``, which vLLM counts only while it tokenizes the words."""
    # The response id repeats the request id in every streamed event.
    max_request_id_chars: int = 256
    max_logprobs: int = 20
    vocab_size: int = 2**31 - 1


# The four prompt shapes, for the JSON schema only: msgspec decodes ``prompt`` as ``Any`` (it
# cannot decode a union of several list shapes), and parse_prompts checks the shape by hand.
# msgspec reads ``extra_json_schema`` only when it writes a schema: decoding does no more work.
_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_PROMPT_SCHEMA = {
    "description": "One prompt (text, or token ids) or a batch of them (texts, or token-id lists).",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        _TOKEN_IDS,
        {"type": "array", "minItems": 1, "items": _TOKEN_IDS},
    ],
}


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class SamplingBody(msgspec.Struct):
    """The fields ``/v1/completions`` and the chat routes share, by name, type and default (the
    base of :class:`CompletionBody` and :class:`braid.wire.chat_request.ChatBody`). Unknown fields are
    ignored; a nullable field's ``null`` means absent, as in vLLM."""

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    user: str | None = None
    priority: int = 0
    # Structured output (braid.wire.structured): decoded as Any, checked by structured_from.
    structured_outputs: Annotated[Any, msgspec.Meta(extra_json_schema=STRUCTURED_OUTPUTS_SCHEMA)] = None
    response_format: Annotated[Any, msgspec.Meta(extra_json_schema=RESPONSE_FORMAT_SCHEMA)] = None
    guided_json: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_json"])] = None
    guided_regex: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_regex"])] = None
    guided_choice: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_choice"])] = None
    guided_grammar: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_grammar"])] = None
    # Fields that change the output and that braid refuses (see _UNSUPPORTED).
    use_beam_search: bool = False
    best_of: int | None = None
    logprob_token_ids: Any = None
    repetition_detection: Any = None


class CompletionBody(SamplingBody):
    """The body of ``POST /v1/completions``: the shared fields and the completions-only ones."""

    prompt: Annotated[Any, msgspec.Meta(extra_json_schema=_PROMPT_SCHEMA)] = None
    echo: bool | None = None
    logprobs: int | None = None
    add_special_tokens: bool = True
    # Refused (see _UNSUPPORTED).
    suffix: str | None = None
    prompt_embeds: Any = None


_DECODER = msgspec.json.Decoder(CompletionBody)
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")


@attrs.frozen
class CompletionRequest:
    """A validated request. ``max_tokens`` is what the client asked for (0 only with ``echo``);
    ``sampling.max_tokens`` is what the engine generates before the context's room is applied
    (at least 1: an echo with ``max_tokens=0`` still generates one token, which is not shown)."""

    model: str | None
    prompts: tuple[Prompt, ...]
    max_tokens: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    echo: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    add_special_tokens: bool
    truncate_prompt_tokens: int | None
    truncation_side: str | None  # "left" (keep the last tokens), "right" (the first), None: left
    request_id: str | None


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _schema(message: str, param: str | None = None) -> SchemaError:
    """What vLLM's pydantic layer rejects (type "Bad Request"), as opposed to a BadRequestError."""
    return SchemaError(message, param=param)


def decode_body(body: bytes, decoder: msgspec.json.Decoder[Any] = _DECODER) -> Any:
    """The body as ``decoder``'s Struct (a :class:`CompletionBody` by default), or a
    :class:`~braid.errors.SchemaError` naming the field as vLLM's pydantic layer does (a missing
    required field by its own location: ``body.tokens``, ``body.tools.0.function``)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _PATH.search(text)
        loc = _loc(m.group(1) if m else None, body)
        if missing := _MISSING.match(text):
            loc = f"{loc}.{missing.group(1)}"  # pydantic names the missing field itself
        raise SchemaError(f"Invalid request body: {text}", param=loc) from None
    except msgspec.DecodeError as exc:
        raise SchemaError(f"The request body is not valid JSON: {exc}", param=_json_error_loc(body)) from None


# Fields whose type is a union with a plain string: pydantic reports the string member's
# failure first, at the field itself.
_STR_UNIONS = ("stop",)


def _loc(path: str | None, body: bytes) -> str:
    """msgspec's ``$.a[0].b`` as vLLM's pydantic location ``body.a.0.b`` (``body`` for the root)."""
    if not path:
        return "body"
    path = path.lstrip("$.")
    field = path.split("[", 1)[0].split(".", 1)[0]
    if field in _STR_UNIONS:
        return f"body.{field}"
    if "[...]" in path:
        # msgspec does not name a dict's key; pydantic does: find the first bad value
        key = _first_bad_key(body, field)
        return f"body.{field}" if key is None else f"body.{field}.{key}"
    return "body." + path.replace("][", ".").replace("[", ".").replace("]", "")


def _first_bad_key(body: bytes, field: str) -> str | None:
    try:
        value = json.loads(body).get(field)
    except (ValueError, AttributeError):
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                return k
    return None


def _json_error_loc(body: bytes) -> str:
    """vLLM (FastAPI) names a JSON syntax error ``body.<character offset>``, as Python's json
    finds it; an empty body is a missing body, named ``body``."""
    if not body:
        return "body"
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        return f"body.{exc.pos}"
    except ValueError:
        pass
    return "body"


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _token_id(value: object, where: str, vocab_size: int) -> int:
    if type(value) is not int:
        raise _schema(f"{where}: token ids must be integers, got {_type_name(value)}.")
    if value < 0:
        raise _schema(f"{where}: token id {value} is negative.")
    if value >= vocab_size:
        raise _bad(f"{where}: token id {value} is out of vocabulary (vocabulary size {vocab_size}).")
    return value


_EMPTY = "Either prompt or prompt_embeds must be provided and non-empty."
_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def parse_prompts(value: object, limits: Limits) -> tuple[Prompt, ...]:
    """The four prompt shapes of the OpenAI API, with strict token ids.

    ``"text"`` and ``[1, 2]`` are one prompt; ``["a", "b"]`` and ``[[1], [2]]`` are a batch.
    """
    if value == []:
        raise _bad("You must pass at least one prompt")
    if value is None or value == "":
        raise _bad(_EMPTY, "prompt")
    if isinstance(value, str):
        return (TextPrompt(value),)
    if not isinstance(value, list):
        raise _schema(f"prompt must be {_SHAPES}; got {_type_name(value)}.", "body.prompt")
    try:
        return _parse_prompt_list(value, limits)
    except SchemaError as exc:
        # the location, for every shape error in the list: vLLM's pydantic union reports the
        # list[int] member first, at the first element that is not a non-negative integer
        where = next((i for i, t in enumerate(value) if type(t) is not int or t < 0), None)
        exc.param = "body.prompt" if where is None else f"body.prompt.{where}"
        raise


def _parse_prompt_list(value: list[object], limits: Limits) -> tuple[Prompt, ...]:
    first = value[0]
    if isinstance(first, str):
        for i, p in enumerate(value):
            if not isinstance(p, str):
                raise _schema(f"prompt[{i}]: a list of strings cannot hold {_type_name(p)}; prompt must be {_SHAPES}.")
        prompts: tuple[Prompt, ...] = tuple(TextPrompt(p) for p in value if isinstance(p, str))
    elif isinstance(first, list):
        out: list[Prompt] = []
        for i, p in enumerate(value):
            if not isinstance(p, list):
                raise _schema(
                    f"prompt[{i}]: a list of token-id lists cannot hold {_type_name(p)}; prompt must be {_SHAPES}."
                )
            if not p:
                raise _bad(f"prompt[{i}]: the token-id list is empty (the decoder prompt cannot be empty).")
            for j, t in enumerate(p):
                if isinstance(t, list | dict):
                    raise _schema(f"prompt[{i}][{j}]: token ids must be integers, got {_type_name(t)}.")
            out.append(
                TokenPrompt(tuple(_token_id(t, f"prompt[{i}][{j}]", limits.vocab_size) for j, t in enumerate(p)))
            )
        prompts = tuple(out)
    else:
        ids = []
        for j, t in enumerate(value):
            if isinstance(t, str | list | dict):
                raise _schema(
                    f"prompt[{j}]: a list of token ids cannot hold {_type_name(t)}; prompt must be {_SHAPES}."
                )
            ids.append(_token_id(t, f"prompt[{j}]", limits.vocab_size))
        return (TokenPrompt(tuple(ids)),)
    if len(prompts) > limits.max_prompts:
        raise _bad(
            f"prompt list length {len(prompts)} exceeds the maximum allowed count of {limits.max_prompts}.",
            "prompt",
        )
    return prompts


_UNSUPPORTED = {
    "suffix": "suffix is not currently supported",
    "use_beam_search": "beam search is not supported by braid",
    "prompt_embeds": "prompt_embeds is not supported by braid",
    "logprob_token_ids": "logprob_token_ids is not supported by braid yet",
    "repetition_detection": "repetition_detection is not supported by braid yet",
}


def _check_range(name: str, value: float | None, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if value is None:
        return
    ok = math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        raise _bad(f"{name} must be in {bracket}{lo:g}, {hi:g}], got {value}.", name)


def _check_count(name: str, value: Sized | None, cap: int) -> None:
    if value is not None and len(value) > cap:
        raise _bad(f"{name} may hold at most {cap} entries, got {len(value)}.", name)


def _check_words(name: str, words: Sequence[str], cap: int) -> None:
    for i, word in enumerate(words):
        if len(word) > cap:
            raise _bad(f"{name}[{i}] has {len(word)} characters; at most {cap} are allowed.", name)


def _check_fields(b: CompletionBody, limits: Limits) -> None:
    for name, message in _UNSUPPORTED.items():
        value = getattr(b, name)
        if name == "use_beam_search":
            value = value or None
        if value is not None:
            raise _bad(message, name)
    if b.best_of is not None and b.best_of != b.n:
        raise _bad("best_of is not supported by braid (it must equal n when given).", "best_of")
    if b.priority != 0:
        raise _bad("priority scheduling is not enabled; priority must be 0.", "priority")
    so = b.stream_options
    if so is not None and (so.include_usage is not None or so.continuous_usage_stats is not None) and not b.stream:
        # vLLM checks the truthiness of the dict: `{}` is allowed without `stream`.
        raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    if b.n < 1:
        raise _bad(f"n must be between 1 and {limits.max_n}, got {b.n}.")  # vLLM names no param
    if b.n > limits.max_n:
        raise _bad(f"n must be between 1 and {limits.max_n}, got {b.n}.", "n")
    if b.max_tokens is not None and b.max_tokens < 1 and not (b.echo and b.max_tokens == 0):
        raise _bad(f"max_tokens must be at least 1, got {b.max_tokens}.", "max_tokens")
    _check_range("temperature", b.temperature, 0.0, 2.0)
    _check_range("top_p", b.top_p, 0.0, 1.0, lo_open=True)
    _check_range("min_p", b.min_p, 0.0, 1.0)
    _check_range("presence_penalty", b.presence_penalty, -2.0, 2.0)
    _check_range("frequency_penalty", b.frequency_penalty, -2.0, 2.0)
    if b.repetition_penalty is not None and not (
        math.isfinite(b.repetition_penalty) and 0 < b.repetition_penalty <= 2.0
    ):
        raise _bad(f"repetition_penalty must be in (0, 2], got {b.repetition_penalty}.", "repetition_penalty")
    if b.top_k is not None and b.top_k < -1:
        raise _bad(f"top_k must be -1 or 0 (disable), or at least 1, got {b.top_k}.", "top_k")
    if b.top_k is not None and b.top_k > INT64_MAX:
        # vLLM treats any top_k over the vocabulary as off, but cannot send this one to its engine.
        raise _bad(f"top_k must be a 64-bit integer, got {b.top_k}.", "top_k")
    if b.seed is not None and not INT64_MIN <= b.seed <= INT64_MAX:
        raise _bad(f"seed must be a 64-bit integer, got {b.seed}.", "seed")
    temperature = 1.0 if b.temperature is None else b.temperature
    if temperature < 1e-5 and b.n > 1:
        raise _bad(f"n must be 1 when using greedy sampling, got {b.n}.")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(b, name)
        if value is None:
            continue
        if value < -1:
            raise _bad(f"{name} must be -1 (the whole vocabulary) or non-negative, got {value}.", name)
        asked = limits.vocab_size if value == -1 else value
        if asked > limits.max_logprobs:
            raise _bad(
                f"Requested {name} of {asked}, which is greater than the maximum allowed: {limits.max_logprobs}.", name
            )
    if b.stream and b.prompt_logprobs is not None and b.prompt_logprobs != 0:
        raise _bad("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    stops = [b.stop] if isinstance(b.stop, str) else (b.stop or [])
    if any(s == "" for s in stops):
        raise _bad("stop cannot contain an empty string.")
    if len(stops) > limits.max_stop:
        raise _bad(f"at most {limits.max_stop} stop strings are allowed, got {len(stops)}.", "stop")
    _check_words("stop", stops, limits.max_word_chars)
    _check_count("stop_token_ids", b.stop_token_ids, limits.max_stop_token_ids)
    _check_count("logit_bias", b.logit_bias, limits.max_logit_bias)
    _check_count("bad_words", b.bad_words, limits.max_bad_words)
    _check_words("bad_words", b.bad_words or (), limits.max_word_chars)
    if b.request_id is not None and len(b.request_id) > limits.max_request_id_chars:
        raise _bad(
            f"request_id may have at most {limits.max_request_id_chars} characters, got {len(b.request_id)}.",
            "request_id",
        )
    for name in ("stop_token_ids", "allowed_token_ids"):
        for t in getattr(b, name) or ():
            if not 0 <= t < limits.vocab_size:
                raise _bad(f"{name} holds token id {t}, outside the vocabulary (size {limits.vocab_size}).", name)
    if b.allowed_token_ids is not None and not b.allowed_token_ids:
        raise _bad("allowed_token_ids cannot be empty.", "allowed_token_ids")
    if b.min_tokens < 0:
        raise _bad(f"min_tokens must be non-negative, got {b.min_tokens}.", "min_tokens")
    max_tokens = 16 if b.max_tokens is None else b.max_tokens
    if b.min_tokens > max(max_tokens, 1):
        raise _bad(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {b.min_tokens}.")
    if b.truncate_prompt_tokens is not None and (b.truncate_prompt_tokens < -1 or b.truncate_prompt_tokens == 0):
        raise _bad(
            f"truncate_prompt_tokens must be -1 or at least 1, got {b.truncate_prompt_tokens}.",
            "truncate_prompt_tokens",
        )


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...] | None:
    if raw is None:
        return None
    out = []
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise _bad(f"logit_bias keys must be token ids, got {key!r}.", "logit_bias") from None
        if not 0 <= token < vocab_size:
            raise _bad(f"logit_bias token id {token} is outside the vocabulary (size {vocab_size}).", "logit_bias")
        if not math.isfinite(value):
            raise _bad(f"logit_bias values must be finite, got {value}.", "logit_bias")
        out.append((token, max(-100.0, min(100.0, value))))
    return tuple(out)


def _sampling_params(b: CompletionBody, limits: Limits, structured: Structured | None) -> SamplingParams:
    """The body's sampling fields, by the names :class:`SamplingParams` declares: a field absent
    or null takes its default there and a list becomes a tuple. Only the fields whose wire form
    differs from the engine's are converted by hand (``structured_outputs``: ``structured``, made
    of it and the other structured-output fields)."""
    given: dict[str, Any] = {}
    for field in attrs.fields(SamplingParams):
        value = getattr(b, field.name)
        if value is not None:
            given[field.name] = tuple(value) if isinstance(value, list) else value
    prompt_logprobs = b.prompt_logprobs
    if b.echo and b.logprobs is not None and prompt_logprobs is None:
        prompt_logprobs = b.logprobs  # echoed tokens need their logprobs, as in vLLM
    max_tokens = 16 if b.max_tokens is None else b.max_tokens
    return SamplingParams(
        **{
            **given,
            "max_tokens": max(max_tokens, 1),  # echo with max_tokens=0 still generates one token
            "seed": None if b.seed == -1 else b.seed,
            "stop": (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ()),
            "logit_bias": _logit_bias(b.logit_bias, limits.vocab_size),
            "prompt_logprobs": prompt_logprobs,
            "structured_outputs": structured,
        }
    )


def parse_request(body: bytes, limits: Limits) -> CompletionRequest:
    """Decode and validate a request body; raises :class:`~braid.errors.InvalidRequest` (a 400)."""
    b = decode_body(body)
    _check_fields(b, limits)
    return build_request(b, parse_prompts(b.prompt, limits), limits, structured_of(b))


def structured_of(b: CompletionBody) -> Structured | None:
    """The body's structured-output constraint (:mod:`braid.wire.structured`), or a 400."""
    return structured_from(
        structured_outputs=b.structured_outputs,
        response_format=b.response_format,
        guided={name: getattr(b, name) for name in GUIDED},
    )


def build_request(
    b: CompletionBody, prompts: tuple[Prompt, ...], limits: Limits, structured: Structured | None
) -> CompletionRequest:
    """The request for a body whose fields passed ``_check_fields``, with its prompts already
    parsed (chat's are rendered from its messages: :mod:`braid.wire.chat_request`) and its
    structured-output constraint (:func:`structured_of`)."""
    if len(prompts) * b.n > limits.max_choices:
        raise _bad(
            f"{len(prompts)} prompts x n={b.n} is {len(prompts) * b.n} choices, more than the maximum of {limits.max_choices}.",
            "n",
        )
    stream = bool(b.stream)
    include_usage = stream and bool(b.stream_options and b.stream_options.include_usage)
    return CompletionRequest(
        model=b.model or None,
        prompts=prompts,
        max_tokens=16 if b.max_tokens is None else b.max_tokens,
        sampling=_sampling_params(b, limits, structured),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(b.stream_options and b.stream_options.continuous_usage_stats),
        echo=bool(b.echo),
        return_token_ids=bool(b.return_token_ids),
        return_tokens_as_token_ids=bool(b.return_tokens_as_token_ids),
        add_special_tokens=b.add_special_tokens,
        truncate_prompt_tokens=b.truncate_prompt_tokens,
        truncation_side=b.truncation_side,
        request_id=b.request_id,
    )
