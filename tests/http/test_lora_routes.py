"""``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` through real hypercorn, on the scripted
engine (it takes any folder with an ``adapter_config.json``): the gate, vLLM's bodies, statuses
and error types, what a load or an unload changes for requests, and an unload under a running
stream. The same routes on vLLM's engine, against vLLM's own server: tests/parity/test_lora_parity.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from braid.engine.adapters import AdapterRegistry
from braid.engine.base import LoraAdapter
from braid.engine.scripted import ScriptedEngine
from tests.helpers import LiveServer, parse_sse, start_server

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def _adapter(root: Path, name: str) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    return str(folder)


def _error(r: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"]) == (type_, status), error
    return dict(error)


async def _models(client: httpx.AsyncClient) -> list[tuple[str, str | None, str]]:
    return [(c["id"], c["parent"], c["root"]) for c in (await client.get("/v1/models")).json()["data"]]


async def _complete(client: httpx.AsyncClient, model: str) -> httpx.Response:
    return await client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3})


@pytest.fixture
async def lora_server(nursery: trio.Nursery) -> LiveServer:
    return await start_server(nursery, token_delay=0.001, runtime_lora_updating=True)


async def test_without_the_gate_the_routes_are_404s_and_undocumented(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        for path in (LOAD, UNLOAD):
            r = await client.post(path, json={"lora_name": "a", "lora_path": "/x"})
            _error(r, 404, "Not Found")
        paths = (await client.get("/openapi.json")).json()["paths"]
    assert LOAD not in paths and UNLOAD not in paths


async def test_a_loaded_adapter_is_listed_selectable_and_gone_after_unload(
    lora_server: LiveServer, tmp_path: Path
) -> None:
    path = _adapter(tmp_path, "a")
    async with httpx.AsyncClient(base_url=lora_server.url, timeout=30) as client:
        assert LOAD in (await client.get("/openapi.json")).json()["paths"]
        r = await client.post(LOAD, json={"lora_name": "tuned", "lora_path": path})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'tuned' added successfully.")
        assert await _models(client) == [("scripted", None, "braid/scripted"), ("tuned", "scripted", path)]
        r = await _complete(client, "tuned")
        assert r.status_code == 200 and r.json()["model"] == "tuned"
        tokenized = await client.post("/tokenize", json={"model": "tuned", "prompt": "hi"})
        assert tokenized.status_code == 200
        r = await client.post(UNLOAD, json={"lora_name": "tuned"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'tuned' removed successfully.")
        assert await _models(client) == [("scripted", None, "braid/scripted")]
        error = _error(await _complete(client, "tuned"), 404, "NotFoundError")
        assert error["param"] == "model"
        assert (await _complete(client, "scripted")).status_code == 200
    ((loaded, inplace),) = lora_server.engine.loras
    assert loaded == LoraAdapter("tuned", 1, path, "scripted") and not inplace


async def test_vllms_refusals(lora_server: LiveServer, tmp_path: Path) -> None:
    path = _adapter(tmp_path, "a")
    async with httpx.AsyncClient(base_url=lora_server.url, timeout=30) as client:
        assert (await client.post(LOAD, json={"lora_name": "a", "lora_path": path})).status_code == 200
        again = _error(await client.post(LOAD, json={"lora_name": "a", "lora_path": path}), 400, "InvalidUserInput")
        assert "has already been loaded" in again["message"] and again["param"] is None
        base = _error(
            await client.post(LOAD, json={"lora_name": "scripted", "lora_path": path}), 400, "InvalidUserInput"
        )
        assert "conflicts with a served base model" in base["message"]
        empty = _error(await client.post(LOAD, json={"lora_name": "", "lora_path": path}), 400, "InvalidUserInput")
        assert empty["message"] == "Both 'lora_name' and 'lora_path' must be provided."
        missing = _error(
            await client.post(LOAD, json={"lora_name": "b", "lora_path": "/no/such"}), 404, "NotFoundError"
        )
        assert missing["message"] == "Loading lora b failed: No adapter found for /no/such"
        schema = _error(await client.post(LOAD, json={"lora_name": "b"}), 400, "Bad Request")
        assert schema["param"] == "body.lora_path"
        wrong = await client.post(
            LOAD, content=b'{"lora_name": "b", "lora_path": "/x"}', headers={"content-type": "text/plain"}
        )
        _error(wrong, 400, "Bad Request")
        unknown = _error(await client.post(UNLOAD, json={"lora_name": "b"}), 404, "NotFoundError")
        assert unknown["message"] == "The lora adapter 'b' cannot be found."
        _error(await client.post(UNLOAD, json={"lora_name": ""}), 400, "InvalidUserInput")
        _error(await client.post(UNLOAD, json={}), 400, "Bad Request")
        # none of those changed what is served
        assert [m[0] for m in await _models(client)] == ["scripted", "a"]


async def test_in_place_keeps_the_id_and_a_name_loaded_again_gets_a_new_one(
    lora_server: LiveServer, tmp_path: Path
) -> None:
    first, second = _adapter(tmp_path, "a"), _adapter(tmp_path, "b")
    async with httpx.AsyncClient(base_url=lora_server.url, timeout=30) as client:
        for body in (
            {"lora_name": "x", "lora_path": first},
            {"lora_name": "y", "lora_path": first},
            {"lora_name": "x", "lora_path": second, "load_inplace": True},
        ):
            assert (await client.post(LOAD, json=body)).status_code == 200, body
        assert await _models(client) == [
            ("scripted", None, "braid/scripted"),
            ("x", "scripted", second),  # reloaded in its place, from its new path
            ("y", "scripted", first),
        ]
        assert (await client.post(UNLOAD, json={"lora_name": "x"})).status_code == 200
        assert (await client.post(LOAD, json={"lora_name": "x", "lora_path": first})).status_code == 200
    ids = [(a.name, a.id, inplace) for a, inplace in lora_server.engine.loras]
    assert ids == [("x", 1, False), ("y", 2, False), ("x", 1, True), ("x", 3, False)]


async def test_the_routes_need_the_api_key(nursery: trio.Nursery, tmp_path: Path) -> None:
    srv = await start_server(nursery, runtime_lora_updating=True, api_keys=("k",))
    body = {"lora_name": "a", "lora_path": _adapter(tmp_path, "a")}
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        for path in (LOAD, UNLOAD):
            _error(await client.post(path, json=body), 401, "Unauthorized")
        assert srv.engine.loras == []
        auth = {"Authorization": "Bearer k"}
        assert (await client.post(LOAD, json=body, headers=auth)).status_code == 200
        assert (await client.post(UNLOAD, json=body, headers=auth)).status_code == 200


async def test_an_unload_under_a_running_stream_leaves_it_whole(lora_server: LiveServer, tmp_path: Path) -> None:
    """The stream began with the adapter; it ends as it would have, and nothing is aborted."""
    path = _adapter(tmp_path, "a")
    body = {"model": "a", "prompt": "hi", "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
    engine = lora_server.engine
    async with httpx.AsyncClient(base_url=lora_server.url, timeout=30) as client:
        assert (await client.post(LOAD, json={"lora_name": "a", "lora_path": path})).status_code == 200
        whole = (await client.post("/v1/completions", json={**body, "stream": False})).json()
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = r.aiter_raw()
            raw = await chunks.__anext__()
            assert engine.in_flight == 1
            assert (await client.post(UNLOAD, json={"lora_name": "a"})).status_code == 200
            _error(await _complete(client, "a"), 404, "NotFoundError")
            raw += b"".join([c async for c in chunks])
    events = parse_sse(raw)
    assert events[-1] == "[DONE]" and {e["model"] for e in events[:-1]} == {"a"}
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert text == whole["choices"][0]["text"] and len(text) == 200
    await engine.wait_until(lambda: engine.in_flight == 0)
    assert engine.aborted_ids == [] and engine.failed_ids == []


async def test_the_registry_is_bounded_and_two_loads_of_one_name_take_one(tmp_path: Path) -> None:
    engine = ScriptedEngine()
    registry = AdapterRegistry(engine, limit=2)
    path = _adapter(tmp_path, "a")
    outcomes: list[str] = []

    async def load(name: str) -> None:
        try:
            outcomes.append(await registry.load(name, path))
        except Exception as exc:  # noqa: BLE001 - the refusal is the outcome
            outcomes.append(type(exc).__name__)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load, "a")
        nursery.start_soon(load, "a")
    assert sorted(outcomes) == ["InvalidUserInput", "Success: LoRA adapter 'a' added successfully."]
    await registry.load("b", path)
    with pytest.raises(Exception, match="2 LoRA adapters are served"):
        await registry.load("c", path)
    await registry.load("b", path, inplace=True)  # a served name may still be reloaded
    registry.unload("a")
    await registry.load("c", path)
    assert [(a.name, a.id) for a in engine.info.adapters] == [("b", 2), ("c", 3)]
