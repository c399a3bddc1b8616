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
from typing import Any

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


# Greedy, and compared up to the first near-tie: the two servers are two engines, whose float32
# logits may differ in the last bits (another batch split, the shared server's prefix cache), so a
# token whose best alternative is within NEAR_TIE of it may go either way on another machine.
# Before that point both must give the same tokens and logprobs within 1e-3; after it only the
# shape is compared (docs/architecture.md, "What a test of the real engine may assume").
BATCH = {
    "prompt": ["def main(", "import os\n", "class Foo", "x = 1\n"],
    "max_tokens": 10,
    "temperature": 0,
    "logprobs": 2,
    "echo": True,
    "stop": ["\n\n"],
}


NEAR_TIE = 0.05
"""Nats between a token's logprob and its best alternative's under which it may flip."""


def _post(server: VllmServer, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": server.model, **body}, timeout=60)


def _usage(usage: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def _choices(choices: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per choice index: whole text, tokens, their logprobs and margins, the finish reason."""
    out: dict[int, dict[str, Any]] = {}
    for c in choices:
        acc = out.setdefault(c["index"], {"text": "", "tokens": [], "lps": [], "margins": [], "finish": None})
        acc["text"] += c["text"]
        lp = c["logprobs"]
        if lp is not None:
            acc["tokens"] += lp["tokens"]
            for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
                acc["lps"].append(0.0 if value is None else value)
                others = [v for t, v in (top or {}).items() if t != token]
                acc["margins"].append(abs(value - max(others)) if value is not None and others else float("inf"))
        if c["finish_reason"] is not None:
            acc["finish"] = c["finish_reason"]
    return out


def _prompt_lengths(server: VllmServer) -> list[int]:
    """Tokens of each prompt of BATCH (echoed first in each choice: given, so never a tie)."""
    return [
        httpx.post(server.url + "/tokenize", json={"model": server.model, "prompt": p}, timeout=60).json()["count"]
        for p in BATCH["prompt"]  # type: ignore[attr-defined]
    ]


def _same(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], prompt_lengths: list[int]) -> bool:
    """The same answers up to each choice's first near-tie on either side (see NEAR_TIE);
    whether every choice was compared whole (no near-tie anywhere)."""
    assert a.keys() == b.keys()
    whole = True
    for i in a:
        x, y, start = a[i], b[i], prompt_lengths[i]
        ties = [k for k, m in enumerate(x["margins"]) if k >= start and m < NEAR_TIE]
        ties += [k for k, m in enumerate(y["margins"]) if k >= start and m < NEAR_TIE]
        n = min([*ties, len(x["tokens"]), len(y["tokens"])])  # the tied token itself may differ
        assert x["tokens"][:n] == y["tokens"][:n], i
        assert x["lps"][:n] == pytest.approx(y["lps"][:n], abs=1e-3), i
        if ties:
            whole = False
        else:
            assert (x["text"], x["tokens"], x["finish"]) == (y["text"], y["tokens"], y["finish"]), i
        assert x["finish"] in ("stop", "length") and y["finish"] in ("stop", "length")
    return whole


def test_both_clients_answer_a_batch_alike(vllm_server: VllmServer, asyncio_server: VllmServer) -> None:
    trio_r, asyncio_r = _post(vllm_server, BATCH), _post(asyncio_server, BATCH)
    assert trio_r.status_code == asyncio_r.status_code == 200
    t, a = trio_r.json(), asyncio_r.json()
    assert len(t["choices"]) == 4
    if _same(_choices(t["choices"]), _choices(a["choices"]), _prompt_lengths(vllm_server)):
        assert _usage(t["usage"]) == _usage(a["usage"])
    else:
        assert t["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"]


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
    if _same(streams[0][0], streams[1][0], _prompt_lengths(vllm_server)):
        assert streams[0][1] == streams[1][1]
    else:
        assert streams[0][1][0]["prompt_tokens"] == streams[1][1][0]["prompt_tokens"]
    assert len(streams[0][0]) == 4


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
