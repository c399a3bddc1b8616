"""``/v1/messages`` through real hypercorn on the scripted engine: shapes, x-api-key, errors in
Anthropic's shape, abort on disconnect, admission."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.anthropic_sse import check_framing, parse_anthropic_sse, rebuild
from tests.helpers import LiveServer, start_server

USER = [{"role": "user", "content": "Hello"}]
# 1500 tokens of script (one a step, 10 ms each on these servers): a client leaves long before
LONG = {"max_tokens": 2000, "messages": [{"role": "user", "content": f"<braid:say>{'x' * 1500}</braid:say>"}]}
KEY = "sk-test"


def body(**fields: object) -> dict[str, object]:
    return {"model": "scripted", "max_tokens": 5, "messages": USER, "temperature": 0} | fields


async def test_a_message_whole_and_streamed(server: LiveServer, client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/messages", json=body(), headers={"X-Request-Id": "abc"})
    assert r.status_code == 200, r.text
    whole = r.json()
    assert whole["id"] == "chatcmpl-abc" and r.headers["X-Request-Id"] == "abc"
    assert (whole["type"], whole["role"], whole["stop_reason"]) == ("message", "assistant", "max_tokens")
    assert [b["type"] for b in whole["content"]] == ["text"] and whole["content"][0]["text"]
    assert whole["usage"]["output_tokens"] == 5 and whole["usage"]["input_tokens"] > 0
    r = await client.post("/v1/messages", json=body(stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_anthropic_sse(r.content)
    check_framing(events)
    assert rebuild(events) == whole["content"]
    start, delta = events[0][1], events[-2][1]
    assert start["message"]["usage"] == {"input_tokens": whole["usage"]["input_tokens"], "output_tokens": 0}
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == whole["usage"]
    assert b"[DONE]" not in r.content


async def test_count_tokens_counts_what_messages_renders(server: LiveServer, client: httpx.AsyncClient) -> None:
    conversation = {"system": [{"type": "text", "text": "Be brief."}], "messages": USER}
    r = await client.post("/v1/messages/count_tokens", json={"model": "scripted", **conversation})
    assert r.status_code == 200, r.text
    counted = r.json()
    whole = (await client.post("/v1/messages", json=body(**conversation))).json()
    assert counted == {
        "input_tokens": whole["usage"]["input_tokens"],
        "context_management": {"original_input_tokens": whole["usage"]["input_tokens"]},
    }
    assert server.gauge("braid_engine_requests_total") == 1  # counting runs nothing


@pytest.mark.parametrize(
    ("path", "sent", "status"),
    [
        ("/v1/messages", {"model": "scripted", "messages": USER}, 400),  # max_tokens is required
        ("/v1/messages", body(max_tokens=0), 400),
        ("/v1/messages", body(max_tokens="5"), 400),
        ("/v1/messages", body(model="nope"), 404),
        ("/v1/messages", body(tool_choice={"type": "tool"}), 400),
        ("/v1/messages", body(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2000), 400),
        ("/v1/messages", body(messages=[{"role": "user", "content": [{"type": "bogus"}]}]), 400),
        ("/v1/messages", body(stream=True, top_k=-5), 400),
        ("/v1/messages/count_tokens", {"model": "scripted"}, 400),
        ("/v1/messages/count_tokens", {"model": "nope", "messages": USER}, 404),
    ],
)
async def test_bad_requests_are_4xx_in_anthropics_shape_before_any_engine_work(
    server: LiveServer, client: httpx.AsyncClient, path: str, sent: dict, status: int
) -> None:
    r = await client.post(path, json=sent)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}, error
    assert server.gauge("braid_engine_requests_total") == 0


async def test_a_disconnect_aborts_the_engine_request(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        async with client.stream("POST", "/v1/messages", json=body(stream=True, **LONG)) as r:
            seen = 0
            async for raw in r.aiter_raw():
                seen += raw.count(b"content_block_delta")
                if seen >= 5:
                    break
            assert srv.engine.in_flight == 1
    await srv.wait_idle(2.0)
    assert srv.engine.aborted_total == 1 and srv.engine.in_flight == 0
    srv.shutdown.set()


async def test_a_client_gone_from_a_whole_answer_aborts_it_too(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/messages", json=body(**LONG))
    await srv.wait_idle(2.0)
    assert srv.engine.aborted_total == 1 and srv.engine.in_flight == 0
    assert srv.app.state.admission.in_use == 0
    srv.shutdown.set()


async def test_admission_refuses_past_the_queue_in_anthropics_shape(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01, max_in_flight=1, max_queued=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        async with client.stream("POST", "/v1/messages", json=body(stream=True, **LONG)) as r:
            async for _ in r.aiter_raw():
                break
            refused = await client.post("/v1/messages", json=body())
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "TooManyRequestsError"
        await srv.wait_idle(2.0)
        assert srv.app.state.admission.in_use == 0
        r2 = await client.post("/v1/messages", json=body())
        assert r2.status_code == 200
    srv.shutdown.set()


async def test_keys_x_api_key_and_anthropics_401(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, api_keys=(KEY,))
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        ok = await client.post("/v1/messages", json=body(), headers={"x-api-key": KEY})
        assert ok.status_code == 200, ok.text
        # on every guarded route, not only Anthropic's
        assert (await client.get("/v1/models", headers={"x-api-key": KEY})).status_code == 200
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong", "x-api-key": KEY}):
            refused = await client.post("/v1/messages", json=body(), headers=headers)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
            assert refused.json() == {
                "type": "error",
                "error": {"type": "Unauthorized", "message": refused.json()["error"]["message"]},
            }
        count = await client.post("/v1/messages/count_tokens", json={"model": "scripted", "messages": USER})
        assert count.status_code == 401 and count.json()["type"] == "error"
        # vLLM's shape elsewhere
        chat = await client.post("/v1/chat/completions", json={"messages": USER})
        assert chat.status_code == 401 and chat.json()["error"]["code"] == 401
    assert srv.engine.finished_total == 1
    srv.shutdown.set()


async def test_anthropics_client_sends_its_key_as_x_api_key(nursery: trio.Nursery) -> None:
    """The ``anthropic`` package itself, with a key: it sends ``x-api-key`` and no Authorization."""
    import anthropic
    from anthropic.types import MessageParam

    hello: list[MessageParam] = [{"role": "user", "content": "Hello"}]
    srv = await start_server(nursery, api_keys=(KEY,))
    client = anthropic.AsyncAnthropic(base_url=srv.url, api_key=KEY, max_retries=0, timeout=10)
    message = await client.messages.create(model="scripted", max_tokens=3, messages=hello)
    assert message.type == "message" and message.usage.output_tokens == 3
    async with client.messages.stream(model="scripted", max_tokens=3, messages=hello) as stream:
        final = await stream.get_final_message()
    assert [b.text for b in final.content] == [b.text for b in message.content]  # type: ignore[union-attr]
    wrong = anthropic.AsyncAnthropic(base_url=srv.url, api_key="wrong", max_retries=0, timeout=10)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await wrong.messages.create(model="scripted", max_tokens=3, messages=hello)
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "Unauthorized"
    srv.shutdown.set()
