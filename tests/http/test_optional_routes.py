"""GET /tokenizer_info (--enable-tokenizer-info-endpoint) and GET /version through real hypercorn."""

from __future__ import annotations

import httpx
import trio

import braid
from braid.settings import ServingOptions
from tests.helpers import start_server


async def test_tokenizer_info_is_a_404_without_the_option(client: httpx.AsyncClient) -> None:
    r = await client.get("/tokenizer_info")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    assert "/tokenizer_info" not in (await client.get("/openapi.json")).json()["paths"]


async def test_tokenizer_info_with_the_option(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, serving=ServingOptions(tokenizer_info_endpoint=True))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        for _ in range(2):  # built once, then the same
            r = await c.get("/tokenizer_info")
            # the scripted engine's tokenizer as vLLM's parsers read it: no tokenizer_config.json
            assert r.status_code == 200 and r.json() == {"tokenizer_class": "HfView"}
        assert "/tokenizer_info" in (await c.get("/openapi.json")).json()["paths"]
        assert (await c.post("/tokenizer_info")).status_code == 405
    server.shutdown.set()


async def test_version_is_braids_on_an_engine_that_is_not_vllm(client: httpx.AsyncClient) -> None:
    r = await client.get("/version")
    assert r.json() == {"version": braid.__version__, "braid_version": braid.__version__}
