"""The scripted engine: final-only delivery (one output that is the sum of the deltas), its prefix cache, its
chat format."""

from __future__ import annotations

import re

import attrs
import pytest
import trio

from braid.engine.base import EngineOutput, EngineRequest, SamplingParams
from braid.engine.scripted import ByteTokenizer, PrefixCache, ScriptedEngine, join_deltas
from braid.errors import BraidError, EngineError, EngineRejected, InvalidRequest
from braid.wire.structured import Structured

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


async def test_on_its_own_clock_untaken_deltas_merge_into_one_output(autojump_clock: trio.testing.MockClock) -> None:
    params = SamplingParams(max_tokens=30, n=2, seed=3, logprobs=1, ignore_eos=True)
    lockstep = ScriptedEngine()
    ids = tuple(lockstep.tokenizer.encode("merge me"))
    steps = await _collect(lockstep, EngineRequest("l", ids, params))
    assert len(steps) == 30  # lockstep (no delay): one output per token

    engine = ScriptedEngine(token_delay=0.01)
    async with engine.open_request(EngineRequest("c", ids, params)) as outputs:
        await trio.sleep(0.105)  # nobody reads: the engine generates 10 steps meanwhile
        first = await outputs.__anext__()
        rest = [o async for o in outputs]
    assert [len(c.token_ids) for c in first.choices] == [10, 10]
    assert len(rest) == 20 and trio.current_time() == pytest.approx(0.30)
    assert join_deltas([first, *rest]) == join_deltas(steps)  # the same completion, merged
    assert engine.finished_total == 1 and engine.in_flight == 0


async def test_a_fault_is_reported_when_generated_not_when_read(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    ids = tuple(engine.tokenizer.encode("x braid:fail@5"))
    reported: list[tuple[float, BraidError]] = []
    request = EngineRequest("f", ids, SamplingParams(max_tokens=50, ignore_eos=True))
    async with engine.open_request(request, lambda err: reported.append((trio.current_time(), err))) as outputs:
        await trio.sleep(1)  # nobody reads
        assert len(reported) == 1 and reported[0][0] == pytest.approx(0.06)
        assert isinstance(reported[0][1], EngineError)
        with pytest.raises(EngineError) as raised:  # the error replaces the untaken outputs
            await outputs.__anext__()
        assert raised.value is reported[0][1]
    assert engine.failed_ids == ["f"] and engine.aborted_ids == [] and engine.in_flight == 0


async def test_a_late_rejection_is_reported_at_the_first_step(autojump_clock: trio.testing.MockClock) -> None:
    for delay in (0.0, 0.5):
        engine = ScriptedEngine(token_delay=delay)
        ids = tuple(engine.tokenizer.encode("x braid:invalid"))
        reported: list[BraidError] = []
        with pytest.raises(EngineRejected):
            async with engine.open_request(
                EngineRequest("r", ids, SamplingParams(max_tokens=5)), reported.append
            ) as outputs:
                await outputs.__anext__()
        assert len(reported) == 1 and isinstance(reported[0], EngineRejected)
        assert engine.failed_ids == ["r"]


async def test_leaving_early_on_its_own_clock_aborts_and_raises_what_the_block_raised(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    ids = tuple(engine.tokenizer.encode("x"))
    request = EngineRequest("a", ids, SamplingParams(max_tokens=500, ignore_eos=True))
    with pytest.raises(KeyError):  # the block's own exception, not a group wrapping it
        async with engine.open_request(request) as outputs:
            await outputs.__anext__()
            raise KeyError("mine")
    with trio.move_on_after(0.05) as scope:  # a cancellation is caught by its own scope
        async with engine.open_request(attrs.evolve(request, request_id="b")) as outputs:
            async for _ in outputs:
                pass
    assert scope.cancelled_caught
    assert engine.aborted_ids == ["a", "b"] and engine.in_flight == 0


# --- structured output: choice only ---------------------------------------------------------------

CHOICES = ("red", "green", "blue", "a much longer choice")


def _choice_params(**fields: object) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 40, "structured_outputs": Structured(choice=CHOICES), **fields})  # type: ignore[arg-type]


async def _texts(engine: ScriptedEngine, params: SamplingParams, prompt: str = "pick one") -> list[tuple[str, str]]:
    ids = tuple(engine.tokenizer.encode(prompt))
    (out,) = await _collect(engine, EngineRequest("s", ids, params, final_only=True))
    return [(c.text, c.finish_reason or "") for c in out.choices]


async def test_choice_emits_one_of_the_choices_then_eos() -> None:
    engine = ScriptedEngine()
    got = await _texts(engine, _choice_params(n=8, seed=3))
    assert all(text in CHOICES and finish == "stop" for text, finish in got)
    assert len({text for text, _ in got}) > 1  # each choice is picked on its own
    ids = tuple(engine.tokenizer.encode("pick one"))
    (out,) = await _collect(engine, EngineRequest("t", ids, _choice_params(), final_only=True))
    (choice,) = out.choices
    assert choice.token_ids[-1] == 1 and engine.tokenizer.decode(choice.token_ids) == choice.text  # EOS


async def test_choice_is_deterministic_by_seed_and_greedy_picks_one() -> None:
    engine = ScriptedEngine()
    seeded = _choice_params(n=4, seed=11)
    assert await _texts(engine, seeded) == await _texts(engine, seeded)
    picks = {tuple(await _texts(engine, _choice_params(n=4, seed=s))) for s in range(8)}
    assert len(picks) > 1  # another seed, another pick
    greedy = await _texts(engine, _choice_params(n=1, temperature=0.0, seed=None))
    assert greedy == await _texts(engine, _choice_params(n=1, temperature=0.0, seed=None))


async def test_max_tokens_and_stop_cut_a_choice() -> None:
    engine = ScriptedEngine()
    only = Structured(choice=("abcdef",))
    assert await _texts(engine, SamplingParams(max_tokens=3, structured_outputs=only)) == [("abc", "length")]
    cut = SamplingParams(max_tokens=10, stop=("cd",), structured_outputs=only)
    assert await _texts(engine, cut) == [("ab", "stop")]


async def test_choice_streams_one_character_per_output() -> None:
    engine = ScriptedEngine()
    ids = tuple(engine.tokenizer.encode("x"))
    only = Structured(choice=("yes",))
    outputs = await _collect(engine, EngineRequest("d", ids, SamplingParams(max_tokens=9, structured_outputs=only)))
    assert [o.choices[0].text for o in outputs] == ["y", "e", "s", ""]


@pytest.mark.parametrize(
    ("structured", "message"),
    [
        (Structured(regex="[a-c]{3}"), "supports only structured_outputs.choice, not regex"),
        (Structured(json='{"type":"object"}', source="response_format"), "not json (from response_format)"),
        (Structured(json_object=True), "not json_object"),
        (Structured(choice=("café",)), "ASCII"),
    ],
    ids=lambda v: getattr(v, "kind", v),
)
async def test_other_constraints_are_refused(structured: Structured, message: str) -> None:
    engine = ScriptedEngine()
    params = SamplingParams(max_tokens=5, structured_outputs=structured)
    with pytest.raises(InvalidRequest, match=re.escape(message)) as info:
        engine.check_structured(params)
    assert info.value.param == structured.source and not isinstance(info.value, EngineRejected)
    # opened without the check first (a caller that skips it): the engine rejects it itself
    ids = tuple(engine.tokenizer.encode("x"))
    with pytest.raises(EngineRejected, match=re.escape(message)):
        await _collect(engine, EngineRequest("r", ids, params))
    assert engine.in_flight == 0


def test_no_constraint_passes_the_check() -> None:
    ScriptedEngine().check_structured(SamplingParams(max_tokens=5))


def _chat(messages: list, tools: list | None = None, **flags: bool) -> str:
    options = {"add_generation_prompt": True, "continue_final_message": False, **flags}
    return ByteTokenizer().apply_chat_template(messages, chat_template=None, template_kwargs={}, tools=tools, **options)


def test_the_chat_format_writes_tools_calls_and_tool_call_ids() -> None:
    call = {"id": "c", "function": {"arguments": {"q": "é"}, "name": "f"}, "type": "function"}
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "d"}]},
        {"role": "tool", "content": "1", "tool_call_id": None},
    ]
    assert _chat(messages, tools) == (
        '<|tools|>\n{"type": "function", "function": {"name": "f"}}\n{"type": "function", "function": {"name": "g"}}\n</s>\n'
        '<|assistant|>\n\n<tool_call>{"id": "c", "function": {"arguments": {"q": "é"}, "name": "f"}, "type": "function"}'
        '</tool_call>\n<tool_call>{"id": "d", "function": {"arguments": {"q": "é"}, "name": "f"}, "type": "function"}'
        "</tool_call></s>\n<|tool|>[None]\n1</s>\n<|assistant|>\n"
    )
    # no tools (or none listed): no tools block; a continued message ends after its last call
    assert _chat(messages[:1], [], add_generation_prompt=False, continue_final_message=True).endswith("</tool_call>")
    assert _chat([{"role": "user", "content": "x"}], []) == "<|user|>\nx</s>\n<|assistant|>\n"


# --- the reply hook: <braid:say>TEXT</braid:say> ---------------------------------------------------

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _say(*scripts: str, before: str = "x ") -> tuple[int, ...]:
    prompt = before + "".join(f"<braid:say>{s}</braid:say>" for s in scripts)
    return tuple(ByteTokenizer().encode(prompt))


async def _said(engine: ScriptedEngine, ids: tuple[int, ...], **fields: object) -> list[tuple[str, str, str | None]]:
    """Each choice's (text, finish_reason, stop_reason), from the joined deltas of a streamed request."""
    params = SamplingParams(**{"max_tokens": 200, **fields})  # type: ignore[arg-type]
    out = join_deltas(await _collect(engine, EngineRequest("say", ids, params)))
    return [(c.text, c.finish_reason or "", c.stop_reason) for c in out.choices]  # type: ignore[misc]


async def test_say_emits_the_script_one_byte_a_step_then_eos() -> None:
    engine = ScriptedEngine()
    ids = _say("multi\nline " + CALL, before="<|user|>\nweather?\n")
    outputs = await _collect(engine, EngineRequest("s", ids, SamplingParams(max_tokens=200, logprobs=2)))
    script = ("multi\nline " + CALL).encode()
    assert [o.choices[0].token_ids for o in outputs] == [(b + 3,) for b in script] + [(1,)]  # then EOS
    assert "".join(o.choices[0].text for o in outputs) == "multi\nline " + CALL
    assert outputs[-1].choices[0].finish_reason == "stop" and outputs[-1].choices[0].stop_reason is None
    for o in outputs:  # the scripted token is the first of its top logprobs
        (delta,) = o.choices
        assert delta.logprobs is not None and next(iter(delta.logprobs[0])) == delta.token_ids[0]
        assert len(delta.logprobs[0]) == 3


async def test_with_several_scripts_choice_k_says_the_kth_modulo_their_number() -> None:
    engine = ScriptedEngine()
    ids = _say("first", CALL)
    for temperature in (1.0, 0.0):
        got = await _said(engine, ids, n=3, temperature=temperature)
        assert got == [("first", "stop", None), (CALL, "stop", None), ("first", "stop", None)]


async def test_max_tokens_cuts_a_script() -> None:
    engine = ScriptedEngine()
    assert await _said(engine, _say("Hello, world"), max_tokens=5) == [("Hello", "length", None)]
    assert await _said(engine, _say("Hello"), max_tokens=5) == [("Hello", "length", None)]  # EOS would be 6th
    assert await _said(engine, _say("Hello"), max_tokens=6) == [("Hello", "stop", None)]


async def test_stop_strings_and_stop_tokens_cut_a_script() -> None:
    engine = ScriptedEngine()
    ids = _say("Hello, world")
    assert await _said(engine, ids, stop=("o, w",)) == [("Hell", "stop", "o, w")]
    assert await _said(engine, ids, stop=("o, w",), include_stop_str_in_output=True) == [("Hello, w", "stop", "o, w")]
    comma = ord(",") + 3
    assert await _said(engine, ids, stop_token_ids=(comma,)) == [("Hello", "stop", comma)]  # type: ignore[list-item]


async def test_after_a_script_min_tokens_and_ignore_eos_draw_letters() -> None:
    engine = ScriptedEngine()
    ids = _say("Hi")
    ((text, finish, _),) = await _said(engine, ids, min_tokens=6)
    assert text.startswith("Hi") and len(text) == 6 and finish == "stop"  # EOS as soon as it may
    ((text, finish, _),) = await _said(engine, ids, ignore_eos=True, max_tokens=30)
    assert text.startswith("Hi") and len(text) == 30 and finish == "length"
    assert set(text[2:]) <= set("abcdefghijklmnopqrstuvwxyz ")


async def test_a_choice_constraint_wins_over_a_script() -> None:
    engine = ScriptedEngine()
    got = await _said(engine, _say("Hello"), structured_outputs=Structured(choice=("yes",)))
    assert got == [("yes", "stop", None)]


async def test_a_script_of_utf8_comes_in_whole_characters() -> None:
    engine = ScriptedEngine()
    text = "é 東京 🙂!"
    outputs = await _collect(engine, EngineRequest("u", _say(text), SamplingParams(max_tokens=100)))
    deltas = [o.choices[0].text for o in outputs]
    assert "".join(deltas) == text and "\ufffd" not in "".join(deltas)
    assert len(outputs) == len(text.encode()) + 1  # still one byte a step: "" while a character is incomplete
    assert deltas[:3] == ["", "é", " "] and "🙂" in deltas
    # cut inside a character: what was held back comes out as the tokenizer decodes it
    cut = await _collect(engine, EngineRequest("c", _say(text), SamplingParams(max_tokens=4)))
    joined = join_deltas(cut).choices[0]
    assert joined.text == "é \ufffd" == engine.tokenizer.decode(joined.token_ids)
    # a stop string cuts the held-back bytes off
    assert await _said(engine, _say(text), stop=(" 東",)) == [("é", "stop", " 東")]


async def test_a_lagging_reader_on_the_engines_clock_gets_the_whole_script(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    ids = _say(CALL, "é" + CALL)
    async with engine.open_request(EngineRequest("l", ids, SamplingParams(max_tokens=500, n=2))) as outputs:
        await trio.sleep(0.25)  # nobody reads meanwhile
        read = [o async for o in outputs]
    assert len(read[0].choices[0].token_ids) > 1  # merged while the reader lagged
    assert [(c.text, c.finish_reason) for c in join_deltas(read).choices] == [(CALL, "stop"), ("é" + CALL, "stop")]


# --- observe: every output as it is made, before any merging --------------------------------------


def _texts_by_choice(outputs: list[EngineOutput]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for o in outputs:
        for d in o.choices:
            texts[d.index] = texts.get(d.index, "") + d.text
    return texts


async def test_observe_sees_each_step_while_a_lagging_reader_gets_them_merged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    params = SamplingParams(max_tokens=30, n=2, seed=3, logprobs=1, ignore_eos=True, stop=("zz",))
    ids = _say("Hello, observer", "é" + CALL)
    steps = await _collect(ScriptedEngine(), EngineRequest("l", ids, params))  # lockstep: one output a step

    engine = ScriptedEngine(token_delay=0.01)
    observed: list[EngineOutput] = []
    async with engine.open_request(EngineRequest("c", ids, params), observe=observed.append) as outputs:
        await trio.sleep(0.105)  # nobody reads: 10 steps are made and observed meanwhile
        assert observed == steps[:10]
        read = [o async for o in outputs]
    assert [len(c.token_ids) for c in read[0].choices] == [10, 10]  # the reader got them merged
    assert observed == steps  # every step, once, in order
    assert _texts_by_choice(observed) == _texts_by_choice(read) == _texts_by_choice(steps)
    assert join_deltas(observed) == join_deltas(read)


async def test_observe_comes_before_deliver_and_sees_what_deliver_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    events: list[tuple[str, str]] = []
    taking = [False]

    def deliver(output: EngineOutput) -> bool:
        events.append(("deliver", output.choices[0].text))
        return taking[0]

    def observe(output: EngineOutput) -> None:
        events.append(("observe", output.choices[0].text))

    request = EngineRequest("d", _say("abcdef"), SamplingParams(max_tokens=50))
    async with engine.open_request(request, None, deliver, observe=observe) as outputs:
        await trio.sleep(0.025)  # "a" refused by deliver, "b" merged into it: both observed
        taking[0] = True
        first = await outputs.__anext__()
        await trio.sleep(1)
        assert [o async for o in outputs] == []  # the rest was delivered
    assert first.choices[0].text == "ab"
    assert events == [
        ("observe", "a"),
        ("deliver", "a"),
        ("observe", "b"),
        *((kind, c) for c in "cdef" for kind in ("observe", "deliver")),
        ("observe", ""),  # EOS
        ("deliver", ""),
    ]


@pytest.mark.parametrize("final_only", [False, True])
async def test_observe_in_lockstep_sees_each_step_once(final_only: bool) -> None:
    engine = ScriptedEngine()
    params = SamplingParams(max_tokens=12, n=2, seed=5, ignore_eos=True)
    ids = tuple(engine.tokenizer.encode("lockstep"))
    steps = await _collect(engine, EngineRequest("s", ids, params))
    observed: list[EngineOutput] = []
    async with engine.open_request(
        EngineRequest("o", ids, params, final_only=final_only), observe=observed.append
    ) as outputs:
        read = [o async for o in outputs]
    assert observed == steps and len(observed) == 12
    assert join_deltas(read) == join_deltas(observed)
    assert len(read) == (1 if final_only else 12)


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_a_failure_is_not_observed(delay: float, autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=delay)
    observed: list[EngineOutput] = []
    ids = tuple(engine.tokenizer.encode("x braid:fail@3"))
    request = EngineRequest("f", ids, SamplingParams(max_tokens=50, ignore_eos=True))
    with pytest.raises(EngineError):
        async with engine.open_request(request, observe=observed.append) as outputs:
            async for _ in outputs:
                pass
    assert len(observed) == 3 and not any(o.finished for o in observed)
