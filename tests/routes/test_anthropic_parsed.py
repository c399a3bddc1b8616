"""``/v1/messages`` with vLLM's parsers (hermes' tool calls, qwen3's reasoning) on the scripted
engine: thinking, text and tool_use blocks, whole and streamed to a lagging reader, and a failure
mid-stream. Marked ``vllm``: the parsers are vLLM's (no engine is started)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.engine.vllm_parsers import load_parsers
from braid.metrics import Metrics
from braid.routes.anthropic import messages
from braid.routes.body import CompletionStream
from braid.routes.common import AppState, JsonResponse
from braid.settings import ParserOptions, Settings
from tests.anthropic_sse import check_framing, parse_anthropic_sse, rebuild

pytestmark = pytest.mark.vllm

TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object"}},
    {"name": "get_time", "input_schema": {"type": "object"}},
]
SAID = (
    "<think>Weather and time.</think>Checking. "
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)
OPTIONS = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")


def state() -> AppState:
    engine = ScriptedEngine(token_delay=0.001)
    parsers = load_parsers(OPTIONS, engine.tokenizer.parser_tokenizer(), engine.info.name)
    return AppState(engine, Settings(buffer=1, parsers=OPTIONS), Metrics(), parsers=parsers)


async def answer(s: AppState, said: str, **fields: Any) -> JsonResponse | bytes:
    body = {
        "model": s.engine.info.name,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": f"<braid:say>{said}</braid:say>"}],
        "tools": TOOLS,
        **fields,
    }

    async def read() -> bytes:
        return json.dumps(body).encode()

    result = await messages(s, read, content_type="application/json", request_id=None)
    if isinstance(result, JsonResponse):
        return result
    assert isinstance(result, CompletionStream)
    raw = b""
    async with result as sends:
        async for data in sends:
            raw += data
            await trio.sleep(0.02)  # a slow client: outputs merge while it sleeps
    return raw


async def test_thinking_text_and_calls_whole_and_streamed() -> None:
    s = state()
    whole = await answer(s, SAID)
    assert isinstance(whole, JsonResponse) and whole.status == 200, whole
    body = json.loads(whole.body)
    thinking, text, *calls = body["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Weather and time."
    assert len(thinking["signature"]) == 32
    assert text == {"type": "text", "text": "Checking. "}
    assert [(c["type"], c["name"], c["input"]) for c in calls] == [
        ("tool_use", "get_weather", {"city": "Paris"}),
        ("tool_use", "get_time", {}),
    ]
    assert body["stop_reason"] == "tool_use" and "stop_sequence" not in body
    raw = await answer(s, SAID, stream=True)
    assert isinstance(raw, bytes)
    events = parse_anthropic_sse(raw)
    check_framing(events)
    blocks = rebuild(events)
    assert blocks[0] == {"type": "thinking", "thinking": "Weather and time."}
    # each answer's call ids are its own (chatcmpl-tool-<random>)
    assert all(b["id"].startswith("chatcmpl-tool-") for b in (*blocks[2:], *calls))
    assert [{k: v for k, v in b.items() if k != "id"} for b in blocks[1:]] == [
        text,
        *({k: v for k, v in c.items() if k != "id"} for c in calls),
    ]
    signatures = [d for k, d in events if k == "content_block_delta" and d["delta"]["type"] == "signature_delta"]
    assert [d["index"] for d in signatures] == [0] and len(signatures[0]["delta"]["signature"]) == 32
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == body["usage"]
    assert s.engine.unfinished_requests() == 0


async def test_a_failure_mid_stream_ends_with_one_error_event() -> None:
    s = state()
    raw = await answer(s, "Hello there braid:fail@3", stream=True)
    assert isinstance(raw, bytes)
    events = parse_anthropic_sse(raw)
    check_framing(events)
    kind, error = events[-1]
    assert kind == "error" and error["error"]["type"] == "InternalServerError", events
    assert "message_stop" not in [k for k, _ in events]
    assert s.engine.unfinished_requests() == 0
