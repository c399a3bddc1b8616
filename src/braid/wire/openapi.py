"""The OpenAPI document served at ``GET /openapi.json``, generated, never written by hand.

The contract:

* Every route of the app is in it, with every status it answers on purpose (an unexpected 500
  is a bug, declared nowhere but on ``POST /v1/completions``, where an engine failure is one).
* Each route declares its own :class:`Operation` beside its view (``braid.routes.*``); this module
  holds the parts they share and builds the document from the operations it is given.
* A request body's schema is msgspec's JSON schema of the Struct its decoder decodes
  (``/tokenize``'s is either of its two), so the two cannot differ. It gives the body's types; the values braid refuses (out of range, or in a
  combination it cannot run) are 400s, with the field named in ``error.param``.
* Response bodies are the Structs of :mod:`braid.wire.shapes`; a stream's events are described
  one by one (OpenAPI 3.2's ``itemSchema``): a JSON chunk or error, then ``[DONE]``.
* The bearer scheme is always described; when the app has API keys, every operation requires
  it and lists the 401, except the routes open without a key (``Settings.open_paths``).

:func:`document` builds it from the operations and the settings (no engine: the model's name is
not in it), once per app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from braid import errors
from braid.settings import Settings
from braid.wire import shapes as responses

OPENAPI_VERSION = "3.2.0"
"""3.2 for ``itemSchema``, the schema of each event of a ``text/event-stream`` response."""

JsonSchema = dict[str, Any]

_REF = "#/components/schemas/{name}"


def ref(struct: type[msgspec.Struct]) -> JsonSchema:
    return {"$ref": _REF.format(name=struct.__name__)}


@attrs.frozen
class Outcome:
    """One declared status of an operation."""

    status: int
    description: str
    content: JsonSchema | None = None
    headers: tuple[str, ...] = ()


@attrs.frozen
class Operation:
    method: str
    path: str
    summary: str
    outcomes: tuple[Outcome, ...]
    request: JsonSchema | None = None
    parameters: tuple[JsonSchema, ...] = ()
    structs: tuple[type[msgspec.Struct], ...] = ()
    """Every Struct its schemas refer to (they go into the document's components)."""
    unauthorized: Outcome | None = None
    """Its 401 when the app has keys, for a route with an error shape of its own (Anthropic's);
    None: vLLM's."""
    required: tuple[tuple[type[msgspec.Struct], str], ...] = ()
    """Body fields required of a client that the decoder gives a default, so that it can report
    a missing one itself (a 400 naming it): marked required, their default dropped."""


def error_outcomes(*classes: type[errors.BraidError]) -> tuple[Outcome, ...]:
    """An error outcome per status, naming the ``error.type`` values braid sends with it."""
    by_status: dict[int, list[str]] = {}
    for cls in classes:
        types = by_status.setdefault(cls.status, [])
        if cls.type not in types:
            types.append(cls.type)
    # Retry-After: braid sets it on these (admission's queue full, a draining or dead engine).
    retry = {errors.TooManyRequests.status, errors.EngineUnavailable.status}
    return tuple(
        Outcome(
            status,
            "error.type: " + ", ".join(types),
            {"application/json": {"schema": ref(responses.Error)}},
            ("Retry-After",) if status in retry else (),
        )
        for status, types in sorted(by_status.items())
    )


def sse_event(chunk: type[msgspec.Struct] = responses.CompletionChunk) -> JsonSchema:
    """One event of a stream: a chunk, or an error (the last before ``[DONE]``)."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [ref(chunk), ref(responses.Error)]},
    }
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }


def json_body(schema: JsonSchema, examples: dict[str, object]) -> JsonSchema:
    """A required JSON request body with named examples."""
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": schema,
                "examples": {name: {"value": value} for name, value in examples.items()},
            }
        },
    }


def generation_ok(description: str, body: type[msgspec.Struct], chunk: type[msgspec.Struct]) -> Outcome:
    """A generating route's 200: a JSON body, or with ``stream`` server-sent events."""
    return Outcome(
        200,
        description + "; with `stream`, server-sent events ending with `data: [DONE]`.",
        {"application/json": {"schema": ref(body)}, "text/event-stream": {"itemSchema": sse_event(chunk)}},
        ("X-Request-Id",),
    )


REQUEST_ERRORS: tuple[type[errors.BraidError], ...] = (
    errors.InvalidRequest,
    errors.SchemaError,
    errors.ModelNotFound,
    errors.DeadlineExceeded,
    errors.BodyTimeout,
    errors.BodyTooLarge,
)
"""What any POST route may answer about its request: a bad, late or too large body, another model."""

GENERATION_ERRORS = error_outcomes(
    *REQUEST_ERRORS, errors.TooManyRequests, errors.EngineError, errors.EngineUnavailable
)
"""What a generating route answers besides its 200: its request's errors, admission's and the engine's."""

REQUEST_ID: JsonSchema = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "The response's id (and the engine requests' ids) instead of a random one.",
    "schema": {"type": "string"},
}


SERVER_OPERATIONS = (
    Operation(
        "get",
        "/v1/models",
        "The served model",
        (Outcome(200, "The one model braid serves.", {"application/json": {"schema": ref(responses.ModelList)}}),),
        structs=(responses.ModelList,),
    ),
    Operation(
        "get",
        "/health",
        "Whether the server takes requests",
        (
            Outcome(200, "Healthy (empty body)."),
            Outcome(503, "Draining, or the engine is dead (empty body)."),
        ),
    ),
    Operation(
        "get",
        "/version",
        "The version of vLLM running the model (vLLM's field), and braid's",
        (Outcome(200, "The versions.", {"application/json": {"schema": ref(responses.Version)}}),),
        structs=(responses.Version,),
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus metrics",
        (Outcome(200, "The text exposition format.", {"text/plain": {"schema": {"type": "string"}}}),),
    ),
    Operation(
        "get",
        "/openapi.json",
        "This document",
        (Outcome(200, "The OpenAPI document.", {"application/json": {"schema": {"type": "object"}}}),),
    ),
)
"""The routes of the server itself, not of one API."""


def _components(operations: Sequence[Operation]) -> dict[str, JsonSchema]:
    structs: list[type[msgspec.Struct]] = [responses.Error]
    for op in operations:
        structs.extend(s for s in op.structs if s not in structs)
    _, schemas = msgspec.json.schema_components(structs, ref_template=_REF)
    for op in operations:
        for struct, name in op.required:
            schema = schemas[struct.__name__]
            if name not in schema.get("required", []):
                schema["required"] = [*schema.get("required", []), name]
            schema["properties"][name].pop("default", None)
    return schemas


def _responses(op: Operation, guarded: bool) -> JsonSchema:
    outcomes = op.outcomes
    if guarded:
        outcomes = (*outcomes, *((op.unauthorized,) if op.unauthorized else error_outcomes(errors.Unauthorized)))
    out: JsonSchema = {}
    for o in sorted(outcomes, key=lambda o: o.status):
        entry: JsonSchema = {"description": o.description}
        if o.content:
            entry["content"] = o.content
        if o.headers:
            entry["headers"] = {h: {"schema": {"type": "string"}} for h in o.headers}
        out[str(o.status)] = entry
    return out


def document(settings: Settings, version: str, operations: Sequence[Operation]) -> JsonSchema:
    """The OpenAPI document of an app that serves these operations with these settings (the keys
    decide the security)."""
    keys = bool(settings.api_keys)
    paths: JsonSchema = {}
    for op in operations:
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
            "schemas": _components(operations),
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


def encoded(settings: Settings, version: str, operations: Sequence[Operation]) -> bytes:
    return msgspec.json.encode(document(settings, version, operations))


__all__ = [
    "GENERATION_ERRORS",
    "OPENAPI_VERSION",
    "REQUEST_ERRORS",
    "REQUEST_ID",
    "SERVER_OPERATIONS",
    "Operation",
    "Outcome",
    "document",
    "encoded",
    "error_outcomes",
    "generation_ok",
    "json_body",
    "ref",
    "sse_event",
]
