"""The scripted engine: final-only delivery (one output that is the sum of the deltas) and its prefix cache."""

from __future__ import annotations

import attrs
import pytest
import trio

from braid.engine.base import EngineOutput, EngineRequest, SamplingParams
from braid.engine.scripted import PrefixCache, ScriptedEngine, join_deltas
from braid.errors import EngineError

PARAMS = [
    SamplingParams(max_tokens=30, n=3, seed=7, logprobs=2, prompt_logprobs=1),
    SamplingParams(max_tokens=40, seed=1, stop=("e ",)),  # stops early, with hold-back of "e"
    SamplingParams(max_tokens=25, n=2, temperature=0.0, ignore_eos=True),
]


async def _collect(engine: ScriptedEngine, request: EngineRequest) -> list[EngineOutput]:
    async with engine.open_request(request) as outputs:
        return [o async for o in outputs]


@pytest.mark.parametrize("params", PARAMS)
async def test_final_only_is_one_output_equal_to_the_joined_deltas(params: SamplingParams) -> None:
    engine = ScriptedEngine()
    ids = tuple(engine.tokenizer.encode("hello there"))
    deltas = await _collect(engine, EngineRequest("d", ids, params))
    final = await _collect(engine, EngineRequest("f", ids, params, final_only=True))
    assert len(deltas) > 1 and len(final) == 1
    assert final[0] == join_deltas(deltas)
    out = final[0]
    assert out.finished and len(out.choices) == params.n
    for choice in out.choices:
        assert choice.finish_reason is not None
        expected = "".join(d.text for o in deltas for d in o.choices if d.index == choice.index)
        assert choice.text == expected
        if params.logprobs is not None:
            assert choice.logprobs is not None and len(choice.logprobs) == len(choice.token_ids)
    assert (out.prompt_logprobs is not None) == (params.prompt_logprobs is not None)
    assert engine.finished_total == 2 and engine.in_flight == 0


async def test_final_only_still_fails_after_s_tokens() -> None:
    engine = ScriptedEngine()
    ids = tuple(engine.tokenizer.encode("x braid:fail@4"))
    with pytest.raises(EngineError, match="after 4 tokens"):
        await _collect(engine, EngineRequest("f", ids, SamplingParams(max_tokens=50), final_only=True))
    assert engine.failed_total == 1 and engine.in_flight == 0


async def test_a_cancelled_final_only_request_is_aborted() -> None:
    engine = ScriptedEngine(token_delay=0.01)
    ids = tuple(engine.tokenizer.encode("x"))
    request = EngineRequest("f", ids, SamplingParams(max_tokens=500, ignore_eos=True), final_only=True)
    with trio.move_on_after(0.05):
        await _collect(engine, request)
    assert engine.aborted_ids == ["f"] and engine.in_flight == 0


def test_join_of_one_output_is_itself() -> None:
    engine = ScriptedEngine()
    ids = tuple(engine.tokenizer.encode("a"))
    one = trio.run(_collect, engine, EngineRequest("o", ids, SamplingParams(max_tokens=1)))
    assert len(one) == 1 and join_deltas(one) == attrs.evolve(one[0])


def test_prefix_cache_finds_whole_blocks_in_order_and_never_the_last_token() -> None:
    cache = PrefixCache(block_size=4)
    a = list(range(10))  # blocks [0:4] [4:8], and 2 tokens more
    assert cache.read(a) == 0
    assert cache.read(a) == 8
    assert cache.read(a[:8]) == 4  # all of it is cached, but the last token is computed again
    assert cache.read([0, 1, 2, 3, 9, 9, 9, 9, 4, 5, 6, 7, 1]) == 4  # block 1 differs: block 2 is not found
    assert cache.read([9, 1, 2, 3, 4, 5, 6, 7, 1]) == 0  # a block is found only after the ones before it
    assert cache.read([0, 1, 2]) == 0  # no whole block


def test_prefix_cache_forgets_everything_at_capacity() -> None:
    cache = PrefixCache(block_size=2, capacity=4)
    cache.read([1, 2, 3, 4, 5, 6, 7, 8, 0])  # 4 blocks: full
    assert cache.read([1, 2, 3, 4, 0]) == 0  # cleared first, then cached again
    assert cache.read([1, 2, 3, 4, 0]) == 4


async def test_every_output_reports_the_prompts_cached_tokens() -> None:
    engine = ScriptedEngine()
    ids = tuple(engine.tokenizer.encode("x" * 40))  # BOS + 40: two whole 16-token blocks, then 9
    first = await _collect(engine, EngineRequest("a", ids, PARAMS[0]))
    again = await _collect(engine, EngineRequest("b", ids, PARAMS[0]))
    final = await _collect(engine, EngineRequest("c", ids, PARAMS[0], final_only=True))
    assert {o.num_cached_tokens for o in first} == {0}
    assert {o.num_cached_tokens for o in again} == {32} and [o.num_cached_tokens for o in final] == [32]
