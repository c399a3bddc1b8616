"""The two other dialects' streams as views of one choice stream: OpenAI's Responses events and
Anthropic's Messages events, and the framing rules each must keep (issue 31 §4).

A dialect's stream is the same request as a chat stream (one choice, its content, reasoning and
tool calls, its finish reason, its usage) written as another event sequence. This module is a
specification like :mod:`model.stream`: it never talks to the server. It takes the stream as
parsed events (:func:`parse_named_sse`: each SSE block's ``event:`` name and its ``data:`` JSON)
and says which rules the sequence breaks; :func:`responses_view` and :func:`messages_view` give
back the choice the events show (text, reasoning, tool calls, the end), which a harness compares
with the engine's output and with the chat stream of the same request.

Rules of the Responses stream (``RESPONSES_RULES``):

* R1 every block is ``event: T`` then ``data: {..."type": T...}``, no ``[DONE]``;
* R2 ``sequence_number`` is 0, 1, 2, ... with no gap or repeat;
* R3 the first event is ``response.created``; exactly one terminal event (``response.completed``,
  ``response.incomplete``, ``response.failed``) or one ``error`` event, and it is the last;
* R4 every item opened (``response.output_item.added``, ``output_index`` 0, 1, ... in order) is
  closed (``response.output_item.done``) before the terminal event, each once, and no event of an
  item comes before it was opened or after it was closed; content parts likewise inside their item;
* R5 the deltas of a text (``response.output_text.delta``, ``response.reasoning_text.delta``,
  ``response.function_call_arguments.delta``) add up to the ``.done`` event's whole, which is
  also what the closed item and the terminal response show;
* R6 the terminal response's ``output`` is the closed items, in order.

Rules of the Messages stream (``MESSAGES_RULES``):

* M1 every block is ``event: T`` then ``data: {..."type": T...}``;
* M2 ``message_start`` first; then content blocks; exactly one ``message_delta`` (the stop
  reason and usage), then exactly one ``message_stop``, the last event; or an ``error`` event,
  the last (the only one when the request failed before its first token, as vLLM's stream);
  ``ping`` may come anywhere before the end;
* M3 content blocks are opened (``content_block_start``) with ``index`` 0, 1, ... in order, one
  at a time; every delta is for the open block and of its kind (``text_delta`` in a ``text``
  block, ``input_json_delta`` in a ``tool_use`` block, ``thinking_delta`` or ``signature_delta``
  in a ``thinking`` block); each block is closed (``content_block_stop``) before ``message_delta``;
* M4 a tool_use block's ``input_json_delta`` pieces add up to a JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

NamedEvent = tuple[str | None, Any]
"""One SSE block: its ``event:`` name (None when it has none) and its decoded ``data:`` (the
string ``"[DONE]"`` for that sentinel)."""

RESPONSES_TERMINAL = ("response.completed", "response.incomplete", "response.failed")

RESPONSES_RULES = {
    "R1": "every block is `event: T` then `data:` with type T; no [DONE]",
    "R2": "sequence_number is 0, 1, 2, ... without gaps or repeats",
    "R3": "response.created first; exactly one terminal event (or one error), the last",
    "R4": "every item and content part opened is closed once, in order, before the end; none used outside",
    "R5": "a text's deltas add up to its done event, its item and the final response",
    "R6": "the terminal response's output is the closed items, in order",
}

MESSAGES_RULES = {
    "M1": "every block is `event: T` then `data:` with type T",
    "M2": "message_start first; one message_delta then one message_stop, the last (or one error, the last)",
    "M3": "blocks indexed 0, 1, ... one open at a time; deltas of the open block's kind; all closed before message_delta",
    "M4": "a tool_use block's input_json_delta pieces add up to a JSON object",
}


def parse_named_sse(raw: bytes) -> list[NamedEvent]:
    """A whole body's SSE blocks as (event name, data); ValueError when a block is not SSE.
    Comment blocks (``: ping``) are skipped."""
    text = raw.decode("utf-8")
    if text and not text.endswith("\n\n"):
        raise ValueError(f"the body must end with a blank line: {text[-40:]!r}")
    events: list[NamedEvent] = []
    for block in text[:-2].split("\n\n") if text else []:
        name: str | None = None
        data: str | None = None
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                if data is not None:
                    raise ValueError(f"two data lines in one block: {block!r}")
                data = line[len("data: ") :]
            else:
                raise ValueError(f"not an SSE line: {line!r}")
        if data is None:
            if name is None:
                continue  # a comment block
            raise ValueError(f"an event without data: {block!r}")
        events.append((name, "[DONE]" if data == "[DONE]" else json.loads(data)))
    return events


@dataclass
class Choice:
    """What a dialect's stream shows of the one choice: as a chat choice would carry it."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, arguments JSON text), in order."""
    end: str | None = None
    """The terminal event's type (Responses) or the stop reason (Messages); None: no normal end."""
    usage: dict[str, Any] | None = None
    error: Any = None


def _named(events: list[NamedEvent], rule: str) -> Iterable[str]:
    for i, (name, data) in enumerate(events):
        if data == "[DONE]":
            yield f"{rule}: event {i} is [DONE]"
        elif not isinstance(data, dict) or name != data.get("type"):
            yield f"{rule}: event {i} is named {name!r} but its data's type is {_type(data)!r}"


def _type(data: Any) -> Any:
    return data.get("type") if isinstance(data, dict) else None


def check_responses(events: list[NamedEvent]) -> list[str]:
    """The Responses rules this stream breaks (empty: none)."""
    return list(_check_responses(events))


def _check_responses(events: list[NamedEvent]) -> Iterable[str]:
    yield from _named(events, "R1")
    datas = [d for _, d in events if isinstance(d, dict)]
    for i, d in enumerate(datas):
        if d.get("sequence_number") != i:
            yield f"R2: event {i} ({d.get('type')}) has sequence_number {d.get('sequence_number')!r}"
            break
    types = [d.get("type") for d in datas]
    if not types or types[0] != "response.created":
        yield f"R3: the first event is {types[0] if types else None!r}, not response.created"
    ends = [i for i, t in enumerate(types) if t in RESPONSES_TERMINAL or t == "error"]
    if len(ends) != 1:
        yield f"R3: {len(ends)} terminal or error events: {[types[i] for i in ends]}"
    elif ends[0] != len(types) - 1:
        yield f"R3: {types[ends[0]]} at {ends[0]} is followed by {types[ends[0] + 1 :]}"
    yield from _responses_items(datas)


def _responses_items(datas: list[dict[str, Any]]) -> Iterable[str]:
    open_items: dict[Any, dict[str, Any]] = {}
    closed: list[dict[str, Any]] = []
    parts: set[tuple[Any, Any]] = set()
    texts: dict[tuple[str, Any, Any], str] = {}
    added = 0
    for i, d in enumerate(datas):
        t = d.get("type", "")
        idx = d.get("output_index")
        if t == "response.output_item.added":
            if idx != added:
                yield f"R4: event {i} opens item {idx!r}, expected {added}"
            open_items[idx] = d.get("item", {})
            added += 1
        elif t == "response.output_item.done":
            if idx not in open_items:
                yield f"R4: event {i} closes item {idx!r}, which is not open"
                continue
            item = d.get("item", {})
            yield from _item_matches(i, idx, item, texts)
            del open_items[idx]
            closed.append(item)
        elif t.startswith("response.") and idx is not None:
            if idx not in open_items:
                yield f"R4: event {i} ({t}) is for item {idx}, which is not open"
                continue
            part = (idx, d.get("content_index", 0))
            if t == "response.content_part.added":
                if part in parts:
                    yield f"R4: event {i} opens part {part} twice"
                parts.add(part)
            elif t == "response.content_part.done":
                if part not in parts:
                    yield f"R4: event {i} closes part {part}, which is not open"
                parts.discard(part)
            elif t.endswith(".delta"):
                key = (t[: -len(".delta")], idx, part[1])
                texts[key] = texts.get(key, "") + str(d.get("delta", ""))
            elif t.endswith(".done") and t != "response.content_part.done":
                key = (t[: -len(".done")], idx, part[1])
                whole = d.get("arguments") if "arguments" in t else d.get("text")
                if texts.get(key, "") != whole:
                    yield f"R5: event {i} ({t}) says {whole!r}, its deltas add up to {texts.get(key, '')!r}"
    terminal = datas[-1] if datas and datas[-1].get("type") in RESPONSES_TERMINAL else None
    if terminal is not None:
        if open_items or parts:
            yield f"R4: items {sorted(open_items)} and parts {sorted(parts)} are still open at the end"
        output = (terminal.get("response") or {}).get("output")
        if output != closed:
            yield f"R6: the final response has {len(output or [])} output items, the stream closed {len(closed)}"


def _item_matches(i: int, idx: Any, item: dict[str, Any], texts: dict[tuple[str, Any, Any], str]) -> Iterable[str]:
    kind = item.get("type")
    if kind == "function_call":
        got = texts.get(("response.function_call_arguments", idx, 0))
        if got is not None and got != item.get("arguments"):
            yield f"R5: item {idx} closes with arguments {item.get('arguments')!r}, its deltas say {got!r}"
    elif kind in ("message", "reasoning"):
        stream = "response.output_text" if kind == "message" else "response.reasoning_text"
        for k, part in enumerate(item.get("content") or ()):
            got = texts.get((stream, idx, k))
            if got is not None and got != part.get("text"):
                yield f"R5: item {idx} part {k} closes with {part.get('text')!r}, its deltas say {got!r}"


def responses_view(events: list[NamedEvent]) -> Choice:
    """The choice a Responses stream shows (from its closed items and terminal event)."""
    choice = Choice()
    for _, d in events:
        if not isinstance(d, dict):
            continue
        t = d.get("type")
        if t == "response.output_item.done":
            item = d.get("item", {})
            if item.get("type") == "message":
                choice.content += "".join(p.get("text", "") for p in item.get("content") or ())
            elif item.get("type") == "reasoning":
                choice.reasoning += "".join(p.get("text", "") for p in item.get("content") or ())
            elif item.get("type") == "function_call":
                choice.tool_calls.append((item.get("name", ""), item.get("arguments", "")))
        elif t in RESPONSES_TERMINAL:
            choice.end = t
            choice.usage = (d.get("response") or {}).get("usage")
        elif t == "error":
            choice.error = d
    return choice


_BLOCK_DELTAS = {
    "text": ("text_delta",),
    "tool_use": ("input_json_delta",),
    "thinking": ("thinking_delta", "signature_delta"),
}


def check_messages(events: list[NamedEvent]) -> list[str]:
    """The Messages rules this stream breaks (empty: none)."""
    return list(_check_messages(events))


def _check_messages(events: list[NamedEvent]) -> Iterable[str]:
    yield from _named(events, "M1")
    datas = [d for _, d in events if isinstance(d, dict) and d.get("type") != "ping"]
    types = [d.get("type") for d in datas]
    if types != ["error"] and (not types or types[0] != "message_start"):
        yield f"M2: the first event is {types[0] if types else None!r}, not message_start"
    errors = [i for i, t in enumerate(types) if t == "error"]
    stops = [i for i, t in enumerate(types) if t == "message_stop"]
    deltas = [i for i, t in enumerate(types) if t == "message_delta"]
    if errors:
        if len(errors) > 1 or errors[0] != len(types) - 1 or stops:
            yield f"M2: an error event must be the one last event: {types}"
    elif len(stops) != 1 or stops[0] != len(types) - 1:
        yield f"M2: {len(stops)} message_stop events, the last event is {types[-1] if types else None!r}"
    elif len(deltas) != 1 or deltas[0] != len(types) - 2:
        yield f"M2: message_delta at {deltas}, expected exactly one right before message_stop"
    open_block: tuple[Any, Any] | None = None
    opened = 0
    inputs: dict[int, str] = {}
    for i, d in enumerate(datas):
        t = d.get("type")
        if t == "content_block_start":
            if open_block is not None:
                yield f"M3: event {i} opens block {d.get('index')} while block {open_block[0]} is open"
            if d.get("index") != opened:
                yield f"M3: event {i} opens block {d.get('index')!r}, expected {opened}"
            open_block = (d.get("index", -1), (d.get("content_block") or {}).get("type", ""))
            opened += 1
        elif t == "content_block_delta":
            kind = (d.get("delta") or {}).get("type")
            if open_block is None or d.get("index") != open_block[0]:
                yield f"M3: event {i} is a delta for block {d.get('index')!r}, which is not open"
            elif kind not in _BLOCK_DELTAS.get(open_block[1], ()):
                yield f"M3: event {i} is a {kind} in a {open_block[1]} block"
            elif kind == "input_json_delta":
                inputs[open_block[0]] = inputs.get(open_block[0], "") + (d.get("delta") or {}).get("partial_json", "")
        elif t == "content_block_stop":
            if open_block is None or d.get("index") != open_block[0]:
                yield f"M3: event {i} closes block {d.get('index')!r}, which is not open"
            open_block = None
        elif t == "message_delta" and open_block is not None:
            yield f"M3: message_delta while block {open_block[0]} is open"
    for index, text in inputs.items():
        try:
            ok = isinstance(json.loads(text or "{}"), dict)
        except ValueError:
            ok = False
        if not ok:
            yield f"M4: block {index}'s input_json_delta pieces add up to {text!r}, not a JSON object"


def messages_view(events: list[NamedEvent]) -> Choice:
    """The choice a Messages stream shows (its blocks' deltas, its stop reason and usage)."""
    choice = Choice()
    kinds: dict[int, str] = {}
    tools: dict[int, list[str]] = {}
    for _, d in events:
        if not isinstance(d, dict):
            continue
        t = d.get("type")
        if t == "content_block_start":
            block = d.get("content_block") or {}
            kinds[d.get("index", -1)] = block.get("type", "")
            if block.get("type") == "tool_use":
                tools[d.get("index", -1)] = [block.get("name", ""), ""]
        elif t == "content_block_delta":
            delta = d.get("delta") or {}
            if delta.get("type") == "text_delta":
                choice.content += delta.get("text", "")
            elif delta.get("type") == "thinking_delta":
                choice.reasoning += delta.get("thinking", "")
            elif delta.get("type") == "input_json_delta" and d.get("index") in tools:
                tools[d["index"]][1] += delta.get("partial_json", "")
        elif t == "message_delta":
            choice.end = (d.get("delta") or {}).get("stop_reason")
            choice.usage = d.get("usage")
        elif t == "error":
            choice.error = d
    choice.tool_calls = [(name, args) for name, args in (tools[k] for k in sorted(tools))]
    return choice


__all__ = [
    "MESSAGES_RULES",
    "RESPONSES_RULES",
    "RESPONSES_TERMINAL",
    "Choice",
    "NamedEvent",
    "check_messages",
    "check_responses",
    "messages_view",
    "parse_named_sse",
    "responses_view",
]
