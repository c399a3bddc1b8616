"""Anthropic's event stream (``event:`` and ``data:`` lines) read back, for the tests of
``/v1/messages`` on both engines and in the parity tier."""

from __future__ import annotations

import json
from typing import Any


def parse_anthropic_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """SSE bytes -> ``(event, data)`` pairs; comments (heartbeats) are skipped. Raises ValueError
    on an event that is not one ``event:`` line and one ``data:`` line whose type it names."""
    events: list[tuple[str, dict[str, Any]]] = []
    for block in raw.decode().split("\n\n"):
        if not block or block.startswith(":"):
            continue
        lines = block.split("\n")
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            raise ValueError(f"not an Anthropic event: {block[:120]!r}")
        kind = lines[0][len("event: ") :]
        data = json.loads(lines[1][len("data: ") :])
        if data.get("type") != kind:
            raise ValueError(f"event {kind!r} carries data of type {data.get('type')!r}")
        events.append((kind, data))
    return events


def check_framing(events: list[tuple[str, dict[str, Any]]]) -> None:
    """The stream's invariants: ``message_start`` first; blocks opened in index order from 0, one
    at a time, each closed, deltas only into the open block; one ``message_delta`` after the last
    block; ``message_stop`` last, exactly once (or a lone ``error`` event last)."""
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start", kinds
    if kinds[-1] == "error":
        assert kinds.count("error") == 1
        return
    assert kinds[-2:] == ["message_delta", "message_stop"] and kinds.count("message_stop") == 1, kinds
    assert kinds.count("message_delta") == 1
    open_index: int | None = None
    next_index = 0
    for kind, data in events[1:-2]:
        if kind == "content_block_start":
            assert open_index is None and data["index"] == next_index, events
            open_index = next_index
        elif kind == "content_block_delta":
            assert data["index"] == open_index, events
        elif kind == "content_block_stop":
            assert data["index"] == open_index, events
            open_index = None
            next_index += 1
        else:
            raise AssertionError(f"unexpected {kind} inside the message")
    assert open_index is None, "a block was left open"


def rebuild(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The content blocks a client rebuilds from the stream (text, thinking and the calls'
    ``input`` joined; signatures dropped). A call whose JSON is not whole keeps the text that
    arrived, under ``"<partial json>"``."""
    blocks: list[dict[str, Any]] = []
    json_parts: dict[int, str] = {}
    for kind, data in events:
        if kind == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif kind == "content_block_delta":
            d = data["delta"]
            block = blocks[data["index"]]
            if d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                json_parts[data["index"]] = json_parts.get(data["index"], "") + d["partial_json"]
    for index, text in json_parts.items():
        try:
            blocks[index]["input"] = json.loads(text)
        except ValueError:  # a call cut short (max_tokens): what arrived
            blocks[index]["input"] = {"<partial json>": text}
    return blocks
