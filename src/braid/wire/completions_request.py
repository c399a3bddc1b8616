"""Validate: a raw ``/v1/completions`` body -> :class:`CompletionRequest`, or an InvalidRequest.

Pure: no I/O, no engine. Everything that can be checked without tokenizing is checked here, so a bad
request is refused before any engine work and before a 200 is committed.

The body's field types are decoded by msgspec in strict mode, which rejects ``2.0`` or ``true``
for an integer field and ``"2"`` for a number, and names the field's JSON path in its message.
``prompt`` is a union of four list shapes that no schema library decodes with a useful message,
so :func:`parse_prompts` checks it by hand and names the prompt index and position of the fault.
Unknown fields are ignored, as vLLM does; fields that would change the output but that braid
cannot honour are refused with a 400 rather than silently ignored. The fields the chat routes
share are declared, checked and converted in :mod:`braid.wire.fields`; this module has the
completions-only ones (the prompts, ``echo``, ``logprobs``, ``suffix``...).
"""

from __future__ import annotations

from typing import Annotated, Any, cast

import attrs
import msgspec

from braid.engine.base import SamplingParams
from braid.errors import InvalidRequest, SchemaError
from braid.wire.fields import Limits, SamplingBody, check_fields, decode_body, sampling_params, structured_of
from braid.wire.structured import Structured


@attrs.frozen
class TextPrompt:
    text: str


@attrs.frozen
class TokenPrompt:
    token_ids: tuple[int, ...]


Prompt = TextPrompt | TokenPrompt


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


class CompletionBody(SamplingBody, frozen=True):
    """The body of ``POST /v1/completions``: the shared fields and the completions-only ones."""

    prompt: Annotated[Any, msgspec.Meta(extra_json_schema=_PROMPT_SCHEMA)] = None
    echo: bool | None = None
    logprobs: int | None = None
    add_special_tokens: bool = True
    # Refused (see UNSUPPORTED_COMPLETIONS).
    suffix: str | None = None
    prompt_embeds: Any = None


_DECODER = msgspec.json.Decoder(CompletionBody)


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
    return_tokens_as_token_ids: bool | None
    """None: the server's default (``--return-tokens-as-token-ids``), applied as the request is planned."""
    add_special_tokens: bool
    truncate_prompt_tokens: int | None
    truncation_side: str | None  # "left" (keep the last tokens), "right" (the first), None: left
    request_id: str | None
    max_tokens_param: str = "max_tokens"
    """The body field that set ``max_tokens``, named by the 400s about it (chat's is
    ``max_completion_tokens``, whichever of its two fields was sent, as vLLM names it)."""
    priority: int = 0
    """vLLM's ``priority`` (lower is earlier): orders braid's admission (braid.stream.admit)."""
    background: bool = False
    """``service_tier: "flex"``: admitted in the background class (braid.stream.admit)."""


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _schema(message: str, param: str | None = None) -> SchemaError:
    """What vLLM's pydantic layer rejects (type "Bad Request"), as opposed to a BadRequestError."""
    return SchemaError(message, param=param)


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


def _valid_ids(values: list[object], vocab_size: int) -> tuple[int, ...] | None:
    """``values`` as token ids when every one is an ``int`` in the vocabulary, checked in one
    sweep (a batch's prompts are thousands of ids); None otherwise, for the caller's element by
    element check, which names the first bad one."""
    if not all(type(t) is int for t in values):
        return None
    ids = cast("list[int]", values)
    return tuple(ids) if min(ids) >= 0 and max(ids) < vocab_size else None


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
            checked = _valid_ids(p, limits.vocab_size)
            if checked is None:
                for j, t in enumerate(p):
                    if isinstance(t, list | dict):
                        raise _schema(f"prompt[{i}][{j}]: token ids must be integers, got {_type_name(t)}.")
                checked = tuple(_token_id(t, f"prompt[{i}][{j}]", limits.vocab_size) for j, t in enumerate(p))
            out.append(TokenPrompt(checked))
        prompts = tuple(out)
    else:
        valid = _valid_ids(value, limits.vocab_size)
        if valid is not None:
            return (TokenPrompt(valid),)
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


UNSUPPORTED_COMPLETIONS = {
    "suffix": "suffix is not currently supported",
    "prompt_embeds": "prompt_embeds is not supported by braid",
}
"""The completions-only fields that braid refuses when they are not null (the shared ones:
:data:`braid.wire.fields.UNSUPPORTED`), each with its 400's message (``param``: the field)."""


def check_body(b: CompletionBody, limits: Limits) -> None:
    """Check a decoded completions body's fields (its prompts apart: :func:`parse_prompts`), or
    raise :class:`~braid.errors.InvalidRequest` (a 400 naming the field)."""
    for name, message in UNSUPPORTED_COMPLETIONS.items():
        if getattr(b, name) is not None:
            raise _bad(message, name)
    check_fields(b, limits, echo=bool(b.echo), logprobs=b.logprobs)


def parse_request(body: bytes, limits: Limits) -> CompletionRequest:
    """Decode and validate a request body; raises :class:`~braid.errors.InvalidRequest` (a 400)."""
    b = decode_body(body, _DECODER)
    check_body(b, limits)
    return build_request(b, parse_prompts(b.prompt, limits), limits, structured_of(b))


def build_request(
    b: CompletionBody,
    prompts: tuple[Prompt, ...],
    limits: Limits,
    structured: Structured | None,
    *,
    max_tokens_param: str = "max_tokens",
) -> CompletionRequest:
    """The request for a body whose fields passed :func:`check_body` (chat's:
    :func:`braid.wire.fields.check_fields`), with its prompts already parsed (chat's are rendered
    from its messages: :mod:`braid.wire.chat_request`) and its structured-output constraint
    (:func:`braid.wire.fields.structured_of`)."""
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
        sampling=sampling_params(b, limits, structured, echo=bool(b.echo), logprobs=b.logprobs),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(b.stream_options and b.stream_options.continuous_usage_stats),
        echo=bool(b.echo),
        return_token_ids=bool(b.return_token_ids),
        return_tokens_as_token_ids=b.return_tokens_as_token_ids,
        add_special_tokens=b.add_special_tokens,
        truncate_prompt_tokens=b.truncate_prompt_tokens,
        truncation_side=b.truncation_side,
        request_id=b.request_id,
        max_tokens_param=max_tokens_param,
        priority=b.priority,
        background=b.service_tier == "flex",
    )
