"""structured_from: the structured-output fields -> one Structured, or a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from braid.errors import InvalidRequest, SchemaError
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits
from braid.wire.structured import GUIDED, KINDS, MAX_JSON_NESTING, Structured, structured_from

SCHEMA = {"type": "object", "properties": {"c": {"enum": ["red", "green"]}}, "additionalProperties": False}
SCHEMA_TEXT = json.dumps(SCHEMA, separators=(",", ":"))


def refused(kind: type[InvalidRequest] = InvalidRequest, **fields: Any) -> InvalidRequest:
    with pytest.raises(kind) as info:
        structured_from(**fields)
    assert info.value.status == 400
    return info.value


# --- the value type ---------------------------------------------------------------------------------


def test_a_structured_holds_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="none"):
        Structured()
    with pytest.raises(ValueError, match="exactly one"):
        Structured(regex="a", choice=("a",))
    with pytest.raises(ValueError, match="choice cannot be empty"):
        Structured(choice=())
    assert Structured(regex="").kind == "regex"  # the empty regex is a constraint (it matches "")
    assert Structured(json_object=True).kind == "json_object"


def test_the_source_is_not_part_of_the_value() -> None:
    assert Structured(regex="a", source="guided_regex") == Structured(regex="a")


# --- structured_outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"json": SCHEMA}, Structured(json=SCHEMA_TEXT)),
        ({"json": json.dumps(SCHEMA, indent=2)}, Structured(json=SCHEMA_TEXT)),  # JSON text: compacted
        ({"regex": "[a-c]{3}"}, Structured(regex="[a-c]{3}")),
        ({"regex": ""}, Structured(regex="")),
        ({"choice": ["yes", "no"]}, Structured(choice=("yes", "no"))),
        ({"grammar": 'root ::= "a"'}, Structured(grammar='root ::= "a"')),
        ({"json_object": True}, Structured(json_object=True)),
        ({"structural_tag": '{"type": "x"}'}, Structured(structural_tag='{"type": "x"}')),
        # null is absent; unknown keys are ignored, as vLLM's dataclass ignores them
        ({"choice": ["a"], "regex": None, "json": None, "backend": "xgrammar"}, Structured(choice=("a",))),
        (
            {"regex": "a", "disable_any_whitespace": True, "disable_additional_properties": True},
            Structured(regex="a", disable_any_whitespace=True, disable_additional_properties=True),
        ),
        ({"regex": "a", "whitespace_pattern": " *"}, Structured(regex="a", whitespace_pattern=" *")),
    ],
    ids=repr,
)
def test_structured_outputs(given: dict[str, Any], expected: Structured) -> None:
    got = structured_from(structured_outputs=given)
    assert got == expected and got is not None and got.source == "structured_outputs"


def test_nothing_asked_is_none() -> None:
    assert structured_from() is None
    assert structured_from(response_format={"type": "text"}) is None
    assert structured_from(guided={name: None for name in GUIDED}) is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "holds none"),
        ({"disable_any_whitespace": True}, "holds none"),
        ({"regex": "a", "choice": ["a"]}, "holds regex, choice"),
        ({"json": SCHEMA, "json_object": True}, "holds json, json_object"),
        ({"choice": []}, "choice cannot be an empty list"),
        ({"json": [1]}, "must be a JSON schema, an object; got a list"),
        ({"json": "true"}, "must be a JSON schema, an object; got a boolean"),
        ({"json": "{not json"}, "is not valid JSON"),
        ({"json": "  "}, "json cannot be an empty string"),
        ({"grammar": " \n"}, "grammar cannot be an empty string"),
        ({"structural_tag": ""}, "structural_tag cannot be an empty string"),
        ({"json_object": False}, "json_object must be true if set"),
        ({"regex": "a\x00b"}, "NUL"),
    ],
    ids=repr,
)
def test_structured_outputs_refused(given: dict[str, Any], message: str) -> None:
    err = refused(structured_outputs=given)
    assert type(err) is InvalidRequest and err.type == "BadRequestError"
    assert err.param == "structured_outputs" and message in err.message


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ("regex", "body.structured_outputs"),
        (["a"], "body.structured_outputs"),
        ({"choice": "a"}, "body.structured_outputs.choice"),
        ({"choice": ["a", 1]}, "body.structured_outputs.choice.1"),
        ({"regex": 3}, "body.structured_outputs.regex"),
        ({"grammar": ["x"]}, "body.structured_outputs.grammar"),
        ({"json_object": "yes"}, "body.structured_outputs.json_object"),
        ({"regex": "a", "disable_any_whitespace": 1}, "body.structured_outputs.disable_any_whitespace"),
        ({"regex": "a", "whitespace_pattern": False}, "body.structured_outputs.whitespace_pattern"),
    ],
    ids=repr,
)
def test_a_wrong_json_type_is_a_schema_error_at_its_location(given: object, param: str) -> None:
    err = refused(SchemaError, structured_outputs=given)
    assert (err.type, err.param) == ("Bad Request", param)


def test_a_schema_nested_too_deeply_is_refused_without_recursing() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(MAX_JSON_NESTING + 1):
        deep = {"type": "object", "properties": {"a": deep}}
    err = refused(structured_outputs={"json": deep})
    assert "nested too deeply" in err.message
    # far past Python's recursion limit, as JSON text
    text = '{"a":' * 5000 + "1" + "}" * 5000
    assert "nested too deeply" in refused(structured_outputs={"json": text}).message
    shallow: dict[str, Any] = {"type": "object"}
    for _ in range(10):
        shallow = {"type": "object", "properties": {"a": shallow}}
    assert structured_from(structured_outputs={"json": shallow}) is not None


# --- the deprecated guided_* fields -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("guided_json", SCHEMA, Structured(json=SCHEMA_TEXT)),
        ("guided_regex", "[a-c]{3}", Structured(regex="[a-c]{3}")),
        ("guided_choice", ["yes", "no"], Structured(choice=("yes", "no"))),
        ("guided_grammar", 'root ::= "a"', Structured(grammar='root ::= "a"')),
    ],
)
def test_each_guided_field_maps_to_its_constraint(name: str, value: object, expected: Structured) -> None:
    got = structured_from(guided={**dict.fromkeys(GUIDED), name: value})
    assert got == expected and got is not None and got.source == name


def test_guided_fields_are_refused_together_or_with_structured_outputs() -> None:
    err = refused(guided={"guided_regex": "a", "guided_choice": ["a"]})
    assert err.param == "guided_choice" and "Only one of guided_regex, guided_choice" in err.message
    err = refused(structured_outputs={"regex": "a"}, guided={"guided_regex": "a"})
    assert err.param == "guided_regex" and "deprecated spelling" in err.message
    err = refused(guided={"guided_choice": []})
    assert err.param == "guided_choice" and "empty list" in err.message
    assert refused(SchemaError, guided={"guided_choice": [1]}).param == "body.guided_choice.0"
    with pytest.raises(ValueError, match="guided_whitespace"):
        structured_from(guided={"guided_whitespace_pattern": " "})  # not one of the fields: the caller's bug


# --- response_format --------------------------------------------------------------------------------


def test_response_format_json_object_and_json_schema() -> None:
    assert structured_from(response_format={"type": "json_object"}) == Structured(json_object=True)
    rf = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}
    got = structured_from(response_format=rf)
    assert got == Structured(json=SCHEMA_TEXT) and got is not None and got.source == "response_format"


def test_response_format_overrides_the_same_kind_and_keeps_the_options() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}
    got = structured_from(
        structured_outputs={"json": {"type": "string"}, "disable_any_whitespace": True}, response_format=rf
    )
    assert got == Structured(json=SCHEMA_TEXT, disable_any_whitespace=True)
    got = structured_from(structured_outputs={"json_object": True}, response_format={"type": "json_object"})
    assert got == Structured(json_object=True)
    # "text" constrains nothing and leaves structured_outputs as it is
    got = structured_from(structured_outputs={"regex": "a"}, response_format={"type": "text"})
    assert got == Structured(regex="a")


def test_response_format_and_another_kind_are_refused() -> None:
    err = refused(structured_outputs={"regex": "a"}, response_format={"type": "json_object"})
    assert err.param == "response_format" and "json_object" in err.message and "regex" in err.message
    err = refused(guided={"guided_choice": ["a"]}, response_format={"type": "json_object"})
    assert err.param == "response_format" and "guided_choice" in err.message


@pytest.mark.parametrize(
    ("rf", "kind", "param", "message"),
    [
        ({"type": "json_schema"}, InvalidRequest, "response_format", "the 'json_schema' field must be provided"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, InvalidRequest, "response_format", "schema must be"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}},
            SchemaError,
            "body.response_format.json_schema.schema",
            "must be an object",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            SchemaError,
            "body.response_format.json_schema.name",
            "name",
        ),
        (
            # checked whatever the type, as vLLM's model checks the field
            {"type": "text", "json_schema": {"name": 3}},
            SchemaError,
            "body.response_format.json_schema.name",
            "name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"}},
            SchemaError,
            "body.response_format.json_schema.strict",
            "boolean",
        ),
        ({"type": "xml"}, SchemaError, "body.response_format.type", "one of 'text'"),
        ({}, SchemaError, "body.response_format.type", "got None"),
        ("json_object", SchemaError, "body.response_format", "an object"),
        ({"type": "structural_tag"}, SchemaError, "body.response_format", "needs 'format'"),
        (
            {"type": "structural_tag", "structures": [{"begin": "<a>"}], "triggers": ["<a>"]},
            SchemaError,
            "body.response_format.structures.0.end",
            "string",
        ),
    ],
    ids=repr,
)
def test_response_format_refused(rf: object, kind: type[InvalidRequest], param: str, message: str) -> None:
    err = refused(kind, response_format=rf)
    assert type(err) is kind and err.param == param and message in err.message


def test_structural_tags_become_the_json_text_vllm_dumps() -> None:
    fmt = {"type": "const_string", "value": "x"}
    got = structured_from(response_format={"type": "structural_tag", "format": fmt, "extra": 1})
    assert got is not None and json.loads(got.structural_tag or "") == {"type": "structural_tag", "format": fmt}
    legacy = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>", "x": 1}],
        "triggers": ["<f"],
    }
    got = structured_from(response_format=legacy)
    assert got is not None and json.loads(got.structural_tag or "") == {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f"],
    }


# --- through parse_request --------------------------------------------------------------------------


def parse(**fields: Any) -> Structured | None:
    body = json.dumps({"prompt": "hi", **fields}).encode()
    return parse_request(body, Limits(vocab_size=259)).sampling.structured_outputs


def test_parse_request_reads_every_field() -> None:
    assert parse() is None
    assert parse(structured_outputs={"choice": ["a"]}) == Structured(choice=("a",))
    assert parse(response_format={"type": "json_object"}) == Structured(json_object=True)
    assert parse(response_format={"type": "text"}, structured_outputs=None) is None
    for name, kind in GUIDED.items():
        got = parse(**{name: SAMPLES[kind]})
        assert got is not None and got.kind == kind and got.source == name
    with pytest.raises(InvalidRequest) as info:
        parse(structured_outputs={"choice": []})
    assert info.value.param == "structured_outputs"


SAMPLES: dict[str, object] = {
    "json": SCHEMA,
    "regex": "a",
    "choice": ["a"],
    "grammar": 'root ::= "a"',
    "json_object": True,
    "structural_tag": '{"type": "x"}',
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_reachable_from_the_body(kind: str) -> None:
    got = parse(structured_outputs={kind: SAMPLES[kind]})
    assert got is not None and got.kind == kind
