"""braid.batch.group on the scripted engine: lines run together answer as each would alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from braid.batch.group import Left, joint_plan, run_group
from braid.batch.validate import Runnable
from braid.engine.scripted import ScriptedEngine
from braid.errors import EngineError, EngineUnavailable
from braid.metrics import Metrics
from braid.routes import chat, completions
from braid.routes.common import AppState, JsonResponse, Prepare, View
from braid.settings import Settings

JSON = "application/json"


def state(engine: ScriptedEngine | None = None, **settings: Any) -> AppState:
    engine = engine or ScriptedEngine(token_delay=0.001)
    return AppState(engine, Settings(**settings), Metrics(), new_id=lambda: "0123456789abcdef", now=lambda: 1234.5)


def lines(*bodies: dict[str, Any]) -> list[Runnable]:
    return [Runnable(i + 1, f"c{i + 1}", json.dumps(b).encode()) for i, b in enumerate(bodies)]


async def run(st: AppState, prepare: Prepare, group: list[Runnable]) -> tuple[Left, dict[str, JsonResponse]]:
    answers: dict[str, JsonResponse] = {}

    async def answer(line: Runnable, result: JsonResponse) -> None:
        assert line.custom_id not in answers, "a line answered twice"
        answers[line.custom_id] = result

    left = await run_group(st, prepare, group, answer)
    return left, answers


async def alone(view: View, body: bytes, engine: ScriptedEngine | None = None) -> JsonResponse:
    async def read_body() -> bytes:
        return body

    result = await view(state(engine), read_body, content_type=JSON, request_id=None, background=True)
    assert isinstance(result, JsonResponse)
    return result


def prompts_histogram(st: AppState) -> tuple[float, float]:
    """How many runs reached the engine, and their prompts in all."""
    get = st.metrics.registry.get_sample_value
    return get("braid_request_prompts_count") or 0.0, get("braid_request_prompts_sum") or 0.0


COMPLETIONS: list[dict[str, Any]] = [
    {"prompt": "Hello", "max_tokens": 5, "temperature": 0},
    {"prompt": ["one", "two", "three"], "max_tokens": 4, "temperature": 1, "seed": 7},
    {"prompt": [[72, 105], [33, 34, 35]], "max_tokens": 3, "logprobs": 2, "echo": True},
    {"prompt": "Stop here", "max_tokens": 12, "stop": ["e"], "return_token_ids": True},
    {"prompt": "Cached?", "max_tokens": 1, "prompt_logprobs": 1},
]


async def test_completions_lines_run_as_one_and_answer_as_each_would_alone() -> None:
    st = state()
    group = lines(*COMPLETIONS)
    left, answers = await run(st, completions.prepare, group)
    assert left == Left()
    assert prompts_histogram(st) == (1.0, 8.0)  # one run of every line's prompts
    assert st.engine.in_flight == 0  # type: ignore[attr-defined]
    for line in group:
        expected = await alone(completions.completions, line.body)
        got = answers[line.custom_id]
        assert (got.status, json.loads(got.body)) == (expected.status, json.loads(expected.body)), line.custom_id
        assert got.headers == expected.headers


CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0},
    {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
        "max_completion_tokens": 6,
        "logprobs": True,
        "top_logprobs": 2,
    },
    {"messages": [{"role": "user", "content": "Again"}], "max_tokens": 3, "seed": 3, "temperature": 1},
]


async def test_chat_lines_run_as_one_and_answer_as_each_would_alone() -> None:
    st = state()
    group = lines(*CHATS)
    left, answers = await run(st, chat.prepare, group)
    assert left == Left()
    assert prompts_histogram(st) == (1.0, 3.0)
    for line in group:
        expected = await alone(chat.chat_completions, line.body)
        assert json.loads(answers[line.custom_id].body) == json.loads(expected.body), line.custom_id


async def test_each_line_is_answered_as_its_own_prompts_end() -> None:
    # The first line is long, the second short: the short one's answer comes while the long one runs.
    st = state(ScriptedEngine(token_delay=0.01))
    order: list[str] = []
    at: dict[str, float] = {}

    async def answer(line: Runnable, result: JsonResponse) -> None:
        order.append(line.custom_id)
        at[line.custom_id] = trio.current_time()

    group = lines(
        {"prompt": "long", "max_tokens": 40, "ignore_eos": True},
        {"prompt": "short", "max_tokens": 2, "ignore_eos": True},
    )
    assert await run_group(st, completions.prepare, group, answer) == Left()
    assert order == ["c2", "c1"]
    assert at["c1"] - at["c2"] > 0.2  # 38 more tokens of 10 ms each: c2 did not wait for them


async def test_a_line_the_route_refuses_is_answered_with_its_error_and_the_rest_run() -> None:
    st = state()
    group = lines(
        {"prompt": "ok", "max_tokens": 2},
        {"prompt": "ok", "max_tokens": 2, "model": "nope"},
        {"prompt": "x" * 3000, "max_tokens": 2},  # more tokens than the context, found once tokenized
        {"prompt": "ok", "max_tokens": 2, "stream": True},
    )
    left, answers = await run(st, completions.prepare, group)
    assert left == Left()
    assert answers["c1"].status == 200
    for cid in ("c2", "c3"):
        expected = await alone(completions.completions, group[int(cid[1:]) - 1].body)
        assert (answers[cid].status, answers[cid].body) == (expected.status, expected.body)
        assert expected.status in (400, 404)
    assert answers["c4"].status == 400 and json.loads(answers["c4"].body)["error"]["param"] == "stream"
    assert prompts_histogram(st) == (1.0, 1.0)


async def test_lines_of_another_n_or_priority_are_given_back() -> None:
    st = state()
    group = lines(
        {"prompt": "a", "max_tokens": 2},
        {"prompt": "b", "max_tokens": 2, "n": 2},
        {"prompt": "c", "max_tokens": 2, "priority": -1},
        {"prompt": "d", "max_tokens": 2},
    )
    left, answers = await run(st, completions.prepare, group)
    assert left == Left((group[1], group[2]), None)
    assert sorted(answers) == ["c1", "c4"]


async def test_an_engine_failure_gives_back_every_line_without_an_answer() -> None:
    st = state(ScriptedEngine(token_delay=0.01))
    group = lines(
        {"prompt": "quick", "max_tokens": 1, "ignore_eos": True},
        {"prompt": "braid:fail@3", "max_tokens": 20, "ignore_eos": True},
        {"prompt": "slow", "max_tokens": 30, "ignore_eos": True},
    )
    left, answers = await run(st, completions.prepare, group)
    assert sorted(answers) == ["c1"]
    assert left.lines == (group[1], group[2]) and isinstance(left.error, EngineError)
    assert st.engine.in_flight == 0  # type: ignore[attr-defined]
    assert st.admission.in_use == 0 and st.admission.waiting == 0


async def test_a_drain_ends_a_running_group_and_gives_back_what_is_unanswered() -> None:
    engine = ScriptedEngine(token_delay=0.01)
    st = state(engine)
    group = lines(
        {"prompt": "quick", "max_tokens": 1, "ignore_eos": True},
        *({"prompt": f"p{i}", "max_tokens": 200, "ignore_eos": True} for i in range(3)),
    )
    answers: dict[str, JsonResponse] = {}

    async def answer(line: Runnable, result: JsonResponse) -> None:
        answers[line.custom_id] = result
        st.draining = True  # the drain starts once the first line is answered

    with trio.fail_after(1):  # not the 2 s the long lines would take
        left = await run_group(st, completions.prepare, group, answer)
    assert sorted(answers) == ["c1"] and answers["c1"].status == 200
    assert left.lines == tuple(group[1:]) and isinstance(left.error, EngineUnavailable)
    assert engine.in_flight == 0 and engine.aborted_total == 3


async def test_a_group_is_bounded_by_its_job_not_by_the_request_timeout() -> None:
    # 20 tokens of 10 ms each: a line alone outlives a 0.05 s --request-timeout; in a group it
    # is bounded by its job's window instead (one deadline cannot be every line's).
    engine = ScriptedEngine(token_delay=0.01)
    st = state(engine, request_timeout=0.05)
    group = lines(*({"prompt": f"p{i}", "max_tokens": 20, "ignore_eos": True} for i in range(3)))
    left, answers = await run(st, completions.prepare, group)
    assert left == Left() and {r.status for r in answers.values()} == {200}

    async def read_body() -> bytes:
        return group[0].body

    by_itself = state(ScriptedEngine(token_delay=0.01), request_timeout=0.05)
    result = await completions.completions(by_itself, read_body, content_type=JSON, request_id=None, background=True)
    assert isinstance(result, JsonResponse) and result.status == 408


async def test_a_draining_server_gives_back_every_line_unrun() -> None:
    st = state()
    st.draining = True
    group = lines({"prompt": "a", "max_tokens": 2})
    left, answers = await run(st, completions.prepare, group)
    assert answers == {} and left.lines == tuple(group) and isinstance(left.error, EngineUnavailable)


async def test_cancelling_a_group_aborts_its_engine_requests() -> None:
    engine = ScriptedEngine(token_delay=0.01)
    st = state(engine)
    group = lines(*({"prompt": f"p{i}", "max_tokens": 500, "ignore_eos": True} for i in range(4)))
    with trio.move_on_after(0.1):
        await run(st, completions.prepare, group)
    assert engine.in_flight == 0
    assert engine.aborted_total == 4
    assert st.admission.in_use == 0 and st.admission.waiting == 0


def test_a_joint_plan_needs_one_n() -> None:
    async def plans() -> list[Any]:
        st = state()
        return [
            (await completions.prepare(st, json.dumps(b).encode(), None, float("inf"))).plan
            for b in ({"prompt": ["a", "b"], "max_tokens": 1}, {"prompt": "c", "max_tokens": 1, "n": 2})
        ]

    first, second = trio.run(plans)
    plan, where = joint_plan([first, first])
    assert [i.prompt_idx for i in plan.items] == [0, 1, 2, 3] and where == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match="share n"):
        joint_plan([first, second])
