"""A parsed chat stream whose reader lags (src/braid/routes/chat.py, src/braid/stream/parse.py).

The body is read slowly through a one-output channel, so the scripted engine, which runs on its
own clock, merges the steps its driver has not taken into one output (as vLLM's output
collector does). The parsers must still see every step: braid feeds them through the engine's
``observe`` hook, where the steps are made. The parser of the second test drops any delta of
more than one token (the bug class of vLLM issues #55082, #19056, #17655), so a braid that fed
it the merged outputs would lose the calls. Marked ``vllm``: the parsers are vLLM's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.engine.vllm_parsers import load_parsers
from braid.metrics import Metrics
from braid.routes.body import CompletionStream
from braid.routes.chat import chat_completions
from braid.routes.common import AppState
from braid.settings import ParserOptions, Settings
from tests.helpers import parse_sse

pytestmark = pytest.mark.vllm

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALLS = (
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)

ONE_TOKEN_PARSER = """
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

@ToolParserManager.register_module("one_token_hermes")
class OneTokenHermes(Hermes2ProToolParser):
    lost = False

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                     current_token_ids, delta_token_ids, request):
        if len(delta_token_ids) > 1:
            self.lost = True  # its state no longer matches the text: nothing more comes out
        if self.lost:
            return None
        return super().extract_tool_calls_streaming(previous_text, current_text, delta_text, previous_token_ids,
                                                    current_token_ids, delta_token_ids, request)
"""


async def lagging_stream(options: ParserOptions, text: str) -> tuple[list[Any], int]:
    """The events of a streamed chat whose reader sleeps between sends, and how many tokens the
    engine generated (to show that outputs were merged)."""
    engine = ScriptedEngine(token_delay=0.001)
    settings = Settings(buffer=1, parsers=options)
    parsers = load_parsers(options, engine.tokenizer.parser_tokenizer(), engine.info.name)
    state = AppState(engine, settings, Metrics(), parsers=parsers)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": f"<braid:say>{text}</braid:say>"}],
            "tools": TOOLS,
            "max_tokens": 400,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()

    async def read() -> bytes:
        return body

    stream = await chat_completions(state, read, content_type="application/json", request_id=None)
    assert isinstance(stream, CompletionStream)
    raw = b""
    async with stream as sends:
        async for data in sends:
            raw += data
            await trio.sleep(0.03)  # a slow client: the engine makes ~30 tokens meanwhile
    events = parse_sse(raw)
    return events, events[-2]["usage"]["completion_tokens"]


def calls(events: list[Any]) -> list[tuple[str, Any]]:
    found: dict[int, list[str]] = {}
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        for piece in e["choices"][0]["delta"].get("tool_calls", []):
            if "id" in piece:
                found[piece["index"]] = [piece["function"]["name"], ""]
            found[piece["index"]][1] += piece["function"]["arguments"]
    return [(name, json.loads(args)) for name, args in found.values()]


def chunks(events: list[Any]) -> int:
    return sum(1 for e in events if e != "[DONE]" and e["choices"])


EXPECTED = [("get_weather", {"city": "Paris"}), ("get_time", {})]


async def test_a_lagging_reader_gets_whole_calls_and_reasoning() -> None:
    options = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    events, tokens = await lagging_stream(options, "<think>Weather and time.</think>" + CALLS)
    assert chunks(events) < tokens / 4, "outputs were merged for the lagging reader"
    assert calls(events) == EXPECTED
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning", "") for e in events if e != "[DONE]" and e["choices"])
    assert reasoning == "Weather and time."


async def test_a_parser_that_needs_one_token_a_delta_gets_them(tmp_path: Path) -> None:
    plugin = tmp_path / "one_token.py"
    plugin.write_text(ONE_TOKEN_PARSER)
    options = ParserOptions(
        enable_auto_tool_choice=True, tool_call_parser="one_token_hermes", tool_parser_plugin=str(plugin)
    )
    events, tokens = await lagging_stream(options, "Checking. " + CALLS)
    assert chunks(events) < tokens / 4, "outputs were merged for the lagging reader"
    assert calls(events) == EXPECTED
