"""--enable-request-id-headers (braid.http.request_id) through real hypercorn."""

from __future__ import annotations

import re

import httpx
import trio

from braid.settings import ServingOptions
from tests.helpers import start_server

HEX32 = re.compile(r"[0-9a-f]{32}")
COMPLETION = {"prompt": "hi", "max_tokens": 2}


async def test_every_answer_carries_one_request_id(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, serving=ServingOptions(request_id_headers=True), api_keys=("k",))
    key = {"Authorization": "Bearer k"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        # the client's own, on any route, errors included
        for method, path, headers in (
            ("GET", "/health", {}),
            ("GET", "/v1/models", key),
            ("GET", "/no-such-route", key),
            ("GET", "/v1/models", {}),  # the 401
            ("POST", "/v1/completions", key),
            ("POST", "/tokenize", key),
        ):
            r = await c.request(method, path, headers={**headers, "X-Request-Id": "client-7"}, json=COMPLETION)
            assert r.headers.get_list("x-request-id") == ["client-7"], (method, path, r.status_code)
        # without one: a new id, different each time; a generating route names its response
        ids = set()
        for _ in range(2):
            r = await c.get("/v1/models", headers=key)
            (rid,) = r.headers.get_list("x-request-id")
            assert HEX32.fullmatch(rid)
            ids.add(rid)
        assert len(ids) == 2
        r = await c.post("/v1/completions", headers=key, json=COMPLETION)
        assert r.headers.get_list("x-request-id") == [r.json()["id"]]
        r = await c.post("/v1/completions", headers=key, json={"prompt": []})  # an error
        assert r.status_code == 400 and HEX32.fullmatch(r.headers["x-request-id"])
        async with c.stream("POST", "/v1/completions", headers=key, json={**COMPLETION, "stream": True}) as s:
            assert s.headers["x-request-id"].startswith("cmpl-")
            await s.aread()
    server.shutdown.set()


async def test_without_the_option_only_generating_answers_carry_it(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        assert "x-request-id" not in (await c.get("/v1/models", headers={"X-Request-Id": "a"})).headers
        assert "x-request-id" not in (await c.post("/v1/completions", json={"prompt": []})).headers
        r = await c.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": "a"})
        assert r.headers.get_list("x-request-id") == ["a"]
    server.shutdown.set()
