"""Chat through real hypercorn: both routes, streamed and not, sibling abort, disconnect, admission."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.helpers import LiveServer, parse_sse, start_server

USER = [{"role": "user", "content": "Hello"}]
LONG = {"max_tokens": 2000, "ignore_eos": True}
ABORTED_WITHIN = 2.0


def conversations(count: int, fail: int | None = None) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"c{i}" + (" braid:fail@5" if i == fail else "")}] for i in range(count)]


async def test_one_conversation_streamed_and_not(server: LiveServer, client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 5, "temperature": 0},
        headers={"X-Request-Id": "abc"},
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "abc"
    body = r.json()
    assert body["id"] == "chatcmpl-abc" and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    r = await client.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 5, "temperature": 0, "stream": True},
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.content)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[1:-1]) == choice["message"]["content"]


async def test_the_batch_route_streams_conversations_times_n(server: LiveServer, client: httpx.AsyncClient) -> None:
    body = {"messages": conversations(3), "max_tokens": 4, "n": 2, "temperature": 1, "seed": 3}
    whole = (await client.post("/v1/chat/completions/batch", json=body)).json()
    assert [c["index"] for c in whole["choices"]] == list(range(6))
    r = await client.post(
        "/v1/chat/completions/batch", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = parse_sse(r.content)
    texts: dict[int, str] = {}
    for e in events[:-2]:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["delta"]["content"]
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    usage = {k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert events[-2]["usage"] == usage and events[-2]["choices"] == []


async def test_a_failing_conversation_aborts_its_siblings(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        r = await client.post(
            "/v1/chat/completions/batch", json={"messages": conversations(8, fail=3), "stream": True, **LONG}
        )
        events = parse_sse(r.content)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 500
    await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.failed_total == 1 and srv.engine.aborted_total == 7
    srv.shutdown.set()


async def test_a_disconnect_aborts_every_conversation(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        async with client.stream(
            "POST", "/v1/chat/completions/batch", json={"messages": conversations(16), "stream": True, **LONG}
        ) as r:
            seen = 0
            async for raw in r.aiter_raw():
                seen += raw.count(b"\n\n")
                if seen >= 40:
                    break
            assert srv.engine.in_flight == 16
    await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.aborted_total == 16
    srv.shutdown.set()


async def test_admission_counts_conversations_times_n(nursery: trio.Nursery) -> None:
    """With two slots, three conversations of n=2 run one after another, each taking both slots."""
    srv = await start_server(nursery, token_delay=0.001, max_in_flight=2)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        r = await client.post(
            "/v1/chat/completions/batch",
            json={"messages": conversations(3), "max_tokens": 3, "n": 2, "temperature": 1},
        )
        assert r.status_code == 200 and len(r.json()["choices"]) == 6
        r = await client.post(
            "/v1/chat/completions", json={"messages": USER, "max_tokens": 3, "n": 3, "temperature": 1}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert srv.app.state.admission.in_use == 0
    srv.shutdown.set()


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/v1/chat/completions", {"messages": USER, "model": "nope"}, 404),
        (
            "/v1/chat/completions",
            {"messages": USER, "add_generation_prompt": True, "continue_final_message": True},
            400,
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
        ("/v1/chat/completions", {"messages": USER, "stream": True, "prompt_logprobs": 1}, 400),
        ("/v1/chat/completions/batch", {"messages": [[]]}, 400),
        ("/v1/chat/completions/batch", {"messages": "x"}, 400),
    ],
)
async def test_bad_chat_requests_are_4xx_before_any_engine_work(
    server: LiveServer, client: httpx.AsyncClient, path: str, body: dict, status: int
) -> None:
    r = await client.post(path, json=body)
    assert r.status_code == status and r.json()["error"]["code"] == status
    assert server.gauge("braid_engine_requests_total") == 0
