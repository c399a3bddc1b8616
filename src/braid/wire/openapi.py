"""The OpenAPI document served at ``GET /openapi.json``, generated, never written by hand.

The contract:

* Every route of the app is in it, with every status it answers on purpose (an unexpected 500
  is a bug, declared nowhere but on ``POST /v1/completions``, where an engine failure is one).
* A request body's schema is msgspec's JSON schema of the Struct its decoder decodes
  (:class:`~braid.wire.completions_request.CompletionBody`, :class:`~braid.wire.chat_request.ChatBody`, those of
  :mod:`braid.wire.tokenize_request`; ``/tokenize``'s is either of its two), so the two cannot differ. It gives the body's types; the values braid refuses (out of range, or in a
  combination it cannot run) are 400s, with the field named in ``error.param``.
* Response bodies are the Structs of :mod:`braid.wire.shapes`; a stream's events are described
  one by one (OpenAPI 3.2's ``itemSchema``): a JSON chunk or error, then ``[DONE]``.
* The bearer scheme is always described; when the app has API keys, every operation requires
  it and lists the 401, except the routes open without a key (``Settings.open_paths``).

:func:`document` builds it from the settings alone (no engine: the model's name is not in it),
once per app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from braid import errors
from braid.settings import Settings
from braid.wire import shapes as responses
from braid.wire.chat_request import ChatBody
from braid.wire.completions_request import CompletionBody
from braid.wire.tokenize_request import DetokenizeBody, TokenizeChatBody, TokenizePromptBody

OPENAPI_VERSION = "3.2.0"
"""3.2 for ``itemSchema``, the schema of each event of a ``text/event-stream`` response."""

JsonSchema = dict[str, Any]

_REF = "#/components/schemas/{name}"


def _ref(struct: type[msgspec.Struct]) -> JsonSchema:
    return {"$ref": _REF.format(name=struct.__name__)}


@attrs.frozen
class _Outcome:
    """One declared status of an operation."""

    status: int
    description: str
    content: JsonSchema | None = None
    headers: tuple[str, ...] = ()


@attrs.frozen
class _Operation:
    method: str
    path: str
    summary: str
    outcomes: tuple[_Outcome, ...]
    request: JsonSchema | None = None
    parameters: tuple[JsonSchema, ...] = ()


def _errors(*classes: type[errors.BraidError]) -> tuple[_Outcome, ...]:
    """An error outcome per status, naming the ``error.type`` values braid sends with it."""
    by_status: dict[int, list[str]] = {}
    for cls in classes:
        types = by_status.setdefault(cls.status, [])
        if cls.type not in types:
            types.append(cls.type)
    # Retry-After: braid sets it on these (admission's queue full, a draining or dead engine).
    retry = {errors.TooManyRequests.status, errors.EngineUnavailable.status}
    return tuple(
        _Outcome(
            status,
            "error.type: " + ", ".join(types),
            {"application/json": {"schema": _ref(responses.Error)}},
            ("Retry-After",) if status in retry else (),
        )
        for status, types in sorted(by_status.items())
    )


def _sse_event(chunk: type[msgspec.Struct] = responses.CompletionChunk) -> JsonSchema:
    """One event of a stream: a chunk, or an error (the last before ``[DONE]``)."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [_ref(chunk), _ref(responses.Error)]},
    }
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }


_EXAMPLES = {
    "text": {"prompt": "Say this is a test", "max_tokens": 16, "temperature": 0},
    "batch_stream": {
        "prompt": ["The sky is", "Water is"],
        "max_tokens": 8,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "token_ids_logprobs": {
        "prompt": [[72, 101, 108], [108, 111]],
        "max_tokens": 4,
        "logprobs": 2,
        "echo": True,
        "return_token_ids": True,
    },
    "prompt_logprobs": {"prompt": [72, 105], "max_tokens": 2, "prompt_logprobs": 1, "stop": ["\n"]},
}


def _operations() -> tuple[_Operation, ...]:
    completion = _Outcome(
        200,
        "The completion; with `stream`, server-sent events ending with `data: [DONE]`.",
        {
            "application/json": {"schema": _ref(responses.Completion)},
            "text/event-stream": {"itemSchema": _sse_event()},
        },
        ("X-Request-Id",),
    )
    json_ok = {"schema": {"type": "object"}}
    chat = _Outcome(
        200,
        "The chat completion; with `stream`, server-sent events ending with `data: [DONE]`.",
        {
            "application/json": {"schema": _ref(responses.ChatCompletion)},
            "text/event-stream": {"itemSchema": _sse_event(responses.ChatChunk)},
        },
        ("X-Request-Id",),
    )
    generation_errors = _errors(
        errors.InvalidRequest,
        errors.SchemaError,
        errors.ModelNotFound,
        errors.DeadlineExceeded,
        errors.BodyTimeout,
        errors.BodyTooLarge,
        errors.TooManyRequests,
        errors.EngineError,
        errors.EngineUnavailable,
    )
    request_id = {
        "name": "X-Request-Id",
        "in": "header",
        "required": False,
        "description": "The response's id (and the engine requests' ids) instead of a random one.",
        "schema": {"type": "string"},
    }
    chat_ops = tuple(
        _Operation(
            "post",
            path,
            summary,
            (chat, *generation_errors),
            request={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _ref(ChatBody),
                        "examples": {"example": {"value": example}},
                    }
                },
            },
            parameters=(request_id,),
        )
        for path, summary, example in (
            (
                "/v1/chat/completions",
                "Create a chat completion (one conversation in `messages`), as vLLM serves it",
                {"messages": [{"role": "user", "content": "Say this is a test"}], "max_tokens": 16},
            ),
            (
                "/v1/chat/completions/batch",
                "Chat completions for a list of conversations (`messages`: a list of message lists); "
                "braid also streams them and takes `n` > 1",
                {"messages": [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]},
            ),
        )
    )
    tokenize_errors = _errors(
        errors.InvalidRequest,
        errors.SchemaError,
        errors.ModelNotFound,
        errors.DeadlineExceeded,
        errors.BodyTimeout,
        errors.BodyTooLarge,
    )
    tokenize_ops = (
        _Operation(
            "post",
            "/tokenize",
            "Token ids of a text, or of a conversation as the chat template renders it (vLLM's route)",
            (
                _Outcome(200, "The token ids.", {"application/json": {"schema": _ref(responses.Tokenize)}}),
                *tokenize_errors,
            ),
            request={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"anyOf": [_ref(TokenizePromptBody), _ref(TokenizeChatBody)]},
                        "examples": {
                            "text": {"value": {"prompt": "Hello world", "return_token_strs": True}},
                            "chat": {"value": {"messages": [{"role": "user", "content": "Hi"}]}},
                        },
                    }
                },
            },
        ),
        _Operation(
            "post",
            "/detokenize",
            "The text of token ids (vLLM's route)",
            (
                _Outcome(200, "The text.", {"application/json": {"schema": _ref(responses.Detokenize)}}),
                *tokenize_errors,
            ),
            request={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _ref(DetokenizeBody),
                        "examples": {"example": {"value": {"tokens": [0, 75, 108, 111]}}},
                    }
                },
            },
        ),
    )
    return (
        *chat_ops,
        *tokenize_ops,
        _Operation(
            "post",
            "/v1/completions",
            "Create a completion (OpenAI's legacy completions API, as vLLM serves it)",
            (completion, *generation_errors),
            request={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _ref(CompletionBody),
                        "examples": {name: {"value": value} for name, value in _EXAMPLES.items()},
                    }
                },
            },
            parameters=(request_id,),
        ),
        _Operation(
            "get",
            "/v1/models",
            "The served model",
            (
                _Outcome(
                    200, "The one model braid serves.", {"application/json": {"schema": _ref(responses.ModelList)}}
                ),
            ),
        ),
        _Operation(
            "get",
            "/health",
            "Whether the server takes requests",
            (
                _Outcome(200, "Healthy (empty body)."),
                _Outcome(503, "Draining, or the engine is dead (empty body)."),
            ),
        ),
        _Operation(
            "get",
            "/version",
            "braid's version",
            (_Outcome(200, "The version.", {"application/json": {"schema": _ref(responses.Version)}}),),
        ),
        _Operation(
            "get",
            "/metrics",
            "Prometheus metrics",
            (_Outcome(200, "The text exposition format.", {"text/plain": {"schema": {"type": "string"}}}),),
        ),
        _Operation(
            "get",
            "/openapi.json",
            "This document",
            (_Outcome(200, "The OpenAPI document.", {"application/json": json_ok}),),
        ),
    )


def _components() -> dict[str, JsonSchema]:
    structs: Sequence[type[msgspec.Struct]] = (
        CompletionBody,
        ChatBody,
        TokenizePromptBody,
        TokenizeChatBody,
        DetokenizeBody,
        responses.ChatCompletion,
        responses.ChatChunk,
        responses.Completion,
        responses.CompletionChunk,
        responses.Error,
        responses.ModelList,
        responses.Version,
        responses.Tokenize,
        responses.Detokenize,
    )
    _, schemas = msgspec.json.schema_components(structs, ref_template=_REF)
    # msgspec gives ``prompt`` the default the decoder needs to report a missing prompt itself
    # (a 400 naming it); to a client it is required, and it has no default.
    body = schemas[CompletionBody.__name__]
    body["required"] = ["prompt"]
    del body["properties"]["prompt"]["default"]
    chat = schemas[ChatBody.__name__]
    chat["required"] = ["messages"]
    del chat["properties"]["messages"]["default"]
    return schemas


def _responses(op: _Operation, guarded: bool) -> JsonSchema:
    outcomes = op.outcomes
    if guarded:
        outcomes = (*outcomes, *_errors(errors.Unauthorized))
    out: JsonSchema = {}
    for o in sorted(outcomes, key=lambda o: o.status):
        entry: JsonSchema = {"description": o.description}
        if o.content:
            entry["content"] = o.content
        if o.headers:
            entry["headers"] = {h: {"schema": {"type": "string"}} for h in o.headers}
        out[str(o.status)] = entry
    return out


def document(settings: Settings, version: str) -> JsonSchema:
    """The OpenAPI document of an app with these settings (the keys decide the security)."""
    keys = bool(settings.api_keys)
    paths: JsonSchema = {}
    for op in _operations():
        guarded = keys and not (op.method == "get" and op.path in settings.open_paths)
        entry: JsonSchema = {"summary": op.summary, "responses": _responses(op, guarded)}
        if op.parameters:
            entry["parameters"] = list(op.parameters)
        if op.request is not None:
            entry["requestBody"] = op.request
        if keys and not guarded:
            entry["security"] = []  # open: overrides the document's requirement
        paths.setdefault(op.path, {})[op.method] = entry
    doc: JsonSchema = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "braid",
            "version": version,
            "description": "An OpenAI-compatible /v1/completions server for vLLM.",
        },
        "paths": paths,
        "components": {
            "schemas": _components(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key of the server (braid serve --api-key, --api-key-file); "
                    "required only when the server has keys.",
                }
            },
        },
    }
    if keys:
        doc["security"] = [{"bearer": []}]
    return doc


def encoded(settings: Settings, version: str) -> bytes:
    return msgspec.json.encode(document(settings, version))


__all__ = ["OPENAPI_VERSION", "document", "encoded"]
