"""The official openai client against braid serving the real vLLM engine (the default tiny model)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.helpers import VllmServer, parse_sse

pytestmark = pytest.mark.vllm


@pytest.fixture
def client(vllm_server: VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_default_model(vllm_server: VllmServer) -> None:
    card = httpx.get(vllm_server.url + "/v1/models").json()["data"][0]
    assert card["id"] == "braid-tiny" and card["max_model_len"] == 1024
    assert "tiny-llama" in card["root"]


def test_text_batch(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    r = client.completions.create(model=vllm_server.model, prompt=["Hello", "World"], max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.finish_reason in {"length", "stop"} and c.text for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_token_id_batch(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    r = client.completions.create(model=vllm_server.model, prompt=[[100, 200, 300], [400]], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage is not None and r.usage.prompt_tokens == 4  # no BOS is added to token prompts


def test_streaming_with_usage(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    # The stream is checked against itself; against the whole answer only on what braid controls
    # (two greedy requests need not agree: docs/architecture.md, "What a test of the real engine
    # may assume"). ignore_eos fixes each choice's length.
    prompts = ["def main(", "import os\n", "class Foo"]
    whole = client.completions.create(
        model=vllm_server.model, prompt=prompts, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    body = {
        "model": vllm_server.model,
        "prompt": prompts,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", vllm_server.url + "/v1/completions", json=body, timeout=60) as r:
        events = parse_sse(r.read())
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    usage = [e for e in events if isinstance(e, dict) and e.get("usage") and not e["choices"]]
    assert len(usage) == 1 and events[-2] is usage[0]
    assert whole.usage is not None and whole.usage.completion_tokens == 3 * 12
    assert usage[0]["usage"]["prompt_tokens"] == whole.usage.prompt_tokens
    assert usage[0]["usage"]["completion_tokens"] == 3 * 12
    for c in whole.choices:
        parts = [
            e["choices"][0]
            for e in events
            if isinstance(e, dict) and e["choices"] and e["choices"][0]["index"] == c.index
        ]
        assert sum(len(p["logprobs"]["tokens"]) for p in parts) == 12
        assert [p["finish_reason"] for p in parts] == [None] * (len(parts) - 1) + ["length"]
        assert c.finish_reason == "length"


def test_echo_logprobs_single_token_prompt(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    r = client.completions.create(
        model=vllm_server.model, prompt=[[42]], max_tokens=3, echo=True, logprobs=2, temperature=0
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None for x in lp.token_logprobs[1:]) and len(lp.tokens or []) == 4
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])


def test_n2_with_a_batch(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    prompts = ["a = ", "b = "]
    r = client.completions.create(model=vllm_server.model, prompt=prompts, n=2, max_tokens=6, temperature=1.0, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    one = client.completions.create(model=vllm_server.model, prompt=prompts, max_tokens=6, temperature=1.0, seed=3)
    assert r.usage is not None and one.usage is not None
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # once per prompt, not per choice


def test_bad_input_never_reaches_the_engine(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=vllm_server.model, prompt=[[1, 999999]], max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=vllm_server.model, prompt="x" * 5000, max_tokens=3)
    vllm_server.wait_engine_idle()


def test_disconnect_mid_stream_on_16_prompts(vllm_server: VllmServer) -> None:
    body = {
        "model": vllm_server.model,
        "prompt": [f"x{i} = " for i in range(16)],
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    aborts_before = vllm_server.metric("braid_engine_aborts_total")
    with httpx.stream("POST", vllm_server.url + "/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for raw in r.iter_raw():
            seen += raw.count(b"data: ")
            if seen >= 40:
                break
    took = vllm_server.wait_engine_idle()
    assert vllm_server.metric("braid_engine_aborts_total") == aborts_before + 16
    print(f"vLLM: 16-prompt disconnect -> braid and vLLM idle in {took * 1000:.0f} ms")


def test_error_in_one_item_aborts_the_rest(vllm_server: VllmServer) -> None:
    body = vllm_server.fail_one_of(8, failing=5)
    r2 = httpx.post(vllm_server.url + "/v1/completions", json={**body, "stream": False}, timeout=60)
    assert r2.status_code == 500 and r2.json()["error"]["type"] == "InternalServerError"
    vllm_server.wait_engine_idle()


def test_a_failure_aborts_the_batch_while_the_client_reads_nothing(vllm_server: VllmServer) -> None:
    """A 64-prompt stream whose prompt 40 fails at its 20th token (``--fault-hooks``), sent by a
    client that never calls recv: the siblings are aborted, and vLLM's unfinished count is back
    to 0, within 100 ms of the failure (they used to run to max_tokens, and braid held the
    request until the 30 s stall timeout)."""
    import json
    import socket
    from urllib.parse import urlsplit

    errors = vllm_server.metric("braid_engine_errors_total")
    aborts = vllm_server.metric("braid_engine_aborts_total")
    prompts = [f"z{i} = " for i in range(64)]
    prompts[40] = "fail here braid:fail@20"
    body = json.dumps(
        {"model": vllm_server.model, "prompt": prompts, "max_tokens": 200, "ignore_eos": True, "stream": True}
    ).encode()
    url = urlsplit(vllm_server.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((url.hostname, url.port))
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        deadline = time.monotonic() + 20
        while vllm_server.metric("braid_engine_errors_total") == errors:
            assert time.monotonic() < deadline, "the failure was not reported within 20 s"
            time.sleep(0.002)
        took = vllm_server.wait_engine_idle(within=0.1)  # braid's in-flight and vLLM's unfinished
    finally:
        sock.close()
    assert vllm_server.metric("braid_engine_aborts_total") == aborts + 63
    print(f"vLLM: fail@20 behind a stalled client -> idle {took * 1000:.0f} ms after the failure")


def _tiny_hf_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from tools.servers import tiny_model_dir

    return AutoTokenizer.from_pretrained(tiny_model_dir())


TOKENIZE_TEXTS = ["Hello, world!", "", "  two  spaces\n\ttab", "naïve café 東京 🙂", "def f(x):\n    return x * 2\n"]


def test_the_worker_tokenizer_encodes_like_the_trio_threads() -> None:
    from braid.engine.vllm_common import HfTokenizer

    hf = _tiny_hf_tokenizer()
    tok = HfTokenizer(hf, hf.vocab_size)
    assert tok._worker_backend is not None  # the tiny model's fast backend passed the probes
    for special in (True, False):
        assert tok.encode_many(TOKENIZE_TEXTS, add_special_tokens=special) == [
            hf.encode(t, add_special_tokens=special) for t in TOKENIZE_TEXTS
        ]


def test_a_large_text_batch_counts_the_same_prompt_tokens(vllm_server: VllmServer) -> None:
    from braid.stream.tokenize import INLINE_CHARS

    hf = _tiny_hf_tokenizer()
    prompts = [(f"{t} {i} " * 100)[:600] for i, t in enumerate(TOKENIZE_TEXTS * 8)]
    assert sum(map(len, prompts)) > INLINE_CHARS  # so braid tokenizes them on its worker thread
    body = {"model": vllm_server.model, "prompt": prompts, "max_tokens": 1, "echo": True}
    r = httpx.post(vllm_server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["usage"]["prompt_tokens"] == sum(len(hf.encode(p)) for p in prompts)
    assert all(c["text"].startswith(prompts[c["index"]]) for c in data["choices"])


def test_stream_interval_sends_tokens_in_groups(vllm_server: VllmServer) -> None:
    # vLLM's output processor honours the request's stream_interval (clamped up to the engine's):
    # the first token at once, then an output every 4 tokens, the rest with the finish.
    body = {
        "model": vllm_server.model,
        "prompt": "def main(",
        "max_tokens": 10,
        "ignore_eos": True,
        "logprobs": 0,
        "stream": True,
        "stream_interval": 4,
    }
    with httpx.stream("POST", vllm_server.url + "/v1/completions", json=body, timeout=60) as r:
        events = parse_sse(r.read())
    counts = [len(e["choices"][0]["logprobs"]["tokens"]) for e in events if isinstance(e, dict) and e["choices"]]
    assert sum(counts) == 10 and counts[0] == 1, counts
    assert len(counts) <= 4, counts  # one event per token (10) if the field were dropped
    r2 = httpx.post(vllm_server.url + "/v1/completions", json={**body, "stream_interval": 0}, timeout=60)
    assert r2.status_code == 400 and r2.json()["error"]["param"] == "body.stream_interval"
