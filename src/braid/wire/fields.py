"""The validation layer the request validators share: ``/v1/completions``
(:mod:`braid.wire.completions_request`), the chat routes (:mod:`braid.wire.chat_request`) and
``/tokenize``/``/detokenize`` (:mod:`braid.wire.tokenize_request`).

Pure: no I/O, no engine. What is here:

* :func:`decode_body`: body bytes -> a msgspec Struct, strictly typed, or a
  :class:`~braid.errors.SchemaError` located as vLLM's pydantic layer locates it;
* :class:`SamplingBody`: the body fields the completions and chat routes share (their
  pass-through sampling fields are declared once, in :class:`braid.engine.base.PassThrough`,
  which it inherits);
* :func:`check_fields`: the checks of those fields (400s naming the field, as vLLM's validators
  name it), against the caps of :class:`Limits`;
* :func:`structured_of` and :func:`sampling_params`: a checked body -> the engine's
  :class:`~braid.engine.base.SamplingParams`;
* :data:`INT64_MIN`, :data:`INT64_MAX`: the bounds of what vLLM's engine takes as an integer.

Unknown fields are ignored, as vLLM does; fields that would change the output but that braid
cannot honour are refused with a 400 (:data:`UNSUPPORTED`) rather than silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence, Sized
from typing import Annotated, Any, Literal, TypeVar

import attrs
import msgspec

from braid.engine.base import PassThrough, SamplingParams
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
"""The 64-bit integer range: a seed, ``top_k`` or token id outside it cannot reach vLLM's engine."""


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


class StreamOptions(msgspec.Struct):
    """Options of a stream: only with ``stream: true`` unless empty."""

    # A key the client sent, even as null, is not UNSET: the object is then non-empty, which vLLM
    # refuses without `stream` (check_fields). Unknown keys are dropped, so an object holding only
    # unknown keys passes without `stream` (vLLM refuses it).
    include_usage: bool | None | msgspec.UnsetType = msgspec.UNSET
    continuous_usage_stats: bool | None | msgspec.UnsetType = msgspec.UNSET


class SamplingBody(PassThrough, frozen=True):
    """The fields ``/v1/completions`` and the chat routes share, by name, type and default (the
    base of :class:`braid.wire.completions_request.CompletionBody` and
    :class:`braid.wire.chat_request.ChatBody`). Unknown fields are ignored; a nullable field's
    ``null`` means absent, as in vLLM.

    The pass-through sampling fields are inherited from :class:`braid.engine.base.PassThrough`
    (where one is added); the fields here are those braid reads, converts or refuses. Frozen, as
    ``PassThrough`` is (a subclass says ``frozen=True`` again, which mypy needs to see).
    """

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
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
    # OpenAI's tiers; "flex" (slower, for work that can wait) puts the request in braid's
    # background class (braid.stream.admit). vLLM accepts the same values and ignores them.
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # Structured output (braid.wire.structured): decoded as Any, checked by structured_from.
    structured_outputs: Annotated[Any, msgspec.Meta(extra_json_schema=STRUCTURED_OUTPUTS_SCHEMA)] = None
    response_format: Annotated[Any, msgspec.Meta(extra_json_schema=RESPONSE_FORMAT_SCHEMA)] = None
    guided_json: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_json"])] = None
    guided_regex: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_regex"])] = None
    guided_choice: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_choice"])] = None
    guided_grammar: Annotated[Any, msgspec.Meta(extra_json_schema=GUIDED_SCHEMAS["guided_grammar"])] = None
    # For the engine's KV connector (disaggregated prefill/decode): SamplingParams.kv_transfer_params,
    # which vLLM takes in its SamplingParams.extra_args. An engine without a connector ignores it,
    # as vLLM's does. On chat, its prompt_token_ids replace the rendered prompt (braid.wire.kv_transfer).
    kv_transfer_params: dict[str, Any] | None = None
    # Fields that change the output and that braid refuses (see UNSUPPORTED).
    use_beam_search: bool = False
    best_of: int | None = None
    logprob_token_ids: Any = None
    repetition_detection: Any = None


_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")

T = TypeVar("T")


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def check_seed(seed: int | None) -> None:
    """A seed vLLM's schema refuses (a 64-bit integer: pydantic's ``ge``/``le`` on every route's
    ``seed``), with the bound and the check's name as vLLM's message gives them."""
    if seed is None or INT64_MIN <= seed <= INT64_MAX:
        return
    if seed < INT64_MIN:
        kind, words, bound = "greater_than_equal", "greater than or equal to", INT64_MIN
    else:
        kind, words, bound = "less_than_equal", "less than or equal to", INT64_MAX
    raise SchemaError(f"seed: Input should be {words} {bound} ({kind}), got {seed}.", param="body.seed")


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """The body as ``decoder``'s type, or a :class:`~braid.errors.SchemaError` (a 400 of type
    ``Bad Request``) whose ``param`` is where vLLM's pydantic layer locates the fault: ``body`` for
    a body that is not an object, ``body.<character offset>`` for invalid JSON, ``body.n`` or
    ``body.stop_token_ids.1`` for a value of the wrong type, and a missing required field by its
    own location (``body.tokens``, ``body.tools.0.function``)."""
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


UNSUPPORTED = {
    "use_beam_search": "beam search is not supported by braid",
    "logprob_token_ids": "logprob_token_ids is not supported by braid yet",
    "repetition_detection": "repetition_detection is not supported by braid yet",
}
"""The shared fields that would change the output and that braid does not implement, each with
the message of its 400 (``param``: the field). ``use_beam_search`` counts when true, the others
when not null."""


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


def check_fields(b: SamplingBody, limits: Limits, *, echo: bool = False, logprobs: int | None = None) -> None:
    """Check the shared fields of a decoded body, or raise :class:`~braid.errors.InvalidRequest`
    (a 400 ``BadRequestError``): the first fault found, with vLLM's ``param`` for it (``None``
    where vLLM names none). Nothing is returned: a body that passes is what
    :func:`sampling_params` and :func:`structured_of` take.

    ``echo`` and ``logprobs`` are the request's own (the routes' fields of those names differ in
    type): ``echo`` lets ``max_tokens`` be 0; ``logprobs``, the number of alternatives per
    sampled token, is bounded as ``prompt_logprobs`` is. Checked here: the refused fields
    (:data:`UNSUPPORTED`, ``best_of`` other than ``n``), ``stream_options`` without
    ``stream``, every numeric range vLLM checks, and every cap of ``limits``.
    """
    for name, message in UNSUPPORTED.items():
        value = getattr(b, name)
        if name == "use_beam_search":
            value = value or None
        if value is not None:
            raise _bad(message, name)
    if b.best_of is not None and b.best_of != b.n:
        raise _bad("best_of is not supported by braid (it must equal n when given).", "best_of")
    so = b.stream_options
    if (
        so is not None
        and not b.stream
        and (so.include_usage is not msgspec.UNSET or so.continuous_usage_stats is not msgspec.UNSET)
    ):
        # vLLM checks the truthiness of the object as sent: `{}` is allowed without `stream`,
        # `{"include_usage": null}` is not.
        raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    if b.n < 1:
        raise _bad(f"n must be between 1 and {limits.max_n}, got {b.n}.")  # vLLM names no param
    if b.n > limits.max_n:
        raise _bad(f"n must be between 1 and {limits.max_n}, got {b.n}.", "n")
    if b.max_tokens is not None and b.max_tokens < 1 and not (echo and b.max_tokens == 0):
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
    check_seed(b.seed)
    if b.stream_interval is not None and b.stream_interval < 1:
        raise SchemaError(
            f"stream_interval: Input should be greater than or equal to 1 (greater_than_equal), "
            f"got {b.stream_interval}.",
            param="body.stream_interval",
        )
    temperature = 1.0 if b.temperature is None else b.temperature
    if temperature < 1e-5 and b.n > 1:
        raise _bad(f"n must be 1 when using greedy sampling, got {b.n}.")
    for name, value in (("logprobs", logprobs), ("prompt_logprobs", b.prompt_logprobs)):
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
    for name, ids in (("stop_token_ids", b.stop_token_ids), ("allowed_token_ids", b.allowed_token_ids)):
        for t in ids or ():
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


def structured_of(b: SamplingBody) -> Structured | None:
    """The body's structured-output constraint (:mod:`braid.wire.structured`), from
    ``structured_outputs``, ``response_format`` or a ``guided_*`` field, or ``None``; a malformed
    one is a 400 naming the field."""
    return structured_from(
        structured_outputs=b.structured_outputs,
        response_format=b.response_format,
        guided={name: getattr(b, name) for name in GUIDED},
    )


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...] | None:
    """Each bad key named, as vLLM names them: first every key that is not an integer, then
    every token id outside the vocabulary (vLLM's two checks, in its order)."""
    if raw is None:
        return None
    out = []
    not_ints = []
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            not_ints.append(key)
            continue
        if not math.isfinite(value):
            raise _bad(f"logit_bias values must be finite, got {value}.", "logit_bias")
        out.append((token, max(-100.0, min(100.0, value))))
    if not_ints:
        raise _bad(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {not_ints!r}", "logit_bias"
        )
    outside = [token for token, _ in out if not 0 <= token < vocab_size]
    if outside:
        raise _bad(
            f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab_size}",
            "logit_bias",
        )
    return tuple(out)


_CONVERTED = frozenset(
    {
        "max_tokens",
        "seed",
        "stop",
        "logit_bias",
        "logprobs",
        "prompt_logprobs",
        "structured_outputs",
        "passthrough",
    }
)
# The fields of SamplingParams that sampling_params takes from the body field of the same name.
_BY_NAME = tuple(f.name for f in attrs.fields(SamplingParams) if f.name not in _CONVERTED)


def sampling_params(
    b: SamplingBody,
    limits: Limits,
    structured: Structured | None,
    *,
    echo: bool = False,
    logprobs: int | None = None,
) -> SamplingParams:
    """The engine's parameters for a body that passed :func:`check_fields` (with the same
    ``echo`` and ``logprobs``), and its constraint (:func:`structured_of`). Raises a 400 only for
    a ``logit_bias`` key that is not a token id of the vocabulary, or a value that is not finite.

    ``passthrough`` takes the body's :class:`~braid.engine.base.PassThrough` fields as they are.
    Each other field of :class:`SamplingParams` takes the body field of its name, absent or null
    giving the default there and a list becoming a tuple; only the fields whose wire form differs
    are converted here: ``max_tokens`` (16 when absent, and at least 1: an echo with
    ``max_tokens=0`` still generates one token), ``seed`` (-1 is none), ``stop`` (a string is
    one stop), ``logit_bias`` (string keys to token ids, values clamped to [-100, 100]),
    ``prompt_logprobs`` (an echo with ``logprobs`` asks for the prompt's, as in vLLM),
    ``logprobs`` and ``structured_outputs`` (the arguments).
    """
    given: dict[str, Any] = {}
    for name in _BY_NAME:
        value = getattr(b, name)
        if value is not None:
            given[name] = tuple(value) if isinstance(value, list) else value
    prompt_logprobs = b.prompt_logprobs
    if echo and logprobs is not None and prompt_logprobs is None:
        prompt_logprobs = logprobs  # echoed tokens need their logprobs, as in vLLM
    max_tokens = 16 if b.max_tokens is None else b.max_tokens
    return SamplingParams(
        **given,
        max_tokens=max(max_tokens, 1),
        seed=None if b.seed == -1 else b.seed,
        stop=(b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ()),
        logit_bias=_logit_bias(b.logit_bias, limits.vocab_size),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        structured_outputs=structured,
        passthrough=PassThrough(**{name: getattr(b, name) for name in PassThrough.__struct_fields__}),
    )


__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "UNSUPPORTED",
    "Limits",
    "SamplingBody",
    "StreamOptions",
    "check_fields",
    "check_seed",
    "decode_body",
    "sampling_params",
    "structured_of",
]
