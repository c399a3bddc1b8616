"""Parse: one request's choices through their tool-call and reasoning parsers. Pure.

A chat request that has tools (``tool_choice`` other than ``"none"``) or runs on a server with a
reasoning parser gets one :class:`ChoiceParsing`, with one parser per choice
(:class:`~braid.engine.tool_calls.ChoiceParser`: braid's face of vLLM's parsers).

* **Streamed**, each choice's parser is fed the engine's deltas one engine step at a time, in
  order, where the engine makes them (:meth:`ChoiceParsing.observer`, the engine's ``observe``
  hook), before any merging for a lagging reader: several vLLM parsers lose calls when one delta
  carries several tokens, and a reader that lags gets several steps in one output. What the
  parser made of the steps waits here until the renderer takes the choice's next output
  (:meth:`ChoiceParsing.take`), joined into one delta.
* **Whole** (a non-streamed response), a choice's text and tokens are gathered and parsed once
  when it finishes (:meth:`ChoiceParsing.whole`), as vLLM's server does.

The rules vLLM's server applies around its parsers are here too: ``finish_reason`` becomes
``"tool_calls"`` when a choice called a tool (not for a named ``tool_choice``), ``parallel_tool_calls:
false`` keeps a choice's first call, ``include_reasoning: false`` drops the reasoning, and the
reasoning tokens are counted for usage when the server has a reasoning parser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from braid.engine.base import EngineOutput, Observe
from braid.engine.tool_calls import ChoiceParser, ParsedDelta, ParsedOutput, join
from braid.wire.chat_request import ToolChoice


@attrs.frozen
class ParsingOptions:
    """What one request asks of its parsers."""

    tool_choice: ToolChoice
    include_reasoning: bool = True
    count_reasoning: bool = False
    """The server has a reasoning parser: usage reports ``reasoning_tokens`` (as vLLM's)."""


@attrs.define
class _Choice:
    parser: ChoiceParser
    pending: list[ParsedDelta] = attrs.Factory(list)
    """What the parser made of engine steps the renderer has not taken yet."""
    texts: list[str] = attrs.Factory(list)
    """Whole mode: the choice's text so far."""
    token_ids: list[int] = attrs.Factory(list)
    """Its generated tokens (whole mode, or to count reasoning tokens)."""
    called: bool = False
    """A tool-call piece was streamed (or the whole parse found a call)."""
    reasoning_tokens: int = 0


@attrs.define
class ChoiceParsing:
    """The parsers of one request's choices (global index ``prompt * n + k``)."""

    options: ParsingOptions
    n: int
    stream: bool
    _choices: list[_Choice]

    @classmethod
    def create(
        cls,
        options: ParsingOptions,
        prompts: Sequence[Sequence[int]],
        n: int,
        stream: bool,
        make: Callable[[Sequence[int]], ChoiceParser],
    ) -> ChoiceParsing:
        """One parser per choice, made by ``make(prompt_token_ids)``."""
        return cls(options, n, stream, [_Choice(make(ids)) for ids in prompts for _ in range(n)])

    def observer(self, prompt_idx: int) -> Observe | None:
        """The engine's ``observe`` hook for prompt ``prompt_idx``'s request: feeds each of its
        choices' parsers every engine step, in order. None for a whole response."""
        if not self.stream:
            return None
        base = prompt_idx * self.n
        choices = self._choices
        count = self.options.count_reasoning

        def observe(output: EngineOutput) -> None:
            for delta in output.choices:
                c = choices[base + delta.index]
                if count:
                    c.token_ids.extend(delta.token_ids)
                c.pending.append(c.parser.feed(delta.text, delta.token_ids, finished=delta.finish_reason is not None))

        return observe

    def take(self, index: int, *, finished: bool) -> ParsedDelta:
        """Choice ``index``'s parsed steps since the last take, as one delta, with vLLM's rules
        applied (calls after the first dropped without parallel calls, reasoning dropped when
        not included)."""
        c = self._choices[index]
        pending, c.pending = c.pending, []
        delta = join(pending) if pending else ParsedDelta()
        opts = self.options
        if delta.tool_calls and not opts.tool_choice.parallel:
            delta = attrs.evolve(delta, tool_calls=tuple(p for p in delta.tool_calls if p.index == 0))
        if delta.reasoning and not opts.include_reasoning:
            delta = attrs.evolve(delta, reasoning="")
        if delta.tool_calls:
            c.called = True
        if finished and opts.count_reasoning:
            c.reasoning_tokens = c.parser.reasoning_tokens(c.token_ids)
        return delta

    def reasoning_so_far(self, index: int) -> int | None:
        """Streamed: how many of choice ``index``'s tokens so far are reasoning (for continuous
        usage, as vLLM's server counts them: its parser over every token so far); None when the
        server does not count them."""
        if not self.options.count_reasoning:
            return None
        c = self._choices[index]
        return c.parser.reasoning_tokens(c.token_ids)

    def gather(self, index: int, text: str, token_ids: Sequence[int]) -> None:
        """Whole mode: keep a delta of choice ``index`` for :meth:`whole`."""
        c = self._choices[index]
        c.texts.append(text)
        c.token_ids.extend(token_ids)

    def whole(self, index: int) -> ParsedOutput:
        """Whole mode: choice ``index``'s gathered output parsed once, with vLLM's rules."""
        c = self._choices[index]
        parsed = c.parser.parse("".join(c.texts), c.token_ids)
        opts = self.options
        if opts.count_reasoning:
            c.reasoning_tokens = c.parser.reasoning_tokens(c.token_ids)
        calls = parsed.tool_calls
        if calls and not opts.tool_choice.parallel:
            calls = calls[:1]
        mode = opts.tool_choice.mode
        content = parsed.content
        if mode in ("required", "named"):
            content = content or ""  # vLLM's message: "" rather than null under a forced call
        c.called = bool(calls)
        return ParsedOutput(
            content=content,
            reasoning=parsed.reasoning if opts.include_reasoning else None,
            tool_calls=calls,
        )

    def finish_reason(self, index: int, reason: str) -> str:
        """The choice's ``finish_reason`` as vLLM's server gives it. Streamed: ``"tool_calls"``
        when call pieces were sent and the engine stopped the choice (not a length cut), unless
        the ``tool_choice`` named the function. Whole: ``"tool_calls"`` when ``"auto"`` found a
        call (whatever stopped it), or under ``"required"`` when the engine stopped it."""
        mode = self.options.tool_choice.mode
        called = self._choices[index].called
        if self.stream:
            return "tool_calls" if called and mode != "named" and reason == "stop" else reason
        if (called and mode == "auto") or (mode == "required" and reason == "stop"):
            return "tool_calls"
        return reason

    @property
    def reasoning_tokens(self) -> int | None:
        """The request's reasoning tokens, summed over its choices (None: not counted)."""
        if not self.options.count_reasoning:
            return None
        return sum(c.reasoning_tokens for c in self._choices)


__all__ = ["ChoiceParsing", "ParsingOptions"]
