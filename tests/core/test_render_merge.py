"""ChoiceRenderer / StreamMerger / ResponseCollector, fed by the real ScriptedEngine.

The expected values are computed from the engine's own outputs (the deltas it yields), never from
braid's rendering, so that every assertion compares two independent derivations.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid.engine.base import ChoiceDelta, EngineOutput, Logprob
from braid.engine.scripted import BOS, EOS, VOCAB_SIZE, ByteTokenizer, ScriptedEngine
from braid.errors import EngineError, InvalidRequest
from braid.merge import Arrival, Phase, ProtocolViolation, ResponseCollector, StreamMerger
from braid.plan import Plan, make_plan
from braid.render import ChoiceRenderer, render_logprobs
from braid.request import Limits, parse_request
from tests.helpers import parse_sse

TOK = ByteTokenizer()
LIMITS = Limits(vocab_size=VOCAB_SIZE)
CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}


def ids_of(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def make(body: dict, *, stream: bool) -> Plan:
    body = {**body, "stream": stream}
    if not stream:
        body.pop("stream_options", None)
    engine = ScriptedEngine()
    req = parse_request(json.dumps(body).encode(), LIMITS)
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-test", created=1700000000)


async def generate(plan: Plan) -> list[list[EngineOutput]]:
    """Every output of every prompt, per prompt, from a real ScriptedEngine run."""
    engine = ScriptedEngine()
    per_prompt = []
    for item in plan.items:
        async with engine.open_request(item.request) as outputs:
            per_prompt.append([o async for o in outputs])
    assert engine.in_flight == 0 and engine.aborted_total == 0
    return per_prompt


def interleave(per_prompt: list[list[EngineOutput]], seed: int) -> list[list[Arrival]]:
    """A random arrival order (each prompt's outputs stay in order), cut into random batches."""
    rng = random.Random(seed)
    queues = [[(i, o) for o in outs] for i, outs in enumerate(per_prompt)]
    order: list[Arrival] = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        order.append(q.pop(0))
    batches, at = [], 0
    while at < len(order):
        size = rng.randint(1, 4)
        batches.append(order[at : at + size])
        at += size
    return batches


async def run_stream(body: dict, seed: int = 0) -> tuple[Plan, list[list[EngineOutput]], list[object]]:
    plan = make(body, stream=True)
    per_prompt = await generate(plan)
    merger = StreamMerger(plan, TOK)
    raw = b"".join(merger.feed(batch) for batch in interleave(per_prompt, seed)) + merger.finish()
    assert merger.phase is Phase.DONE and raw.endswith(b"\n\n")
    return plan, per_prompt, parse_sse(raw)


async def run_whole(body: dict, seed: int = 0) -> tuple[Plan, list[list[EngineOutput]], dict]:
    plan = make(body, stream=False)
    per_prompt = await generate(plan)
    collector = ResponseCollector(plan, TOK)
    for batch in interleave(per_prompt, seed):
        collector.feed(batch)
    return plan, per_prompt, json.loads(collector.body())


def content_chunks(events: list[object]) -> list[dict]:
    return [e for e in events if isinstance(e, dict) and e["choices"]]


def by_index(events: list[object]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for e in content_chunks(events):
        assert len(e["choices"]) == 1
        out[e["choices"][0]["index"]].append(e["choices"][0])
    return out


class Expected:
    """Per global choice index, what the engine produced (texts, token ids, finish), by hand."""

    def __init__(self, plan: Plan, per_prompt: list[list[EngineOutput]]) -> None:
        self.text: dict[int, str] = defaultdict(str)
        self.token_ids: dict[int, list[int]] = defaultdict(list)
        self.finish: dict[int, tuple[str | None, object]] = {}
        self.prompt_ids: dict[int, tuple[int, ...]] = {}
        self.steps: dict[int, list] = defaultdict(list)
        self.prompt_tokens = 0
        for i, outs in enumerate(per_prompt):
            self.prompt_tokens += len(outs[0].prompt_token_ids)
            for out in outs:
                for d in out.choices:
                    g = i * plan.n + d.index
                    self.text[g] += d.text
                    self.token_ids[g] += d.token_ids
                    self.steps[g] += d.logprobs or ()
                    self.prompt_ids[g] = out.prompt_token_ids
                    if d.finish_reason is not None:
                        assert g not in self.finish
                        self.finish[g] = (d.finish_reason, d.stop_reason)
        self.completion_tokens = sum(len(t) for t in self.token_ids.values())


def cumulative_offsets(tokens: list[str], start: int = 0) -> list[int]:
    out = []
    for t in tokens:
        out.append(start)
        start += len(t)
    return out


# --- index mapping, texts, finish reasons -------------------------------------------------------

BATCH = {"prompt": ["ab", "cd", "ef"], "n": 2, "max_tokens": 8, "temperature": 0.8}


async def test_global_index_is_prompt_idx_times_n_plus_k() -> None:
    plan, per_prompt, events = await run_stream(BATCH, seed=3)
    exp = Expected(plan, per_prompt)
    assert len(set(exp.text.values())) == 6, "the choices must differ for this test to mean anything"
    chunks = by_index(events)
    assert sorted(chunks) == list(range(6))
    for g, parts in chunks.items():
        assert "".join(p["text"] for p in parts) == exp.text[g]
    _, _, whole = await run_whole(BATCH)
    assert [c["index"] for c in whole["choices"]] == list(range(6))
    assert [c["text"] for c in whole["choices"]] == [exp.text[g] for g in range(6)]


async def test_renderer_chunks_carry_the_prompt_index() -> None:
    plan, per_prompt, _ = await run_stream(BATCH)
    renderer = ChoiceRenderer(plan, TOK)
    for batch in interleave(per_prompt, 5):
        for prompt_idx, output in batch:
            for c in renderer.render(prompt_idx, output):
                assert c.prompt_idx == prompt_idx
                assert c.index // plan.n == prompt_idx
    assert renderer.all_finished


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
    plan, _, events = await run_stream(BATCH)
    for e in content_chunks(events):
        assert set(e) == {"id", "object", "created", "model", "choices"}
        assert (e["id"], e["object"], e["created"], e["model"]) == ("cmpl-test", "text_completion", 1700000000, "scripted")
        assert set(e["choices"][0]) == CHOICE_KEYS  # no routed_experts in a stream
        assert e["choices"][0]["logprobs"] is None and e["choices"][0]["token_ids"] is None
        assert e["choices"][0]["prompt_token_ids"] is None  # no echo, no return_token_ids


async def test_concurrent_prompts_in_true_arrival_order() -> None:
    """Drivers on a trio nursery, as braid runs them; the merger sees the real interleaving."""
    body = {"prompt": [f"p{i}" for i in range(5)], "n": 2, "max_tokens": 6, "ignore_eos": True}
    plan = make(body, stream=True)
    engine = ScriptedEngine()
    merger = StreamMerger(plan, TOK)
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
    assert ["".join(p["text"] for p in chunks[c["index"]]) for c in whole["choices"]] == [c["text"] for c in whole["choices"]]
    assert all(len(c["text"]) == 6 for c in whole["choices"])


# --- usage -----------------------------------------------------------------------------------------


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
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
        "kv_transfer_params", "ec_transfer_params", "metrics",
    ]
    assert (whole["id"], whole["object"], whole["created"], whole["model"]) == ("cmpl-test", "text_completion", 1700000000, "scripted")
    assert [whole[k] for k in ("service_tier", "system_fingerprint", "kv_transfer_params", "ec_transfer_params", "metrics")] == [None] * 5
    assert list(whole["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"]
    assert len(whole["choices"]) == 4
    for c in whole["choices"]:
        assert list(c) == [
            "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs",
            "prompt_token_ids", "routed_experts",
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
    merger = StreamMerger(plan, TOK)
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
    merger = StreamMerger(plan, TOK)
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
    plan = make({"prompt": ["a", "b"], "max_tokens": 6, "stream_options": {"include_usage": True}}, stream=True)
    per_prompt = await generate(plan)
    merger = StreamMerger(plan, TOK)
    partial = parse_sse(merger.feed([(0, per_prompt[0][0]), (1, per_prompt[1][0])]))
    assert len(partial) == 2
    err = InvalidRequest("Token id 999 is out of vocabulary", param="prompt")
    raw = merger.fail(err)
    # vLLM writes error events with json.dumps (spaces after separators), then [DONE]; no usage.
    assert raw == b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
    events = parse_sse(raw)
    assert events == [{"error": {"message": err.message, "type": "BadRequestError", "param": "prompt", "code": 400}}, "[DONE]"]
    assert merger.phase is Phase.DONE
    for call in (lambda: merger.feed([(0, per_prompt[0][1])]), merger.finish, lambda: merger.fail(err)):
        with pytest.raises(ProtocolViolation):
            call()


async def test_fail_before_any_output() -> None:
    plan = make({"prompt": "a"}, stream=True)
    merger = StreamMerger(plan, TOK)
    events = parse_sse(merger.fail(EngineError("boom")))
    assert events == [{"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}, "[DONE]"]


async def test_collector_needs_every_choice_finished() -> None:
    plan = make({"prompt": ["a", "b"], "max_tokens": 4, "ignore_eos": True}, stream=False)
    per_prompt = await generate(plan)
    collector = ResponseCollector(plan, TOK)
    with pytest.raises(ProtocolViolation):
        collector.body()
    collector.feed([(0, o) for o in per_prompt[0]] + [(1, o) for o in per_prompt[1][:-1]])
    with pytest.raises(ProtocolViolation):
        collector.body()
    collector.feed([(1, per_prompt[1][-1])])
    assert [c["text"] for c in json.loads(collector.body())["choices"]] == [
        "".join(d.text for o in outs for d in o.choices) for outs in per_prompt
    ]


# --- echo and logprobs ------------------------------------------------------------------------------


def check_logprobs_entries(lp: dict, plan: Plan) -> None:
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert (logprob is None) == (top is None)
        if top is not None:
            assert top[tok] == logprob <= 0
            assert 1 <= len(top) <= plan.logprobs + 1


ECHO_TOKEN_PROMPT = {
    "prompt": [ids_of("hello"), ids_of("hey you")], "n": 2, "max_tokens": 8, "echo": True, "logprobs": 2, "ignore_eos": True,
}


async def test_echo_logprobs_non_streaming() -> None:
    plan, per_prompt, whole = await run_whole(ECHO_TOKEN_PROMPT)
    exp = Expected(plan, per_prompt)
    for c in whole["choices"]:
        g = c["index"]
        prompt = ["hello", "hey you"][g // 2]
        lp = c["logprobs"]
        assert c["text"] == prompt + exp.text[g]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(x is not None for x in lp["token_logprobs"][1:])
        assert lp["tokens"][: len(prompt)] == list(prompt)
        assert len(lp["tokens"]) == len(prompt) + len(exp.token_ids[g])
        check_logprobs_entries(lp, plan)
        # no special tokens in the prompt and no stop strings: offsets follow tokens and text alike
        assert lp["text_offset"] == cumulative_offsets(lp["tokens"])
        # echo with logprobs requests prompt logprobs, shown per choice (vLLM's raw field)
        assert c["prompt_logprobs"][0] is None and len(c["prompt_logprobs"]) == len(prompt)
        assert all(str(t) in d for t, d in zip(ids_of(prompt)[1:], c["prompt_logprobs"][1:], strict=True))


async def test_echo_logprobs_streaming_offsets_continue_and_match_non_streaming() -> None:
    plan, per_prompt, events = await run_stream(ECHO_TOKEN_PROMPT, seed=2)
    _, _, whole = await run_whole(ECHO_TOKEN_PROMPT)
    chunks = by_index(events)
    for c in whole["choices"]:
        parts = chunks[c["index"]]
        prompt = ["hello", "hey you"][c["index"] // 2]
        assert parts[0]["text"].startswith(prompt)
        assert parts[0]["logprobs"]["token_logprobs"][0] is None and parts[0]["logprobs"]["top_logprobs"][0] is None
        assert all(x is not None for p in parts[1:] for x in p["logprobs"]["token_logprobs"])
        assert len(parts) > 1, "offsets must be seen continuing across chunks"
        streamed = [x for p in parts for x in p["logprobs"]["text_offset"]]
        assert streamed == cumulative_offsets([t for p in parts for t in p["logprobs"]["tokens"]])
        assert streamed == c["logprobs"]["text_offset"]
        assert parts[1]["logprobs"]["text_offset"][0] == len(parts[0]["text"])  # after the echoed prompt
        assert all("prompt_logprobs" not in p for p in parts)


OFFSET_CASES = {
    # the echoed BOS is the token "<s>" but adds no text
    "echo-bos": {"prompt": ["hello", "yo"], "n": 2, "max_tokens": 8, "echo": True, "logprobs": 1},
    # text that may start a stop string is held back: deltas carry a token but (yet) no text
    "stop-holdback": {"prompt": [ids_of("hello world")], "max_tokens": 16, "logprobs": 1, "stop": ["zzz", "ab"], "ignore_eos": True},
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", OFFSET_CASES)
async def test_text_offset_is_cumulative_over_tokens_when_text_lags(case: str, stream: bool) -> None:
    if stream:
        _, _, events = await run_stream(OFFSET_CASES[case], seed=6)
        lps = [
            {k: [x for p in parts for x in p["logprobs"][k]] for k in ("tokens", "text_offset")}
            for parts in by_index(events).values()
        ]
    else:
        _, _, whole = await run_whole(OFFSET_CASES[case])
        lps = [c["logprobs"] for c in whole["choices"]]
    for lp in lps:
        assert lp["text_offset"] == cumulative_offsets(lp["tokens"])


@pytest.mark.parametrize("case", OFFSET_CASES)
async def test_streamed_offsets_equal_non_streamed_offsets_when_text_lags(case: str) -> None:
    plan, _, events = await run_stream(OFFSET_CASES[case], seed=6)
    _, _, whole = await run_whole(OFFSET_CASES[case], seed=7)
    chunks = by_index(events)
    for c in whole["choices"]:
        parts = chunks[c["index"]]
        assert [x for p in parts for x in p["logprobs"]["text_offset"]] == c["logprobs"]["text_offset"]
        assert [x for p in parts for x in p["logprobs"]["tokens"]] == c["logprobs"]["tokens"]


async def test_echo_logprobs_text_prompt_shows_bos_token() -> None:
    plan, per_prompt, whole = await run_whole({"prompt": "hi", "max_tokens": 4, "echo": True, "logprobs": 0})
    lp = whole["choices"][0]["logprobs"]
    assert whole["choices"][0]["text"].startswith("hi")
    assert lp["tokens"][:3] == ["<s>", "h", "i"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x is not None for x in lp["token_logprobs"][1:])


@pytest.mark.parametrize("stream", [False, True])
async def test_single_token_prompt_with_echo_and_logprobs(stream: bool) -> None:
    body = {"prompt": [[5]], "max_tokens": 6, "echo": True, "logprobs": 2}
    if stream:
        plan, per_prompt, events = await run_stream(body)
        parts = by_index(events)[0]
        lp = {k: [x for p in parts for x in p["logprobs"][k]] for k in ("tokens", "token_logprobs", "top_logprobs")}
        first = parts[0]["logprobs"]
        assert first["tokens"][0] == TOK.token_text(5) and first["token_logprobs"][0] is None
    else:
        plan, per_prompt, whole = await run_whole(body)
        lp = whole["choices"][0]["logprobs"]
        assert whole["choices"][0]["prompt_logprobs"] == [None]
    exp = Expected(plan, per_prompt)
    assert lp["tokens"][0] == TOK.token_text(5)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == 1 + len(exp.token_ids[0])
    assert None not in lp["token_logprobs"][1:] and None not in lp["top_logprobs"][1:]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
async def test_top_logprobs_keep_k_plus_one_entries_actual_token_first(k: int) -> None:
    plan, per_prompt, whole = await run_whole({"prompt": ["ab", "cd"], "n": 2, "max_tokens": 6, "logprobs": k})
    exp = Expected(plan, per_prompt)
    for c in whole["choices"]:
        steps = exp.steps[c["index"]]
        lp = c["logprobs"]
        assert len(lp["top_logprobs"]) == len(steps) == len(exp.token_ids[c["index"]])
        for tid, step, tok, logprob, top in zip(
            exp.token_ids[c["index"]], steps, lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
        ):
            wanted = {e.decoded_token: e.logprob for e in list(step.values())[: k + 1]}
            assert top == wanted
            assert list(top)[0] == tok == step[tid].decoded_token
            assert logprob == step[tid].logprob
            assert len(top) == k + 1  # the scripted engine offers k distinct alternatives


async def test_logprobs_zero_gives_one_entry_and_three_up_to_four() -> None:
    for k, most in ((0, 1), (3, 4)):
        plan, _, whole = await run_whole({"prompt": "abc", "max_tokens": 8, "logprobs": k, "echo": True})
        tops = [t for t in whole["choices"][0]["logprobs"]["top_logprobs"] if t is not None]
        assert tops and all(1 <= len(t) <= most for t in tops)
        assert any(len(t) == most for t in tops)


def test_render_logprobs_floors_and_ids() -> None:
    steps = [None, {7: Logprob(float("-inf"), 3, "x"), 8: Logprob(-1.5, 1, "y")}]
    frag = render_logprobs((BOS, 7), steps, top=1, offset=10, tokenizer=TOK, as_ids=False)
    assert frag.tokens == ("<s>", "x") and frag.text_offset == (10, 13)
    assert frag.token_logprobs == (None, -9999.0)
    assert frag.top_logprobs == (None, {"x": -9999.0, "y": -1.5})
    frag = render_logprobs((BOS, 7), steps, top=0, offset=0, tokenizer=TOK, as_ids=True)
    assert frag.tokens == (f"token_id:{BOS}", "token_id:7")
    assert frag.top_logprobs == (None, {"token_id:7": -9999.0})
    assert frag.text_offset == (0, len(f"token_id:{BOS}"))


async def test_return_tokens_as_token_ids() -> None:
    plan, per_prompt, whole = await run_whole({"prompt": "ab", "max_tokens": 5, "logprobs": 1, "return_tokens_as_token_ids": True})
    exp = Expected(plan, per_prompt)
    lp = whole["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in exp.token_ids[0]]
    assert all(set(top) <= {f"token_id:{t}" for t in range(VOCAB_SIZE)} for top in lp["top_logprobs"])


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_zero_max_tokens_shows_only_the_prompt(stream: bool) -> None:
    body = {"prompt": ["abc", "de"], "n": 2, "max_tokens": 0, "echo": True, "logprobs": 1,
            "stream_options": {"include_usage": True}}
    if stream:
        plan, per_prompt, events = await run_stream(body)
        chunks = by_index(events)
        texts = {g: "".join(p["text"] for p in parts) for g, parts in chunks.items()}
        tokens = {g: [t for p in parts for t in p["logprobs"]["tokens"]] for g, parts in chunks.items()}
        usage = events[-2]["usage"]
    else:
        plan, per_prompt, whole = await run_whole(body)
        texts = {c["index"]: c["text"] for c in whole["choices"]}
        tokens = {c["index"]: c["logprobs"]["tokens"] for c in whole["choices"]}
        usage = whole["usage"]
    assert texts == {0: "abc", 1: "abc", 2: "de", 3: "de"}
    assert tokens[0] == ["<s>", "a", "b", "c"] and tokens[3] == ["<s>", "d", "e"]
    # the one hidden token per choice is counted (vLLM: completion_tokens = 1 per choice)
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == 4 + 3


# --- token ids ----------------------------------------------------------------------------------------


async def test_return_token_ids() -> None:
    body = {"prompt": ["ab", "cde"], "n": 2, "max_tokens": 6, "return_token_ids": True}
    plan, per_prompt, whole = await run_whole(body)
    exp = Expected(plan, per_prompt)
    for c in whole["choices"]:
        assert c["token_ids"] == exp.token_ids[c["index"]]
        assert c["prompt_token_ids"] == [BOS, *ids_of(["ab", "cde"][c["index"] // 2])]
    _, _, events = await run_stream(body, seed=9)
    for g, parts in by_index(events).items():
        assert parts[0]["prompt_token_ids"] == whole["choices"][g]["prompt_token_ids"]
        assert all(p["prompt_token_ids"] is None for p in parts[1:])
        assert [t for p in parts for t in p["token_ids"]] == exp.token_ids[g]


async def test_no_token_ids_unless_asked() -> None:
    _, _, whole = await run_whole({"prompt": ["ab"], "max_tokens": 4})
    assert whole["choices"][0]["token_ids"] is None and whole["choices"][0]["prompt_token_ids"] is None
    _, _, events = await run_stream({"prompt": ["ab"], "max_tokens": 4})
    assert all(p["prompt_token_ids"] is None and p["token_ids"] is None for p in by_index(events)[0])


@pytest.mark.parametrize(
    ("prompt", "ids"),
    [(["ab", "xyz"], [[BOS, *ids_of("ab")], [BOS, *ids_of("xyz")]]), ([[9, 10], [7, 8, 9]], [[9, 10], [7, 8, 9]])],
    ids=["text", "tokens"],
)
@pytest.mark.parametrize("logprobs", [None, 1])
async def test_echo_stream_carries_prompt_token_ids_on_each_choices_first_chunk(
    prompt: list, ids: list[list[int]], logprobs: int | None
) -> None:
    """vLLM's streams put the prompt ids on an echoing choice's first chunk even without
    return_token_ids; its non-streamed bodies do not, and token_ids stay null in both."""
    body: dict = {"prompt": prompt, "n": 2, "max_tokens": 4, "echo": True, "ignore_eos": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    _, _, events = await run_stream(body, seed=5)
    chunks = by_index(events)
    assert sorted(chunks) == [0, 1, 2, 3]
    wanted = {0: ids[0], 1: ids[0], 2: ids[1], 3: ids[1]}
    for g, parts in chunks.items():
        assert len(parts) > 1
        assert parts[0]["prompt_token_ids"] == wanted[g]
        assert all(p["prompt_token_ids"] is None for p in parts[1:])
        assert all(p["token_ids"] is None for p in parts)
    _, _, whole = await run_whole(body)
    assert [c["prompt_token_ids"] for c in whole["choices"]] == [None] * 4
    assert [c["token_ids"] for c in whole["choices"]] == [None] * 4


async def test_echo_stream_with_zero_max_tokens_carries_prompt_token_ids() -> None:
    _, _, events = await run_stream({"prompt": ["abc", "de"], "max_tokens": 0, "echo": True})
    chunks = by_index(events)
    assert {g: parts[0]["prompt_token_ids"] for g, parts in chunks.items()} == {0: [BOS, *ids_of("abc")], 1: [BOS, *ids_of("de")]}
    assert {g: "".join(p["text"] for p in parts) for g, parts in chunks.items()} == {0: "abc", 1: "de"}


async def test_echo_with_return_token_ids_echoes_no_text() -> None:
    plan, per_prompt, whole = await run_whole({"prompt": "ab", "max_tokens": 4, "echo": True, "return_token_ids": True})
    exp = Expected(plan, per_prompt)
    assert whole["choices"][0]["text"] == exp.text[0]
    assert whole["choices"][0]["prompt_token_ids"] == [BOS, *ids_of("ab")]


# --- stop strings -------------------------------------------------------------------------------------

STOPS = ["e", "t ", "abc", "q"]


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_strings_never_appear_in_the_text(stream: bool) -> None:
    body = {"prompt": [f"s{i}" for i in range(6)], "n": 3, "max_tokens": 30, "stop": STOPS, "ignore_eos": True}
    if stream:
        _, _, events = await run_stream(body, seed=1)
        choices = [
            {"text": "".join(p["text"] for p in parts), "finish_reason": parts[-1]["finish_reason"], "stop_reason": parts[-1]["stop_reason"]}
            for parts in by_index(events).values()
        ]
    else:
        _, _, whole = await run_whole(body)
        choices = whole["choices"]
    stopped = [c for c in choices if c["stop_reason"] is not None]
    assert len(stopped) >= 3, "the test needs choices that actually stopped on a string"
    for c in choices:
        assert not any(s in c["text"] for s in STOPS), c
        if c["stop_reason"] is not None:
            assert c["finish_reason"] == "stop" and c["stop_reason"] in STOPS
        else:
            assert c["finish_reason"] == "length" and len(c["text"]) == 30


async def test_no_streamed_chunk_shows_a_stop_string_early() -> None:
    """Hold-back: the text streamed so far never contains a stop string, even mid-way."""
    body = {"prompt": [f"s{i}" for i in range(6)], "n": 3, "max_tokens": 30, "stop": STOPS, "ignore_eos": True}
    _, _, events = await run_stream(body, seed=1)
    for parts in by_index(events).values():
        so_far = ""
        for p in parts:
            so_far += p["text"]
            assert not any(s in so_far for s in STOPS)


async def test_include_stop_str_in_output_keeps_the_stop_string() -> None:
    body = {"prompt": [f"s{i}" for i in range(6)], "n": 3, "max_tokens": 30, "stop": STOPS, "ignore_eos": True,
            "include_stop_str_in_output": True}
    _, _, whole = await run_whole(body)
    stopped = [c for c in whole["choices"] if c["stop_reason"] is not None]
    assert stopped
    for c in stopped:
        assert c["text"].endswith(c["stop_reason"])
        assert c["text"].find(c["stop_reason"]) == len(c["text"]) - len(c["stop_reason"])


async def test_stop_token_ids_finish_with_the_token_as_stop_reason() -> None:
    stop_id = ids_of("a")[0]
    body = {"prompt": [f"t{i}" for i in range(4)], "n": 2, "max_tokens": 40, "stop_token_ids": [stop_id], "ignore_eos": True}
    plan, per_prompt, whole = await run_whole(body)
    exp = Expected(plan, per_prompt)
    stopped = [c for c in whole["choices"] if c["stop_reason"] is not None]
    assert stopped
    for c in stopped:
        assert c["stop_reason"] == stop_id and c["finish_reason"] == "stop" and "a" not in c["text"]
        assert exp.token_ids[c["index"]][-1] == stop_id


async def test_eos_finishes_with_stop_and_no_text() -> None:
    body = {"prompt": [f"e{i}" for i in range(8)], "max_tokens": 60}
    plan, per_prompt, whole = await run_whole(body)
    exp = Expected(plan, per_prompt)
    eos = [c for c in whole["choices"] if exp.token_ids[c["index"]][-1] == EOS]
    assert eos, "some choice should hit EOS within 60 tokens"
    for c in eos:
        assert (c["finish_reason"], c["stop_reason"]) == ("stop", None)
        assert len(c["text"]) == len(exp.token_ids[c["index"]]) - 1


# --- property: stream == non-stream ----------------------------------------------------------------

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
        assert (parts[-1]["finish_reason"], parts[-1]["stop_reason"]) == (c["finish_reason"], c["stop_reason"]) == exp.finish[g]
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
            shown = (len(exp.prompt_ids[g]) if plan.echo else 0) + (0 if plan.hide_completion else len(exp.token_ids[g]))
            assert len(lp["tokens"]) == shown
            check_logprobs_entries(lp, plan)
            assert [x for p in parts for x in p["logprobs"]["text_offset"]] == lp["text_offset"]
            if all(text_matches_tokens(p) for p in parts):
                assert lp["text_offset"] == cumulative_offsets(lp["tokens"])
        if body.get("stop") and not body.get("include_stop_str_in_output"):
            assert not any(s in exp.text[g] for s in body["stop"])


# --- cached tokens (--enable-prompt-tokens-details) ---------------------------------------------


def _cached_outputs(plan: Plan) -> list[Arrival]:
    """Prompt 0 reports 16 cached tokens, then (its second choice) 32; prompt 1 reports 0 on
    every output; prompt 2 reports nothing."""
    reports = {0: [16, 32], 1: [0, 0], 2: [None, None]}
    arrivals: list[Arrival] = []
    for item in plan.items:
        ids = item.request.prompt_token_ids
        for k, cached in enumerate(reports[item.prompt_idx]):
            delta = ChoiceDelta(k, "z", (ids_of("z")[0],), None, "length")
            arrivals.append((item.prompt_idx, EngineOutput(ids, (delta,), k == 1, None, cached)))
    return arrivals


def _cached_plan(*, stream: bool, report: bool) -> Plan:
    body = {"prompt": ["abc", "de", "f"], "n": 2, "max_tokens": 1, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}
    req = parse_request(json.dumps(body).encode(), LIMITS)
    engine = ScriptedEngine()
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-test", created=1, cached_tokens=report)


def test_cached_tokens_are_summed_over_the_prompts_once_per_prompt() -> None:
    plan = _cached_plan(stream=False, report=True)
    collector = ResponseCollector(plan, TOK)
    collector.feed(_cached_outputs(plan))
    usage = json.loads(collector.body())["usage"]
    assert usage["prompt_tokens"] == 4 + 3 + 2
    # vLLM 0.32's shape; 16 + 0: a prompt's first report counts, and a prompt with none adds 0
    assert usage["prompt_tokens_details"] == {"cached_tokens": 16, "created_cache_tokens": None, "multimodal_tokens": None}

    plan = _cached_plan(stream=True, report=True)
    merger = StreamMerger(plan, TOK)
    merger.feed(_cached_outputs(plan))
    final = parse_sse(merger.finish())[0]
    assert final["usage"] == {"prompt_tokens": 9, "total_tokens": 15, "completion_tokens": 6,
                              "prompt_tokens_details": {"cached_tokens": 16}}


def test_cached_tokens_are_not_reported_unless_the_server_enables_them() -> None:
    plan = _cached_plan(stream=False, report=False)
    collector = ResponseCollector(plan, TOK)
    collector.feed(_cached_outputs(plan))
    assert json.loads(collector.body())["usage"]["prompt_tokens_details"] is None
    plan = _cached_plan(stream=True, report=False)
    merger = StreamMerger(plan, TOK)
    merger.feed(_cached_outputs(plan))
    assert "prompt_tokens_details" not in parse_sse(merger.finish())[0]["usage"]


def test_cached_tokens_are_left_out_when_no_output_reports_them() -> None:
    plan = _cached_plan(stream=False, report=True)
    collector = ResponseCollector(plan, TOK)
    collector.feed([(i, EngineOutput(o.prompt_token_ids, o.choices, o.finished, None, None))
                    for i, o in _cached_outputs(plan)])
    assert json.loads(collector.body())["usage"]["prompt_tokens_details"] is None
