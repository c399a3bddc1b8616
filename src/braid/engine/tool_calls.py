"""What a model's output means beyond its text: reasoning, content and tool calls. Pure.

A tool-call or reasoning parser (:mod:`braid.engine.vllm_parsers` wraps vLLM's) splits one
choice's generated text into these values. A stream gets them delta by delta, in the engine's
order (:class:`ParsedDelta`); a whole response gets them once (:class:`ParsedOutput`). The
invariant braid keeps, checked by ``tests/engine/test_vllm_parsers.py``: however the token stream
is split into deltas, the streamed deltas of a choice rebuilt with :func:`rebuild` equal the parse
of the whole output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs


@attrs.frozen
class ToolCall:
    """One whole call: ``arguments`` is the JSON text the model wrote (not parsed)."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ToolCallDelta:
    """A piece of the call at ``index`` (per choice, from 0): its id and name come once, first;
    ``arguments`` is the next fragment of its JSON text ("" for none)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen
class ParsedDelta:
    """What one engine delta of a choice adds: content, reasoning text, tool-call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.content or self.reasoning or self.tool_calls)


@attrs.frozen
class ParsedOutput:
    """A whole choice's output. ``content`` None when the output was only calls (or reasoning)."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()


class ChoiceParser(Protocol):
    """The parser of one choice of one request: it keeps the choice's stream state, so a choice
    is either streamed (:meth:`feed` for each delta, in order) or parsed whole (:meth:`parse`),
    never both. Neither raises: a parser that fails passes the text on as content."""

    def feed(self, text: str, token_ids: Sequence[int], *, finished: bool) -> ParsedDelta: ...

    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput: ...

    def reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of a choice's generated tokens are reasoning (0 without a reasoning parser)."""
        ...


def join(deltas: Sequence[ParsedDelta]) -> ParsedDelta:
    """Several deltas of one choice as one (what a lagging reader is sent at once): texts
    concatenated, and the pieces of each call joined into one piece per call, in call order
    (its id and name from its first piece that has them). Rebuilding the joined delta gives
    what rebuilding the deltas gives."""
    if len(deltas) == 1:
        return deltas[0]
    pieces: dict[int, list[ToolCallDelta]] = {}
    for d in deltas:
        for piece in d.tool_calls:
            pieces.setdefault(piece.index, []).append(piece)
    calls = []
    for index, parts in pieces.items():
        calls.append(
            ToolCallDelta(
                index,
                next((p.id for p in parts if p.id), None),
                next((p.name for p in parts if p.name), None),
                "".join(p.arguments for p in parts),
            )
        )
    return ParsedDelta(
        content="".join(d.content for d in deltas),
        reasoning="".join(d.reasoning for d in deltas),
        tool_calls=tuple(calls),
    )


def rebuild(deltas: Iterable[ParsedDelta]) -> ParsedOutput:
    """A choice's streamed deltas put back together, as a client rebuilds them: content and
    reasoning concatenated, each call's id and name from its first piece that has one, its
    arguments the concatenated fragments."""
    content, reasoning = [], []
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    for d in deltas:
        content.append(d.content)
        reasoning.append(d.reasoning)
        for piece in d.tool_calls:
            calls.setdefault(piece.index, []).append(piece.arguments)
            if piece.id and piece.index not in ids:
                ids[piece.index] = piece.id
            if piece.name and piece.index not in names:
                names[piece.index] = piece.name
    text, thought = "".join(content), "".join(reasoning)
    return ParsedOutput(
        content=text or None,
        reasoning=thought or None,
        tool_calls=tuple(ToolCall(ids.get(i, ""), names.get(i, ""), "".join(calls[i])) for i in sorted(calls)),
    )


__all__ = ["ChoiceParser", "ParsedDelta", "ParsedOutput", "ToolCall", "ToolCallDelta", "join", "rebuild"]
