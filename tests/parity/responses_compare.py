"""Normalise one server's answer on ``/v1/responses`` for comparison. Pure.

As tests/parity/compare.py does for the other routes, what must differ between two servers is
normalised away, and nothing else:

* ids: the response's ``id`` (and ``previous_response_id``) and the ids of its items (``msg_``, ``rs_``, ``fc_``) and calls
  (``call_id``) become their prefix and the order they first appear in (``msg#0``): two servers
  draw different ids, but an item must keep its id from ``output_item.added`` to ``done`` and
  into ``response.completed``;
* ``created_at``;
* chunk boundaries of a stream: consecutive delta events of one item are joined (their
  ``delta`` texts and logprobs), since vLLM merges deltas when its consumer lags. Every other
  event is kept in order, and the ``sequence_number`` s must count up from 0 (checked here, then
  dropped);
* errors are compared on status, ``error.type``, ``error.param`` and ``error.code``, as
  everywhere.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.parity.compare import Reply, diff

ID_KEYS = ("id", "item_id", "call_id", "previous_response_id")
_ID = re.compile(r"^(resp|msg|rs|fc|ctc|chatcmpl-tool|call)[_-]")
DELTAS = (
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
)


def parse_event_stream(raw: bytes) -> list[tuple[str | None, Any]]:
    """``event:``/``data:`` SSE blocks -> (event name, parsed data); comments as (":", None)."""
    out: list[tuple[str | None, Any]] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name = None
        data = None
        for line in block.split("\n"):
            if line.startswith(":"):
                out.append((":", None))
            elif line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
            else:
                raise ValueError(f"not an SSE line: {line[:80]!r}")
        if data is not None:
            out.append((name, "[DONE]" if data == "[DONE]" else json.loads(data)))
    return out


class _Ids:
    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def name(self, value: str) -> str:
        if value not in self.seen:
            m = _ID.match(value)
            prefix = m.group(1) if m else "id"
            count = sum(1 for v in self.seen.values() if v.startswith(prefix + "#"))
            self.seen[value] = f"{prefix}#{count}"
        return self.seen[value]


def _norm(value: Any, ids: _Ids) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "created_at":
                continue
            if k in ID_KEYS and isinstance(v, str):
                out[k] = ids.name(v)
            else:
                out[k] = _norm(v, ids)
        return out
    if isinstance(value, list):
        return [_norm(v, ids) for v in value]
    return value


def stream_view(raw: bytes) -> dict[str, Any]:
    """A stream as compared: its events in order (deltas joined, ids normalised), whether the
    sequence numbers count up from 0, whether the event name repeats the data's ``type``, and
    how many ``[DONE]`` lines it has."""
    ids = _Ids()
    events: list[dict[str, Any]] = []
    numbers: list[int] = []
    names_match = True
    done = 0
    for name, data in parse_event_stream(raw):
        if name == ":":
            continue
        if data == "[DONE]":
            done += 1
            continue
        numbers.append(data.get("sequence_number", -1))
        names_match = names_match and name == data.get("type")
        ev = _norm({k: v for k, v in data.items() if k != "sequence_number"}, ids)
        last = events[-1] if events else None
        if (
            ev.get("type") in DELTAS
            and last is not None
            and last.get("type") == ev["type"]
            and last.get("item_id") == ev.get("item_id")
        ):
            last["delta"] += ev["delta"]
            if "logprobs" in ev:
                last["logprobs"] = last.get("logprobs", []) + ev["logprobs"]
            continue
        events.append(ev)
    return {
        "events": events,
        "sequence_numbers_count_up": numbers == list(range(len(numbers))),
        "event_names_match": names_match,
        "done_lines": done,
    }


def view(reply: Reply) -> dict[str, Any]:
    if reply.status != 200:
        body = reply.body if isinstance(reply.body, dict) else {}
        e = body.get("error", body)
        return {"status": reply.status, "error": {k: e.get(k) for k in ("type", "param", "code")}}
    if reply.content_type.startswith("text/event-stream"):
        return {"status": 200, "stream": stream_view(reply.raw)}
    return {"status": 200, "body": _norm(reply.body, _Ids())}


def compare(braid: Reply, vllm: Reply) -> list[str]:
    return diff(view(braid), view(vllm))


__all__ = ["compare", "parse_event_stream", "stream_view", "view"]
