"""The Responses API's output: the ``response`` object and its event stream. Pure.

Shaped as vLLM 0.32 writes them (its ``ResponsesResponse`` and its simple, non-Harmony event
processor), from the same choice chunks as chat (:mod:`braid.stream.render`, one choice):

* a stream is ``event: <type>`` / ``data: <json>`` pairs with ``sequence_number`` s from 0:
  ``response.created`` and ``response.in_progress`` (the response with no output), then per
  output item ``response.output_item.added``, its deltas and its closing events, then
  ``response.completed`` with the whole response; no ``[DONE]``. An item is a message
  (``response.content_part.added``, ``response.output_text.delta`` ..., ``.done``,
  ``response.content_part.done``), a reasoning item (the same with ``reasoning_text``) or a
  function call (``response.function_call_arguments.delta`` ..., ``.done``). A delta holding
  several parts is taken in vLLM's order: reasoning, content, then each call by index; a part of
  another kind (or another call) closes the open item and opens the next.
* a whole response lists the parsed output as items: the reasoning, the message (when there is
  content), then the calls; without a parser, the text as one message.
* ``status`` is ``incomplete`` (``incomplete_details.reason``: ``max_output_tokens``) when the
  output was cut by its length, else ``completed``.
* an error after the stream started is OpenAI's ``error`` event, after which the stream ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from braid.engine.tool_calls import ParsedDelta, ParsedOutput
from braid.errors import BraidError
from braid.wire.output import ChoiceChunk, CollectedChoice, ResponseMeta, Usage, encode
from braid.wire.responses_request import ResponsesEcho


@attrs.frozen
class ResponsesShape:
    """What a response adds to its plan: the request's echo and the engine's output budget."""

    echo: ResponsesEcho
    max_output_tokens: int
    """The engine request's ``max_tokens`` (the context's room when the request gave none)."""
    text: dict[str, Any] | None = None
    """``text`` as the response repeats it (a forced call's schema replaces the request's)."""
    parsed: bool = False
    """The output goes through the request's parsers (reasoning, calls)."""
    hide_logprobs: bool = False
    """Reasoning hidden (``include_reasoning`` false through a parser): no logprobs either."""


def _usage(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens or 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": usage.total_tokens,
    }


def response_object(
    meta: ResponseMeta,
    shape: ResponsesShape,
    *,
    status: str,
    output: Sequence[Mapping[str, Any]],
    usage: Usage | None,
) -> dict[str, object]:
    """The ``response`` object, in vLLM's field order."""
    e = shape.echo
    return {
        "id": meta.id,
        "created_at": meta.created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": e.instructions,
        "metadata": e.metadata,
        "model": meta.model,
        "object": "response",
        "output": list(output),
        "parallel_tool_calls": e.parallel_tool_calls,
        "temperature": e.temperature,
        "tool_choice": e.tool_choice,
        "tools": list(e.tools),
        "top_p": e.top_p,
        "background": e.background,
        "max_output_tokens": shape.max_output_tokens,
        "max_tool_calls": e.max_tool_calls,
        "previous_response_id": e.previous_response_id,
        "prompt": None,
        "reasoning": e.reasoning,
        "service_tier": e.service_tier,
        "status": status,
        "text": shape.text,
        "top_logprobs": e.top_logprobs,
        "truncation": e.truncation,
        "usage": None if usage is None else _usage(usage),
        "user": e.user,
        "presence_penalty": e.presence_penalty,
        "frequency_penalty": e.frequency_penalty,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _output_text(text: str, logprobs: list[dict[str, object]] | None) -> dict[str, object]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, parts: list[dict[str, object]], status: str) -> dict[str, object]:
    return {"id": item_id, "content": parts, "role": "assistant", "status": status, "type": "message", "phase": None}


def reasoning_item(item_id: str, text: str | None, status: str | None) -> dict[str, object]:
    content = None if text is None else [{"text": text, "type": "reasoning_text"}]
    return {
        "id": item_id,
        "summary": [],
        "type": "reasoning",
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, object]:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": item_id,
        "async": None,
        "caller": None,
        "namespace": None,
        "status": status,
    }


def _stream_logprobs(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """Logprobs as a delta event carries them: no ``bytes``."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]],
        }
        for e in entries
    ]


@attrs.define
class _Open:
    """The output item being streamed."""

    kind: str  # "message", "reasoning" or "call"
    item_id: str
    text: str = ""
    logprobs: list[dict[str, object]] = attrs.Factory(list)
    call_index: int | None = None
    call_id: str = ""
    name: str = ""


@attrs.define
class ResponsesEvents:
    """The Responses events and body of one response (one conversation, one choice).

    ``new_id`` gives the hex of each output item's id (``msg_``, ``rs_``, ``fc_``)."""

    meta: ResponseMeta
    shape: ResponsesShape
    new_id: Callable[[], str]
    _seq: int = 0
    _open: _Open | None = None
    _done: list[dict[str, object]] = attrs.Factory(list)
    """The items streamed and closed, in order: the output of ``response.completed``."""
    _finish_reason: str | None = None
    completed: bytes | None = None
    """The whole response ``response.completed`` carried (JSON), once it is sent."""
    _held: list[Mapping[str, Any]] = attrs.Factory(list)
    """Logprobs of tokens the parser has not placed yet (:meth:`chunk`)."""

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.new_id()[:16]}"

    def _event(self, kind: str, fields: dict[str, object]) -> bytes:
        data = {**fields, "sequence_number": self._seq, "type": kind}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + encode(data) + b"\n\n"

    def _response(self, status: str, usage: Usage | None) -> dict[str, object]:
        output = self._done if status != "in_progress" else []
        return response_object(self.meta, self.shape, status=status, output=output, usage=usage)

    def opening(self) -> bytes:
        response = self._response("in_progress", None)
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    # -- the open item

    def _open_item(self, kind: str, call_index: int | None = None, call_id: str = "", name: str = "") -> bytes:
        index = len(self._done)
        if kind == "message":
            item = _Open("message", self._item_id("msg"))
            self._open = item
            return self._event(
                "response.output_item.added",
                {"item": message_item(item.item_id, [], "in_progress"), "output_index": index},
            ) + self._event(
                "response.content_part.added",
                {
                    "content_index": 0,
                    "item_id": item.item_id,
                    "output_index": index,
                    "part": _output_text("", []),
                },
            )
        if kind == "reasoning":
            item = _Open("reasoning", self._item_id("rs"))
            self._open = item
            added = {"id": item.item_id, "summary": [], "type": "reasoning", "status": "in_progress"}
            return self._event("response.output_item.added", {"item": added, "output_index": index}) + self._event(
                "response.content_part.added",
                {
                    "content_index": 0,
                    "item_id": item.item_id,
                    "output_index": index,
                    "part": {"text": "", "type": "reasoning_text"},
                },
            )
        item = _Open("call", self._item_id("fc"), call_index=call_index, call_id=call_id, name=name)
        self._open = item
        return self._event(
            "response.output_item.added",
            {"item": call_item(item.item_id, call_id, name, "", "in_progress"), "output_index": index},
        )

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        index = len(self._done)
        if item.kind == "message":
            part = _output_text(item.text, item.logprobs or None)
            done = message_item(item.item_id, [part] if item.text else [], "completed")
            out = (
                self._event(
                    "response.output_text.done",
                    {
                        "content_index": 0,
                        "item_id": item.item_id,
                        "logprobs": [],
                        "output_index": index,
                        "text": item.text,
                    },
                )
                + self._event(
                    "response.content_part.done",
                    {"content_index": 0, "item_id": item.item_id, "output_index": index, "part": part},
                )
                + self._event("response.output_item.done", {"item": done, "output_index": index})
            )
        elif item.kind == "reasoning":
            part = {"text": item.text, "type": "reasoning_text"}
            done = reasoning_item(item.item_id, item.text, "completed")
            out = (
                self._event(
                    "response.reasoning_text.done",
                    {"content_index": 0, "item_id": item.item_id, "output_index": index, "text": item.text},
                )
                + self._event(
                    "response.content_part.done",
                    {"content_index": 0, "item_id": item.item_id, "output_index": index, "part": part},
                )
                + self._event("response.output_item.done", {"item": done, "output_index": index})
            )
        else:
            done = call_item(item.item_id, item.call_id, item.name, item.text, "completed")
            out = self._event(
                "response.function_call_arguments.done",
                {"arguments": item.text, "item_id": item.item_id, "output_index": index, "name": item.name},
            ) + self._event("response.output_item.done", {"item": done, "output_index": index})
        self._done.append(done)
        return out

    def _content(self, text: str, logprobs: Sequence[Mapping[str, Any]]) -> bytes:
        out = b""
        if self._open is None or self._open.kind != "message":
            out += self._close() + self._open_item("message")
        item = self._open
        assert item is not None
        item.text += text
        item.logprobs.extend(dict(e) for e in logprobs)
        return out + self._event(
            "response.output_text.delta",
            {
                "content_index": 0,
                "delta": text,
                "item_id": item.item_id,
                "logprobs": _stream_logprobs(logprobs),
                "output_index": len(self._done),
            },
        )

    def _reasoning(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open.kind != "reasoning":
            out += self._close() + self._open_item("reasoning")
        item = self._open
        assert item is not None
        item.text += text
        return out + self._event(
            "response.reasoning_text.delta",
            {"content_index": 0, "delta": text, "item_id": item.item_id, "output_index": len(self._done)},
        )

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "call" or item.call_index != index:
            # vLLM opens a call item on the piece that names it (the parser's first for a call)
            out += self._close() + self._open_item("call", index, call_id or "", name or "")
            item = self._open
            assert item is not None
        if not arguments:
            return out
        item.text += arguments
        return out + self._event(
            "response.function_call_arguments.delta",
            {"delta": arguments, "item_id": item.item_id, "output_index": len(self._done)},
        )

    def _parsed(self, p: ParsedDelta, logprobs: Sequence[Mapping[str, Any]]) -> bytes:
        out = b""
        if p.reasoning:
            out += self._reasoning(p.reasoning)
        if p.content:
            out += self._content(p.content, logprobs)
        if p.tool_calls:
            by_index: dict[int, list[Any]] = {}
            for piece in p.tool_calls:
                by_index.setdefault(piece.index, []).append(piece)
            for index, pieces in by_index.items():
                first = pieces[0]
                out += self._call(index, first.id, first.name, "".join(x.arguments for x in pieces))
        return out

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes:
        if c.finish_reason is not None:
            self._finish_reason = c.finish_reason
        logprobs: Sequence[Mapping[str, Any]] = ()
        if c.logprobs is not None and not self.shape.hide_logprobs:
            assert isinstance(c.logprobs, tuple), "responses render chat's logprobs"
            logprobs = c.logprobs
        if c.parsed is not None:
            if c.parsed.empty:
                # Tokens the parser holds back (a possible marker): their logprobs go with the
                # content they turn out to be, as the whole response lists every token's.
                self._held.extend(logprobs)
                return b""
            held, self._held = self._held, []
            return self._parsed(c.parsed, [*held, *logprobs])
        if not c.text:
            # A token whose text is still to come (part of a character) or is nothing (a special
            # token skipped): its logprobs go with the next text, so that a stream lists every
            # token's, as the whole response does. (vLLM drops them, unless its consumer lagged
            # and the token's output was merged with the next: tests/parity/deviations.py.)
            self._held.extend(logprobs)
            return b""
        held, self._held = self._held, []
        return self._content(c.text, [*held, *logprobs])

    def closing(self, usage: Usage) -> bytes:
        """The open item's closing events, then ``response.completed``."""
        if self._held and self._open is not None and self._open.kind == "message":
            # The last tokens had no text of their own: their logprobs close the message.
            self._open.logprobs.extend(dict(e) for e in self._held)
            self._held = []
        out = self._close()
        status = "incomplete" if self._finish_reason == "length" else "completed"
        response = self._response(status, usage)
        self.completed = encode(response)
        return out + self._event("response.completed", {"response": response})

    def usage(self, usage: Usage) -> bytes:
        return self.closing(usage)

    def error(self, err: BraidError) -> bytes:
        data: dict[str, object] = {"code": err.type, "message": err.message, "param": err.param}
        return self._event("error", data)

    # -- the whole response

    def _items(self, ch: CollectedChoice) -> list[dict[str, object]]:
        whole: ParsedOutput | None = ch.whole
        logprobs: list[dict[str, object]] | None = None
        if self.shape.echo.top_logprobs is not None and not self.shape.hide_logprobs:
            logprobs = [dict(e) for f in ch.logprobs for e in f]  # type: ignore[union-attr]
        if whole is None:
            parts = [_output_text(ch.text, logprobs)] if ch.text else []
            return [message_item(self._item_id("msg"), parts, "completed")]
        items: list[dict[str, object]] = []
        if whole.reasoning:
            items.append(reasoning_item(self._item_id("rs"), whole.reasoning, None))
        if whole.content:
            items.append(message_item(self._item_id("msg"), [_output_text(whole.content, logprobs)], "completed"))
        for call in whole.tool_calls:
            items.append(call_item(self._item_id("fc"), call.id, call.name, call.arguments, "completed"))
        return items

    def body(
        self, choices: Sequence[CollectedChoice], usage: Usage, kv_transfer_params: Mapping[str, Any] | None = None
    ) -> bytes:
        (ch,) = choices
        status = "incomplete" if ch.finish_reason == "length" else "completed"
        return encode(response_object(self.meta, self.shape, status=status, output=self._items(ch), usage=usage))


__all__ = [
    "ResponsesEvents",
    "ResponsesShape",
    "call_item",
    "message_item",
    "reasoning_item",
    "response_object",
]
