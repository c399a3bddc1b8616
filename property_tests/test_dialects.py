"""The Responses and Messages routes against the model's dialect rules (model/dialects.py).

What is real: the routes' production views (``braid.routes.responses.create_response``,
``braid.routes.anthropic.messages``) and chat's (``braid.routes.chat.chat_completions``), their
run and merge, the SSE body driven as quart drives it, and the scripted engine (pythonic tool
calls through vLLM's parser when a scenario calls tools). What is simulated: the client (it
reads everything, or disconnects at a virtual time) and faults (the scripted engine's
``braid:fail@S``).

Properties, for either dialect, streamed and whole, with and without a tool call:

* the stream keeps its dialect's rules (R1-R6, M1-M4), ending normally or with one error event;
* it shows what the engine generated for its request: the text of a completions request of the
  same prompt token ids (greedy, a differential check), or the tool call the engine was scripted
  to write; and the whole answer shows the same as the stream;
* an engine failure ends the stream with an error event, or the whole answer with an error;
* a disconnect leaves no engine request running, and neither does any other end.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from braid.engine.base import EngineRequest
from braid.engine.scripted import ScriptedEngine
from braid.routes.anthropic import messages
from braid.routes.common import AppState, JsonResponse
from braid.routes.completions import completions
from braid.routes.responses import create_response
from braid.settings import ParserOptions, Settings
from model.dialects import Choice, check_messages, check_responses, messages_view, parse_named_sse, responses_view
from property_tests.harness import METRICS, PARSERS, TOOLS, server_parsers

View = Callable[..., Awaitable[Any]]

CALL = '[get_weather(city="Paris")]'


def _body(dialect: str, text: str, max_tokens: int, stream: bool, tools: bool) -> dict[str, Any]:
    """One user message in the dialect's request shape, greedy (so that the engine's text is a
    function of the prompt's token ids)."""
    if dialect == "responses":
        body: dict[str, Any] = {"input": text, "max_output_tokens": max_tokens, "temperature": 0, "stream": stream}
        if tools:
            body["tools"] = [{"type": "function", "name": t["function"]["name"], **_params(t)} for t in TOOLS]
        return body
    if dialect == "messages":
        body = {"model": "scripted", "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        body["messages"] = [{"role": "user", "content": text}]
        if tools:
            body["tools"] = [
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
            ]
        return body
    raise ValueError(dialect)


def _params(tool: dict[str, Any]) -> dict[str, Any]:
    return {"parameters": tool["function"]["parameters"]}


async def _answer(
    state: AppState, view: View, body: dict[str, Any], disconnect_at: float | None
) -> tuple[int, bytes, bool]:
    """The view's answer: its status, its whole body (a stream's writes joined) and whether it
    streamed; a disconnect cancels the request as quart-trio does (status 0: the client left
    before the answer ended)."""
    data = json.dumps(body).encode()

    async def read_body() -> bytes:
        return data

    out: list[bytes] = []
    streamed = False
    with trio.move_on_at(disconnect_at if disconnect_at is not None else float("inf")) as cut:
        response = await view(state, read_body, content_type="application/json", request_id=None)
        if isinstance(response, JsonResponse):
            return response.status, response.body, False
        streamed = True
        async with response as stream:
            async for chunk in stream:
                await trio.lowlevel.checkpoint()
                out.append(chunk)
    return (0 if cut.cancelled_caught else 200), b"".join(out), streamed


def _state(engine: ScriptedEngine, tools: bool) -> AppState:
    settings = Settings(parsers=PARSERS["pythonic"] if tools else ParserOptions())
    return AppState(engine, settings, METRICS, now=lambda: 0.0, parsers=server_parsers("pythonic") if tools else None)


class PromptRecordingEngine(ScriptedEngine):
    """The scripted engine, keeping each engine request's prompt token ids."""

    def __init__(self, token_delay: float = 0.0) -> None:
        super().__init__(token_delay=token_delay)
        self.prompts: list[tuple[int, ...]] = []

    def open_request(self, request: EngineRequest, *args: Any, **kwargs: Any) -> Any:
        self.prompts.append(tuple(request.prompt_token_ids))
        return super().open_request(request, *args, **kwargs)


def _run(
    view: View, body: dict[str, Any], *, tools: bool, token_delay: float = 0.0, disconnect_at: float | None = None
) -> tuple[int, bytes, bool, PromptRecordingEngine]:
    engine = PromptRecordingEngine(token_delay=token_delay)

    async def main() -> tuple[int, bytes, bool]:
        return await _answer(_state(engine, tools), view, body, disconnect_at)

    status, raw, streamed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return status, raw, streamed, engine


VIEWS: dict[str, tuple[View, Callable[[list[Any]], list[str]], Callable[[list[Any]], Choice]]] = {
    "responses": (create_response, check_responses, responses_view),
    "messages": (messages, check_messages, messages_view),
}


def _whole(dialect: str, body: dict[str, Any]) -> Choice:
    """What a dialect's whole (non-streamed) answer shows."""
    seen = Choice()
    if dialect == "responses":
        for item in body["output"]:
            if item["type"] == "message":
                seen.content += "".join(p["text"] for p in item["content"])
            elif item["type"] == "reasoning":
                seen.reasoning += "".join(p["text"] for p in item.get("content") or ())
            elif item["type"] == "function_call":
                seen.tool_calls.append((item["name"], item["arguments"]))
        return seen
    for block in body["content"]:
        if block["type"] == "text":
            seen.content += block["text"]
        elif block["type"] == "thinking":
            seen.reasoning += block["thinking"]
        elif block["type"] == "tool_use":
            seen.tool_calls.append((block["name"], json.dumps(block["input"])))
    return seen


def _generated(prompt: tuple[int, ...], max_tokens: int) -> Choice:
    """What the engine generates for these prompt ids (greedy): a completions request's text."""
    body = {"prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0}
    status, raw, _, _ = _run(completions, body, tools=False)
    assert status == 200, raw
    return Choice(content=json.loads(raw)["choices"][0]["text"])


def _same(a: Choice, b: Choice) -> bool:
    def calls(c: Choice) -> list[tuple[str, Any]]:
        return [(name, json.loads(args or "{}")) for name, args in c.tool_calls]

    return (a.content, a.reasoning, calls(a)) == (b.content, b.reasoning, calls(b))


texts = st.sampled_from(["hello", "tell me a story", "ünïcode ☃ text"])
dialects = st.sampled_from(sorted(VIEWS))


@given(dialect=dialects, text=texts, max_tokens=st.integers(1, 12), tools=st.booleans())
def test_a_dialect_shows_the_chat_choice_streamed_and_whole(
    dialect: str, text: str, max_tokens: int, tools: bool
) -> None:
    view, check, show = VIEWS[dialect]
    if tools:
        text += f"<braid:say>{CALL}</braid:say>"
        max_tokens += len(CALL)
    status, raw, streamed, engine = _run(view, _body(dialect, text, max_tokens, True, tools), tools=tools)
    assert status == 200 and streamed, raw
    events = parse_named_sse(raw)
    assert check(events) == [], events
    seen = show(events)
    assert seen.error is None and seen.end is not None
    if tools:  # the script is the whole answer: one call, no text
        assert _same(seen, Choice(tool_calls=[("get_weather", '{"city": "Paris"}')])), seen
    else:
        assert len(engine.prompts) == 1
        assert _same(seen, _generated(engine.prompts[0], max_tokens)), seen
    assert engine.in_flight == 0
    status, whole, streamed, engine = _run(view, _body(dialect, text, max_tokens, False, tools), tools=tools)
    assert status == 200 and not streamed, whole
    assert _same(_whole(dialect, json.loads(whole)), seen)
    assert engine.in_flight == 0


@given(dialect=dialects, fail_after=st.integers(0, 6), stream=st.booleans())
def test_an_engine_failure_ends_with_one_error(dialect: str, fail_after: int, stream: bool) -> None:
    view, check, show = VIEWS[dialect]
    body = _body(dialect, f"hello braid:fail@{fail_after}", 12, stream, False)
    status, raw, streamed, engine = _run(view, body, tools=False)
    if streamed:
        events = parse_named_sse(raw)
        assert check(events) == [], events
        assert show(events).error is not None and show(events).end is None
    else:
        assert status >= 400 and "error" in json.loads(raw), raw
    assert engine.in_flight == 0


@given(dialect=dialects, stream=st.booleans(), at=st.floats(0.0, 0.2), tools=st.booleans())
def test_a_disconnect_leaves_no_engine_request(dialect: str, stream: bool, at: float, tools: bool) -> None:
    view, check, _ = VIEWS[dialect]
    text = "a long story" + (f"<braid:say>{CALL}</braid:say>" if tools else "")
    body = _body(dialect, text, 64, stream, tools)
    status, raw, streamed, engine = _run(view, body, tools=tools, token_delay=0.01, disconnect_at=at)
    assert engine.in_flight == 0
    if status == 0:  # the client left before the answer ended: its engine request was aborted
        assert len(engine.aborted_ids) + engine.finished_total == len(engine.prompts)
        if engine.prompts and not engine.finished_total:
            assert engine.aborted_ids
    if streamed and raw:
        # what was sent before the cut is a prefix of a well-formed stream: no rule about the
        # order of what was sent is broken (the end rules need the end)
        prefix_rules = [v for v in check(parse_named_sse(raw)) if v[:2] in ("R1", "R2", "M1")]
        assert prefix_rules == []
