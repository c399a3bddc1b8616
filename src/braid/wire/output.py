"""The output side every generating route shares: the values a response is made of, SSE framing
and usage. Pure.

A route's output module (:mod:`braid.wire.completions_response`, :mod:`braid.wire.chat_response`)
implements :class:`ChoiceEvents` over these parts; the route-independent merger
(:mod:`braid.stream.merge`) drives it. So a new dialect writes only its own shapes: the
collecting of choices, the usage sums, the ``data:`` framing, error events and ``[DONE]`` are
here, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import msgspec

from braid.engine.tool_calls import ParsedDelta, ParsedOutput
from braid.errors import BraidError

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": ping\n\n"

encode = msgspec.json.Encoder().encode
"""The JSON encoder of every response body and event (one instance: msgspec reuses its buffer)."""


@attrs.frozen
class ResponseMeta:
    """What every chunk (and the whole body) of one response repeats."""

    id: str
    created: int
    model: str


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    """``prompt_tokens_details.cached_tokens``; None: not reported (the server's default)."""
    reasoning_tokens: int | None = None
    """``completion_tokens_details.reasoning_tokens``; None: not reported (no reasoning parser)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def final_event(self) -> dict[str, object]:
        """The usage of a stream's final usage event: vLLM drops the details' nulls there."""
        body = self.as_dict()
        if self.cached_tokens is not None:
            body["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        if self.reasoning_tokens is not None:
            body["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return body

    def body(self) -> dict[str, object]:
        """The usage of a non-streamed body: every details field, null when not reported."""
        details = None
        if self.cached_tokens is not None:
            details = {"cached_tokens": self.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
        completion = None if self.reasoning_tokens is None else {"reasoning_tokens": self.reasoning_tokens}
        return {**self.as_dict(), "prompt_tokens_details": details, "completion_tokens_details": completion}


@attrs.frozen
class LogprobsFragment:
    """Completions' legacy logprobs for some tokens of one choice (joined per choice in a body)."""

    text_offset: tuple[int, ...]
    token_logprobs: tuple[float | None, ...]
    tokens: tuple[str, ...]
    top_logprobs: tuple[dict[str, float] | None, ...]


ChatLogprobs = tuple[dict[str, object], ...]
"""Chat's logprobs ``content`` entries (``{token, logprob, bytes, top_logprobs}``) for some tokens."""


@attrs.frozen
class ChoiceChunk:
    """What one choice gained from one engine output."""

    index: int
    prompt_idx: int
    text: str
    logprobs: LogprobsFragment | ChatLogprobs | None
    """In the route's shape (the renderer is told which); None when not asked for."""
    finish_reason: str | None
    stop_reason: str | int | None
    token_ids: tuple[int, ...] | None
    prompt_token_ids: tuple[int, ...] | None
    prompt_logprobs: tuple[dict[str, dict[str, object]] | None, ...] | None
    completion_tokens: int
    """The choice's completion tokens so far (for continuous usage)."""
    reasoning_tokens: int | None = None
    """How many of those are reasoning (continuous usage through a reasoning parser); None: not counted."""
    parsed: ParsedDelta | None = None
    """A streamed choice's parsed delta (content, reasoning, call pieces: :mod:`braid.stream.parse`),
    which the route writes in place of ``text``; None when the request is not parsed."""
    whole: ParsedOutput | None = None
    """On a whole response's last chunk of a parsed choice: its whole output parsed."""


@attrs.define
class CollectedChoice:
    """One choice of a non-streamed response, gathered from its chunks in order."""

    texts: list[str] = attrs.Factory(list)
    logprobs: list[LogprobsFragment | ChatLogprobs] = attrs.Factory(list)
    token_ids: list[int] = attrs.Factory(list)
    first: ChoiceChunk | None = None
    last: ChoiceChunk | None = None

    @property
    def whole(self) -> ParsedOutput | None:
        """The choice's parsed output (a parsed request's), from its last chunk."""
        return None if self.last is None else self.last.whole

    def add(self, c: ChoiceChunk) -> None:
        self.first = self.first or c
        self.last = c
        self.texts.append(c.text)
        if c.logprobs is not None:
            self.logprobs.append(c.logprobs)
        if c.token_ids is not None:
            self.token_ids.extend(c.token_ids)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def finish_reason(self) -> str | None:
        return None if self.last is None else self.last.finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return None if self.last is None else self.last.stop_reason


class ChoiceEvents(Protocol):
    """A route's wire shapes for one response: the events of a stream and the whole body.

    ``opening`` is what a stream sends before its first choice delta (chat's role chunks);
    ``chunk`` one choice delta, with the choice's running usage when the request asked for
    continuous usage; ``usage`` the final usage event; ``error`` an error event; ``body`` the
    non-streamed response from every choice, in index order."""

    def opening(self) -> bytes: ...

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes: ...

    def usage(self, usage: Usage) -> bytes: ...

    def error(self, err: BraidError) -> bytes: ...

    def body(
        self, choices: Sequence[CollectedChoice], usage: Usage, kv_transfer_params: Mapping[str, Any] | None = None
    ) -> bytes:
        """The non-streamed response; ``kv_transfer_params``: the KV connector's, for the first
        prompt (:attr:`braid.stream.render.ChoiceRenderer.kv_transfer_params`)."""
        ...


def sse_head(meta: ResponseMeta, obj: str) -> bytes:
    """The constant start of every chunk event of a response, up to its ``choices`` list: encoded
    once per response, so that an event costs one encode of its choice."""
    head = encode({"id": meta.id, "object": obj, "created": meta.created, "model": meta.model})
    return b"data: " + head[:-1] + b',"choices":['


def usage_event(head: bytes, usage: Usage) -> bytes:
    """A stream's final usage event: no choices, the usage."""
    return head + b'],"usage":' + encode(usage.final_event()) + b"}\n\n"


def error_event(err: BraidError) -> bytes:
    # vLLM writes error events with json.dumps (spaced, ASCII-escaped), unlike chunks.
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def error_body(err: BraidError) -> bytes:
    """A JSON error response's body, in vLLM's error shape."""
    return encode(err.body())


__all__ = [
    "DONE",
    "HEARTBEAT",
    "ChatLogprobs",
    "ChoiceChunk",
    "ChoiceEvents",
    "CollectedChoice",
    "LogprobsFragment",
    "ResponseMeta",
    "Usage",
    "encode",
    "error_body",
    "error_event",
    "sse_head",
    "usage_event",
]
