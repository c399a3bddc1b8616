"""braid.stream.render: the choice index, echo, logprobs, token ids and stop reasons of each chunk.

Driven through the merger and collector (tests/helpers.py's run_stream and run_whole) with the real
ScriptedEngine, and compared with what the engine itself produced.
"""

from __future__ import annotations

import pytest

from braid.engine.base import Logprob
from braid.engine.scripted import BOS, EOS, VOCAB_SIZE
from braid.stream.render import ChoiceRenderer, render_logprobs
from tests.helpers import (
    TOK,
    Expected,
    by_index,
    check_logprobs_entries,
    cumulative_offsets,
    ids_of,
    interleave,
    run_stream,
    run_whole,
)

# --- index mapping --------------------------------------------------------------------------------

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


# --- echo and logprobs ----------------------------------------------------------------------------


ECHO_TOKEN_PROMPT = {
    "prompt": [ids_of("hello"), ids_of("hey you")],
    "n": 2,
    "max_tokens": 8,
    "echo": True,
    "logprobs": 2,
    "ignore_eos": True,
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
    "stop-holdback": {
        "prompt": [ids_of("hello world")],
        "max_tokens": 16,
        "logprobs": 1,
        "stop": ["zzz", "ab"],
        "ignore_eos": True,
    },
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
    plan, per_prompt, whole = await run_whole(
        {"prompt": "ab", "max_tokens": 5, "logprobs": 1, "return_tokens_as_token_ids": True}
    )
    exp = Expected(plan, per_prompt)
    lp = whole["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in exp.token_ids[0]]
    assert all(set(top) <= {f"token_id:{t}" for t in range(VOCAB_SIZE)} for top in lp["top_logprobs"])


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_zero_max_tokens_shows_only_the_prompt(stream: bool) -> None:
    body = {
        "prompt": ["abc", "de"],
        "n": 2,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "stream_options": {"include_usage": True},
    }
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


# --- token ids ------------------------------------------------------------------------------------


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
    assert {g: parts[0]["prompt_token_ids"] for g, parts in chunks.items()} == {
        0: [BOS, *ids_of("abc")],
        1: [BOS, *ids_of("de")],
    }
    assert {g: "".join(p["text"] for p in parts) for g, parts in chunks.items()} == {0: "abc", 1: "de"}


async def test_echo_with_return_token_ids_echoes_no_text() -> None:
    plan, per_prompt, whole = await run_whole({"prompt": "ab", "max_tokens": 4, "echo": True, "return_token_ids": True})
    exp = Expected(plan, per_prompt)
    assert whole["choices"][0]["text"] == exp.text[0]
    assert whole["choices"][0]["prompt_token_ids"] == [BOS, *ids_of("ab")]


# --- stop strings ---------------------------------------------------------------------------------

STOPS = ["e", "t ", "abc", "q"]


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_strings_never_appear_in_the_text(stream: bool) -> None:
    body = {"prompt": [f"s{i}" for i in range(6)], "n": 3, "max_tokens": 30, "stop": STOPS, "ignore_eos": True}
    if stream:
        _, _, events = await run_stream(body, seed=1)
        choices = [
            {
                "text": "".join(p["text"] for p in parts),
                "finish_reason": parts[-1]["finish_reason"],
                "stop_reason": parts[-1]["stop_reason"],
            }
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
    body = {
        "prompt": [f"s{i}" for i in range(6)],
        "n": 3,
        "max_tokens": 30,
        "stop": STOPS,
        "ignore_eos": True,
        "include_stop_str_in_output": True,
    }
    _, _, whole = await run_whole(body)
    stopped = [c for c in whole["choices"] if c["stop_reason"] is not None]
    assert stopped
    for c in stopped:
        assert c["text"].endswith(c["stop_reason"])
        assert c["text"].find(c["stop_reason"]) == len(c["text"]) - len(c["stop_reason"])


async def test_stop_token_ids_finish_with_the_token_as_stop_reason() -> None:
    stop_id = ids_of("a")[0]
    body = {
        "prompt": [f"t{i}" for i in range(4)],
        "n": 2,
        "max_tokens": 40,
        "stop_token_ids": [stop_id],
        "ignore_eos": True,
    }
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
