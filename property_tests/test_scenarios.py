"""Plain @given properties: one scenario per example, one trio.run on a virtual clock each.

Every emitted sequence is checked against every invariant of model/stream.py; a failure prints
the violated invariants (by number and name) and the shrunk scenario.
"""

from __future__ import annotations

import attrs
from hypothesis import example, given, note
from hypothesis import strategies as st

from model import check_server, check_trace
from property_tests.harness import Scenario, run_scenario
from property_tests.strategies import SAYS, scenarios


def assert_model(s: Scenario) -> dict:
    trace, engine = run_scenario(s)
    violations = check_trace(trace) + check_server([trace], s.max_in_flight, s.reserve)
    if violations:
        note(f"scenario: {s!r}")
        for r in trace["records"][:200]:
            note(f"  {r}")
    assert not violations, "\n".join(map(str, violations))
    assert engine.in_flight == 0
    assert len(engine.aborted_ids) == len(set(engine.aborted_ids))
    return trace


@given(scenarios(stream=True))
def test_streams_follow_the_model(s: Scenario) -> None:
    """Any stream: faults, disconnects, slow readers, stalls, drains, usage, echo, logprobs."""
    assert_model(s)


@given(scenarios(stream=False))
def test_non_streaming_responses_follow_the_model(s: Scenario) -> None:
    """Any non-streaming request: all-or-nothing, usage, cleanup after errors and disconnects."""
    assert_model(s)


@given(scenarios(faults=True, client_events=False, max_prompts=16))
def test_engine_failures_abort_the_batch(s: Scenario) -> None:
    """A failing or late-rejected prompt: one error (event + [DONE], or JSON), siblings aborted at once."""
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=True, max_prompts=16))
def test_client_and_server_events_abort_the_batch(s: Scenario) -> None:
    """Disconnects, stalled readers and drains: silence afterwards, every engine request aborted at once."""
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=False, stall=True, max_prompts=16))
def test_a_stalled_reader_gets_408_and_aborts_the_batch(s: Scenario) -> None:
    """A client that stops reading: StreamStalled (408 error event once it reads again), all aborted at once."""
    assert_model(s)


@given(scenarios(stream=True, faults=True, client_events=False, stalled_reader=True, max_prompts=16))
@example(  # the case measured on the HTTP server: a batch, one prompt failing, a client reading nothing
    Scenario(
        prompts=tuple(f"p{i}" + (" braid:fail@3" if i == 5 else "") for i in range(8)),
        max_tokens=6,
        ignore_eos=True,
        token_delay=0.5,
        pause=(0.0, 100.0),
        stall_timeout=30.0,
        buffer=1,
    )
)
def test_a_failure_aborts_the_batch_while_the_reader_is_stalled(s: Scenario) -> None:
    """The engine fails a prompt while the client reads nothing and every driver waits on the full
    channel: the batch is aborted when the engine reports the failure (I10's bound runs from the
    engine_failure record), not when the failing driver would next have read."""
    assert_model(s)


@given(scenarios(faults=False, client_events=False, invalid=True, max_prompts=4))
def test_invalid_bodies_are_rejected_before_any_engine_work(s: Scenario) -> None:
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=False, max_prompts=16))
def test_a_clean_stream_assembles_to_the_non_streaming_response(s: Scenario) -> None:
    """Differential: without faults the streamed choices, joined, are the non-streaming response's."""
    s = attrs.evolve(s, stall_timeout=1e4)  # a slow reader must not stall out here
    streamed = assert_model(s)
    plain = assert_model(attrs.evolve(s, stream=False, include_usage=False, continuous_usage=False))
    texts: dict[int, str] = {}
    for r in streamed["records"]:
        if r["kind"] == "sse" and r["event"]["type"] == "chunk":
            c = r["event"]["data"]["choices"][0]
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    (body,) = [r["body"] for r in plain["records"] if r["kind"] == "json"]
    assert [c["text"] for c in body["choices"]] == [texts[j] for j in range(len(body["choices"]))]


# Chat: the same properties through the served chat view (single and batch routes).


@given(scenarios(stream=True, chat=True))
def test_chat_streams_follow_the_model(s: Scenario) -> None:
    """Any chat stream: role, echo and content chunks, usage, faults, disconnects, stalls, drains."""
    assert_model(s)


@given(scenarios(stream=False, chat=True))
def test_chat_non_streaming_responses_follow_the_model(s: Scenario) -> None:
    """Any non-streaming chat request: all-or-nothing, roles, echo, usage, cleanup."""
    assert_model(s)


@given(scenarios(faults=True, client_events=False, max_prompts=16, chat=True))
def test_chat_engine_failures_abort_the_batch(s: Scenario) -> None:
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=True, max_prompts=16, chat=True))
def test_chat_client_and_server_events_abort_the_batch(s: Scenario) -> None:
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=False, stall=True, max_prompts=16, chat=True))
def test_a_stalled_chat_reader_gets_408_and_aborts_the_batch(s: Scenario) -> None:
    assert_model(s)


@given(scenarios(faults=False, client_events=False, invalid=True, max_prompts=4, chat=True))
def test_invalid_chat_bodies_are_rejected_before_any_engine_work(s: Scenario) -> None:
    assert_model(s)


@given(scenarios(stream=True, faults=False, client_events=False, max_prompts=16, chat=True))
def test_a_clean_chat_stream_assembles_to_the_non_streaming_response(s: Scenario) -> None:
    """Differential: without faults each streamed choice (its role, then its deltas' contents
    joined, echo first) is the non-streaming response's message."""
    s = attrs.evolve(s, stall_timeout=1e4)
    streamed = assert_model(s)
    plain = assert_model(attrs.evolve(s, stream=False, include_usage=False, continuous_usage=False))
    roles: dict[int, str] = {}
    texts: dict[int, str] = {}
    for r in streamed["records"]:
        if r["kind"] == "sse" and r["event"]["type"] == "chunk":
            c = r["event"]["data"]["choices"][0]
            if "role" in c["delta"]:
                roles[c["index"]] = c["delta"]["role"]
            texts[c["index"]] = texts.get(c["index"], "") + c["delta"]["content"]
    (body,) = [r["body"] for r in plain["records"] if r["kind"] == "json"]
    got = [(c["message"]["role"], c["message"]["content"]) for c in body["choices"]]
    assert got == [(roles[j], texts[j]) for j in range(len(body["choices"]))]


# Chat through vLLM's tool-call and reasoning parsers (hermes, pythonic, qwen3_coder, hermes with
# qwen3), on the scripted engine writing calls and reasoning in each format.


@given(scenarios(stream=True, parsing=True, max_prompts=4))
def test_parsed_chat_streams_follow_the_model(s: Scenario) -> None:
    """Any parsed chat stream: call pieces, reasoning, finish reasons; with faults, disconnects,
    stalls and drains as for any stream."""
    assert_model(s)


@given(scenarios(stream=False, parsing=True, max_prompts=4))
def test_parsed_chat_responses_follow_the_model(s: Scenario) -> None:
    assert_model(s)


@given(
    scenarios(stream=True, parsing=True, faults=False, client_events=False, max_prompts=2),
    st.sampled_from([0.0, 0.2, 2.0, 7.0]),
    st.sampled_from([1, 2]),
)
@example(
    Scenario(("p0",), chat="single", parser="pythonic", says=(SAYS["pythonic"][-1],), max_tokens=200, parallel=False),
    2.0,
    1,
)
@example(
    Scenario(
        ("p0", "p1"),
        chat="batch",
        parser="hermes+qwen3",
        says=(SAYS["hermes+qwen3"][-1],),
        n=2,
        max_tokens=200,
        include_reasoning=False,
    ),
    7.0,
    2,
)
def test_parsed_calls_survive_any_split_of_the_stream(s: Scenario, read_delay: float, buffer: int) -> None:
    """The split-invariance property, end to end: the engine generates on its own clock while the
    reader lags by ``read_delay`` per write through a channel of ``buffer`` outputs, so the outputs
    it takes carry several engine steps each, split wherever the timing falls. Every finished
    choice's streamed calls, content and reasoning, rebuilt, are the parse of its whole text (I19)."""
    s = attrs.evolve(s, token_delay=1.0, read_delay=read_delay, buffer=buffer, stall_timeout=1e6, heartbeat=1e5)
    assert_model(s)
