"""GET /openapi.json (braid.wire.openapi), and real responses against braid.wire.shapes.

The fuzzing of every route against the document is tests/http/test_schemathesis.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import pytest
import schemathesis
import trio

import braid
from braid.http.app import OPERATIONS, ROUTES
from braid.settings import Settings
from braid.wire import shapes as responses
from braid.wire.completions_request import CompletionBody, parse_request
from braid.wire.fields import Limits
from braid.wire.openapi import OPENAPI_VERSION, document
from tests.helpers import LiveServer, start_server


async def test_the_served_document_has_every_route_of_the_app(client: httpx.AsyncClient, server: LiveServer) -> None:
    r = await client.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc == document(Settings(), braid.__version__, OPERATIONS)
    assert doc["openapi"] == OPENAPI_VERSION and doc["info"]["version"] == braid.__version__
    assert set(doc["paths"]) == ROUTES
    # every rule quart routes, with its methods (HEAD and OPTIONS come with GET and every rule)
    for rule in server.app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        methods = {m.lower() for m in rule.methods or ()} - {"head", "options"}
        assert set(doc["paths"][rule.rule]) == methods, rule.rule


@pytest.mark.parametrize("settings", [Settings(), Settings(api_keys=("k",), metrics_public=True)])
def test_the_document_is_valid_openapi(settings: Settings) -> None:
    # against the OpenAPI 3.2 meta-schema, which schemathesis carries
    schemathesis.openapi.from_dict(document(settings, "0", OPERATIONS)).validate()


def test_the_request_schema_is_the_decoders() -> None:
    body = document(Settings(), "0", OPERATIONS)["components"]["schemas"]["CompletionBody"]
    assert set(body["properties"]) == set(CompletionBody.__struct_fields__)
    assert body["required"] == ["prompt"] and "default" not in body["properties"]["prompt"]
    shapes = body["properties"]["prompt"]["anyOf"]
    assert [s["type"] for s in shapes] == ["string", "array", "array", "array"]
    assert body["properties"]["stream_options"] == {
        "anyOf": [{"$ref": "#/components/schemas/StreamOptions"}, {"type": "null"}],
        "default": None,
    }


def test_the_examples_are_valid_requests() -> None:
    examples = document(Settings(), "0", OPERATIONS)["paths"]["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"
    ]["examples"]
    assert examples
    for name, example in examples.items():
        assert parse_request(json.dumps(example["value"]).encode(), Limits(vocab_size=259)).prompts, name


def _statuses(doc: dict[str, Any], path: str, method: str = "get") -> set[int]:
    return {int(s) for s in doc["paths"][path][method]["responses"]}


def test_security_follows_the_keys() -> None:
    open_doc = document(Settings(), "0", OPERATIONS)
    scheme = {"type": "http", "scheme": "bearer"}
    assert open_doc["components"]["securitySchemes"]["bearer"].items() >= scheme.items()
    assert "security" not in open_doc
    assert all(401 not in _statuses(open_doc, p, m) for p, ops in open_doc["paths"].items() for m in ops)

    keyed = document(Settings(api_keys=("k",)), "0", OPERATIONS)
    assert keyed["security"] == [{"bearer": []}]
    assert keyed["paths"]["/health"]["get"]["security"] == [] and 401 not in _statuses(keyed, "/health")
    for path in ROUTES - {"/health"}:
        (method,) = keyed["paths"][path]
        assert 401 in _statuses(keyed, path, method) and "security" not in keyed["paths"][path][method], path

    public = document(Settings(api_keys=("k",), metrics_public=True), "0", OPERATIONS)
    assert public["paths"]["/metrics"]["get"]["security"] == [] and 401 not in _statuses(public, "/metrics")
    assert 401 in _statuses(public, "/openapi.json")


# --- real responses, decoded strictly through braid.wire.shapes ---------------------------------------


def _strict(raw: bytes | str, kind: type[msgspec.Struct]) -> Any:
    return msgspec.json.decode(raw, type=kind)


async def test_a_non_streamed_body_is_a_completion(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, prompt_tokens_details=True)
    body = {
        "prompt": [[72, 105], [33]],
        "n": 2,
        "max_tokens": 3,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "echo": True,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        for extra in ({}, {"logprobs": None, "prompt_logprobs": None, "echo": False, "return_token_ids": False}):
            r = await c.post("/v1/completions", json={**body, **extra})
            assert r.status_code == 200, r.text
            completion = _strict(r.content, responses.Completion)
            assert len(completion.choices) == 4
    server.shutdown.set()


async def test_every_stream_event_is_a_chunk_or_an_error(client: httpx.AsyncClient) -> None:
    body = {
        "prompt": ["Hi", "there"],
        "max_tokens": 3,
        "echo": True,
        "logprobs": 1,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    for prompt, last in (("Hi", responses.CompletionChunk), ("braid:fail@1", responses.Error)):
        r = await client.post("/v1/completions", json={**body, "prompt": ["fine", prompt]})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = r.text.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        data = [e.removeprefix("data: ") for e in events[:-2]]
        for event in data[:-1]:
            _strict(event, responses.CompletionChunk)
        _strict(data[-1], last)


async def test_errors_models_and_version_are_their_structs(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "x", "n": 0})
    assert r.status_code == 400
    _strict(r.content, responses.Error)
    _strict((await client.get("/nope")).content, responses.Error)
    _strict((await client.get("/v1/models")).content, responses.ModelList)
    assert _strict((await client.get("/version")).content, responses.Version).version == braid.__version__
