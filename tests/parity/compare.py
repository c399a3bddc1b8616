"""Normalise one server's answer to a request, and list how two answers differ.

Pure functions over parsed replies, so the comparison itself is unit-tested without vLLM
(tests/parity/test_compare.py). What is normalised away, and nothing else:

* ``id``, ``created`` and ``system_fingerprint`` (they must differ between two servers);
* JSON key order (replies are compared as parsed values);
* float noise below ``FLOAT_TOL`` (two engine instances batch the same requests differently, and
  float32 matmuls over different batch shapes differ in the last bits);
* error messages (compared on status, ``error.type``, ``error.param`` and ``error.code``:
  vLLM's wording changes between releases);
* for streams, chunk boundaries: vLLM merges deltas when its consumer lags, so a stream is
  compared as its per-index concatenation (text, token ids, logprobs), the ordered finish
  reasons per index, the final usage chunk, the ``[DONE]`` count and the error events. A chat
  stream's ``reasoning`` is concatenated too, and its ``tool_calls`` pieces rebuilt into one
  call per call index (name, type, the concatenated arguments): how a parser cuts a call into
  pieces is its own (vLLM's differ per parser), what a client rebuilds is compared.

A chat stream (``chat.completion.chunk``) is summarised the same way, per index: the
concatenated ``delta.content``, the roles its deltas carried in order and whether the first
chunk of the index carried one (a missing role chunk, or one after content, is a difference),
any other delta field in order, the concatenated ``logprobs.content``, the prompt token ids
(chunk-level in chat), and the union of the keys its choices and deltas carried (a field vLLM
always sends, even as null, must be there); for the whole stream, the union of chunk-level keys
and the ``object`` and ``model`` values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from tests.helpers import parse_sse

FLOAT_TOL = 2e-3
IGNORED_KEYS = frozenset({"id", "created", "system_fingerprint"})


@attrs.frozen
class Reply:
    """What one server sent back: status, and the parsed JSON body or SSE events."""

    status: int
    content_type: str
    body: Any = None  # parsed JSON (non-stream, or an error before the stream started)
    events: tuple[Any, ...] | None = None  # SSE: dicts for data JSON, "[DONE]", ":" for comments
    raw: bytes = b""
    headers: tuple[tuple[str, str | None], ...] = ()  # the response headers the case compares

    @property
    def streamed(self) -> bool:
        return self.events is not None


def make_reply(status: int, content_type: str, raw: bytes, headers: tuple[tuple[str, str | None], ...] = ()) -> Reply:
    if status == 200 and content_type.startswith("text/event-stream"):
        return Reply(status, content_type, events=tuple(parse_sse(raw)), raw=raw, headers=headers)
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = {"unparsed": raw[:200].decode(errors="replace")}
    return Reply(status, content_type, body=body, raw=raw, headers=headers)


HEX32 = re.compile(r"[0-9a-f]{32}")


def _is_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str) and any(c in value for c in ".eE")


def header_view(name: str, value: str | None) -> Any:
    """A response header as compared: an ORCA load report (``endpoint-load-metrics``) as its
    format, its figures' names in order, and whether every figure is a float (the figures are
    each server's load at that moment); a server-made request id (32 hex digits, vLLM's
    ``uuid4().hex``) as its shape; any other value as sent."""
    if value is None:
        return None
    if name == "endpoint-load-metrics":
        kind, _, rest = value.partition(" ")
        figures: list[tuple[str, Any]] = []
        if kind == "TEXT" and rest:
            for item in rest.split(", "):
                key, _, number = item.partition("=")
                figures.append((key.removeprefix("named_metrics."), number))
        elif kind == "JSON":
            figures = list(json.loads(rest)["named_metrics"].items())
        return {"format": kind, "names": [k for k, _ in figures], "floats": all(_is_float(v) for _, v in figures)}
    if name == "x-request-id" and HEX32.fullmatch(value):
        return "<32 hex digits>"
    return value


def _error_view(err: Mapping[str, Any]) -> dict[str, Any]:
    e = err.get("error", err)
    return {"type": e.get("type"), "param": e.get("param"), "code": e.get("code")}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in IGNORED_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _extend(acc: dict[str, Any], key: str, values: Sequence[Any] | None) -> None:
    if values is not None:
        acc.setdefault(key, []).extend(values)


def _new_chat_choice() -> dict[str, Any]:
    return {
        "content": "",
        "roles": [],
        "first_chunk_has_role": None,
        "finish_reasons": [],
        "stop_reasons": [],
        "choice_keys": set(),
        "delta_keys": set(),
    }


def _add_chat_choice(acc: dict[str, Any], ch: Mapping[str, Any], ev: Mapping[str, Any]) -> None:
    """One chat chunk's choice into its index's summary (finish reasons, token ids, logprobs
    and usage are added by the caller, as for completions)."""
    delta = ch.get("delta") or {}
    role = delta.get("role")
    if acc["first_chunk_has_role"] is None:
        acc["first_chunk_has_role"] = role is not None
    if role is not None:
        acc["roles"].append(role)
    acc["content"] += delta.get("content") or ""
    if delta.get("reasoning"):
        acc["reasoning"] = acc.get("reasoning", "") + delta["reasoning"]
    for piece in delta.get("tool_calls") or ():
        calls = acc.setdefault("tool_calls", {})
        call = calls.setdefault(piece.get("index"), {"name": None, "arguments": "", "type": None})
        fn = piece.get("function") or {}
        call["name"] = call["name"] or fn.get("name")
        call["type"] = call["type"] or piece.get("type")
        call["arguments"] += fn.get("arguments") or ""
    for key, value in delta.items():
        if key not in ("role", "content", "reasoning", "tool_calls") and value is not None:
            acc.setdefault("delta." + key, []).append(value)
    acc["choice_keys"].update(ch)
    acc["delta_keys"].update(delta)
    _extend(acc, "prompt_token_ids", ev.get("prompt_token_ids"))


def summarize_stream(events: Sequence[Any]) -> dict[str, Any]:
    """One comparable value for a whole stream (see the module docstring)."""
    per: dict[int, dict[str, Any]] = {}
    usage_chunks: list[Any] = []
    errors: list[Any] = []
    done = 0
    after_done = 0
    content_chunks_without_usage = 0
    chat: bool | None = None  # decided by the first chunk with choices
    chunk_keys: set[str] = set()
    objects: set[Any] = set()
    models: set[Any] = set()
    for ev in events:
        if ev == ":":
            continue
        if done:
            after_done += 1
        if ev == "[DONE]":
            done += 1
            continue
        if "error" in ev:
            errors.append(_error_view(ev))
            continue
        choices = ev.get("choices", [])
        if not choices:
            usage_chunks.append(ev.get("usage"))
            continue
        if chat is None:
            chat = any("delta" in ch for ch in choices) or ev.get("object") == "chat.completion.chunk"
        if chat:
            chunk_keys.update(k for k in ev if k not in IGNORED_KEYS)
            objects.add(ev.get("object"))
            models.add(ev.get("model"))
        for ch in choices:
            if chat:
                acc = per.setdefault(ch["index"], _new_chat_choice())
                _add_chat_choice(acc, ch, ev)
            else:
                acc = per.setdefault(ch["index"], {"text": "", "finish_reasons": [], "stop_reasons": []})
                acc["text"] += ch.get("text") or ""
            if ch.get("finish_reason") is not None:
                acc["finish_reasons"].append(ch["finish_reason"])
                acc["stop_reasons"].append(ch.get("stop_reason"))
            _extend(acc, "token_ids", ch.get("token_ids"))
            _extend(acc, "prompt_token_ids", ch.get("prompt_token_ids"))
            lp = ch.get("logprobs")
            if lp is not None:
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset", "content"):
                    _extend(acc, "logprobs." + key, lp.get(key))
            if "usage" in ev and ev["usage"] is not None:
                acc["last_usage"] = ev["usage"]
            else:
                content_chunks_without_usage += 1
    if chat:
        for acc in per.values():
            acc["choice_keys"] = sorted(acc["choice_keys"])
            acc["delta_keys"] = sorted(acc["delta_keys"])
    out: dict[str, Any] = {}
    if chat:
        out = {
            "chunk_keys": sorted(chunk_keys),
            "objects": sorted(map(str, objects)),
            "models": sorted(map(str, models)),
        }
    return out | {
        "choices": {i: per[i] for i in sorted(per)},
        "usage_chunks": usage_chunks,
        "errors": errors,
        "done": done,
        "events_after_done": after_done,
        "continuous_usage": {i: per[i].get("last_usage") for i in sorted(per)},
        "content_chunks_without_usage": content_chunks_without_usage,
    }


def view(reply: Reply) -> dict[str, Any]:
    """The comparable value of one reply (with the headers its case compares, by :func:`header_view`)."""
    out = _body_view(reply)
    if reply.headers:
        out["headers"] = {name: header_view(name, value) for name, value in reply.headers}
    return out


def _body_view(reply: Reply) -> dict[str, Any]:
    if reply.status != 200:
        body = reply.body if isinstance(reply.body, dict) else {}
        return {"status": reply.status, "error": _error_view(body)}
    if reply.streamed:
        summary = summarize_stream(reply.events or ())
        # whether each content chunk carried usage is compared as a yes/no, not a count:
        # chunk boundaries differ between servers
        summary["content_chunks_without_usage"] = summary["content_chunks_without_usage"] > 0
        summary["continuous_usage"] = {
            i: ({k: v for k, v in u.items() if k != "total_tokens"} if u else None)
            for i, u in summary["continuous_usage"].items()
        }
        for acc in summary["choices"].values():
            acc.pop("last_usage", None)
        return {"status": 200, "stream": summary}
    return {"status": 200, "body": _strip(reply.body)}


def _floats_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)


def diff(a: Any, b: Any, path: str = "$") -> list[str]:
    """Differences between two views, as readable lines; ``[]`` when they match."""
    if isinstance(a, bool) or isinstance(b, bool):
        return [] if a is b else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return [] if a == b else [f"{path}: {a!r} != {b!r}"]
        return [] if _floats_close(float(a), float(b)) else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: missing on the left (right has {_short(b[k])})")
            elif k not in b:
                out.append(f"{path}.{k}: missing on the right (left has {_short(a[k])})")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)} ({_short(a)} vs {_short(b)})"]
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {_short(a)} != {_short(b)}"]


def _short(v: Any, limit: int = 120) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."
