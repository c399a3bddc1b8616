"""The scripted engine's final-only delivery: one output that is the sum of the deltas."""

from __future__ import annotations

import attrs
import pytest
import trio

from braid.engine.base import EngineOutput, EngineRequest, SamplingParams
from braid.engine.scripted import ScriptedEngine, join_deltas
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
