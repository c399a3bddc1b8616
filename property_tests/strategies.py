"""Hypothesis strategies for scenarios (property_tests.harness.Scenario).

Values are drawn from small sets of "interesting" numbers rather than continuous ranges: they
shrink to readable examples, and the timings hit the boundaries (heartbeat, stall timeout, token
delay) often.
"""

from __future__ import annotations

from typing import TypedDict

from hypothesis import strategies as st

from property_tests.harness import CHAT_INVALID_BODIES, INVALID_BODIES, PARSERS, Scenario

TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 40.0])


_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
_THINK = "<think>The user wants the weather.</think>"
SAYS: dict[str, list[str]] = {
    "hermes": [
        "It is sunny.",
        _CALL,
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    ],
    "pythonic": ["It is sunny.", "[get_weather(city='Zürich')]", "[get_weather(city='Paris'), get_time()]"],
    "qwen3_coder": [
        "It is sunny.",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    ],
    "xlam": [
        "It is sunny.",
        '[{"name": "get_weather", "arguments": {"city": "Zürich"}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
    ],
    "hermes+qwen3": [_THINK + "It is sunny.", "Thinking without an end", _CALL, _THINK + _CALL],
}
"""What the scripted engine may write in a parsing scenario, per server (the keys of PARSERS)."""


class _ParsingFields(TypedDict, total=False):
    """The parsing fields of a Scenario (left out otherwise: Scenario's defaults)."""

    parser: str | None
    says: tuple[str, ...]
    tool_choice: str
    parallel: bool
    include_reasoning: bool


class _ChatFields(TypedDict, total=False):
    """The chat fields of a Scenario (left out of a completions request: Scenario's defaults)."""

    chat: str | None
    tails: tuple[str | None, ...]
    add_generation_prompt: bool


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    stream: bool | None = None,
    max_prompts: int = 64,
    faults: bool | None = None,
    client_events: bool | None = None,
    invalid: bool | None = False,
    stall: bool = False,
    stalled_reader: bool = False,
    chat: bool = False,
    parsing: bool = False,
) -> Scenario:
    """A request, its engine's timing and faults, and what the client and server do meanwhile.

    ``faults`` / ``client_events``: True forces at least one engine fault / one client or server
    event (disconnect, stall, drain), False forbids them, None draws. ``invalid`` the same for an
    invalid body. ``stalled_reader``: the client stops reading after its first write, for longer
    than the engine takes to fail and well within the stall timeout, while the engine generates on
    its own clock and the channel is small: failures must abort the batch while every driver waits.

    ``chat``: a chat request instead, on the single route (one conversation) or the batch route
    (one per prompt); each conversation is its user message (the prompt, fault hooks included),
    maybe followed by an assistant message (what echo repeats when the reply has that role), with
    a generation prompt or continuing its last message.

    ``parsing``: a chat request with tools on a server with tool-call (and maybe reasoning)
    parsers, whose engine writes tool calls, reasoning or text in that server's format
    (:data:`SAYS`), one script per choice; long enough ``max_tokens`` for most to finish.
    """
    chat = chat or parsing
    route = draw(st.sampled_from(["batch", "single"])) if chat else None
    num = 1 if route == "single" else draw(st.one_of(st.integers(1, 4), st.integers(1, max_prompts)))
    fillers = draw(st.lists(st.text("xyz ", max_size=4), min_size=num, max_size=num))
    prompts = [f"p{i}{f}" for i, f in enumerate(fillers)]
    want_faults = draw(st.booleans()) if faults is None else faults
    if want_faults:
        kind = draw(st.sampled_from(["fail", "invalid", "both"]))
        if kind in ("fail", "both"):
            i = draw(st.integers(0, num - 1))
            prompts[i] += f" braid:fail@{draw(st.integers(0, 6))}"
        if kind in ("invalid", "both"):
            i = draw(st.integers(0, num - 1))
            prompts[i] += " braid:invalid"
    is_stream = draw(st.booleans()) if stream is None else stream
    echo = draw(st.booleans())
    if parsing:
        max_tokens = draw(st.sampled_from([3, 30, 200, 200, 200]))
    else:
        max_tokens = draw(st.integers(0 if echo and not chat else 1, 6))
    include_usage = is_stream and draw(st.booleans())
    events = draw(st.booleans()) if client_events is None else client_events
    disconnect_at = pause = drain = None
    if events:
        which = draw(st.sets(st.sampled_from(["disconnect", "pause", "drain"]), min_size=1))
        if "disconnect" in which:
            disconnect_at = draw(TIMES)
        if "pause" in which:
            pause = (draw(TIMES), draw(st.sampled_from([1.0, 6.0, 40.0, 100.0])))
        if "drain" in which:
            drain = (draw(TIMES), draw(st.sampled_from([0.0, 0.5, 2.0, 10.0])))
    if stall:
        pause = (draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])), draw(st.sampled_from([10.0, 40.0])))
    if stalled_reader:
        pause = (draw(st.sampled_from([0.0, 0.5])), 100.0)
    bad = None
    bodies = CHAT_INVALID_BODIES if chat else INVALID_BODIES
    if parsing:  # its server has --enable-auto-tool-choice
        bodies = {k: v for k, v in bodies.items() if k != "tool_choice auto"}
    if invalid is None:
        bad = draw(st.none() | st.sampled_from(sorted(bodies)))
    elif invalid:
        bad = draw(st.sampled_from(sorted(bodies)))
    chat_fields: _ChatFields = {}
    if chat:
        chat_fields = {
            "chat": route,
            "tails": tuple(draw(st.lists(st.sampled_from([None, "", "ok", "a b"]), min_size=1, max_size=3))),
            "add_generation_prompt": draw(st.booleans()),
        }
    parsing_fields: _ParsingFields = {}
    if parsing:
        parser = draw(st.sampled_from(sorted(PARSERS)))
        parsing_fields = {
            "parser": parser,
            # the last script of each format says the most (two calls, or reasoning and a call)
            "says": tuple(draw(st.lists(st.sampled_from([*SAYS[parser], SAYS[parser][-1]]), min_size=1, max_size=2))),
            "tool_choice": draw(st.sampled_from(["auto", "auto", "auto", "none"])),
            # hermes and qwen3_coder turn parallel_tool_calls false into a structural tag, which
            # the scripted engine refuses (it runs only choice constraints)
            "parallel": parser != "pythonic" or draw(st.booleans()),
            "include_reasoning": draw(st.booleans()),
        }
    return Scenario(
        **chat_fields,
        **parsing_fields,
        prompts=tuple(prompts),
        n=(n := draw(st.integers(1, 4))),
        max_tokens=max_tokens,
        stream=is_stream,
        include_usage=include_usage,
        continuous_usage=include_usage and draw(st.booleans()),
        echo=echo,
        logprobs=draw(st.none() | st.integers(0, 3)),
        ignore_eos=draw(st.booleans()),
        seed=draw(st.none() | st.integers(0, 3)),
        invalid=bad,
        token_delay=draw(st.sampled_from([0.5, 1.0] if stalled_reader else [0.0, 0.5, 1.0])),
        step_delays=tuple(
            tuple(p)
            for p in draw(
                st.lists(st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.5, 3.0, 20.0]), max_size=4), min_size=1, max_size=4)
            )
        ),
        read_delay=draw(st.sampled_from([0.0, 0.0, 0.2, 2.0])),
        pause=pause,
        disconnect_at=disconnect_at,
        drain=drain,
        heartbeat=draw(st.sampled_from([0.25, 1.0, 3.0, 15.0])),
        stall_timeout=draw(st.sampled_from([1.0, 5.0] if stall else [30.0] if stalled_reader else [1.0, 5.0, 30.0])),
        buffer=draw(st.sampled_from([1, 2] if stall or stalled_reader else [1, 2, 8, 64])),
        # n <= 4 (drawn above), so every request fits the slots
        max_in_flight=(slots := draw(st.sampled_from([0, 4, 5, 8]))),
        reserve=draw(st.sampled_from([0, 1])) if slots else 0,
        priority=draw(st.sampled_from([0, 0, 0, -1, 2])),
        # the background class holds at most BACKGROUND_SLOTS (property_tests/test_stateful.py)
        # of the slots: a larger n is a 400
        background=n <= 2 and draw(st.sampled_from([False, False, True])),
    )
