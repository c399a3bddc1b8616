"""``POST /v1/responses`` through real hypercorn on the scripted engine: shapes, framing, aborts
on disconnect, admission, API keys and 4xx for bad input, as the chat route has them."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import trio

from tests.helpers import start_server
from tests.parity.responses_compare import parse_event_stream

LONG = {"max_output_tokens": 2000, "ignore_eos": True}
ABORTED_WITHIN = 2.0  # as tests/http/test_cancellation.py: far above the behaviour, far below the defect


async def test_a_whole_response(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post(
            "/v1/responses", json={"input": "Hello", "max_output_tokens": 5, "instructions": "Hi", "ignore_eos": True}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["instructions"] == "Hi" and body["max_output_tokens"] == 5
    (item,) = body["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["status"] == "completed"
    assert item["content"][0]["type"] == "output_text" and item["content"][0]["text"]
    usage = body["usage"]
    assert usage["output_tokens"] == 5 and usage["total_tokens"] == usage["input_tokens"] + 5
    assert r.headers["x-request-id"] == body["id"]
    srv.shutdown.set()


async def test_a_stream_is_framed_and_adds_up_to_the_whole_response(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    body = {"input": "Hello", "max_output_tokens": 6, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=srv.url) as client:
        whole = (await client.post("/v1/responses", json=body)).json()
        r = await client.post("/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_event_stream(r.content)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    kinds = [name for name, _ in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert b"[DONE]" not in r.content
    text = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert text == final["output"][0]["content"][0]["text"] == whole["output"][0]["content"][0]["text"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"] == 6
    srv.shutdown.set()


async def test_stream_disconnect_aborts_the_engine_request(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream("POST", "/v1/responses", json={"input": "Hi", "stream": True, **LONG}) as r:
            buf = b""
            async for chunk in r.aiter_raw():
                buf += chunk
                if buf.count(b"response.output_text.delta") >= 5:
                    break
            assert srv.engine.in_flight == 1
        await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.in_flight == 0 and srv.engine.aborted_total == 1
    assert srv.aborts() == {"disconnect": 1}
    assert srv.app.state.admission.in_use == 0
    srv.shutdown.set()


async def test_whole_response_disconnect_aborts_the_engine_request(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url) as client, trio.open_nursery() as inner:
        inner.start_soon(partial(client.post, "/v1/responses", json={"input": "Hi", **LONG}))
        with trio.fail_after(10):
            await srv.engine.wait_until(lambda: srv.engine.in_flight >= 1)
        inner.cancel_scope.cancel()
    await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.in_flight == 0 and srv.aborts() == {"disconnect": 1}
    srv.shutdown.set()


async def test_an_engine_failure_mid_stream_is_an_error_event(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.001)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post("/v1/responses", json={"input": "x braid:fail@3", "stream": True, **LONG})
    events = parse_event_stream(r.content)
    name, data = events[-1]
    assert name == "error" and data["code"] == "InternalServerError" and data["message"]
    assert data["sequence_number"] == len(events) - 1
    assert "response.completed" not in [n for n, _ in events]
    assert srv.engine.in_flight == 0
    srv.shutdown.set()


async def test_admission_refuses_beyond_the_queue(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01, max_in_flight=1, max_queued=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        async with client.stream("POST", "/v1/responses", json={"input": "Hi", "stream": True, **LONG}) as first:
            async for _ in first.aiter_raw():
                break  # it holds the one slot now
            r = await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2})
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == 429
        await srv.wait_idle(ABORTED_WITHIN)
        r = await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2})
        assert r.status_code == 200
    assert srv.app.state.admission.in_use == 0
    srv.shutdown.set()


async def test_an_api_key_is_required(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, api_keys=("key-one",))
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized"
        r = await client.post(
            "/v1/responses", json={"input": "Hi", "max_output_tokens": 2}, headers={"Authorization": "Bearer nope"}
        )
        assert r.status_code == 401
        r = await client.post(
            "/v1/responses", json={"input": "Hi", "max_output_tokens": 2}, headers={"Authorization": "Bearer key-one"}
        )
        assert r.status_code == 200
    assert srv.engine.in_flight == 0
    srv.shutdown.set()


BAD = [
    ({"max_output_tokens": 2}, "Bad Request", "body.input"),
    ({"input": 5}, "Bad Request", "body.input"),
    ({"input": []}, "BadRequestError", None),
    ({"input": [{"type": "bogus"}]}, "Bad Request", "body.input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "Bad Request", "body.input"),
    ({"input": "Hi", "tool_choice": "required"}, "BadRequestError", "tool_choice"),
    ({"input": "Hi", "tools": [{"type": "web_search_preview"}]}, "BadRequestError", "tools"),
    ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "Bad Request", "body.text.format.ResponseFormatText.type"),
    ({"input": "Hi", "max_output_tokens": 0}, "BadRequestError", "max_tokens"),
    ({"input": "Hi", "temperature": 9}, "BadRequestError", "temperature"),
    ({"input": "Hi", "background": True}, "invalid_request_error", "background"),
    ({"input": "Hi", "prompt": {"id": "x"}}, "BadRequestError", "prompt"),
    ({"input": "Hi", "reasoning": {"effort": 3}}, "Bad Request", "body.reasoning.effort"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}, "BadRequestError", "input"),
]


@pytest.mark.parametrize(("body", "type_", "param"), BAD, ids=lambda v: json.dumps(v)[:50])
async def test_bad_input_is_a_4xx(
    nursery: trio.Nursery, body: dict[str, object], type_: str, param: str | None
) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == (type_, param)
    assert srv.engine.in_flight == 0 and srv.app.state.admission.in_use == 0
    srv.shutdown.set()


async def test_unknown_previous_response_is_404(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post("/v1/responses", json={"input": "Hi", "previous_response_id": "resp_x"})
    assert r.status_code == 404
    assert (r.json()["error"]["type"], r.json()["error"]["param"]) == ("invalid_request_error", "response_id")
    srv.shutdown.set()
