"""``kv_transfer_params`` through real hypercorn on the scripted engine: on chat its
``prompt_token_ids`` are the prompt the engine gets (braid.wire.kv_transfer)."""

from __future__ import annotations

import httpx
import trio

from tests.helpers import parse_sse, start_server

USER = [{"role": "user", "content": "a long question that renders to many more tokens than five"}]
IDS = [104, 105, 33, 10, 65]


async def test_chat_prompt_is_the_forwarded_ids(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        body = {"messages": USER, "max_tokens": 3, "return_token_ids": True}
        rendered = (await client.post("/v1/chat/completions", json=body)).json()
        reused = await client.post(
            "/v1/chat/completions", json={**body, "kv_transfer_params": {"prompt_token_ids": IDS}}
        )
        streamed = await client.post(
            "/v1/chat/completions",
            json={
                **body,
                "stream": True,
                "stream_options": {"include_usage": True},
                "kv_transfer_params": {"prompt_token_ids": IDS},
            },
        )
    assert rendered["usage"]["prompt_tokens"] > len(IDS)
    data = reused.json()
    assert reused.status_code == 200 and data["prompt_token_ids"] == IDS
    assert data["usage"]["prompt_tokens"] == len(IDS) and data["kv_transfer_params"] is None
    events = parse_sse(streamed.content)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["prompt_tokens"] == len(IDS)
    srv.shutdown.set()


async def test_batch_chat_refuses_forwarded_ids(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        r = await client.post(
            "/v1/chat/completions/batch",
            json={"messages": [USER, USER], "kv_transfer_params": {"prompt_token_ids": IDS}},
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "kv_transfer_params.prompt_token_ids"
    srv.shutdown.set()
