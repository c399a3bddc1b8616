"""Structured output over HTTP, on the scripted engine (choice only): a constraint braid or the
engine refuses is a 400 before anything starts, a stream's included, never an SSE error event."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import LiveServer, parse_sse

pytestmark = pytest.mark.usefixtures("server")

CHOICES = ["red", "green", "blue"]


def started(server: LiveServer) -> float:
    return server.gauge("braid_engine_requests_total")


async def test_a_choice_constrains_every_choice(client: httpx.AsyncClient) -> None:
    body = {"prompt": ["a", "b"], "n": 3, "max_tokens": 20, "seed": 1, "structured_outputs": {"choice": CHOICES}}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 6 and all(c["text"] in CHOICES and c["finish_reason"] == "stop" for c in choices)


async def test_the_deprecated_guided_choice_does_the_same(client: httpx.AsyncClient) -> None:
    body = {"prompt": "a", "max_tokens": 20, "seed": 1, "structured_outputs": {"choice": CHOICES}}
    modern = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    del body["structured_outputs"]
    r = await client.post("/v1/completions", json={**body, "guided_choice": CHOICES})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == modern


async def test_a_streamed_choice(client: httpx.AsyncClient) -> None:
    body = {"prompt": "a", "max_tokens": 20, "stream": True, "structured_outputs": {"choice": CHOICES}}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = parse_sse(await r.aread())
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
    assert "".join(c["text"] for c in chunks) in CHOICES and chunks[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "empty list"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one kind"),
        ({"structured_outputs": {"json": [1]}}, "structured_outputs", "an object"),
        ({"structured_outputs": {"choice": [1]}}, "body.structured_outputs.choice.0", "must be a string"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "'json_schema' field must be provided"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "Only one of"),
        # well-formed, but not what the scripted engine runs: the engine's check, before the stream
        (
            {"structured_outputs": {"regex": "[a-c]{3}"}},
            "structured_outputs",
            "supports only structured_outputs.choice",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format", "not json_object"),
    ],
    ids=repr,
)
async def test_a_refused_constraint_is_a_400_before_the_stream(
    client: httpx.AsyncClient, server: LiveServer, fields: dict, param: str, message: str
) -> None:
    before = started(server)
    for stream in (True, False):
        r = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": stream, **fields})
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"] and error["code"] == 400
    assert started(server) == before  # no engine request was opened
    r = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5})
    assert r.status_code == 200 and started(server) == before + 1  # (as one that is run does)


async def test_response_format_text_is_no_constraint(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


async def test_the_document_declares_the_fields(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    props = doc["components"]["schemas"]["CompletionBody"]["properties"]
    assert "choice" in props["structured_outputs"]["properties"]
    assert props["response_format"]["properties"]["type"]["enum"] == [
        "text",
        "json_object",
        "json_schema",
        "structural_tag",
    ]
    assert all(props[name]["deprecated"] for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"))
