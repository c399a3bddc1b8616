"""Tool calls and reasoning through real hypercorn, on the scripted engine with vLLM's parsers.

The scripted engine writes what a prompt's ``<braid:say>`` block says (braid.engine.scripted),
so these tests script a model that calls a tool, thinks, or does both; vLLM's own parsers (hermes,
qwen3) read it through braid's adapter. Marked ``vllm``: the parsers are vLLM's package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from braid.settings import ParserOptions
from braid.wire import shapes
from tests.helpers import parse_sse, start_server

pytestmark = pytest.mark.vllm

HERMES = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
THINKING = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TWO_CALLS = CALL + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
THINK = "<think>The user wants the weather.</think>"


def say(*scripts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "".join(f"<braid:say>{s}</braid:say>" for s in scripts)}]


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def rebuilt(events: list[Any]) -> dict[int, dict[str, Any]]:
    """Each choice of a stream put back together, as a client does (and checked on the way:
    a call's first piece has its id, type and name; no piece after the choice's finish)."""
    out: dict[int, dict[str, Any]] = {}
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        for c in e["choices"]:
            ch = out.setdefault(c["index"], {"content": "", "reasoning": "", "calls": {}, "finish": None})
            assert ch["finish"] is None, "nothing after a choice's finish_reason"
            delta = c["delta"]
            ch["content"] += delta.get("content") or ""
            ch["reasoning"] += delta.get("reasoning") or ""
            for piece in delta.get("tool_calls", []):
                call = ch["calls"].get(piece["index"])
                if call is None:
                    assert piece["id"].startswith("chatcmpl-tool-") and piece["type"] == "function"
                    call = ch["calls"][piece["index"]] = {
                        "id": piece["id"],
                        "name": piece["function"]["name"],
                        "arguments": "",
                    }
                else:
                    assert "id" not in piece and "name" not in piece["function"]
                call["arguments"] += piece["function"]["arguments"]
            ch["finish"] = c["finish_reason"]
    return out


async def post(client: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/chat/completions") -> Any:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return parse_sse(r.content) if body.get("stream") else r.json()


@pytest.fixture
async def tc(nursery: trio.Nursery) -> Any:
    """A client of a server with hermes' tool parser."""
    srv = await start_server(nursery, parsers=HERMES)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        yield client


@pytest.fixture
async def rc(nursery: trio.Nursery) -> Any:
    """A client of a server with hermes' tool parser and qwen3's reasoning parser, which takes
    what comes before ``</think>`` as reasoning (Qwen3's template opens the thinking)."""
    srv = await start_server(nursery, parsers=THINKING)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        yield client


async def test_an_auto_call_whole_and_streamed(tc: httpx.AsyncClient) -> None:
    body = {"messages": say(CALL), "tools": TOOLS, "max_tokens": 200}
    whole = await post(tc, body)
    (choice,) = whole["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    assert calls_of(message) == [("get_weather", {"city": "Paris"})]
    assert (
        message["tool_calls"][0]["id"].startswith("chatcmpl-tool-") and message["tool_calls"][0]["type"] == "function"
    )

    events = await post(tc, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert (
        events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    )
    (ch,) = rebuilt(events).values()
    assert ch["finish"] == "tool_calls" and ch["content"] == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in ch["calls"].values()] == calls_of(message)


async def test_text_before_a_call_and_two_calls(tc: httpx.AsyncClient) -> None:
    body = {"messages": say("Let me check. " + TWO_CALLS), "tools": TOOLS, "max_tokens": 300}
    message = (await post(tc, body))["choices"][0]["message"]
    assert message["content"] == "Let me check. "
    assert calls_of(message) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    (ch,) = rebuilt(await post(tc, {**body, "stream": True})).values()
    assert ch["content"] == "Let me check. " and [c["name"] for c in ch["calls"].values()] == [
        "get_weather",
        "get_time",
    ]
    # Without parallel calls hermes constrains the output to one call (a structural tag), which
    # only a real engine runs: the scripted one refuses it before anything starts.
    r = await tc.post("/v1/chat/completions", json={**body, "parallel_tool_calls": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


async def test_without_parallel_calls_a_choice_keeps_its_first(nursery: trio.Nursery) -> None:
    # pythonic's format asks for no constraint under "auto": the second call is written, and
    # dropped, as vLLM drops it
    srv = await start_server(nursery, parsers=ParserOptions(enable_auto_tool_choice=True, tool_call_parser="pythonic"))
    body = {"messages": say("[get_weather(city='Paris'), get_time()]"), "tools": TOOLS, "max_tokens": 200}
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        both = (await post(client, body))["choices"][0]["message"]
        assert calls_of(both) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
        only_first = (await post(client, {**body, "parallel_tool_calls": False}))["choices"][0]["message"]
        assert calls_of(only_first) == [("get_weather", {"city": "Paris"})]
        (ch,) = rebuilt(await post(client, {**body, "parallel_tool_calls": False, "stream": True})).values()
        assert [c["name"] for c in ch["calls"].values()] == ["get_weather"] and ch["finish"] == "tool_calls"


async def test_reasoning_then_a_call_with_reasoning_tokens_in_usage(rc: httpx.AsyncClient) -> None:
    tc = rc
    body = {"messages": say(THINK + CALL), "tools": TOOLS, "max_tokens": 300}
    whole = await post(tc, body)
    message = whole["choices"][0]["message"]
    assert message["reasoning"] == "The user wants the weather." and calls_of(message) == [
        ("get_weather", {"city": "Paris"})
    ]
    details = whole["usage"]["completion_tokens_details"]
    assert 0 < details["reasoning_tokens"] < whole["usage"]["completion_tokens"]
    events = await post(tc, {**body, "stream": True, "stream_options": {"include_usage": True}})
    (ch,) = rebuilt(events).values()
    assert ch["reasoning"] == message["reasoning"] and [c["name"] for c in ch["calls"].values()] == ["get_weather"]
    assert events[-2]["usage"]["completion_tokens_details"] == details
    hidden = (await post(tc, {**body, "include_reasoning": False}))["choices"][0]["message"]
    assert hidden["reasoning"] is None and calls_of(hidden) == calls_of(message)


async def test_continuous_usage_counts_reasoning_tokens_as_they_come(rc: httpx.AsyncClient) -> None:
    body = {
        "messages": say(THINK + "It is sunny."),
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = await post(rc, body)
    final = events[-2]["usage"]["completion_tokens_details"]["reasoning_tokens"]
    counts = [e["usage"]["completion_tokens_details"]["reasoning_tokens"] for e in events[:-2]]
    assert counts[0] == 0  # the role chunk
    assert counts == sorted(counts) and counts[-1] == final > 0
    # the reasoning ends at its marker: the content's chunks count no more
    content = [
        e["usage"]["completion_tokens_details"]["reasoning_tokens"]
        for e in events[:-2]
        if e["choices"][0]["delta"].get("content")
    ]
    assert content and set(content[1:]) == {final}


async def test_hidden_reasoning_hides_the_tokens_logprobs_and_ids_too(rc: httpx.AsyncClient) -> None:
    # as vLLM's server: with include_reasoning false the generated tokens' logprobs and ids would
    # spell the reasoning out, so neither is sent (the prompt's ids still are)
    body = {
        "messages": say(THINK + "It is sunny."),
        "max_tokens": 200,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
    }
    shown = (await post(rc, body))["choices"][0]
    assert shown["logprobs"]["content"] and shown["token_ids"]
    hidden = await post(rc, {**body, "include_reasoning": False})
    (choice,) = hidden["choices"]
    assert (choice["message"]["reasoning"], choice["message"]["content"]) == (None, "It is sunny.")
    assert choice["logprobs"] is None and choice["token_ids"] is None and hidden["prompt_token_ids"]
    events = await post(rc, {**body, "include_reasoning": False, "stream": True})
    chunks = [c for e in events if e != "[DONE]" for c in e["choices"]]
    assert all(c["logprobs"] is None and c.get("token_ids") is None for c in chunks)
    (ch,) = rebuilt(events).values()
    assert (ch["reasoning"], ch["content"], ch["finish"]) == ("", "It is sunny.", "stop")
    # nothing is sent for the hidden steps: fewer chunks than tokens
    assert len(chunks) < len(shown["token_ids"])


async def test_hidden_reasoning_deltas_say_reasoning_null(rc: httpx.AsyncClient) -> None:
    # as vLLM's parser leaves them: with include_reasoning false, each delta with content (or call
    # pieces) carries "reasoning": null; the role chunk and the finish chunk do not
    body = {"messages": say(THINK + "It is sunny."), "max_tokens": 200, "stream": True}
    hidden = [
        c["delta"] for e in await post(rc, {**body, "include_reasoning": False}) if e != "[DONE]" for c in e["choices"]
    ]
    said = [d for d in hidden if d.get("content")]
    assert said and all("reasoning" in d and d["reasoning"] is None for d in said)
    assert not any("reasoning" in d for d in hidden if not d.get("content"))
    shown = [c["delta"] for e in await post(rc, body) if e != "[DONE]" for c in e["choices"]]
    assert not any("reasoning" in d and d["reasoning"] is None for d in shown)


async def test_reasoning_without_tools_is_parsed_too(rc: httpx.AsyncClient) -> None:
    body = {"messages": say(THINK + "It is sunny."), "max_tokens": 200}
    message = (await post(rc, body))["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("The user wants the weather.", "It is sunny.")
    assert "tool_calls" not in message
    (ch,) = rebuilt(await post(rc, {**body, "stream": True})).values()
    assert (ch["reasoning"], ch["content"], ch["finish"]) == (message["reasoning"], "It is sunny.", "stop")
    # chat_template_kwargs reach the parser too: without thinking, qwen3's reads no reasoning
    plain = {"messages": say("It is sunny."), "max_tokens": 200}
    assert (await post(rc, plain))["choices"][0]["message"]["reasoning"] == "It is sunny."
    off = (await post(rc, {**plain, "chat_template_kwargs": {"enable_thinking": False}}))["choices"][0]["message"]
    assert (off["reasoning"], off["content"]) == (None, "It is sunny.")
    # and reasoning_effort "none" turns thinking off as vLLM's does (enable_thinking false)
    effort = (await post(rc, {**plain, "reasoning_effort": "none"}))["choices"][0]["message"]
    assert (effort["reasoning"], effort["content"]) == (None, "It is sunny.")


async def test_tool_choice_none_leaves_a_call_as_text(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, parsers=ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes"))
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        body = {"messages": say(CALL), "tools": TOOLS, "tool_choice": "none", "max_tokens": 200}
        (choice,) = (await post(client, body))["choices"]
        assert choice["message"]["content"] == CALL and choice["finish_reason"] == "stop"
        assert "tool_calls" not in choice["message"]
        no_tools = (await post(client, {"messages": say(CALL), "max_tokens": 200}))["choices"][0]
        assert no_tools["message"]["content"] == CALL


async def test_n_choices_and_the_batch_route_each_parse_their_own(tc: httpx.AsyncClient) -> None:
    body = {"messages": say(CALL, "No tool needed."), "tools": TOOLS, "max_tokens": 200, "n": 2}
    choices = (await post(tc, body))["choices"]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "stop"]
    assert choices[1]["message"]["content"] == "No tool needed." and "tool_calls" not in choices[1]["message"]
    streamed = rebuilt(await post(tc, {**body, "stream": True}))
    assert [streamed[i]["finish"] for i in (0, 1)] == ["tool_calls", "stop"]
    batch = {"messages": [say(CALL), say("Hi.")], "tools": TOOLS, "max_tokens": 200}
    whole = (await post(tc, batch, "/v1/chat/completions/batch"))["choices"]
    assert calls_of(whole[0]["message"]) == [("get_weather", {"city": "Paris"})]
    assert whole[1]["message"]["content"] == "Hi." and "tool_calls" not in whole[1]["message"]
    streamed = rebuilt(await post(tc, {**batch, "stream": True}, "/v1/chat/completions/batch"))
    assert streamed[0]["finish"] == "tool_calls" and streamed[1]["content"] == "Hi."


async def test_the_batch_route_parses_reasoning(rc: httpx.AsyncClient) -> None:
    batch = {"messages": [say(THINK + CALL), say(THINK + "Hi.")], "tools": TOOLS, "max_tokens": 200, "n": 2}
    whole = (await post(rc, batch, "/v1/chat/completions/batch"))["choices"]
    assert len(whole) == 4 and all(c["message"]["reasoning"] == "The user wants the weather." for c in whole)
    assert [c["finish_reason"] for c in whole] == ["tool_calls", "tool_calls", "stop", "stop"]
    streamed = rebuilt(await post(rc, {**batch, "stream": True}, "/v1/chat/completions/batch"))
    assert [streamed[i]["content"] for i in (2, 3)] == ["Hi.", "Hi."]


async def test_a_call_cut_by_length(tc: httpx.AsyncClient) -> None:
    # cut inside the arguments: vLLM's hermes shows no call in the whole message (it cannot load
    # the JSON) and the stream has sent the name and what it had of the arguments
    body = {"messages": say(CALL), "tools": TOOLS, "max_tokens": 45}
    (choice,) = (await post(tc, body))["choices"]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    (ch,) = rebuilt(await post(tc, {**body, "stream": True})).values()
    assert ch["finish"] == "length"
    (call,) = ch["calls"].values()
    assert call["name"] == "get_weather" and '{"city": "Paris"}'.startswith(call["arguments"])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_parser_that_raises_leaves_the_text_as_content(
    nursery: trio.Nursery, tmp_path: Path, stream: bool
) -> None:
    plugin = tmp_path / "broken_parser.py"
    plugin.write_text(
        "from vllm.tool_parsers import ToolParserManager\n"
        "from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser\n"
        "@ToolParserManager.register_module('broken_for_braid')\n"
        "class Broken(Hermes2ProToolParser):\n"
        "    def extract_tool_calls(self, *a, **k):\n"
        "        raise RuntimeError('a parser bug')\n"
        "    def extract_tool_calls_streaming(self, *a, **k):\n"
        "        raise RuntimeError('a parser bug')\n"
    )
    options = ParserOptions(
        enable_auto_tool_choice=True, tool_call_parser="broken_for_braid", tool_parser_plugin=str(plugin)
    )
    srv = await start_server(nursery, parsers=options)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        got = await post(client, {"messages": say("Hi " + CALL), "tools": TOOLS, "max_tokens": 200, "stream": stream})
    if stream:
        assert got[-1] == "[DONE]" and not any(e != "[DONE]" and "error" in e for e in got)
        (ch,) = rebuilt(got).values()
        assert ch["content"].endswith("</tool_call>") and ch["finish"] == "stop"
    else:
        assert got["choices"][0]["message"]["content"] == "Hi " + CALL


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "does not match any of the specified"),
        ({"tool_choice": "sometimes"}, "Invalid value for `tool_choice`"),
        ({"tools": [], "tool_choice": "auto"}, "must not be an empty array"),
    ],
)
async def test_bad_tool_requests_are_400s_before_the_stream(tc: httpx.AsyncClient, body: dict, message: str) -> None:
    full = {"messages": say(CALL), "tools": TOOLS, "stream": True, **body}
    r = await tc.post("/v1/chat/completions", json=full)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


async def test_parsed_bodies_and_chunks_are_the_declared_shapes(rc: httpx.AsyncClient) -> None:
    # braid.wire.shapes describes these bytes (and /openapi.json is made from it): decoded strictly
    body = {"messages": say(THINK + TWO_CALLS, THINK + "It is sunny."), "tools": TOOLS, "max_tokens": 300, "n": 2}
    r = await rc.post("/v1/chat/completions", json=body)
    whole = msgspec.json.decode(r.content, type=shapes.ChatCompletion)
    first = whole.choices[0].message
    assert (
        first.reasoning
        and first.tool_calls
        and [c.function.name for c in first.tool_calls] == ["get_weather", "get_time"]
    )
    assert whole.choices[1].message.content == "It is sunny." and whole.choices[1].message.tool_calls is msgspec.UNSET
    r = await rc.post("/v1/chat/completions", json={**body, "stream": True})
    datas = [line[len("data: ") :] for line in r.text.split("\n\n") if line.startswith("data: {")]
    chunks = [msgspec.json.decode(d, type=shapes.ChatChunk) for d in datas]
    pieces = [p for c in chunks for ch in c.choices for p in (ch.delta.tool_calls or [])]
    assert {p.index for p in pieces} == {0, 1} and sum(p.id is not msgspec.UNSET for p in pieces) == 2
