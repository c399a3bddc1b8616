"""braid's two ways of driving vLLM give the same answers: the engine-core client on the Trio
thread (the default, the tier's shared server) and AsyncLLM on an asyncio thread
(``--engine-client asyncio``, started here once for this module, with
``--enable-prompt-tokens-details``, which the last test checks; the others compare usage without
the details)."""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import VllmServer, parse_sse
from tools.servers import run_braid

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def asyncio_server(vllm_server: VllmServer) -> Iterator[VllmServer]:
    with run_braid(
        "--fault-hooks",
        "--engine-client",
        "asyncio",
        "--enable-prompt-tokens-details",
        seed=0,
        log=Path("/tmp/braid-vllm-asyncio.log"),
    ) as server:
        yield VllmServer(server)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0


# Greedy: the tier's shared server has served other tests, so its prefix cache differs from the
# fresh one's, and a cached prefix gives slightly different float32 logits. Sampled tokens can
# then differ at temperature 1; greedy ones do not, and logprobs agree to a few decimals.
BATCH = {
    "prompt": ["def main(", "import os\n", "class Foo", "x = 1\n"],
    "max_tokens": 10,
    "temperature": 0,
    "logprobs": 2,
    "echo": True,
    "stop": ["\n\n"],
}


def _post(server: VllmServer, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": server.model, **body}, timeout=60)


def _usage(usage: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def _choices(choices: list[dict[str, object]]) -> dict[int, dict[str, object]]:
    """Per choice index: whole text, tokens, finish reason, and the logprobs (compared approximately)."""
    out: dict[int, dict[str, object]] = {}
    for c in choices:
        acc = out.setdefault(c["index"], {"text": "", "tokens": [], "lps": [], "finish": None})  # type: ignore[arg-type]
        acc["text"] += c["text"]  # type: ignore[operator]
        lp = c["logprobs"]
        if lp is not None:
            acc["tokens"] += lp["tokens"]  # type: ignore[index, operator]
            acc["lps"] += [0.0 if v is None else v for v in lp["token_logprobs"]]  # type: ignore[index, operator]
        if c["finish_reason"] is not None:
            acc["finish"] = c["finish_reason"]
    return out


def _same(a: dict[int, dict[str, object]], b: dict[int, dict[str, object]]) -> None:
    assert a.keys() == b.keys()
    for i in a:
        assert {k: v for k, v in a[i].items() if k != "lps"} == {k: v for k, v in b[i].items() if k != "lps"}
        assert a[i]["lps"] == pytest.approx(b[i]["lps"], abs=1e-3)


def test_both_clients_answer_a_batch_alike(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    trio_r, asyncio_r = _post(vllm_server, BATCH), _post(asyncio_server, BATCH)
    assert trio_r.status_code == asyncio_r.status_code == 200
    t, a = trio_r.json(), asyncio_r.json()
    assert _usage(t["usage"]) == _usage(a["usage"]) and len(t["choices"]) == 4
    _same(_choices(t["choices"]), _choices(a["choices"]))


def test_both_clients_stream_alike(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    body = {**BATCH, "stream": True, "stream_options": {"include_usage": True}}
    streams = []
    for server in (vllm_server, asyncio_server):
        with httpx.stream(
            "POST", server.url + "/v1/completions", json={"model": server.model, **body}, timeout=60
        ) as r:
            events = parse_sse(r.read())
        assert events[-1] == "[DONE]"
        # How deltas are cut into events depends on timing (a lagging reader gets merged deltas).
        choices = [c for e in events if isinstance(e, dict) for c in e["choices"]]
        usage = [_usage(e["usage"]) for e in events if isinstance(e, dict) and e.get("usage")]
        streams.append((_choices(choices), usage))
    _same(streams[0][0], streams[1][0])
    assert streams[0][1] == streams[1][1] and len(streams[0][0]) == 4


def test_both_clients_fan_out_n2(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    body = {"prompt": ["a", "b"], "n": 2, "max_tokens": 6, "ignore_eos": True, "seed": 3, "logprobs": 1}
    results = []
    for server in (vllm_server, asyncio_server):
        r = _post(server, body)
        assert r.status_code == 200
        j = r.json()
        results.append(
            ([(c["index"], c["finish_reason"], len(c["logprobs"]["tokens"])) for c in j["choices"]], _usage(j["usage"]))
        )
    assert results[0] == results[1]
    assert [i for i, _, _ in results[0][0]] == [0, 1, 2, 3]


def test_the_asyncio_client_aborts_a_failed_batch(asyncio_server: VllmServer) -> None:
    asyncio_server.fail_one_of(6, failing=2)


def test_cached_tokens_are_summed_over_a_batch(asyncio_server: VllmServer) -> None:
    # Token ids, so that nothing else this session sent shares a prefix with them; vLLM's CPU
    # backend caches blocks of 128 tokens, and always computes a prompt's last token.
    rng = random.Random(20261203)
    seen = [rng.randrange(100, 1000) for _ in range(300)]
    fresh = [rng.randrange(100, 1000) for _ in range(200)]
    first = _post(asyncio_server, {"prompt": seen, "max_tokens": 1}).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    batch = {"prompt": [seen, [*seen, 7], fresh], "max_tokens": 1}
    usage = _post(asyncio_server, batch).json()["usage"]
    assert usage["prompt_tokens"] == 300 + 301 + 200
    # 256 + 256 + 0; vLLM's own server reports one prompt's value (256)
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": 512,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }
    with httpx.stream(
        "POST",
        asyncio_server.url + "/v1/completions",
        timeout=60,
        json={
            "model": asyncio_server.model,
            **batch,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        events = parse_sse(r.read())
    # the batch was read once before: now its fresh prompt's first block is cached too
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 512 + 128}  # type: ignore[index]
