"""Structured output: a request's constraint fields -> one :class:`Structured`, or an InvalidRequest.

Pure: no vLLM, no engine, no I/O. Both endpoints call :func:`structured_from` with the raw
(JSON-decoded) values of their body fields; the engine compiles the constraint (vLLM: its
structured-output backend, xgrammar first), and braid asks it to validate the constraint before a
stream's 200 is committed (:func:`braid.engine.base.check_structured`).

The fields, as vLLM 0.32's OpenAI server reads them (``vllm/entrypoints/generate/base/protocol.py``
``structured_outputs_from_response_format``):

* ``structured_outputs``: vLLM's ``StructuredOutputsParams`` as an object: exactly one constraint
  of ``json`` (a schema: an object, or its JSON text), ``regex``, ``choice`` (a non-empty list of
  strings), ``grammar`` (EBNF or Lark), ``json_object`` (``true``), ``structural_tag`` (JSON
  text), and the options ``disable_any_whitespace``, ``disable_additional_properties``,
  ``whitespace_pattern``. Other keys are ignored, as vLLM's dataclass ignores them.
* ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "description", "strict"}}``, or a
  structural tag (``{"type": "structural_tag", "format": ...}``, or the legacy ``structures`` and
  ``triggers``). It overrides a ``structured_outputs`` constraint of the same kind (vLLM replaces
  that field) and keeps its options; a constraint of another kind as well is a 400 (vLLM's "only
  one kind of constraint").
* ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``: the spelling vLLM used
  before ``structured_outputs`` (up to 0.11, where it mapped each to the field of the same
  suffix). vLLM 0.32 no longer reads them and silently ignores them; braid maps them as vLLM did,
  because a constraint a client asked for must not be dropped. One of them, alone: with
  ``structured_outputs`` as well, or two of them, is a 400.

A value of the wrong JSON type is a :class:`~braid.errors.SchemaError` (type "Bad Request", param
the pydantic-style location ``body.<field>.<key>``, as for the other body fields); a value braid
or vLLM refuses is an :class:`~braid.errors.InvalidRequest` whose param names the body field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from braid.engine.constraint import KINDS, Kind, Structured
from braid.errors import InvalidRequest, SchemaError

GUIDED: Mapping[str, Kind] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
"""The deprecated body fields, and the constraint each maps to."""

MAX_JSON_NESTING = 64
"""vLLM's ``MAX_STRUCTURED_OUTPUT_JSON_NESTING``: objects and arrays of a schema nest at most this
deep. Checked here too, so that nothing braid does with a schema (``json.dumps``) recurses without
bound; vLLM's own check of the structural tag (deeper, for its wrapper) is left to the engine."""


# --- the JSON types, checked by hand (the fields are decoded as Any) --------------------------------


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _expect(value: object, types: type, what: str, loc: str) -> Any:
    """``value`` if it is of ``types``, else a SchemaError at ``loc`` (never asked for a number,
    so a boolean, which Python counts as one, needs no special case)."""
    if isinstance(value, types):
        return value
    raise SchemaError(f"{loc.removeprefix('body.')} must be {what}, got {_type_name(value)}.", param=loc)


def _nested_deeper(value: object, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels below ``value`` (vLLM's rule,
    level by level, so a deep document costs no recursion)."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _too_deep(field: str) -> InvalidRequest:
    return InvalidRequest(
        f"The JSON schema is nested too deeply: objects and arrays may nest at most {MAX_JSON_NESTING} levels.",
        param=field,
    )


def _schema_text(value: object, loc: str, field: str) -> str:
    """A JSON schema (an object, or its JSON text) as compact JSON text; it must be an object."""
    if isinstance(value, str):
        if not value.strip():
            raise InvalidRequest(f"{loc.removeprefix('body.')} cannot be an empty string.", param=field)
        try:
            value = json.loads(value)
        except RecursionError:
            raise _too_deep(field) from None
        except ValueError:
            raise InvalidRequest(
                f"{loc.removeprefix('body.')} is not valid JSON: a JSON schema is an object.", param=field
            ) from None
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"{loc.removeprefix('body.')} must be a JSON schema, an object; got {_type_name(value)}.", param=field
        )
    if _nested_deeper(value, MAX_JSON_NESTING):
        raise _too_deep(field)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _nonblank(value: object, loc: str, field: str) -> str:
    text: str = _expect(value, str, "a string", loc)
    if not text.strip():
        raise InvalidRequest(f"{loc.removeprefix('body.')} cannot be an empty string.", param=field)
    return text


def _constraint(kind: Kind, value: object, loc: str, field: str) -> dict[str, Any]:
    """One constraint's value, checked, as the keyword of :class:`Structured`."""
    if kind == "json":
        return {"json": _schema_text(value, loc, field)}
    if kind == "regex":
        regex: str = _expect(value, str, "a string", loc)
        if "\x00" in regex:
            # vLLM's rule: the backends' regex converters do not handle it, and it never means anything.
            raise InvalidRequest(f"{loc.removeprefix('body.')} must not contain a NUL character.", param=field)
        return {"regex": regex}  # "" is a valid regex (it matches the empty text), as vLLM says
    if kind == "choice":
        items: list[object] = _expect(value, list, "a list of strings", loc)
        if not items:
            raise InvalidRequest(f"{loc.removeprefix('body.')} cannot be an empty list.", param=field)
        return {"choice": tuple(_expect(c, str, "a string", f"{loc}.{i}") for i, c in enumerate(items))}
    if kind == "json_object":
        if not _expect(value, bool, "a boolean", loc):
            raise InvalidRequest(
                f"{loc.removeprefix('body.')} must be true if set; omit it to disable structured output.", param=field
            )
        return {"json_object": True}
    return {kind: _nonblank(value, loc, field)}  # grammar, structural_tag


# --- the three ways to ask -------------------------------------------------------------------------


def _from_structured_outputs(value: object) -> tuple[dict[str, Any], Kind]:
    field = "structured_outputs"
    so: dict[str, Any] = _expect(value, dict, "an object", f"body.{field}")
    given = [kind for kind in KINDS if so.get(kind) is not None]
    if len(given) != 1:
        raise InvalidRequest(
            "structured_outputs must hold exactly one kind of constraint (json, regex, choice, grammar, json_object "
            f"or structural_tag); it holds {', '.join(given) if given else 'none'}.",
            param=field,
        )
    kind = given[0]
    out = _constraint(kind, so[kind], f"body.{field}.{kind}", field)
    for option in ("disable_any_whitespace", "disable_additional_properties"):
        if so.get(option) is not None:
            out[option] = _expect(so[option], bool, "a boolean", f"body.{field}.{option}")
    if so.get("whitespace_pattern") is not None:
        out["whitespace_pattern"] = _expect(
            so["whitespace_pattern"], str, "a string", f"body.{field}.whitespace_pattern"
        )
    return out, kind


def _from_guided(guided: Mapping[str, object]) -> tuple[dict[str, Any], Kind, str] | None:
    unknown = set(guided) - set(GUIDED)
    if unknown:
        raise ValueError(f"not deprecated guided fields: {sorted(unknown)}")  # the caller's bug
    given = [name for name in GUIDED if guided.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequest(
            f"Only one of {', '.join(given)} may be given: each is a different constraint.", param=given[1]
        )
    name = given[0]
    kind = GUIDED[name]
    return _constraint(kind, guided[name], f"body.{name}", name), kind, name


_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "structural_tag")


def _from_response_format(value: object) -> tuple[dict[str, Any], Kind] | None:
    field = "response_format"
    rf: dict[str, Any] = _expect(value, dict, "an object", f"body.{field}")
    kind = rf.get("type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise SchemaError(
            f"response_format.type must be one of {', '.join(map(repr, _RESPONSE_FORMAT_TYPES))}; got {kind!r}.",
            param=f"body.{field}.type",
        )
    # Checked whatever the type says, as vLLM's model checks the field whenever it is there.
    spec = rf.get("json_schema")
    if spec is not None:
        loc = f"body.{field}.json_schema"
        _expect(spec, dict, "an object", loc)
        _expect(spec.get("name"), str, "a string (the schema's name)", f"{loc}.name")
        if spec.get("description") is not None:
            _expect(spec["description"], str, "a string", f"{loc}.description")
        if spec.get("strict") is not None:
            # Either way: the backends always hold the output to the schema.
            _expect(spec["strict"], bool, "a boolean", f"{loc}.strict")
        if spec.get("schema") is not None:
            _expect(spec["schema"], dict, "an object", f"{loc}.schema")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}, "json_object"
    if kind == "json_schema":
        if spec is None:
            raise InvalidRequest(
                "When response_format type is 'json_schema', the 'json_schema' field must be provided.", param=field
            )
        if spec.get("schema") is None:
            raise InvalidRequest("response_format.json_schema.schema must be provided: the JSON schema.", param=field)
        return {"json": _schema_text(spec["schema"], f"body.{field}.json_schema.schema", field)}, "json"
    return {"structural_tag": _structural_tag(rf)}, "structural_tag"


def _structural_tag(rf: dict[str, Any]) -> str:
    """A structural-tag response format as the JSON text vLLM gives its backend (its model's
    dump: only the fields it declares). The tag itself is validated by the engine."""
    loc = "body.response_format"
    if "format" in rf:
        tag: dict[str, Any] = {"type": "structural_tag", "format": rf["format"]}
    elif "structures" in rf or "triggers" in rf:
        structures: list[object] = _expect(rf.get("structures"), list, "a list", f"{loc}.structures")
        triggers: list[object] = _expect(rf.get("triggers"), list, "a list of strings", f"{loc}.triggers")
        for i, t in enumerate(triggers):
            _expect(t, str, "a string", f"{loc}.triggers.{i}")
        dumped = []
        for i, item in enumerate(structures):
            at = f"{loc}.structures.{i}"
            s: dict[str, Any] = _expect(item, dict, "an object", at)
            schema = s.get("schema")
            if schema is not None:
                _expect(schema, dict, "an object", f"{at}.schema")
            dumped.append(
                {
                    "begin": _expect(s.get("begin"), str, "a string", f"{at}.begin"),
                    "schema": schema,
                    "end": _expect(s.get("end"), str, "a string", f"{at}.end"),
                }
            )
        tag = {"type": "structural_tag", "structures": dumped, "triggers": triggers}
    else:
        raise SchemaError(
            "a structural_tag response_format needs 'format' (or the legacy 'structures' and 'triggers').", param=loc
        )
    if _nested_deeper(tag, MAX_JSON_NESTING + 4):
        raise InvalidRequest("response_format is nested too deeply.", param="response_format")
    return json.dumps(tag, ensure_ascii=False, separators=(",", ":"))


def structured_from(
    *,
    structured_outputs: object = None,
    response_format: object = None,
    guided: Mapping[str, object] | None = None,
) -> Structured | None:
    """The request's one structured-output constraint, or ``None`` when it asks for none.

    Each argument is the JSON-decoded value of the body field of that name (``None``: absent or
    null); ``guided`` maps the deprecated field names of :data:`GUIDED` that the body has to their
    values (a name outside :data:`GUIDED` is a ``ValueError``: a bug of the caller). The rules are
    the module docstring's. Raises :class:`~braid.errors.SchemaError` for a value of the wrong
    JSON type and :class:`~braid.errors.InvalidRequest` for a value that cannot be a constraint
    (none or several kinds, an empty choice list, a schema that is not an object, an empty
    grammar...), each naming the field. Whether the engine can compile the constraint (a regex or
    a schema its backend refuses) is the engine's check, not this function's.
    """
    base: dict[str, Any] | None = None
    base_kind: Kind | None = None
    source = "structured_outputs"
    if structured_outputs is not None:
        base, base_kind = _from_structured_outputs(structured_outputs)
    legacy = _from_guided(guided or {})
    if legacy is not None:
        if base is not None:
            raise InvalidRequest(
                f"{legacy[2]} is the deprecated spelling of structured_outputs: give one of them, not both.",
                param=legacy[2],
            )
        base, base_kind, source = legacy
    override = None if response_format is None else _from_response_format(response_format)
    if override is not None:
        constraint, kind = override
        if base is not None and base_kind != kind:
            # vLLM replaces the field of response_format's kind, and two constraints are refused.
            raise InvalidRequest(
                f"response_format asks for {kind} and {source} for {base_kind}: only one kind of constraint may be given.",
                param="response_format",
            )
        base = {**(base or {}), **constraint}
        source = "response_format"
    if base is None:
        return None
    return Structured(**base, source=source)


# --- the JSON schema of the fields, for /openapi.json ----------------------------------------------

# null is absent, for every field and key here, as braid reads them.
_STRINGS: dict[str, Any] = {"type": ["array", "null"], "items": {"type": "string"}}

STRUCTURED_OUTPUTS_SCHEMA: dict[str, Any] = {
    "description": "One structured-output constraint (exactly one of json, regex, choice, grammar, json_object, "
    "structural_tag), and options for the backend that compiles it.",
    "type": ["object", "null"],
    "properties": {
        "json": {"description": "A JSON schema (an object, or its JSON text).", "type": ["object", "string", "null"]},
        "regex": {"type": ["string", "null"]},
        "choice": {**_STRINGS, "minItems": 1},
        "grammar": {"description": "An EBNF (GBNF) or Lark grammar.", "type": ["string", "null"], "minLength": 1},
        "json_object": {"enum": [True, None]},
        "structural_tag": {
            "description": "A structural tag, as JSON text.",
            "type": ["string", "null"],
            "minLength": 1,
        },
        "disable_any_whitespace": {"type": ["boolean", "null"]},
        "disable_additional_properties": {"type": ["boolean", "null"]},
        "whitespace_pattern": {"type": ["string", "null"]},
    },
}
RESPONSE_FORMAT_SCHEMA: dict[str, Any] = {
    "description": "The output's format: text (unconstrained), any JSON object, JSON following a schema "
    "(json_schema), or a structural tag (format, or the legacy structures and triggers).",
    "type": ["object", "null"],
    "required": ["type"],
    "properties": {
        "type": {"enum": list(_RESPONSE_FORMAT_TYPES)},
        "json_schema": {
            "type": ["object", "null"],
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": ["string", "null"]},
                "schema": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
}
GUIDED_SCHEMAS: Mapping[str, dict[str, Any]] = {
    "guided_json": {"deprecated": True, "description": "structured_outputs.json", "type": ["object", "string", "null"]},
    "guided_regex": {"deprecated": True, "description": "structured_outputs.regex", "type": ["string", "null"]},
    "guided_choice": {"deprecated": True, "description": "structured_outputs.choice", **_STRINGS},
    "guided_grammar": {"deprecated": True, "description": "structured_outputs.grammar", "type": ["string", "null"]},
}
"""The JSON schemas of the fields (``msgspec.Meta(extra_json_schema=...)`` on a body decoded as ``Any``)."""
