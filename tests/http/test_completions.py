"""/v1/completions through real hypercorn: batches, JSON and SSE, echo/logprobs, bad input."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import LiveServer, RecordingTokenizer, big_batch, parse_sse, start_server

pytestmark = pytest.mark.usefixtures("server")


async def test_batch_json_returns_choices_in_prompt_order_with_summed_usage(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    prompts = ["Hello", "World"]
    body = {"model": "scripted", "prompt": prompts, "max_tokens": 4, "temperature": 0}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert [c["index"] for c in data["choices"]] == [0, 1]
    prompt_tokens = sum(len(server.engine.tokenizer.encode(p)) for p in prompts)
    # Scripted tokens are one character each; a "stop" here is EOS, one token with no text.
    completion_tokens = sum(len(c["text"]) + (c["finish_reason"] == "stop") for c in data["choices"])
    assert data["usage"] == {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert all(c["finish_reason"] in {"stop", "length"} for c in data["choices"])
    assert all(c["routed_experts"] is None for c in data["choices"])
    assert (data["kv_transfer_params"], data["ec_transfer_params"], data["metrics"]) == (None, None, None)


async def test_batch_stream_indices_one_usage_chunk_one_done(client: httpx.AsyncClient) -> None:
    body = {
        "prompt": ["Hello", "World"],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        raw = await r.aread()
    events = parse_sse(raw)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    usage_events = [e for e in events if isinstance(e, dict) and e.get("usage")]
    assert len(usage_events) == 1 and usage_events[0]["choices"] == [] and events[-2] is usage_events[0]
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    assert all(len(e["choices"]) == 1 for e in chunks)
    assert {e["choices"][0]["index"] for e in chunks} == {0, 1}
    for i in (0, 1):
        reasons = [e["choices"][0]["finish_reason"] for e in chunks if e["choices"][0]["index"] == i]
        assert reasons[-1] is not None and all(x is None for x in reasons[:-1])
    # the same request without streaming gives the same texts (the scripted engine is deterministic)
    body.pop("stream_options")
    body["stream"] = False
    whole = (await client.post("/v1/completions", json=body)).json()
    for c in whole["choices"]:
        streamed = "".join(e["choices"][0]["text"] for e in chunks if e["choices"][0]["index"] == c["index"])
        assert streamed == c["text"]
    assert usage_events[0]["usage"] == {
        k: whole["usage"][k] for k in ("prompt_tokens", "total_tokens", "completion_tokens")
    }


async def test_n_and_token_id_batches_use_global_indices(client: httpx.AsyncClient) -> None:
    body = {"prompt": [[5, 6, 7], [8], [9, 10]], "n": 3, "max_tokens": 3, "seed": 7, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(await r.aread())
    indices = {e["choices"][0]["index"] for e in events if isinstance(e, dict) and e["choices"]}
    assert indices == set(range(9))
    assert "usage" not in events[-2]  # no usage chunk unless asked


async def test_echo_logprobs_single_token_prompt(client: httpx.AsyncClient) -> None:
    body = {"prompt": [[72]], "echo": True, "logprobs": 2, "max_tokens": 2, "ignore_eos": True}
    c = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    lp = c["logprobs"]
    assert c["text"].startswith("E")  # id 72 is the byte 69, "E"
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == 3  # the unscored prompt token + 2 generated
    assert all(1 <= len(t) <= 3 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:j]) for j in range(3)]
    assert c["prompt_logprobs"][0] is None and len(c["prompt_logprobs"]) == 1


async def test_streamed_echo_offsets_match_non_streamed(client: httpx.AsyncClient) -> None:
    body = {"prompt": ["abc", "de"], "echo": True, "logprobs": 1, "max_tokens": 5, "seed": 3}
    whole = (await client.post("/v1/completions", json=body)).json()
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = parse_sse(await r.aread())
    for c in whole["choices"]:
        parts = [
            e["choices"][0]
            for e in events
            if isinstance(e, dict) and e["choices"] and e["choices"][0]["index"] == c["index"]
        ]
        assert "".join(p["text"] for p in parts) == c["text"]
        assert [o for p in parts for o in p["logprobs"]["text_offset"]] == c["logprobs"]["text_offset"]
        assert [t for p in parts for t in p["logprobs"]["tokens"]] == c["logprobs"]["tokens"]


BRE, SCHEMA = "BadRequestError", "Bad Request"  # vLLM's two error types for a 400

# (body, type, param): vLLM 0.32's answer to each. The scripted model's context is 2048 tokens
# and a text prompt gets a BOS token, so "x" * 2047 fills it exactly.
BAD_BODIES = [
    ({"prompt": []}, BRE, None),
    ({"prompt": ""}, BRE, "prompt"),
    ({"prompt": None}, BRE, "prompt"),
    ({}, BRE, "prompt"),
    ({"prompt": [[]]}, BRE, None),
    ({"prompt": [1, "a"]}, SCHEMA, "body.prompt.1"),
    ({"prompt": [[1], "a"]}, SCHEMA, "body.prompt.0"),
    ({"prompt": [["a"]]}, SCHEMA, "body.prompt.0"),
    ({"prompt": {"x": 1}}, SCHEMA, "body.prompt"),
    ({"prompt": 3}, SCHEMA, "body.prompt"),
    ({"prompt": [1, 2.0]}, SCHEMA, "body.prompt.1"),
    ({"prompt": [[1], [True]]}, SCHEMA, "body.prompt.0"),
    ({"prompt": [-1]}, SCHEMA, "body.prompt.0"),
    ({"prompt": [7, 8, -1]}, SCHEMA, "body.prompt.2"),
    ({"prompt": [999999]}, BRE, None),
    ({"prompt": ["x"] * 1025}, BRE, "prompt"),
    ({"prompt": "x", "suffix": "y"}, BRE, "suffix"),
    ({"prompt": "x", "n": 2, "temperature": 0}, BRE, None),
    ({"prompt": "x", "n": 0}, BRE, None),
    ({"prompt": "x", "max_tokens": 0}, BRE, "max_tokens"),
    ({"prompt": "x", "max_tokens": 100000}, BRE, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**12}, BRE, "max_tokens"),  # absurd: vLLM's own 400, not a clamp
    ({"prompt": "x", "max_tokens": 2**70}, BRE, "max_tokens"),  # beyond what the engine's transport carries
    ({"prompt": "x", "logit_bias": {str(i): 1.0 for i in range(1025)}}, BRE, "logit_bias"),
    ({"prompt": "x" * 3000}, BRE, "input_tokens"),
    ({"prompt": "x" * 2048, "max_tokens": 1}, BRE, "input_tokens"),  # 2049 tokens
    ({"prompt": "x" * 2047}, BRE, "max_tokens"),  # 2048 tokens: no room for one output token
    ({"prompt": [[5] * 2048], "max_tokens": 1}, BRE, "max_tokens"),
    ({"prompt": "x" * 2047, "echo": True, "max_tokens": 0}, BRE, None),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, BRE, "stream_options"),
    ({"prompt": "x", "logprobs": 21}, BRE, "logprobs"),
    ({"prompt": "x", "n": 2.0}, SCHEMA, "body.n"),
    ({"prompt": "x", "n": "two"}, SCHEMA, "body.n"),
    ({"prompt": "x", "temperature": "hot"}, SCHEMA, "body.temperature"),
    ({"prompt": "x", "stream_options": {"include_usage": "yes"}}, SCHEMA, "body.stream_options.include_usage"),
    ({"prompt": "x", "stop_token_ids": [1, "a"]}, SCHEMA, "body.stop_token_ids.1"),
    ({"prompt": "x", "stop": [""]}, BRE, None),
    ({"prompt": "x", "stream": True, "prompt_logprobs": 1}, BRE, "prompt_logprobs"),
]


@pytest.mark.parametrize(("body", "type_", "param"), BAD_BODIES, ids=lambda v: repr(v)[:40])
async def test_bad_input_is_a_400_in_vllm_error_shape(
    client: httpx.AsyncClient, server: LiveServer, body: dict, type_: str, param: str | None
) -> None:
    for stream in (False, True):
        r = await client.post(
            "/v1/completions", json={**body, "stream": stream} if stream and "stream_options" not in body else body
        )
        assert r.status_code == 400, r.text
        assert r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert list(err) == ["message", "type", "param", "code"]
        assert (err["code"], err["type"], err["param"]) == (400, type_, param)
        assert err["message"]
    assert server.engine.finished_total == 0 and server.engine.in_flight == 0  # no engine work was started


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b'{"prompt": ', "body.11"),
        (b'{"prompt": "x",}', "body.15"),
        (b"nope", "body.0"),
        (b"[1, 2]", "body"),
        (b'"x"', "body"),
    ],
)
async def test_malformed_json_is_a_schema_error_at_vllms_location(
    client: httpx.AsyncClient, content: bytes, param: str
) -> None:
    r = await client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == (400, SCHEMA, param)


@pytest.mark.parametrize("headers", [{"content-type": "text/plain"}, {}], ids=["text-plain", "none"])
async def test_a_body_that_is_not_declared_json_is_refused(client: httpx.AsyncClient, headers: dict) -> None:
    r = await client.post("/v1/completions", content=b'{"prompt": "x"}', headers=headers)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["error"] == {
        "message": "Unsupported Media Type: Only 'application/json' is allowed",
        "type": SCHEMA,
        "param": None,
        "code": 400,
    }


async def test_a_prompt_that_leaves_less_room_than_max_tokens_stops_at_the_context(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    """vLLM 0.32 shrinks max_tokens to what the context leaves: 2045 prompt tokens of 2048 and
    max_tokens 16 give 3 tokens and finish "length"; the other prompt keeps its 16."""
    body = {"prompt": ["x" * 2044, "short"], "max_tokens": 16, "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    # scripted tokens are one character each, and with ignore_eos none is EOS
    assert [(c["index"], len(c["text"]), c["finish_reason"]) for c in data["choices"]] == [
        (0, 3, "length"),
        (1, 16, "length"),
    ]
    assert data["usage"]["prompt_tokens"] == 2045 + 6
    assert data["usage"]["completion_tokens"] == 3 + 16
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True, "return_token_ids": True}) as r:
        assert r.status_code == 200
        events = parse_sse(await r.aread())
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
    for index, tokens in ((0, 3), (1, 16)):
        parts = [c for c in chunks if c["index"] == index]
        assert sum(len(c["token_ids"]) for c in parts) == tokens
        assert [c["finish_reason"] for c in parts] == [None] * (len(parts) - 1) + ["length"]
        assert (
            "".join(c["text"] for c in parts) == data["choices"][index]["text"]
        )  # the scripted engine is deterministic
    assert server.engine.finished_total == 4 and server.engine.in_flight == 0


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model `nope` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


async def test_unknown_route_and_method_are_json(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = await client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("GET", "/v1/completions", "OPTIONS, POST"), ("TRACE", "/health", "GET, HEAD, OPTIONS")],
)
async def test_a_405_says_which_methods_are_allowed(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    # found by schemathesis (tests/http/test_schemathesis.py): the 405 had no Allow header
    r = await client.request(method, path)
    assert r.status_code == 405 and r.headers["content-type"] == "application/json"
    assert set(r.headers["allow"].split(", ")) == set(allow.split(", "))


async def test_late_engine_rejection(client: httpx.AsyncClient, server: LiveServer) -> None:
    body = {"prompt": ["fine", "braid:invalid", "also fine"], "max_tokens": 50, "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200  # committed before the engine looked at the prompt
        events = parse_sse(await r.aread())
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert events[-2]["error"]["code"] == 400 and events[-2]["error"]["param"] == "prompt"
    await server.wait_idle(0.25)


async def test_models_health_version_metrics(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == "scripted" and card["max_model_len"] == 2048 and card["root"]
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/version")).json()["version"]
    await client.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
    text = (await client.get("/metrics")).text
    assert "braid_engine_requests_in_flight 0.0" in text
    for cause in ("disconnect", "error", "stall", "timeout", "drain", "queue"):
        assert f'braid_engine_aborts_total{{cause="{cause}"}} 0.0' in text
    # non-streaming: every engine request finished, none timed token by token
    assert "braid_e2e_request_latency_seconds_count 3.0" in text
    assert "braid_time_to_first_token_seconds_count 0.0" in text
    assert "braid_engine_requests_total 3.0" in text


async def test_requests_sharing_a_client_id_get_distinct_engine_ids(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    """The response id may be the client's own; the ids a batch abort names must not be shared."""
    body = {"prompt": ["a", "b"], "max_tokens": 2000, "ignore_eos": True, "stream": True}
    headers = {"X-Request-Id": "same"}
    for _ in range(2):
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    assert '"id":"cmpl-same"' in line.replace(" ", "")
                    break
        await server.wait_idle(within=5)  # the disconnect aborted this stream's batch
    first, second = server.engine.batch_aborts[-2:]
    assert len(first) == len(second) == 2
    assert all(i.startswith("cmpl-same-") for i in first + second)
    assert not set(first) & set(second)


async def test_a_large_text_batch_is_tokenized_off_the_trio_thread(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    tok = RecordingTokenizer()
    server.engine.tokenizer = tok
    prompts = big_batch(32)
    body = {"prompt": prompts, "max_tokens": 1, "echo": True, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(await r.aread())
    assert tok.threads == ["many:worker"]  # one batch on a worker thread, nothing inline
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == sum(len(tok.encode(p)) for p in prompts)
    texts: dict[int, str] = {}
    for e in events[:-2]:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert all(texts[i].startswith(p) for i, p in enumerate(prompts))  # each echo is its own prompt


async def test_a_text_over_the_character_bound_is_refused_without_tokenizing(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    tok = RecordingTokenizer()
    server.engine.tokenizer = tok
    bound = server.engine.info.max_model_len * tok.max_chars_per_token
    r = await client.post("/v1/completions", json={"prompt": ["ok", "x" * (bound + 1)], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_text"
    assert tok.threads == []  # neither prompt was tokenized


async def test_enabled_prompt_tokens_details_sum_the_cached_tokens_of_a_batch(nursery) -> None:  # type: ignore[no-untyped-def]
    server = await start_server(nursery, prompt_tokens_details=True)
    seen = "a" * 47  # BOS + 47 = 48 ids: three 16-token blocks
    batch = [seen, "a" * 20 + "b" * 30, "short", seen + "c"]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        first = await c.post("/v1/completions", json={"prompt": seen, "max_tokens": 2})
        assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        whole = await c.post("/v1/completions", json={"prompt": batch, "max_tokens": 2})
        # 32 (the last block holds the last token), 16, 0, 48; vLLM 0.32 reports one prompt's
        assert whole.json()["usage"]["prompt_tokens_details"] == {
            "cached_tokens": 32 + 16 + 0 + 48,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        }
        body = {"prompt": batch, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
        events = parse_sse((await c.post("/v1/completions", json=body)).content)
    # the batch has been read once more: now its second prompt's third block is cached too
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32 + 48 + 0 + 48}  # type: ignore[index]
    server.shutdown.set()


async def test_x_request_id_is_echoed_on_every_answer(client: httpx.AsyncClient) -> None:
    body = {"prompt": "hi", "max_tokens": 2}
    r = await client.post("/v1/completions", json=body, headers={"X-Request-Id": "abc-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-1" and r.json()["id"] == "cmpl-abc-1"
    r = await client.post("/v1/completions", json=body)
    assert r.headers["x-request-id"] == r.json()["id"]
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        first = json.loads((await s.aread()).split(b"\n\n")[0].removeprefix(b"data: "))
        assert s.headers["x-request-id"] == first["id"]
    r = await client.post("/v1/completions", json={**body, "n": 0}, headers={"X-Request-Id": "bad-1"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"


async def test_metrics_count_answers_by_route_and_status(server: LiveServer, client: httpx.AsyncClient) -> None:
    """Every answer is counted, 404s under route "other" (a client cannot add labels); the queue
    wait and the prompts per request are observed once per request."""
    await client.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
    await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "n": 0})
    await client.get("/health")
    await client.get("/no/such/route/1")
    await client.get("/no/such/route/2")
    registry = server.app.state.metrics.registry

    def count(route: str, status: str) -> float:
        return registry.get_sample_value("braid_http_responses_total", {"route": route, "status": status}) or 0.0

    assert count("/v1/completions", "200") == 1 and count("/v1/completions", "400") == 1
    assert count("/health", "200") == 1 and count("other", "404") == 2
    assert registry.get_sample_value("braid_request_prompts_count") == 1
    assert registry.get_sample_value("braid_request_prompts_sum") == 3
    assert registry.get_sample_value("braid_admission_queue_wait_seconds_count") == 1
