"""``GET /load`` and ``GET /get_load`` through real hypercorn: what the figure counts and when it falls.

The scripted engine is slow enough here (``token_delay``) that requests are caught open, and
``max_in_flight=1`` makes all but one of them wait in admission's queue, which must count too.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import trio

from tests.helpers import parse_sse, start_server

LONG = {"max_tokens": 2000, "ignore_eos": True}
SHORT = {"max_tokens": 20, "ignore_eos": True}


async def _loads(client: httpx.AsyncClient) -> tuple[int, int]:
    a, b = await client.get("/load"), await client.get("/get_load")
    assert (a.status_code, b.status_code) == (200, 200)
    assert a.headers["content-type"] == b.headers["content-type"] == "application/json"
    return a.json()["server_load"], b.json()["load"]


async def _until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` (admission's counters change with no event to wait on)."""
    for _ in range(int(within / 0.005)):
        if predicate():
            return
        await trio.sleep(0.005)
    raise AssertionError(f"not within {within} s")


async def test_load_counts_running_and_queued_requests_until_answered(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01, server_load_tracking=True, max_in_flight=1)
    admission = srv.app.state.admission
    done: list[int] = []
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        assert await _loads(client) == (0, 0)

        async def one(body: dict[str, object]) -> None:
            r = await client.post("/v1/completions", json=body)
            done.append(r.status_code)

        # One chat, two completions, one of them a batch: three requests, whatever their prompts.
        nursery.start_soon(one, {"prompt": "a", **SHORT})
        nursery.start_soon(one, {"prompt": ["b", "c"], **SHORT})
        nursery.start_soon(one, {"prompt": "d", **SHORT})
        await _until(lambda: admission.in_use == 1 and admission.queued == 2)
        assert await _loads(client) == (3, 3)
        await _until(lambda: len(done) == 3)
        assert done == [200, 200, 200]
        assert await _loads(client) == (0, 0)
    srv.shutdown.set()


async def test_load_is_zero_without_the_flag(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        async with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True, **LONG}) as r:
            chunks = r.aiter_raw()  # kept: closing the iterator would close the response
            await chunks.__anext__()
            assert srv.engine.in_flight == 1
            assert await _loads(client) == (0, 0)  # vLLM's answer without --enable-server-load-tracking
    srv.shutdown.set()


async def test_a_stream_counts_until_its_client_hangs_up(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01, server_load_tracking=True)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": True, **LONG},
        ) as r:
            chunks = r.aiter_raw()
            await chunks.__anext__()
            assert await _loads(client) == (1, 1)
            await chunks.__anext__()
            assert srv.engine.in_flight == 1 and await _loads(client) == (1, 1)
        # leaving the block closes the connection mid-stream: the run aborts and the count falls
        await srv.wait_idle(2.0)
        for _ in range(200):  # the count falls when the app's call for the request returns
            if await _loads(client) == (0, 0):
                break
            await trio.sleep(0.01)
        assert await _loads(client) == (0, 0)
    srv.shutdown.set()


async def test_errors_and_utility_routes_leave_no_load(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, server_load_tracking=True)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        bad = await client.post("/v1/completions", json={"prompt": "x", "n": 0})
        assert bad.status_code == 400
        assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 200
        assert (await client.get("/v1/completions")).status_code == 405
        ok = await client.post("/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 3})
        assert parse_sse(ok.content).count("[DONE]") == 1
        assert await _loads(client) == (0, 0)
    srv.shutdown.set()


async def test_openapi_documents_both_routes(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
    assert set(paths["/load"]) == set(paths["/get_load"]) == {"get"}
    srv.shutdown.set()
