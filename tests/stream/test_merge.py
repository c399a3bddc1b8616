"""braid.stream.merge: StreamMerger and ResponseCollector, the streamed and non-streamed bodies they
build (texts, finish reasons, usage, [DONE]) and their protocol, fed by the real ScriptedEngine.

Expected values come from the engine's own outputs (tests/helpers.py's Expected), never from
braid's rendering.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid.engine.base import ChoiceDelta, EngineOutput
from braid.engine.scripted import VOCAB_SIZE, ScriptedEngine
from braid.errors import EngineError, InvalidRequest
from braid.routes import completions
from braid.stream.merge import Phase, ProtocolViolation
from braid.stream.plan import Plan, make_plan
from braid.stream.run import Arrival
from braid.wire.completions_request import parse_request
from tests.helpers import (
    LIMITS,
    TOK,
    Expected,
    by_index,
    check_logprobs_entries,
    content_chunks,
    cumulative_offsets,
    generate,
    ids_of,
    make,
    parse_sse,
    run_stream,
    run_whole,
)

CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}


# --- texts and finish reasons, streamed and not ---------------------------------------------------

BODIES = {
    "plain": {"prompt": ["Hello", "World"], "max_tokens": 10},
    "greedy": {"prompt": ["x", "y", "z"], "max_tokens": 12, "temperature": 0},
    "n3": {"prompt": [[10, 11], [12]], "n": 3, "max_tokens": 9},
    "stops": {"prompt": ["abc", "def"], "n": 2, "max_tokens": 20, "stop": ["e", "ab", "q r"], "ignore_eos": True},
    "echo": {"prompt": ["one", "two"], "n": 2, "max_tokens": 5, "echo": True},
    "echo_logprobs": {"prompt": ["one", "two"], "max_tokens": 5, "echo": True, "logprobs": 2},
    "logprobs": {"prompt": ["p", "q"], "n": 2, "max_tokens": 7, "logprobs": 3},
    "token_ids": {"prompt": ["p", "q"], "max_tokens": 7, "return_token_ids": True},
    "echo_zero": {"prompt": ["p", "qq"], "n": 2, "max_tokens": 0, "echo": True, "logprobs": 1},
}


@pytest.mark.parametrize("name", BODIES)
async def test_streamed_texts_concatenate_to_the_non_streaming_texts(name: str) -> None:
    body = BODIES[name]
    plan, per_prompt, events = await run_stream(body, seed=11)
    _, _, whole = await run_whole(body, seed=12)
    exp = Expected(plan, per_prompt)
    chunks = by_index(events)
    assert sorted(chunks) == list(range(plan.num_choices)) == [c["index"] for c in whole["choices"]]
    for c in whole["choices"]:
        parts = chunks[c["index"]]
        assert "".join(p["text"] for p in parts) == c["text"]
        assert (parts[-1]["finish_reason"], parts[-1]["stop_reason"]) == (c["finish_reason"], c["stop_reason"])
        assert (c["finish_reason"], c["stop_reason"]) == exp.finish[c["index"]]
        prefix = plan.items[c["index"] // plan.n].echo_text
        generated = "" if plan.hide_completion else exp.text[c["index"]]
        assert c["text"] == prefix + generated
        if plan.logprobs is not None:
            for key in ("tokens", "token_logprobs", "top_logprobs"):
                assert [x for p in parts for x in p["logprobs"][key]] == c["logprobs"][key]


@pytest.mark.parametrize("name", BODIES)
async def test_exactly_one_finish_reason_per_choice_on_its_last_chunk(name: str) -> None:
    plan, _, events = await run_stream(BODIES[name], seed=4)
    for parts in by_index(events).values():
        reasons = [p["finish_reason"] for p in parts]
        assert reasons[-1] in {"stop", "length"}
        assert reasons[:-1] == [None] * (len(parts) - 1)


async def test_stream_chunk_shape() -> None:
    plan, _, events = await run_stream({"prompt": ["ab", "cd", "ef"], "n": 2, "max_tokens": 8, "temperature": 0.8})
    for e in content_chunks(events):
        assert set(e) == {"id", "object", "created", "model", "choices"}
        assert (e["id"], e["object"], e["created"], e["model"]) == (
            "cmpl-test",
            "text_completion",
            1700000000,
            "scripted",
        )
        assert set(e["choices"][0]) == CHOICE_KEYS  # no routed_experts in a stream
        assert e["choices"][0]["logprobs"] is None and e["choices"][0]["token_ids"] is None
        assert e["choices"][0]["prompt_token_ids"] is None  # no echo, no return_token_ids


async def test_concurrent_prompts_in_true_arrival_order() -> None:
    """Drivers on a trio nursery, as braid runs them; the merger sees the real interleaving."""
    body = {"prompt": [f"p{i}" for i in range(5)], "n": 2, "max_tokens": 6, "ignore_eos": True}
    plan = make(body, stream=True)
    engine = ScriptedEngine()
    merger = completions.merger(plan, TOK)
    send, recv = trio.open_memory_channel[Arrival](0)
    raw = []

    async def drive(item, send):
        async with send, engine.open_request(item.request) as outputs:
            async for o in outputs:
                await send.send((item.prompt_idx, o))

    async with trio.open_nursery() as nursery:
        async with send:
            for item in plan.items:
                nursery.start_soon(drive, item, send.clone())
        async for arrival in recv:
            raw.append(merger.feed([arrival]))
    raw.append(merger.finish())
    events = parse_sse(b"".join(raw))
    order = [e["choices"][0]["index"] for e in content_chunks(events)]
    assert order[:10] != sorted(order[:10]) or len(set(order[:10])) > 2, "prompts should interleave"
    _, _, whole = await run_whole(body)
    chunks = by_index(events)
    assert ["".join(p["text"] for p in chunks[c["index"]]) for c in whole["choices"]] == [
        c["text"] for c in whole["choices"]
    ]
    assert all(len(c["text"]) == 6 for c in whole["choices"])


# --- usage ----------------------------------------------------------------------------------------


async def test_non_streaming_usage_counts_prompts_once_and_sums_completions() -> None:
    body = {"prompt": ["abc", "de"], "n": 3, "max_tokens": 9}
    plan, per_prompt, whole = await run_whole(body)
    exp = Expected(plan, per_prompt)
    assert exp.prompt_tokens == 4 + 3
    assert whole["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 7 + exp.completion_tokens,
        "completion_tokens": exp.completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert exp.completion_tokens == sum(len(ids) for ids in exp.token_ids.values()) > 0


async def test_non_streaming_body_has_vllms_shape() -> None:
    """vLLM 0.32's CompletionResponse: every field present, in its order, the unused ones null."""
    _, _, whole = await run_whole({"prompt": ["abc", "de"], "n": 2, "max_tokens": 5})
    assert list(whole) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert (whole["id"], whole["object"], whole["created"], whole["model"]) == (
        "cmpl-test",
        "text_completion",
        1700000000,
        "scripted",
    )
    assert [
        whole[k] for k in ("service_tier", "system_fingerprint", "kv_transfer_params", "ec_transfer_params", "metrics")
    ] == [None] * 5
    assert list(whole["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    assert len(whole["choices"]) == 4
    for c in whole["choices"]:
        assert list(c) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "token_ids",
            "prompt_logprobs",
            "prompt_token_ids",
            "routed_experts",
        ]
        assert c["routed_experts"] is None
        assert (c["logprobs"], c["token_ids"], c["prompt_logprobs"], c["prompt_token_ids"]) == (None, None, None, None)


async def test_include_usage_gives_one_usage_chunk_just_before_one_done() -> None:
    body = {"prompt": ["abc", "de"], "n": 3, "max_tokens": 9, "stream_options": {"include_usage": True}}
    plan, per_prompt, events = await run_stream(body)
    exp = Expected(plan, per_prompt)
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    with_usage = [e for e in events if isinstance(e, dict) and "usage" in e]
    assert len(with_usage) == 1 and with_usage[0] is events[-2]
    assert with_usage[0]["choices"] == []
    assert with_usage[0]["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 7 + exp.completion_tokens,
        "completion_tokens": exp.completion_tokens,
    }
    _, _, whole = await run_whole(body)
    assert whole["usage"]["completion_tokens"] == exp.completion_tokens


async def test_no_usage_without_include_usage() -> None:
    for options in (None, {"include_usage": False}, {"continuous_usage_stats": True}):
        body = {"prompt": ["abc", "de"], "max_tokens": 5, "stream_options": options}
        _, _, events = await run_stream(body)
        assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
        assert not [e for e in events if isinstance(e, dict) and "usage" in e]
        assert all(e["choices"] for e in events[:-1])


async def test_continuous_usage_on_every_chunk() -> None:
    body = {
        "prompt": ["abc", "d"],
        "n": 2,
        "max_tokens": 6,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    plan, per_prompt, events = await run_stream(body, seed=8)
    exp = Expected(plan, per_prompt)
    so_far: dict[int, int] = defaultdict(int)
    chunks = content_chunks(events)
    assert chunks
    for e in chunks:
        c = e["choices"][0]
        so_far[c["index"]] += len(c["token_ids"])
        prompt_tokens = len(plan.items[c["index"] // plan.n].request.prompt_token_ids)
        assert e["usage"] == {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + so_far[c["index"]],
            "completion_tokens": so_far[c["index"]],
        }
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == exp.completion_tokens == sum(so_far.values())
    assert events[-2]["usage"]["prompt_tokens"] == 4 + 2


# --- the protocol state machine -------------------------------------------------------------------


async def test_finish_before_every_choice_finished_is_a_protocol_violation() -> None:
    plan = make({"prompt": ["a", "b"], "max_tokens": 4, "ignore_eos": True}, stream=True)
    per_prompt = await generate(plan)
    merger = completions.merger(plan, TOK)
    with pytest.raises(ProtocolViolation):
        merger.finish()
    merger.feed([(0, o) for o in per_prompt[0]])  # prompt 0 done, prompt 1 not started
    with pytest.raises(ProtocolViolation):
        merger.finish()
    merger.feed([(1, o) for o in per_prompt[1][:-1]])  # all but the last output of prompt 1
    with pytest.raises(ProtocolViolation):
        merger.finish()
    assert merger.phase is Phase.STREAMING  # a refused finish() changes nothing
    merger.feed([(1, per_prompt[1][-1])])
    assert merger.finish() == b"data: [DONE]\n\n"


async def test_nothing_is_accepted_after_done() -> None:
    plan = make({"prompt": "a", "max_tokens": 3, "stream_options": {"include_usage": True}}, stream=True)
    per_prompt = await generate(plan)
    merger = completions.merger(plan, TOK)
    merger.feed([(0, o) for o in per_prompt[0]])
    assert merger.finish().endswith(b"data: [DONE]\n\n")
    assert merger.phase is Phase.DONE
    with pytest.raises(ProtocolViolation):
        merger.feed([])
    with pytest.raises(ProtocolViolation):
        merger.feed([(0, per_prompt[0][-1])])
    with pytest.raises(ProtocolViolation):
        merger.finish()
    with pytest.raises(ProtocolViolation):
        merger.fail(EngineError("late"))


async def test_fail_gives_an_error_event_then_done_and_nothing_after() -> None:
    plan = make(
        {"prompt": ["a", "b"], "max_tokens": 6, "min_tokens": 2, "stream_options": {"include_usage": True}}, stream=True
    )
    per_prompt = await generate(plan)
    merger = completions.merger(plan, TOK)
    partial = parse_sse(merger.feed([(0, per_prompt[0][0]), (1, per_prompt[1][0])]))
    assert len(partial) == 2
    err = InvalidRequest("Token id 999 is out of vocabulary", param="prompt")
    raw = merger.fail(err)
    # vLLM writes error events with json.dumps (spaces after separators), then [DONE]; no usage.
    assert raw == b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
    events = parse_sse(raw)
    assert events == [
        {"error": {"message": err.message, "type": "BadRequestError", "param": "prompt", "code": 400}},
        "[DONE]",
    ]
    assert merger.phase is Phase.DONE
    for call in (lambda: merger.feed([(0, per_prompt[0][1])]), merger.finish, lambda: merger.fail(err)):
        with pytest.raises(ProtocolViolation):
            call()


async def test_fail_before_any_output() -> None:
    plan = make({"prompt": "a"}, stream=True)
    merger = completions.merger(plan, TOK)
    events = parse_sse(merger.fail(EngineError("boom")))
    assert events == [
        {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}},
        "[DONE]",
    ]


async def test_collector_needs_every_choice_finished() -> None:
    plan = make({"prompt": ["a", "b"], "max_tokens": 4, "ignore_eos": True}, stream=False)
    per_prompt = await generate(plan)
    collector = completions.collector(plan, TOK)
    with pytest.raises(ProtocolViolation):
        collector.body()
    collector.feed([(0, o) for o in per_prompt[0]] + [(1, o) for o in per_prompt[1][:-1]])
    with pytest.raises(ProtocolViolation):
        collector.body()
    collector.feed([(1, per_prompt[1][-1])])
    assert [c["text"] for c in json.loads(collector.body())["choices"]] == [
        "".join(d.text for o in outs for d in o.choices) for outs in per_prompt
    ]


# --- property: stream == non-stream ---------------------------------------------------------------

_text = st.text(alphabet="abcxyz é", min_size=0, max_size=6)
_tokens = st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=1, max_size=6)


@st.composite
def bodies(draw: st.DrawFn) -> dict:
    if draw(st.booleans()):
        prompt: object = draw(st.lists(_text, min_size=1, max_size=3))
    else:
        prompt = draw(st.lists(_tokens, min_size=1, max_size=3))
    greedy = draw(st.booleans())
    body: dict = {
        "prompt": prompt,
        "n": 1 if greedy else draw(st.integers(1, 3)),
        "temperature": 0 if greedy else 0.9,
        "max_tokens": draw(st.integers(0, 12)),
        "echo": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
        "return_token_ids": draw(st.booleans()),
        "stream_options": {"include_usage": True, "continuous_usage_stats": draw(st.booleans())},
    }
    if body["max_tokens"] == 0:
        body["echo"] = True
    if draw(st.booleans()):
        body["logprobs"] = draw(st.integers(0, 4))
    if draw(st.booleans()):
        body["stop"] = draw(st.lists(st.text(alphabet="abcxyz ", min_size=1, max_size=3), min_size=1, max_size=3))
        body["include_stop_str_in_output"] = draw(st.booleans())
    if draw(st.booleans()):
        body["ignore_eos"] = True
    return body


def text_matches_tokens(part: dict) -> bool:
    """The chunk's text is exactly its tokens' text (a final EOS adds a token but no text)."""
    joined = "".join(part["logprobs"]["tokens"])
    return part["text"] == joined or (part["finish_reason"] is not None and part["text"] + "</s>" == joined)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies(), seed=st.integers(0, 2**16))
def test_property_stream_equals_non_stream(body: dict, seed: int) -> None:
    async def main() -> tuple:
        return await run_stream(body, seed), await run_whole(body, seed + 1)

    (plan, per_prompt, events), (_, _, whole) = trio.run(main)
    exp = Expected(plan, per_prompt)
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == []
    assert whole["usage"]["prompt_tokens_details"] is None and whole["usage"]["completion_tokens_details"] is None
    assert usage["usage"] == {k: v for k, v in whole["usage"].items() if not k.endswith("_details")}
    assert whole["usage"]["prompt_tokens"] == exp.prompt_tokens
    assert whole["usage"]["completion_tokens"] == exp.completion_tokens
    chunks = by_index(events)
    assert sorted(chunks) == list(range(plan.num_choices)) == [c["index"] for c in whole["choices"]]
    for c in whole["choices"]:
        g = c["index"]
        parts = chunks[g]
        assert [p["finish_reason"] for p in parts[:-1]] == [None] * (len(parts) - 1)
        assert (
            (parts[-1]["finish_reason"], parts[-1]["stop_reason"])
            == (c["finish_reason"], c["stop_reason"])
            == exp.finish[g]
        )
        assert "".join(p["text"] for p in parts) == c["text"]
        echo = plan.items[g // plan.n].echo_text
        assert c["text"] == echo + ("" if plan.hide_completion else exp.text[g])
        assert c["routed_experts"] is None
        if plan.return_token_ids:
            assert [t for p in parts for t in p["token_ids"]] == c["token_ids"] == exp.token_ids[g]
            assert parts[0]["prompt_token_ids"] == c["prompt_token_ids"] == list(exp.prompt_ids[g])
        else:
            assert c["token_ids"] is None and c["prompt_token_ids"] is None
            # a stream echoes the prompt ids on the first chunk even without return_token_ids
            assert parts[0]["prompt_token_ids"] == (list(exp.prompt_ids[g]) if plan.echo else None)
        assert all(p["prompt_token_ids"] is None for p in parts[1:])
        if plan.logprobs is None:
            assert c["logprobs"] is None and all(p["logprobs"] is None for p in parts)
        else:
            lp = c["logprobs"]
            for key in ("tokens", "token_logprobs", "top_logprobs"):
                assert [x for p in parts for x in p["logprobs"][key]] == lp[key]
            shown = (len(exp.prompt_ids[g]) if plan.echo else 0) + (
                0 if plan.hide_completion else len(exp.token_ids[g])
            )
            assert len(lp["tokens"]) == shown
            check_logprobs_entries(lp, plan)
            assert [x for p in parts for x in p["logprobs"]["text_offset"]] == lp["text_offset"]
            if all(text_matches_tokens(p) for p in parts):
                assert lp["text_offset"] == cumulative_offsets(lp["tokens"])
        if body.get("stop") and not body.get("include_stop_str_in_output"):
            assert not any(s in exp.text[g] for s in body["stop"])


# --- cached tokens (--enable-prompt-tokens-details) -----------------------------------------------


def _cached_outputs(plan: Plan) -> list[Arrival]:
    """Prompt 0 reports 16 cached tokens, then (its second choice) 32; prompt 1 reports 0 on
    every output; prompt 2 reports nothing."""
    reports: dict[int, list[int | None]] = {0: [16, 32], 1: [0, 0], 2: [None, None]}
    arrivals: list[Arrival] = []
    for item in plan.items:
        ids = item.request.prompt_token_ids
        for k, cached in enumerate(reports[item.prompt_idx]):
            delta = ChoiceDelta(k, "z", (ids_of("z")[0],), None, "length")
            arrivals.append((item.prompt_idx, EngineOutput(ids, (delta,), k == 1, None, cached)))
    return arrivals


def _cached_plan(*, stream: bool, report: bool) -> Plan:
    body = {
        "prompt": ["abc", "de", "f"],
        "n": 2,
        "max_tokens": 1,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    req = parse_request(json.dumps(body).encode(), LIMITS)
    engine = ScriptedEngine()
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-test", created=1, cached_tokens=report)


def test_cached_tokens_are_summed_over_the_prompts_once_per_prompt() -> None:
    plan = _cached_plan(stream=False, report=True)
    collector = completions.collector(plan, TOK)
    collector.feed(_cached_outputs(plan))
    usage = json.loads(collector.body())["usage"]
    assert usage["prompt_tokens"] == 4 + 3 + 2
    # vLLM 0.32's shape; 16 + 0: a prompt's first report counts, and a prompt with none adds 0
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": 16,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }

    plan = _cached_plan(stream=True, report=True)
    merger = completions.merger(plan, TOK)
    merger.feed(_cached_outputs(plan))
    final = parse_sse(merger.finish())[0]
    assert final["usage"] == {
        "prompt_tokens": 9,
        "total_tokens": 15,
        "completion_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 16},
    }


def test_cached_tokens_are_not_reported_unless_the_server_enables_them() -> None:
    plan = _cached_plan(stream=False, report=False)
    collector = completions.collector(plan, TOK)
    collector.feed(_cached_outputs(plan))
    assert json.loads(collector.body())["usage"]["prompt_tokens_details"] is None
    plan = _cached_plan(stream=True, report=False)
    merger = completions.merger(plan, TOK)
    merger.feed(_cached_outputs(plan))
    assert "prompt_tokens_details" not in parse_sse(merger.finish())[0]["usage"]


def test_cached_tokens_are_left_out_when_no_output_reports_them() -> None:
    plan = _cached_plan(stream=False, report=True)
    collector = completions.collector(plan, TOK)
    collector.feed(
        [(i, EngineOutput(o.prompt_token_ids, o.choices, o.finished, None, None)) for i, o in _cached_outputs(plan)]
    )
    assert json.loads(collector.body())["usage"]["prompt_tokens_details"] is None
