"""braid's two ways of driving vLLM give the same answers: the engine-core client on the Trio
thread (the default, the tier's shared server) and AsyncLLM on an asyncio thread
(``--engine-client asyncio``, started here once for this module)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import VllmServer, parse_sse
from tools.servers import run_braid

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def asyncio_server(vllm_server: VllmServer) -> Iterator[VllmServer]:
    with run_braid("--fault-hooks", "--engine-client", "asyncio", seed=0, log=Path("/tmp/braid-vllm-asyncio.log")) as server:
        yield VllmServer(server)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0


BATCH = {"prompt": ["def main(", "import os\n", "class Foo"], "max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 2,
         "logprobs": 2, "echo": True, "stop": ["\n\n"]}


def _post(server: VllmServer, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": server.model, **body}, timeout=60)


def _stable(response: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in response.items() if k not in ("id", "created")}


def test_both_clients_answer_a_batch_identically(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    trio_r, asyncio_r = _post(vllm_server, BATCH), _post(asyncio_server, BATCH)
    assert trio_r.status_code == asyncio_r.status_code == 200
    assert _stable(trio_r.json()) == _stable(asyncio_r.json())
    assert len(trio_r.json()["choices"]) == 6


def test_both_clients_stream_identically(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    body = {**BATCH, "stream": True, "stream_options": {"include_usage": True}}
    streams = []
    for server in (vllm_server, asyncio_server):
        with httpx.stream("POST", server.url + "/v1/completions", json={"model": server.model, **body}, timeout=60) as r:
            events = parse_sse(r.read())
        # How deltas are cut into events depends on timing (a lagging reader gets merged
        # deltas); each choice's whole text, tokens, logprobs and finish reason may not.
        per_choice: dict[int, dict[str, list[object]]] = {}
        for e in events:
            if isinstance(e, dict):
                for c in e["choices"]:
                    acc = per_choice.setdefault(c["index"], {"text": [], "tokens": [], "lps": [], "finish": []})
                    acc["text"].append(c["text"])
                    acc["tokens"] += c["logprobs"]["tokens"]
                    acc["lps"] += c["logprobs"]["token_logprobs"]
                    acc["finish"].append(c["finish_reason"])
        for acc in per_choice.values():
            acc["text"] = ["".join(acc["text"])]  # type: ignore[list-item]
            acc["finish"] = [f for f in acc["finish"] if f is not None]
        usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
        streams.append((per_choice, usage, events[-1]))
    assert streams[0] == streams[1]
    assert streams[0][2] == "[DONE]" and len(streams[0][0]) == 6


def test_the_asyncio_client_aborts_a_failed_batch(asyncio_server: VllmServer) -> None:
    aborts = asyncio_server.metric("braid_engine_aborts_total")
    prompts = [f"y{i} = " for i in range(6)]
    prompts[2] = "fail here braid:fail@3"
    body = {"model": asyncio_server.model, "prompt": prompts, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", asyncio_server.url + "/v1/completions", json=body, timeout=60) as r:
        events = parse_sse(r.read())
    assert events[-1] == "[DONE]" and "error" in events[-2]
    asyncio_server.wait_engine_idle()
    assert asyncio_server.metric("braid_engine_aborts_total") == aborts + 5
