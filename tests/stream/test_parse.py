"""braid.stream.parse: the rules around a request's parsers, with a small parser of braid's own
(vLLM's parsers behind braid's adapter are tests/engine/test_vllm_parsers.py's).

The parser here reads ``[think]...[/think]`` as reasoning and ``{name:args}`` as a call, a
character at a time (so it is split-safe by construction): what is checked is what
:class:`~braid.stream.parse.ChoiceParsing` does with what a parser gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from braid.engine.base import ChoiceDelta, EngineOutput
from braid.engine.tool_calls import ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta, join, rebuild
from braid.stream.parse import ChoiceParsing, ParsingOptions
from braid.wire.chat_request import ToolChoice


@attrs.define
class BraceParser:
    """``{name:args}`` is a call, ``[think]..[/think]`` reasoning, the rest content."""

    made: list[int]
    state: str = "content"
    buf: str = ""
    calls: int = 0

    def feed(self, text: str, token_ids: Sequence[int], *, finished: bool) -> ParsedDelta:
        content, reasoning, pieces = [], [], []
        for ch in text:
            self.buf += ch
            if self.state == "content":
                if "[think]".startswith(self.buf):
                    if self.buf == "[think]":
                        self.state, self.buf = "think", ""
                    continue
                if self.buf == "{":
                    self.state, self.buf = "name", ""
                    continue
                content.append(self.buf)
                self.buf = ""
            elif self.state == "think":
                if self.buf.endswith("[/think]"):
                    reasoning.append(self.buf[: -len("[/think]")])
                    self.state, self.buf = "content", ""
                else:  # hold back what may start the closing tag
                    keep = next(
                        k for k in range(len(self.buf), -1, -1) if "[/think]".startswith(self.buf[len(self.buf) - k :])
                    )
                    reasoning.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
            elif self.state == "name":
                if ch == ":":
                    pieces.append(ToolCallDelta(self.calls, f"call-{self.calls}", self.buf[:-1], ""))
                    self.state, self.buf = "args", ""
            elif self.state == "args":
                if ch == "}":
                    if self.buf[:-1]:
                        pieces.append(ToolCallDelta(self.calls, None, None, self.buf[:-1]))
                    self.calls += 1
                    self.state, self.buf = "content", ""
                else:
                    pieces.append(ToolCallDelta(self.calls, None, None, ch))
                    self.buf = ""
        return ParsedDelta("".join(content), "".join(reasoning), tuple(pieces))

    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput:
        return rebuild([BraceParser([]).feed(text, token_ids, finished=True)])

    def reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        return len(token_ids) // 2


def parsing(
    mode: str = "auto", *, stream: bool = True, n: int = 1, prompts: int = 1, **options: object
) -> ChoiceParsing:
    made: list[int] = []
    return ChoiceParsing.create(
        ParsingOptions(ToolChoice(mode, parallel=bool(options.pop("parallel", True))), **options),  # type: ignore[arg-type]
        [(1, 2, 3)] * prompts,
        n,
        stream,
        lambda ids: BraceParser(made),
    )


def out(*deltas: ChoiceDelta) -> EngineOutput:
    return EngineOutput((1, 2, 3), deltas, finished=any(d.finish_reason for d in deltas))


TEXT = "[think]hm[/think]ok {f:1}{g:22}"


def test_streamed_steps_taken_late_equal_steps_taken_one_by_one() -> None:
    # one step per character, observed where the engine makes them; the renderer takes them
    # after every step in one run, after the last in the other (a reader that lagged)
    eager, lagging = parsing(), parsing()
    observe_eager, observe_lagging = eager.observer(0), lagging.observer(0)
    assert observe_eager is not None and observe_lagging is not None
    taken = []
    for i, ch in enumerate(TEXT):
        last = i == len(TEXT) - 1
        step = out(ChoiceDelta(0, ch, (i,), finish_reason="stop" if last else None))
        observe_eager(step)
        observe_lagging(step)
        taken.append(eager.take(0, finished=last))
    merged = lagging.take(0, finished=True)
    assert (
        rebuild(taken)
        == rebuild([merged])
        == ParsedOutput("ok ", "hm", (ToolCall("call-0", "f", "1"), ToolCall("call-1", "g", "22")))
    )
    assert lagging.take(0, finished=True) == ParsedDelta()  # taken once


def test_join_keeps_one_piece_per_call_with_its_id_and_name_first() -> None:
    deltas = [
        ParsedDelta("a", "", (ToolCallDelta(0, "x", "f", ""),)),
        ParsedDelta("", "r", (ToolCallDelta(0, None, None, "{"), ToolCallDelta(1, "y", "g", "1"))),
        ParsedDelta("b", "", (ToolCallDelta(0, None, None, "}"),)),
    ]
    joined = join(deltas)
    assert joined == ParsedDelta("ab", "r", (ToolCallDelta(0, "x", "f", "{}"), ToolCallDelta(1, "y", "g", "1")))
    assert rebuild([joined]) == rebuild(deltas)


@pytest.mark.parametrize("stream", [True, False])
def test_without_parallel_calls_a_choice_keeps_its_first_call(stream: bool) -> None:
    p = parsing(parallel=False, stream=stream)
    if stream:
        observe = p.observer(0)
        assert observe is not None
        observe(out(ChoiceDelta(0, TEXT, (1,), finish_reason="stop")))
        calls = rebuild([p.take(0, finished=True)]).tool_calls
    else:
        assert p.observer(0) is None  # a whole response is parsed once, at the end
        p.gather(0, TEXT[:5], (1,))
        p.gather(0, TEXT[5:], (2,))
        calls = p.whole(0).tool_calls
    assert [c.name for c in calls] == ["f"]


def test_reasoning_is_dropped_when_not_included_and_counted_when_asked() -> None:
    p = parsing(include_reasoning=False, count_reasoning=True, stream=False)
    p.gather(0, TEXT, (1, 2, 3, 4))
    whole = p.whole(0)
    assert whole.reasoning is None and whole.content == "ok " and p.reasoning_tokens == 2
    assert parsing().reasoning_tokens is None  # no reasoning parser: usage says nothing


@pytest.mark.parametrize(
    ("mode", "stream", "text", "engine", "expected"),
    [
        ("auto", True, "{f:1}", "stop", "tool_calls"),
        ("auto", True, "{f:1}", "length", "length"),
        ("auto", True, "plain", "stop", "stop"),
        ("named", True, "{f:1}", "stop", "stop"),
        ("required", True, "{f:1}", "stop", "tool_calls"),
        ("auto", False, "{f:1}", "stop", "tool_calls"),
        ("auto", False, "{f:1}", "length", "tool_calls"),  # vLLM's whole response: any stop
        ("auto", False, "plain", "stop", "stop"),
        ("required", False, "plain", "stop", "tool_calls"),  # vLLM says so under "required"
        ("required", False, "{f:1}", "length", "length"),
        ("named", False, "{f:1}", "stop", "stop"),
    ],
)
def test_finish_reason_as_vllms_server_gives_it(mode: str, stream: bool, text: str, engine: str, expected: str) -> None:
    p = parsing(mode, stream=stream)
    if stream:
        observe = p.observer(0)
        assert observe is not None
        observe(out(ChoiceDelta(0, text, (1,), finish_reason=engine)))
        p.take(0, finished=True)
    else:
        p.gather(0, text, (1,))
        p.whole(0)
    assert p.finish_reason(0, engine) == expected


def test_a_forced_call_leaves_content_empty_not_null() -> None:
    for mode, content in (("required", ""), ("named", ""), ("auto", None)):
        p = parsing(mode, stream=False)
        p.gather(0, "{f:1}", (1,))
        assert p.whole(0).content == content


def test_choices_of_every_prompt_have_their_own_parser() -> None:
    p = parsing(n=2, prompts=2)
    observe = p.observer(1)
    assert observe is not None
    observe(out(ChoiceDelta(0, "{f:", (1,)), ChoiceDelta(1, "x", (2,))))
    observe(out(ChoiceDelta(0, "1}", (3,), finish_reason="stop"), ChoiceDelta(1, "y", (4,), finish_reason="stop")))
    assert rebuild([p.take(2, finished=True)]).tool_calls == (ToolCall("call-0", "f", "1"),)
    assert p.take(3, finished=True).content == "xy"
    assert p.take(0, finished=False) == ParsedDelta()  # prompt 0 saw nothing
