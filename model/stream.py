"""The stream model: the trace, its outputs and the numbered invariants of one completions or chat request.

This module is a specification, not an implementation: it never talks to the server. A harness
records what happened around the *real* server code as a **trace** of plain data, and
:func:`check_trace` says which invariants the trace breaks. The request's state machine (its
states, events and transition tables) is :mod:`model.machine`; invariant 0 replays a trace
through it. docs/stream-model.md is the prose version; each invariant there links to the
predicate here.

Trace format (everything is plain JSON-like data)::

    {
      "request": {"kind": "completions" | "chat",   # the route (absent: completions)
                  "valid": bool,             # False: the body breaks the API (must be rejected)
                  "stream": bool, "n": int,
                  "prompts": [str, ...],       # completions: the prompt texts (the echo of prompt i)
                  "echo": bool, "hide_completion": bool,   # echo with max_tokens=0
                  "logprobs": int | None,      # chat: top_logprobs, when logprobs is true
                  "include_usage": bool, "continuous_usage": bool,
                  # chat only: one conversation per engine prompt, and how the reply is rendered
                  "conversations": [[{"role": str, "content": str}, ...], ...],
                  "add_generation_prompt": bool,    # False: continue_final_message
                  # chat through a tool-call or reasoning parser (absent or None: none runs)
                  "parsing": {"tool_choice": "auto" | "none" | "required" | "named",
                              "parallel": bool, "include_reasoning": bool}},
      "parses": [ {"content": str | None, "reasoning": str | None,
                   "tool_calls": [[name, arguments], ...]} | None, ... ],   # per choice index
      "limits": {"heartbeat": float,           # the server's idle heartbeat period
                 "abort_bound": float,         # how long an abort may take after its trigger
                 "max_in_flight": int,         # the server's engine slots (0: unbounded)
                 "handover_tokens": int},      # slots are handed on with at most this many left
      "left_running": int,                     # engine requests still running after the end
      "records": [ {"seq": int, "t": float, "kind": str, ...}, ... ]   # in seq order
    }

Record kinds (``seq`` is a total order, ``t`` virtual time):

* ``engine_open``  ``prompt``, ``prompt_tokens``: the engine request of prompt ``prompt`` starts.
* ``engine_output`` ``prompt``, ``deltas``: one engine output, ``[[k, text, n_tokens, finish_reason], ...]``.
* ``engine_failure`` ``prompt``, ``error``: the engine reported that this request failed
  (``EngineError`` | ``EngineRejected``), at the moment it knew, whether or not anyone was reading
  the request's outputs. The abort bound runs from here, not from the moment a driver noticed.
* ``engine_close`` ``prompt``, ``outcome`` (``finished`` | ``failed`` | ``aborted``), ``error``
  (``None`` | ``EngineError`` | ``EngineRejected`` | ``StreamStalled`` | other class name) and
  ``aborts`` (how many aborts the engine saw for this request).
* ``engine_ending`` ``prompt``, ``tokens_left``: the engine said the request of prompt ``prompt``
  is near its end: at most ``tokens_left`` of its ``max_tokens`` are still to come (its slots
  may be handed on from here, before its ``engine_close``).
* ``disconnect`` / ``drain``: the client went away / the server's drain deadline cancelled the request.
* ``sse``  ``event`` (one event from :func:`parse_sse`) and ``wait`` (seconds the body was
  waited on before it produced the write holding this event).
* ``json`` ``status``, ``body``: the one JSON response (non-streaming requests and rejections).
* ``end``  ``how`` (``complete`` | ``disconnect`` | ``drain`` | ``watchdog`` | ``crash``), ``detail``.
* ``slot_ask`` / ``slot_grant`` / ``slot_cancel`` / ``slot_release`` ``slots``: admission (the
  server's engine slots): the request asks for its next prompt's slots, is granted them (or its
  ask is cancelled), hands slots back. Asks and grants come in prompt order. ``limits.max_in_flight`` is the server's slot count (0: unbounded).

A chat request is a completions request whose prompts are its conversations: prompt ``i`` is
conversation ``i`` and choice ``k`` of it has index ``i*n + k``; the engine records are the same.
Only its framing differs: a role chunk, then (with echo) an echo chunk, then the content chunks
(chat's image of the completions chunks), per choice (see :func:`chat_parts`).

Chat with ``parsing`` (a request with tools, or a server with a reasoning parser) shows a choice's
engine text through vLLM's parsers: its content fragments carry ``delta.content``, ``delta.reasoning``
and ``delta.tool_calls`` pieces instead of the engine's deltas one for one. ``parses`` is the oracle
the harness records: for each choice, vLLM's ``parse()`` of its whole engine text (what the choice
generated, however it was split into outputs), before the server's rules (I19-I21 apply them).

Most invariants judge one request's trace (:func:`check_trace`). Admission's rules that are about
the server as a whole (the slot bound across requests, round-robin between them) judge the traces
of all requests of one run together, merged by ``seq`` (:func:`check_server`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from model.machine import ERROR_STATUS, RequestMachine

Trace = dict[str, Any]
Record = dict[str, Any]

EPS = 1e-9

# --------------------------------------------------------------------------------------------
# Outputs


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """One body write -> its SSE events; raises ValueError when the framing is wrong.

    Events: ``{"type": "chunk", "data": obj}`` (a completion chunk with one choice),
    ``{"type": "usage", "data": obj}`` (no choices, a usage object), ``{"type": "error",
    "data": obj}``, ``{"type": "done"}`` and ``{"type": "ping"}`` (an SSE comment).
    """
    text = raw.decode("utf-8")
    if not text.endswith("\n\n"):
        raise ValueError(f"a write must end with a blank line: {text[-40:]!r}")
    events: list[dict[str, Any]] = []
    for block in text[:-2].split("\n\n"):
        if "\n" in block or not block:
            raise ValueError(f"one line per event expected: {block!r}")
        if block.startswith(":"):
            events.append({"type": "ping"})
        elif block == "data: [DONE]":
            events.append({"type": "done"})
        elif block.startswith("data: "):
            obj = json.loads(block[len("data: ") :])
            if "error" in obj:
                events.append({"type": "error", "data": obj})
            elif obj.get("choices") == [] and "usage" in obj:
                events.append({"type": "usage", "data": obj})
            else:
                events.append({"type": "chunk", "data": obj})
        else:
            raise ValueError(f"not an SSE event: {block!r}")
    return events


# --------------------------------------------------------------------------------------------
# Derived views of a trace (pure functions the predicates share)


def _records(trace: Trace, *kinds: str) -> list[Record]:
    return [r for r in trace["records"] if r["kind"] in kinds]


def _events(trace: Trace) -> list[tuple[Record, dict[str, Any]]]:
    return [(r, r["event"]) for r in _records(trace, "sse")]


def _end(trace: Trace) -> Record | None:
    ends = _records(trace, "end")
    return ends[-1] if ends else None


def _is_chat(trace: Trace) -> bool:
    return bool(trace["request"].get("kind") == "chat")


def _parsing(trace: Trace) -> dict[str, Any] | None:
    """Chat through parsers: the request's parsing options (None: its text is shown as generated)."""
    if not _is_chat(trace):
        return None
    parsing: dict[str, Any] | None = trace["request"].get("parsing")
    return parsing


def _token_data_hidden(trace: Trace) -> bool:
    """Chat through parsers with the reasoning hidden: the tokens' logprobs are hidden too (they
    would spell the reasoning out), as vLLM's server hides them."""
    parsing = _parsing(trace)
    return parsing is not None and not parsing["include_reasoning"]


def _num_prompts(trace: Trace) -> int:
    """The engine prompts of the request: its prompts, or a chat request's conversations."""
    req = trace["request"]
    return len(req["conversations"] if _is_chat(trace) else req["prompts"])


def _num_choices(trace: Trace) -> int:
    return _num_prompts(trace) * trace["request"]["n"]


def reply_role(trace: Trace, prompt: int) -> str:
    """Chat: the role of conversation ``prompt``'s replies: ``assistant`` after a generation
    prompt, else the role of the message the reply continues (the last one)."""
    req = trace["request"]
    return "assistant" if req["add_generation_prompt"] else str(req["conversations"][prompt][-1]["role"])


def echo_text(trace: Trace, prompt: int) -> str:
    """Chat: what ``echo`` puts before each reply of conversation ``prompt``: the last message's
    content when that message has the reply's role, else nothing ("" without echo)."""
    req = trace["request"]
    last = req["conversations"][prompt][-1]
    if not req["echo"] or last["role"] != reply_role(trace, prompt):
        return ""
    return str(last.get("content") or "")


def _prompt_tokens(trace: Trace) -> dict[int, int]:
    return {r["prompt"]: r["prompt_tokens"] for r in _records(trace, "engine_open")}


def _failures(trace: Trace) -> list[Record]:
    """The failures the client must hear of, in the order they happened: the engine's reports of
    failed requests, and the engine closes that are failures it did not report first (a stall,
    or an engine that reports a failure only when it is read)."""
    reported = {r["prompt"] for r in _records(trace, "engine_failure")}
    out = [
        r
        for r in trace["records"]
        if (r["kind"] == "engine_failure" and r["error"] in ERROR_STATUS)
        or (r["kind"] == "engine_close" and r["error"] in ERROR_STATUS and r["prompt"] not in reported)
    ]
    return out


def _triggers(trace: Trace) -> list[Record]:
    """Records after which the whole batch must be aborted: failures, stalls, disconnects, drains."""
    return [r for r in trace["records"] if r["kind"] in ("disconnect", "drain")] + _failures(trace)


def expected_chunks(trace: Trace) -> dict[int, list[dict[str, Any]]]:
    """What each choice's chunks must be, from the engine's deltas (index ``prompt*n + k``).

    One chunk per engine delta, in engine order; a delta with no text, no token and no
    finish_reason shows nothing (unless it is an echoed first chunk). The first chunk of an echoed
    choice starts with the prompt's text and carries the prompt's tokens' logprobs; with
    ``hide_completion`` (echo and max_tokens=0) generated text and tokens are not shown, but counted.
    For chat these are the content chunks: its echo is not part of them.
    """
    req = trace["request"]
    n, hide = req["n"], req["hide_completion"]
    echo = req["echo"] and not _is_chat(trace)  # chat's echo is a chunk of its own (chat_parts)
    ptoks = _prompt_tokens(trace)
    out: dict[int, list[dict[str, Any]]] = {j: [] for j in range(_num_choices(trace))}
    counted: dict[int, int] = {}
    for r in _records(trace, "engine_output"):
        p = r["prompt"]
        for k, text, ntok, finish in r["deltas"]:
            j = p * n + k
            first = not out[j]
            counted[j] = counted.get(j, 0) + ntok
            shown_text, shown_tok = ("", 0) if hide else (text, ntok)
            if finish is None and not text and not ntok and not (first and echo):
                continue
            if first and echo:
                shown_text = req["prompts"][p] + shown_text
                shown_tok += ptoks[p]
            out[j].append(
                {
                    "text": shown_text,
                    "finish_reason": finish,
                    "lp_tokens": shown_tok,
                    "completion_tokens": counted[j],
                    "seq": r["seq"],
                    "prompt": p,
                }
            )
    return out


def _all_choice_chunks(trace: Trace) -> dict[int, list[tuple[Record, dict[str, Any]]]]:
    """Every emitted choice fragment per index, in order: (record, choice dict)."""
    out: dict[int, list[tuple[Record, dict[str, Any]]]] = {}
    for r, ev in _events(trace):
        if ev["type"] == "chunk":
            for c in ev["data"].get("choices", []):
                out.setdefault(c.get("index"), []).append((r, c))
    return out


ROLE, ECHO, CONTENT = "role", "echo", "content"


def chat_parts(trace: Trace) -> dict[int, list[tuple[str, Record, dict[str, Any]]]]:
    """A chat stream's fragments per choice index, each classified: (part, record, choice dict).

    ``role``: its delta names a role. ``echo``: the first fragment without a role of a choice whose
    conversation has an echo text (:func:`echo_text`), which is where the echo must be (I18 says
    whether it is the echo). ``content``: every other fragment; its text is ``delta.content``.
    """
    out: dict[int, list[tuple[str, Record, dict[str, Any]]]] = {}
    n = trace["request"]["n"]
    for j, got in _all_choice_chunks(trace).items():
        want_echo = isinstance(j, int) and 0 <= j < _num_choices(trace) and bool(echo_text(trace, j // n))
        parts = out.setdefault(j, [])
        for r, c in got:
            delta = c.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                parts.append((ROLE, r, c))
            elif want_echo and all(part == ROLE for part, _, _ in parts):
                parts.append((ECHO, r, c))
            else:
                parts.append((CONTENT, r, c))
    return out


def _choice_chunks(trace: Trace) -> dict[int, list[tuple[Record, dict[str, Any]]]]:
    """The fragments that carry a choice's engine deltas, per index, in order: (record, choice
    dict). Completions: every fragment. Chat: its content fragments, with their ``delta.content``
    as ``text`` (so the invariants about a choice's deltas judge both alike)."""
    if not _is_chat(trace):
        return _all_choice_chunks(trace)
    out: dict[int, list[tuple[Record, dict[str, Any]]]] = {}
    for j, parts in chat_parts(trace).items():
        got = out.setdefault(j, [])
        for part, r, c in parts:
            delta = c.get("delta")
            if part == CONTENT:
                got.append((r, {**c, "text": delta.get("content") if isinstance(delta, dict) else None}))
    return out


def _normal_end(trace: Trace) -> bool:
    """The request ran to its end: it was valid, and neither a disconnect nor a drain cut it."""
    end = _end(trace)
    return trace["request"]["valid"] and end is not None and end["how"] == "complete"


def _first_done_seq(trace: Trace) -> int | None:
    for r, ev in _events(trace):
        if ev["type"] == "done":
            return r["seq"]
    return None


# --------------------------------------------------------------------------------------------
# The invariants


@dataclass(frozen=True)
class Invariant:
    """One numbered invariant: :attr:`check` yields a message per violation of :attr:`text`.

    :attr:`prefix_safe`: a trace cut at an arbitrary instant (a request still running) already
    satisfies it whenever the whole run will; the stateful test checks these after every step
    (:data:`PREFIX_SAFE`). The others judge a request that has ended.
    """

    number: int
    name: str
    text: str
    check: Callable[[Trace], Iterable[str]]
    prefix_safe: bool


@dataclass(frozen=True)
class Violation:
    number: int
    name: str
    message: str

    def __str__(self) -> str:
        return f"I{self.number} {self.name}: {self.message}"


INVARIANTS: list[Invariant] = []


def invariant(
    number: int, text: str, *, prefix_safe: bool
) -> Callable[[Callable[[Trace], Iterable[str]]], Callable[[Trace], Iterable[str]]]:
    def register(fn: Callable[[Trace], Iterable[str]]) -> Callable[[Trace], Iterable[str]]:
        INVARIANTS.append(Invariant(number, fn.__name__, text, fn, prefix_safe))
        return fn

    return register


@invariant(
    1,
    "Every write is well-formed SSE and every completion or chat chunk carries exactly one choice "
    "(a text for completions, a delta for chat).",
    prefix_safe=True,
)
def framing(trace: Trace) -> Iterable[str]:
    chat = _is_chat(trace)
    obj = "chat.completion.chunk" if chat else "text_completion"
    for r in _records(trace, "sse_malformed"):
        yield f"malformed write at t={r['t']}: {r['detail']}"
    for r, ev in _events(trace):
        if ev["type"] in ("chunk", "usage"):
            d = ev["data"]
            if d.get("object") != obj:
                yield f"seq {r['seq']}: object is {d.get('object')!r}"
            if ev["type"] == "chunk" and len(d.get("choices") or ()) != 1:
                yield f"seq {r['seq']}: a chunk with {len(d.get('choices') or ())} choices"
            for c in d.get("choices") or ():
                if chat and not (isinstance(c.get("delta"), dict) and "text" not in c):
                    yield f"seq {r['seq']}: a chat choice without a delta: {sorted(c)}"
                if not chat and ("delta" in c or not isinstance(c.get("text"), str)):
                    yield f"seq {r['seq']}: a completion choice without a text: {sorted(c)}"
    if not trace["request"]["stream"] and _records(trace, "sse"):
        yield "a non-streaming request wrote SSE events"


@invariant(2, "Every emitted choice index is prompt_idx*n + k for an existing choice (0 <= k < n).", prefix_safe=True)
def choice_index(trace: Trace) -> Iterable[str]:
    total = _num_choices(trace)
    for j in _all_choice_chunks(trace):
        if not isinstance(j, int) or not 0 <= j < total:
            yield f"choice index {j!r} is not prompt_idx*n+k for any of the {total} choices"
    for r in _records(trace, "json"):
        if r["status"] == 200:
            idx = [c.get("index") for c in r["body"].get("choices", [])]
            if idx != list(range(total)):
                yield f"JSON choices have indices {idx}, expected 0..{total - 1}"


@invariant(
    3,
    "Each choice's chunks (chat: its content chunks) are its engine deltas in engine order (so "
    "its text is their concatenation, after the echoed prompt), each emitted no earlier than its delta "
    "(chat through parsers: no more chunks than engine deltas; I19 says what they show).",
    prefix_safe=True,
)
def choice_sequence(trace: Trace) -> Iterable[str]:
    want = expected_chunks(trace)
    parsed = _parsing(trace) is not None
    for j, got in _choice_chunks(trace).items():
        exp = want.get(j, [])
        if len(got) > len(exp):
            yield f"choice {j}: {len(got)} chunks but the engine produced only {len(exp)} deltas for it"
        if parsed:
            continue  # what parsed text shows is I19's
        for m, ((r, c), e) in enumerate(zip(got, exp, strict=False)):
            if c.get("text") != e["text"]:
                yield f"choice {j} chunk {m}: text {c.get('text')!r}, engine delta says {e['text']!r}"
                break
            if r["seq"] < e["seq"]:
                yield f"choice {j} chunk {m} was written before the engine produced it"
                break


@invariant(
    4,
    "Exactly one non-null finish_reason per finished choice, on its last chunk, equal to "
    "the engine's (chat through parsers: as I21 says); on a normal end without error every choice "
    "has finished.",
    prefix_safe=True,
)
def one_finish_reason(trace: Trace) -> Iterable[str]:
    want = expected_chunks(trace)
    chunks = _choice_chunks(trace)
    errored = any(ev["type"] == "error" for _, ev in _events(trace))
    for j, got in chunks.items():
        reasons = [(m, c.get("finish_reason")) for m, (_, c) in enumerate(got) if c.get("finish_reason") is not None]
        if len(reasons) > 1:
            yield f"choice {j} has {len(reasons)} finish reasons"
        if reasons and reasons[-1][0] != len(got) - 1:
            yield f"choice {j} has chunks after its finish_reason"
        exp = want.get(j, [])
        if _parsing(trace) is not None:
            continue  # chunks are not one per engine delta there; I21 says which reason
        for m, (_, c) in enumerate(got):
            if m < len(exp) and c.get("finish_reason") != exp[m]["finish_reason"]:
                yield f"choice {j} chunk {m}: finish_reason {c.get('finish_reason')!r}, engine says {exp[m]['finish_reason']!r}"
    if trace["request"]["stream"] and _normal_end(trace) and not errored:
        for j in range(_num_choices(trace)):
            got = chunks.get(j, [])
            if not got or got[-1][1].get("finish_reason") is None:
                yield f"the stream ended normally but choice {j} never got a finish_reason"


@invariant(
    5,
    "At most one usage chunk; only with include_usage; only after every choice finished and "
    "right before [DONE]; never after an error.",
    prefix_safe=True,
)
def usage_placement(trace: Trace) -> Iterable[str]:
    req = trace["request"]
    evs = _events(trace)
    usage = [i for i, (_, ev) in enumerate(evs) if ev["type"] == "usage"]
    if len(usage) > 1:
        yield f"{len(usage)} usage chunks"
    if usage and not req["include_usage"]:
        yield "a usage chunk without stream_options.include_usage"
    for i in usage:
        finished = {
            c.get("index")
            for _, ev in evs[:i]
            if ev["type"] == "chunk"
            for c in ev["data"]["choices"]
            if c.get("finish_reason") is not None
        }
        if len(finished) < _num_choices(trace):
            yield f"usage chunk written when {len(finished)} of {_num_choices(trace)} choices had finished"
        if any(ev["type"] == "error" for _, ev in evs[:i]):
            yield "usage chunk after an error event"
        if i + 1 >= len(evs) or evs[i + 1][1]["type"] != "done":
            yield "usage chunk not immediately followed by [DONE]"
    if (
        req["stream"]
        and req["include_usage"]
        and _normal_end(trace)
        and not usage
        and not any(ev["type"] == "error" for _, ev in evs)
    ):
        yield "include_usage stream ended normally without a usage chunk"


@invariant(
    6,
    "Usage totals equal the model's sums: prompt tokens once per prompt (chat: per conversation), "
    "completion tokens as the engine counted them, summed over choices, total = prompt + completion; "
    "continuous usage per chunk is the chunk's prompt and the choice's tokens so far (a chat role or "
    "echo chunk: its conversation's prompt and 0).",
    prefix_safe=True,
)
def usage_totals(trace: Trace) -> Iterable[str]:
    req = trace["request"]
    ptoks = _prompt_tokens(trace)
    want_chunks = expected_chunks(trace)
    prompt_total = sum(ptoks.values())
    completion_total = sum(sum(d[2] for d in r["deltas"]) for r in _records(trace, "engine_output"))

    def check(usage: dict[str, Any], prompt: int, completion: int, where: str) -> Iterable[str]:
        got = (usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens"))
        if got != (prompt, completion, prompt + completion):
            yield f"{where}: usage {got}, expected {(prompt, completion, prompt + completion)}"

    for _, ev in _events(trace):
        if ev["type"] == "usage":
            yield from check(ev["data"]["usage"], prompt_total, completion_total, "usage chunk")
    for r, ev in _events(trace):
        if ev["type"] != "chunk":
            continue
        u = ev["data"].get("usage")
        if req["continuous_usage"] != (u is not None):
            yield f"seq {r['seq']}: chunk usage is {u!r} with continuous_usage={req['continuous_usage']}"
    if req["continuous_usage"] and _parsing(trace) is not None:
        # Parsed chunks are not one per engine delta (a held-back marker sends nothing): each
        # chunk's count is one the choice reached, and they only go up.
        for j, got in _choice_chunks(trace).items():
            exp = want_chunks.get(j, [])
            reached = {e["completion_tokens"]: e["prompt"] for e in exp}
            last = 0
            for m, (r, _) in enumerate(got):
                u = r["event"]["data"].get("usage")
                if u is None or not exp:
                    continue
                count = u.get("completion_tokens")
                if count not in reached or count <= last:
                    yield f"choice {j} chunk {m} (continuous usage): {count} completion tokens, after {last}"
                    break
                last = count
                yield from check(u, ptoks.get(reached[count], -1), count, f"choice {j} chunk {m} (continuous usage)")
    elif req["continuous_usage"]:
        for j, got in _choice_chunks(trace).items():
            exp = want_chunks.get(j, [])
            for m, (r, _) in enumerate(got):
                u = r["event"]["data"].get("usage")
                if u is not None and m < len(exp):
                    e = exp[m]
                    yield from check(
                        u,
                        ptoks.get(e["prompt"], -1),
                        e["completion_tokens"],
                        f"choice {j} chunk {m} (continuous usage)",
                    )
    if req["continuous_usage"] and _is_chat(trace):
        # A chat choice's role and echo chunks: its conversation's prompt tokens, nothing generated.
        for j, parts in chat_parts(trace).items():
            p = j // req["n"] if isinstance(j, int) else -1
            for part, r, _ in parts:
                u = r["event"]["data"].get("usage")
                if part != CONTENT and u is not None and p in ptoks:
                    yield from check(u, ptoks[p], 0, f"choice {j} {part} chunk (continuous usage)")
    for r in _records(trace, "json"):
        if r["status"] == 200:
            yield from check(r["body"].get("usage", {}), prompt_total, completion_total, "JSON response")


@invariant(
    7,
    "Exactly one [DONE], as the last event, on a normal end and after an error event; nothing after it.",
    prefix_safe=True,
)
def done_terminal(trace: Trace) -> Iterable[str]:
    evs = _events(trace)
    dones = [i for i, (_, ev) in enumerate(evs) if ev["type"] == "done"]
    if len(dones) > 1:
        yield f"{len(dones)} [DONE] events"
    if dones and dones[0] != len(evs) - 1:
        yield f"{len(evs) - 1 - dones[0]} events after [DONE]"
    if trace["request"]["stream"] and _normal_end(trace) and not dones:
        yield "the stream ended normally without [DONE]"
    errors = [i for i, (_, ev) in enumerate(evs) if ev["type"] == "error"]
    if errors and not (dones and dones[0] > errors[0]) and _normal_end(trace):
        yield "an error event without [DONE] after it"


@invariant(
    8,
    "A stream that ends normally has an error event if and only if an engine request failed "
    "or the reader stalled: exactly one, with the first failure's status, after which only "
    "[DONE] follows.",
    prefix_safe=True,
)
def error_event(trace: Trace) -> Iterable[str]:
    if not trace["request"]["stream"]:
        return
    evs = _events(trace)
    errors = [i for i, (_, ev) in enumerate(evs) if ev["type"] == "error"]
    failures = _failures(trace)
    if len(errors) > 1:
        yield f"{len(errors)} error events"
    if errors and not failures:
        yield "an error event although no engine request failed or stalled"
    if _normal_end(trace) and failures and not errors:
        yield f"{failures[0]['error']} in the engine request of prompt {failures[0]['prompt']}, but no error event"
    if errors and failures:
        code = evs[errors[0]][1]["data"].get("error", {}).get("code")
        if code != ERROR_STATUS[failures[0]["error"]]:
            yield f"error event code {code}, first failure was {failures[0]['error']}"
        if any(ev["type"] not in ("done",) for _, ev in evs[errors[0] + 1 :]):
            yield "events other than [DONE] after the error event"


@invariant(
    9,
    "Nothing at all is written after a client disconnect or a drain cancellation (the connection is closed).",
    prefix_safe=True,
)
def silent_after_close(trace: Trace) -> Iterable[str]:
    closes = _records(trace, "disconnect", "drain")
    if not closes:
        return
    first = closes[0]
    for r in _records(trace, "sse", "json"):
        if r["seq"] > first["seq"]:
            yield f"{r['kind']} written at t={r['t']} after the {first['kind']} at t={first['t']}"


@invariant(
    10,
    "Engine cleanup: by the end every engine request is finished, failed or aborted, none "
    "aborted twice, none left running; after an error, disconnect, stall or drain every "
    "engine request still open is closed within abort_bound; without any of these none is "
    "aborted.",
    prefix_safe=False,
)
def engine_cleanup(trace: Trace) -> Iterable[str]:
    opens = {r["prompt"]: r for r in _records(trace, "engine_open")}
    closes: dict[int, list[Record]] = {}
    for r in _records(trace, "engine_close"):
        closes.setdefault(r["prompt"], []).append(r)
    if len(opens) != len(_records(trace, "engine_open")):
        yield "an engine request was opened twice"
    if trace.get("left_running", 0):
        yield f"{trace['left_running']} engine requests left running"
    for p, _o in opens.items():
        cs = closes.get(p, [])
        if len(cs) != 1:
            yield f"engine request of prompt {p} closed {len(cs)} times"
            continue
        if cs[0]["aborts"] > 1:
            yield f"engine request of prompt {p} aborted {cs[0]['aborts']} times"
    triggers = _triggers(trace)
    bound = trace["limits"]["abort_bound"]
    if triggers:
        first = min(triggers, key=lambda r: r["seq"])
        for p, cs in closes.items():
            if not cs:
                continue
            c = cs[0]
            if c["seq"] > first["seq"] and c["t"] > first["t"] + bound + EPS:
                yield (
                    f"engine request of prompt {p} closed at t={c['t']:g} ({c['outcome']}), "
                    f"{c['t'] - first['t']:g} s after the {first['kind']} at t={first['t']:g} (bound {bound:g} s)"
                )
    else:
        for p, cs in closes.items():
            if cs and cs[0]["outcome"] != "finished":
                yield f"engine request of prompt {p} {cs[0]['outcome']} although nothing went wrong"
    if _normal_end(trace) and trace["request"]["valid"] and not triggers:
        missing = set(range(_num_prompts(trace))) - set(opens)
        if missing:
            yield f"prompts {sorted(missing)} never reached the engine"


@invariant(
    11,
    "A non-streaming response is all-or-nothing: exactly one JSON response on a normal end "
    "(none after a disconnect or drain): 200 with every choice complete if no engine request "
    "failed (chat: a message with the reply's role, the echo and the text; through parsers, as I19 "
    "and I21 say), else the first failure's error and no choices.",
    prefix_safe=False,
)
def all_or_nothing(trace: Trace) -> Iterable[str]:
    req = trace["request"]
    if req["stream"] or not req["valid"]:
        return
    js = _records(trace, "json")
    if not _normal_end(trace):
        return
    if len(js) != 1:
        yield f"{len(js)} JSON responses"
        return
    r = js[0]
    failures = _failures(trace)
    if failures:
        want = ERROR_STATUS[failures[0]["error"]]
        if r["status"] != want or "choices" in r["body"] or "error" not in r["body"]:
            yield f"status {r['status']} body keys {sorted(r['body'])} after {failures[0]['error']} (want {want}, an error body)"
        return
    if r["status"] != 200:
        yield f"status {r['status']} although nothing failed"
        return
    chat = _is_chat(trace)
    obj = "chat.completion" if chat else "text_completion"
    if r["body"].get("object") != obj:
        yield f"the JSON response's object is {r['body'].get('object')!r}, expected {obj!r}"
    chunks = expected_chunks(trace)
    for c in r["body"].get("choices", []):
        j = c.get("index")
        exp = chunks.get(j, [])
        text = "".join(e["text"] for e in exp)
        got_text = c.get("text")
        if chat and isinstance(j, int) and 0 <= j < _num_choices(trace):
            message = c.get("message") or {}
            got_text = message.get("content")
            p = j // req["n"]
            text = echo_text(trace, p) + text
            if message.get("role") != reply_role(trace, p):
                yield f"choice {j}: message role {message.get('role')!r}, the reply's role is {reply_role(trace, p)!r}"
        if _parsing(trace) is not None:
            pass  # its message and finish_reason are I19's and I21's
        elif got_text != text:
            yield f"choice {j}: text {got_text!r}, the engine produced {text!r}"
        fin = exp[-1]["finish_reason"] if exp else None
        if fin is None:
            yield f"choice {j}: the engine never finished it"
        elif _parsing(trace) is None and c.get("finish_reason") != fin:
            yield f"choice {j}: finish_reason {c.get('finish_reason')!r}, engine said {fin!r}"
        if req["logprobs"] is not None and not _token_data_hidden(trace):
            lp = c.get("logprobs") or {}
            ntok = sum(e["lp_tokens"] for e in exp)
            got = len(lp.get("content") or ()) if chat else len(lp.get("tokens", ()))
            if got != ntok:
                yield f"choice {j}: {got} logprob tokens, expected {ntok}"
        elif chat and c.get("logprobs") is not None:
            yield f"choice {j}: logprobs without a request for them"


@invariant(
    12,
    "Heartbeat: pings only while the stream is open (before [DONE]); a ping only after the "
    "body was idle for heartbeat seconds; no write waited longer than heartbeat.",
    prefix_safe=True,
)
def heartbeat(trace: Trace) -> Iterable[str]:
    hb = trace["limits"]["heartbeat"]
    done = _first_done_seq(trace)
    for r, ev in _events(trace):
        if ev["type"] == "ping":
            if done is not None and r["seq"] > done:
                yield f"ping at t={r['t']} after [DONE]"
            if r["wait"] < hb - EPS:
                yield f"ping at t={r['t']} after only {r['wait']:g} s idle (heartbeat {hb:g} s)"
        if r["wait"] > hb + EPS:
            yield f"a write at t={r['t']} came after {r['wait']:g} s of silence (heartbeat {hb:g} s)"


@invariant(
    13,
    "Logprobs: when requested every chunk has four equal-length lists with one entry per token "
    "of its delta (plus the prompt's tokens on an echoed first chunk), and a choice's text_offsets "
    "run on from 0 across its chunks, each the previous offset plus the previous token's length; "
    "chat: a content chunk has {content: [one entry per token]}, at most top_logprobs alternatives "
    "each, role and echo chunks none; when not requested (or the reasoning is hidden) logprobs is null.",
    prefix_safe=True,
)
def logprobs_shape(trace: Trace) -> Iterable[str]:
    if _is_chat(trace):
        yield from _chat_logprobs_shape(trace)
        return
    req = trace["request"]
    want = expected_chunks(trace)
    for j, got in _choice_chunks(trace).items():
        exp = want.get(j, [])
        offset = 0
        for m, (_, c) in enumerate(got):
            lp = c.get("logprobs")
            if req["logprobs"] is None:
                if lp is not None:
                    yield f"choice {j} chunk {m}: logprobs without a request for them"
                continue
            if lp is None:
                yield f"choice {j} chunk {m}: no logprobs"
                continue
            lens = {key: len(lp.get(key) or ()) for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs")}
            if len(set(lens.values())) != 1:
                yield f"choice {j} chunk {m}: logprobs lists of lengths {lens}"
                continue
            if m < len(exp) and lens["tokens"] != exp[m]["lp_tokens"]:
                yield f"choice {j} chunk {m}: {lens['tokens']} logprob tokens, expected {exp[m]['lp_tokens']}"
            for off, tok in zip(lp["text_offset"], lp["tokens"], strict=False):
                if off != offset:
                    yield f"choice {j} chunk {m}: text_offset {off} where the previous tokens end at {offset}"
                    break
                offset += len(tok)
            else:
                continue
            break


def _chat_logprobs_shape(trace: Trace) -> Iterable[str]:
    """I13 for chat: a content chunk's logprobs are ``{"content": [entry per token]}``, each entry
    ``{token, logprob, bytes, top_logprobs}`` with at most ``top_logprobs`` alternatives; role and
    echo chunks have none."""
    req = trace["request"]
    top = None if _token_data_hidden(trace) else req["logprobs"]
    want = expected_chunks(trace)
    for j, parts in chat_parts(trace).items():
        exp = want.get(j, [])
        m = 0
        for part, _, c in parts:
            lp = c.get("logprobs")
            if part != CONTENT:
                if lp is not None:
                    yield f"choice {j}: logprobs on its {part} chunk"
                continue
            m += 1
            if top is None:
                if lp is not None:
                    yield f"choice {j} chunk {m - 1}: logprobs without a request for them"
                continue
            entries = lp.get("content") if isinstance(lp, dict) else None
            if not isinstance(entries, list):
                yield f"choice {j} chunk {m - 1}: logprobs {lp!r}, expected {{'content': [...]}}"
                continue
            if m - 1 < len(exp) and len(entries) != exp[m - 1]["lp_tokens"]:
                yield f"choice {j} chunk {m - 1}: {len(entries)} logprob entries, expected {exp[m - 1]['lp_tokens']}"
            for e in entries:
                if not {"token", "logprob", "bytes", "top_logprobs"} <= set(e):
                    yield f"choice {j} chunk {m - 1}: a logprob entry with keys {sorted(e)}"
                    break
                if top != -1 and len(e["top_logprobs"]) > top:
                    yield f"choice {j} chunk {m - 1}: {len(e['top_logprobs'])} alternatives, top_logprobs is {top}"
                    break


@invariant(14, "An invalid request is rejected: one 4xx JSON error, no engine request, no stream.", prefix_safe=True)
def rejected(trace: Trace) -> Iterable[str]:
    if trace["request"]["valid"]:
        return
    if _records(trace, "engine_open"):
        yield "an invalid request reached the engine"
    if _records(trace, "sse"):
        yield "an invalid request got a stream"
    js = _records(trace, "json")
    if len(js) != 1 or not 400 <= js[0]["status"] < 500 or "error" not in js[0]["body"]:
        yield f"an invalid request got {[(r['status'], sorted(r['body'])) for r in js]}, expected one 4xx error"


@invariant(
    15,
    "Liveness: every request ends (normally, by disconnect or by drain), never by a crash or "
    "by the harness's watchdog.",
    prefix_safe=False,
)
def liveness(trace: Trace) -> Iterable[str]:
    end = _end(trace)
    if end is None:
        yield "the trace has no end"
    elif end["how"] in ("crash", "watchdog"):
        yield f"ended by {end['how']}: {end.get('detail')}"


@invariant(
    16,
    "Admission: a prompt's engine request opens only after its slots were granted; the request "
    "never holds more than max_in_flight slots, and never fewer than its open engine requests take "
    "(n each) unless the engine said they are near their end, with at most handover_tokens left; "
    "by its end it holds none and waits for none (a request cancelled while prompts wait for "
    "slots opens none of them).",
    prefix_safe=True,
)
def admission(trace: Trace) -> Iterable[str]:
    cap = trace["limits"].get("max_in_flight", 0)
    lead = trace["limits"].get("handover_tokens", 0)
    n = trace["request"]["n"]
    grants = opens = holds = asks = 0
    running: set[int] = set()  # prompts whose engine request is open and not near its end
    ended = False
    for r in trace["records"]:
        kind = r["kind"]
        if kind == "engine_open":
            running.add(r["prompt"])
            if cap and holds < n * len(running):
                yield f"seq {r['seq']}: prompt {r['prompt']}'s engine request opened without its slots held"
        elif kind == "engine_close":
            running.discard(r["prompt"])
        elif kind == "engine_ending":
            if r["tokens_left"] > lead:
                yield f"seq {r['seq']}: prompt {r['prompt']} handed on with {r['tokens_left']} tokens left (at most {lead})"
            running.discard(r["prompt"])
        if kind == "slot_ask":
            asks += 1
        elif kind == "slot_cancel":
            asks -= 1
        elif kind == "slot_grant":
            grants += 1
            holds += r["slots"]
            if ended:
                yield f"seq {r['seq']}: slots granted after the request ended"

            if grants > asks:
                yield f"seq {r['seq']}: a grant nobody asked for"
            if cap and holds > cap:
                yield f"seq {r['seq']}: the request holds {holds} slots, the server has {cap}"
        elif kind == "slot_release":
            holds -= r["slots"]
            if holds < 0:
                yield f"seq {r['seq']}: more slots released than granted"
            elif cap and holds < n * len(running):
                yield f"seq {r['seq']}: slots released that {len(running)} engine requests still run on, not near their end"
        elif kind == "engine_open" and cap:
            opens += 1
            if opens > grants:
                yield f"seq {r['seq']}: the engine request of prompt {r['prompt']} opened without a slot"
        elif kind == "end":
            ended = True
            if holds:
                yield f"the request ended holding {holds} slots"


def _errored(trace: Trace) -> bool:
    return any(ev["type"] == "error" for _, ev in _events(trace))


def _valid_index(trace: Trace, j: object) -> bool:
    return isinstance(j, int) and 0 <= j < _num_choices(trace)


@invariant(
    17,
    "Chat: a choice has at most one role chunk, its first chunk (before its echo and content), "
    "with delta {role: the reply's role, content: ''} and no finish_reason; role chunks come in "
    "choice order; a stream that ends normally without an error has one for every choice.",
    prefix_safe=True,
)
def chat_role(trace: Trace) -> Iterable[str]:
    if not _is_chat(trace):
        return  # completions choices have no delta (I1)
    n = trace["request"]["n"]
    order: list[tuple[int, int]] = []
    have: set[int] = set()
    for j, parts in chat_parts(trace).items():
        roles = [(m, r, c) for m, (part, r, c) in enumerate(parts) if part == ROLE]
        if len(roles) > 1:
            yield f"choice {j} has {len(roles)} role chunks"
        if not roles:
            continue
        m, r, c = roles[0]
        if m != 0:
            yield f"choice {j}: its role chunk comes after {m} of its other chunks"
        if c.get("finish_reason") is not None:
            yield f"choice {j}: its role chunk has finish_reason {c.get('finish_reason')!r}"
        if _valid_index(trace, j):
            want = {"role": reply_role(trace, j // n), "content": ""}
            if c.get("delta") != want:
                yield f"choice {j}: role chunk delta {c.get('delta')!r}, expected {want!r}"
            order.append((r["seq"], j))
            have.add(j)
    in_order = [j for _, j in sorted(order)]
    if in_order != sorted(in_order):
        yield f"role chunks came for choices {in_order}, not in choice order"
    if trace["request"]["stream"] and _normal_end(trace) and not _errored(trace):
        missing = sorted(set(range(_num_choices(trace))) - have)
        if missing:
            yield f"the stream ended normally but choices {missing} never got their role chunk"


@invariant(
    18,
    "Chat with echo: when a conversation's last message has the reply's role and some text, each "
    "of its choices has one echo chunk carrying exactly that text, right after its role chunk and "
    "before any content, with no finish_reason (on a normal end without an error, every such "
    "choice); otherwise there is no echo chunk (I3).",
    prefix_safe=True,
)
def chat_echo(trace: Trace) -> Iterable[str]:
    if not _is_chat(trace):
        return
    n = trace["request"]["n"]
    have: set[int] = set()
    for j, parts in chat_parts(trace).items():
        if not _valid_index(trace, j):
            continue
        want = echo_text(trace, j // n)
        for m, (part, _, c) in enumerate(parts):
            if part != ECHO:
                continue
            have.add(j)
            if m == 0 or parts[m - 1][0] != ROLE:
                yield f"choice {j}: its echo chunk does not come right after its role chunk"
            if c.get("delta") != {"content": want}:
                yield f"choice {j}: delta {c.get('delta')!r} where its echo {want!r} belongs"
            if c.get("finish_reason") is not None:
                yield f"choice {j}: its echo chunk has finish_reason {c.get('finish_reason')!r}"
    if trace["request"]["stream"] and _normal_end(trace) and not _errored(trace):
        missing = [j for j in range(_num_choices(trace)) if echo_text(trace, j // n) and j not in have]
        if missing:
            yield f"the stream ended normally but choices {missing} never got their echo chunk"


# --------------------------------------------------------------------------------------------
# Chat through tool-call and reasoning parsers (I19-I21)


def _rebuilt(deltas: Iterable[dict[str, Any]]) -> tuple[str, str, list[list[str]]]:
    """A streamed choice put back together as a client does: content and reasoning concatenated,
    each call's name from its first piece and its arguments the concatenated fragments."""
    content, reasoning = [], []
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning") or "")
        for piece in delta.get("tool_calls") or ():
            fn = piece.get("function") or {}
            call = calls.setdefault(piece.get("index"), [fn.get("name") or "", ""])
            call[1] += fn.get("arguments") or ""
    return "".join(content), "".join(reasoning), [calls[i] for i in sorted(calls, key=str)]


def expected_parse(trace: Trace, j: int) -> tuple[str, str, list[list[str]]] | None:
    """What choice ``j`` must show through its parsers: vLLM's parse of its whole engine text
    (``parses``) under the request's rules: no calls under ``tool_choice`` none, only the first
    without parallel calls, no reasoning without ``include_reasoning``. Content without the
    whitespace around it (vLLM streams the whitespace around a call or after a reasoning block as
    content, and its parse of the whole drops it), null as empty. None: no parse recorded."""
    parsing = _parsing(trace)
    parses = trace.get("parses") or []
    if parsing is None or j >= len(parses) or parses[j] is None:
        return None
    p = parses[j]
    calls = [list(c) for c in p["tool_calls"]]
    if parsing["tool_choice"] == "none":
        calls = []
    elif not parsing["parallel"]:
        calls = calls[:1]
    reasoning = (p["reasoning"] or "") if parsing["include_reasoning"] else ""
    return (p["content"] or "").strip(), reasoning, calls


def _content_parts(trace: Trace) -> dict[int, list[tuple[Record, dict[str, Any]]]]:
    """Chat: each valid choice's content fragments (record, choice dict), in order."""
    return {
        j: [(r, c) for part, r, c in parts if part == CONTENT]
        for j, parts in chat_parts(trace).items()
        if _valid_index(trace, j)
    }


@invariant(
    19,
    "Chat through parsers: a streamed choice that the engine stopped, in a stream that ended "
    "normally without an error, rebuilt (content and reasoning concatenated, each call's name "
    "from its first piece and its arguments the concatenated fragments) shows what vLLM's parse "
    "of its whole engine text shows under the request's rules (no calls under tool_choice none, "
    "only the first without parallel calls, no reasoning without include_reasoning); so does "
    "every choice's message of a whole response (after its echo).",
    prefix_safe=True,
)
def parsed_as_whole(trace: Trace) -> Iterable[str]:
    if _parsing(trace) is None:
        return
    req = trace["request"]
    engine = expected_chunks(trace)

    def compare(j: int, where: str, got: tuple[str, str, list[list[str]]]) -> Iterable[str]:
        want = expected_parse(trace, j)
        if want is None:
            yield f"choice {j}: no parse of its engine text was recorded"
            return
        content, reasoning, calls = got
        if (content.strip(), reasoning, calls) != want:
            yield f"choice {j} {where}: content/reasoning/calls {(content.strip(), reasoning, calls)!r}, the whole parse says {want!r}"

    if req["stream"]:
        if not _normal_end(trace) or _errored(trace):
            return
        for j, got in _content_parts(trace).items():
            exp = engine.get(j, [])
            if exp and exp[-1]["finish_reason"] == "stop":
                yield from compare(j, "streamed", _rebuilt(c.get("delta") or {} for _, c in got))
        return
    for r in _records(trace, "json"):
        if r["status"] != 200:
            continue
        for c in r["body"].get("choices", []):
            j = c.get("index")
            if not _valid_index(trace, j):
                continue
            message = c.get("message") or {}
            content = message.get("content") or ""
            echo = echo_text(trace, j // req["n"])
            if not content.startswith(echo):
                yield f"choice {j}: message content {content!r} does not start with its echo {echo!r}"
                continue
            calls = [
                [(t.get("function") or {}).get("name") or "", (t.get("function") or {}).get("arguments") or ""]
                for t in message.get("tool_calls") or ()
            ]
            yield from compare(j, "message", (content[len(echo) :], message.get("reasoning") or "", calls))


@invariant(
    20,
    "Chat through parsers: a choice's tool-call pieces have call indices from 0 up, a new index "
    "one past the last; a call's first piece carries an id (no two calls of a response share "
    "one), type function and the name, its later pieces only argument fragments; none under "
    "tool_choice none, only index 0 without parallel calls; no reasoning after the choice's first "
    "content or call piece; a whole response's calls have ids, distinct, of type function. "
    "Without parsers, no reasoning and no calls.",
    prefix_safe=True,
)
def tool_call_pieces(trace: Trace) -> Iterable[str]:
    if not _is_chat(trace):
        return
    parsing = _parsing(trace)
    ids: set[str] = set()
    for j, got in _content_parts(trace).items():
        started: dict[int, str] = {}
        answered = False
        for m, (_, c) in enumerate(got):
            delta = c.get("delta") or {}
            if parsing is None:
                if "reasoning" in delta or "tool_calls" in delta:
                    yield f"choice {j} chunk {m}: reasoning or calls without a parser: {sorted(delta)}"
                continue
            if delta.get("reasoning") and answered:
                yield f"choice {j} chunk {m}: reasoning after its content or calls began"
            pieces = delta.get("tool_calls") or ()
            answered = answered or bool(delta.get("content")) or bool(pieces)
            for piece in pieces:
                index, fn = piece.get("index"), piece.get("function") or {}
                if parsing["tool_choice"] == "none":
                    yield f"choice {j} chunk {m}: a call piece under tool_choice none"
                    return
                if not parsing["parallel"] and index != 0:
                    yield f"choice {j} chunk {m}: call {index!r} without parallel calls"
                if index in started:
                    if "id" in piece or "type" in piece or "name" in fn:
                        yield f"choice {j} chunk {m}: a later piece of call {index} repeats its id, type or name"
                    continue
                if index != len(started):
                    yield f"choice {j} chunk {m}: call {index!r} begins after {len(started)} calls"
                call_id = piece.get("id")
                if not call_id or piece.get("type") != "function" or not fn.get("name"):
                    yield f"choice {j} chunk {m}: call {index!r} begins without an id, type or name: {piece!r}"
                elif call_id in ids:
                    yield f"choice {j} chunk {m}: call id {call_id!r} used twice"
                ids.add(str(call_id))
                started[index] = str(call_id)
    for r in _records(trace, "json"):
        for c in r["body"].get("choices", []) if r["status"] == 200 else ():
            message = c.get("message") or {}
            calls = message.get("tool_calls") or ()
            if parsing is None and (calls or message.get("reasoning")):
                yield f"choice {c.get('index')}: reasoning or calls without a parser"
            for t in calls:
                if not t.get("id") or t.get("type") != "function" or t["id"] in ids:
                    yield f"choice {c.get('index')}: a call without an id of its own or not a function: {t!r}"
                ids.add(str(t.get("id")))


@invariant(
    21,
    "Chat through parsers: finish_reason is vLLM's server's. Streamed: tool_calls when the choice "
    "sent a call piece and the engine stopped it, unless tool_choice named the function. Whole: "
    "tool_calls when the message has calls under tool_choice auto, or under required when the "
    "engine stopped it. Otherwise the engine's reason.",
    prefix_safe=True,
)
def tool_calls_finish(trace: Trace) -> Iterable[str]:
    parsing = _parsing(trace)
    if parsing is None:
        return
    mode = parsing["tool_choice"]
    engine = expected_chunks(trace)
    for j, got in _content_parts(trace).items():
        exp = engine.get(j, [])
        reasons = [c.get("finish_reason") for _, c in got if c.get("finish_reason") is not None]
        if not reasons or not exp:
            continue
        called = any((c.get("delta") or {}).get("tool_calls") for _, c in got)
        fin = exp[-1]["finish_reason"]
        want = "tool_calls" if called and fin == "stop" and mode != "named" else fin
        if reasons[-1] != want:
            yield f"choice {j}: finish_reason {reasons[-1]!r}, expected {want!r} (engine: {fin!r}, called: {called})"
    for r in _records(trace, "json"):
        for c in r["body"].get("choices", []) if r["status"] == 200 else ():
            j = c.get("index")
            exp = engine.get(j, []) if _valid_index(trace, j) else []
            if not exp:
                continue
            called = bool((c.get("message") or {}).get("tool_calls"))
            fin = exp[-1]["finish_reason"]
            want = "tool_calls" if (called and mode == "auto") or (mode == "required" and fin == "stop") else fin
            if c.get("finish_reason") != want:
                yield f"choice {j}: finish_reason {c.get('finish_reason')!r}, expected {want!r} (engine: {fin!r}, called: {called})"


def check_server(
    traces: list[Trace], max_in_flight: int, reserve: int = 0, background_slots: int = 0
) -> list[Violation]:
    """Admission's server-wide rules over the traces of every request of one run (one ``seq``).

    A request's rank is its class, then its priority: ``request.background`` (it asked for the
    background class, or its key put it there; absent: interactive) sorts after every interactive
    request, then ``request.priority`` (vLLM's field: lower is earlier; absent: 0). The
    background class's *room* is ``max_in_flight - reserve``, or ``background_slots`` when that
    is set and smaller.

    * A1 (slot bound): the slots granted and not yet released, summed over all requests, never
      exceed ``max_in_flight`` (when it is not 0).
    * A2 (round-robin): while a request waits for a grant (from its ``slot_ask`` to its
      ``slot_grant``), no other request of the same or a worse rank is granted slots twice.
      So a request's wait is bounded by the number of requests of its rank admitted ahead of
      it, not by their prompt counts (better ranks may pass it any number of times).
    * A3 (priority): a request is granted slots only when every request of a better rank that
      waits could not take them: its ask is more than the free slots (less the ``reserve`` when
      it holds slots already, or is of the background class, which never takes the reserve; and
      more than what is left of the background room, for the background class).
    * A4 (background yields): a background request is granted slots only while no interactive
      request waits, whatever the interactive one asks for. With A5, an interactive request's
      wait does not grow with the background backlog: once it asks, the background class takes
      no slot more, and holds at most its room.
    * A5 (background room): the slots granted to background requests never exceed the room, and
      a grant to one never leaves fewer than ``reserve`` slots free.
    * A6 (background progress): whenever admission has settled (before each ask, release or
      cancel, and at the end), if no interactive request waits, the longest-waiting background
      request of the best background priority does not wait for slots that are free (its ask
      fits the free slots less the reserve, and the background room). So once interactive
      traffic stops, background requests are admitted as slots free up.
    * A7 (engine bound): the engine requests open and not near their end never take more than
      ``max_in_flight`` slots' worth, server wide (:func:`_engine_bound`).
    """
    merged = sorted(
        ((r, i) for i, t in enumerate(traces) for r in t["records"] if r["kind"].startswith("slot_")),
        key=lambda x: x[0]["seq"],
    )
    priority = [int(t.get("request", {}).get("priority") or 0) for t in traces]
    background = [bool(t.get("request", {}).get("background")) for t in traces]
    rank = [(background[i], priority[i]) for i in range(len(traces))]
    room = max_in_flight - reserve
    if background_slots:
        room = min(room, background_slots)
    out: list[Violation] = []
    held = background_held = 0
    holds = [0] * len(traces)
    asks: dict[int, int] = {}  # request -> the slots of its pending ask (in ask order)
    waiting: dict[int, dict[int, int]] = {}  # request -> grants to each other request since its ask

    def settled(where: str) -> None:
        if not max_in_flight or any(not background[j] for j in asks):
            return
        pending = [j for j in asks if background[j]]
        if not pending:
            return
        best = min(priority[j] for j in pending)
        head = next(j for j in pending if priority[j] == best)
        want = asks[head]
        if want <= max_in_flight - held - reserve and background_held + want <= room:
            out.append(
                Violation(
                    -7,
                    "background_progress",
                    f"{where}: background request {head} waits for {want} slots with "
                    f"{max_in_flight - held} free and no interactive request waiting",
                )
            )

    for r, i in merged:
        kind = r["kind"]
        if kind != "slot_grant":
            settled(f"seq {r['seq']}")
        if kind == "slot_grant":
            if max_in_flight:
                free = max_in_flight - held
                for j, want in asks.items():
                    if j == i or j not in waiting:
                        continue
                    if background[i] and not background[j]:
                        out.append(
                            Violation(
                                -5,
                                "background_yields",
                                f"seq {r['seq']}: background request {i} was granted slots while "
                                f"interactive request {j} waited for {want}",
                            )
                        )
                        continue
                    if rank[j] >= rank[i]:
                        continue
                    can = free - (reserve if holds[j] or background[j] else 0)
                    if background[j]:
                        can = min(can, room - background_held)
                    if want <= can:
                        out.append(
                            Violation(
                                -4,
                                "priority",
                                f"seq {r['seq']}: request {i} (rank {rank[i]}) was granted slots "
                                f"while request {j} (rank {rank[j]}) waited for {want} of {can} free",
                            )
                        )
            held += r["slots"]
            holds[i] += r["slots"]
            if background[i]:
                background_held += r["slots"]
                if max_in_flight and (background_held > room or held > max_in_flight - reserve):
                    out.append(
                        Violation(
                            -6,
                            "background_room",
                            f"seq {r['seq']}: background request {i} granted {r['slots']}: the background "
                            f"class holds {background_held} of its {room}, {max_in_flight - held} slots free "
                            f"(reserve {reserve})",
                        )
                    )
            if max_in_flight and held > max_in_flight:
                out.append(
                    Violation(-2, "slot_bound", f"seq {r['seq']}: {held} slots granted, the server has {max_in_flight}")
                )
            waiting.pop(i, None)
            asks.pop(i, None)
            for j, seen in waiting.items():
                if rank[i] < rank[j]:
                    continue  # a better rank may pass
                seen[i] = seen.get(i, 0) + 1
                if seen[i] == 2:
                    out.append(
                        Violation(
                            -3,
                            "round_robin",
                            f"seq {r['seq']}: request {i} was granted slots twice while request {j} waited",
                        )
                    )
        elif kind == "slot_release":
            held -= r["slots"]
            holds[i] -= r["slots"]
            if background[i]:
                background_held -= r["slots"]
        elif kind == "slot_ask":
            waiting[i] = {}
            asks[i] = r["slots"]
        elif kind == "slot_cancel":
            waiting.pop(i, None)
            asks.pop(i, None)
    settled("at the end")
    out.extend(_engine_bound(traces, max_in_flight))
    return out


def _engine_bound(traces: list[Trace], max_in_flight: int) -> list[Violation]:
    """A7: the engine requests open and not near their end (those the engine has not said have at
    most ``handover_tokens`` left) never take more than ``max_in_flight`` slots' worth, ``n``
    each, server wide. Those near their end are beyond it, each for at most ``handover_tokens``
    more tokens (I16): so ``braid_engine_requests_in_flight`` may pass the slots for those steps
    while ``braid_admission_slots_in_use`` never does (docs/admission.md, "Slots")."""
    if not max_in_flight:
        return []
    records = sorted(
        (
            (r, i)
            for i, t in enumerate(traces)
            for r in t["records"]
            if r["kind"] in ("engine_open", "engine_close", "engine_ending")
        ),
        key=lambda x: x[0]["seq"],
    )
    n = [int(t.get("request", {}).get("n") or 1) for t in traces]
    running: dict[tuple[int, int], int] = {}
    for r, i in records:
        if r["kind"] == "engine_open":
            running[(i, r["prompt"])] = n[i]
            taken = sum(running.values())
            if taken > max_in_flight:
                return [
                    Violation(
                        -8,
                        "engine_bound",
                        f"seq {r['seq']}: engine requests not near their end take {taken} slots' worth, "
                        f"the server has {max_in_flight}",
                    )
                ]
        else:
            running.pop((i, r["prompt"]), None)
    return []


# --------------------------------------------------------------------------------------------
# The state machine (model/machine.py), replayed over a trace


def replay(trace: Trace) -> RequestMachine:
    """The machine after every record of ``trace`` (its :attr:`~RequestMachine.errors`: the illegal steps)."""
    m = RequestMachine(trace["request"]["n"], _num_prompts(trace))
    for r in trace["records"]:
        m.apply(r)
    m.finish()
    return m


@invariant(
    0,
    "The trace is a run of the state machine: no output in a terminal state, no delta for a "
    "finished or unknown choice, and every request reaches done or rejected.",
    prefix_safe=False,
)
def transitions(trace: Trace) -> Iterable[str]:
    yield from replay(trace).errors


INVARIANTS.sort(key=lambda i: i.number)

#: The names of the invariants a trace cut at an arbitrary instant must already satisfy.
PREFIX_SAFE = frozenset(i.name for i in INVARIANTS if i.prefix_safe)

if len({i.name for i in INVARIANTS}) != len(INVARIANTS) or len({i.number for i in INVARIANTS}) != len(INVARIANTS):
    raise RuntimeError("two invariants share a name or a number")  # a Violation would not say which one broke


def check_trace(trace: Trace) -> list[Violation]:
    """Every violation of every invariant by this trace (empty: the trace is a run of the model)."""
    seqs = [r["seq"] for r in trace["records"]]
    out = []
    if seqs != sorted(seqs):
        out.append(Violation(-1, "trace", "records are not in seq order"))
    for inv in INVARIANTS:
        for message in inv.check(trace):
            out.append(Violation(inv.number, inv.name, message))
    return out
