"""POST /invocations through real hypercorn: SageMaker's adapter header, not the body, names the model."""

from __future__ import annotations

import httpx

from braid.routes.invocations import ADAPTER_HEADER, adapter_from_header

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_the_body_s_model_is_replaced_by_the_adapter_header(client: httpx.AsyncClient) -> None:
    # no header: model is null, the base model, whatever the body names (as vLLM's SageMaker layer)
    r = await client.post("/invocations", json={**CHAT, "model": "no-such-model"})
    assert r.status_code == 200 and r.json()["model"] == "scripted"
    r = await client.post("/invocations", json={"prompt": "x", "max_tokens": 2, "model": "x"})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    # the header names the model (an adapter); one the server does not serve is the 404
    r = await client.post("/invocations", json=CHAT, headers={ADAPTER_HEADER: "scripted"})
    assert r.status_code == 200
    r = await client.post("/invocations", json={**CHAT, "model": "scripted"}, headers={ADAPTER_HEADER: "nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    # the rewrite leaves what is not a JSON object to be refused as it is
    r = await client.post("/invocations", content=b'{"prompt": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("JSON decode error")


NONE: dict[str, str] = {}


def test_the_rewrite() -> None:
    assert adapter_from_header(b'{"model": "a", "prompt": "x"}', {ADAPTER_HEADER: "b"}.get) == (
        b'{"model":"b","prompt":"x"}'
    )
    assert adapter_from_header(b'{"prompt": "x"}', NONE.get) == b'{"prompt":"x","model":null}'
    assert adapter_from_header(b"[1]", NONE.get) == b"[1]"
    assert adapter_from_header(b"{", NONE.get) == b"{"
