"""Real agent clients end to end on the real engine (issue 26 §9, "Real clients, in CI").

LangChain's ``ChatOpenAI``, the OpenAI Agents SDK and pydantic-ai, each pointed at the tier's
braid (pythonic's tool parser, tools/servers.py TOOL_FLAGS), each running the tool-calling loop
its users run. The tiny model cannot choose a tool, so each client forces the call
(``tool_choice`` "required" or a named function, which braid turns into structured output) and
bans whitespace with test_tools.py's logit bias. Every call here is real model output, parsed by
vLLM's parser through braid and then by the client's own code; the tools really run on the
arguments the model wrote, and their results go back to braid in the client's own request shape.
Each test records the request bodies the client sent (an httpx event hook: nothing is mocked).
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIChatModelSettings
from pydantic_ai.providers.openai import OpenAIProvider

from tests.helpers import VllmServer, no_whitespace

pytestmark = pytest.mark.vllm

City = Literal["Paris", "Oslo"]  # an enum, so that the tiny model's forced arguments end
CITIES = ("Paris", "Oslo")
QUESTION = "Weather in Paris?"


def weather(city: str) -> str:
    return f"sunny, 21 C in {city}"


class Recorder:
    """The JSON bodies of the chat requests a client sent, in order (an httpx event hook)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.sync_client = httpx.Client(timeout=120, event_hooks={"request": [self.record]})

    def record(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.content))

    async def arecord(self, request: httpx.Request) -> None:
        self.record(request)

    def async_client(self) -> httpx.AsyncClient:
        """A new client for one asyncio run (the openai client closes it)."""
        return httpx.AsyncClient(timeout=120, event_hooks={"request": [self.arecord]})


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    with r.sync_client:
        yield r


def assert_result_in_prompt(server: VllmServer, body: dict[str, Any], result: str, prompt_tokens: int) -> None:
    """The conversation ``body`` sent renders, with the model's chat template, to a prompt that
    holds the tool's ``result`` and has as many tokens as braid's usage counted: the result
    reached the model, not only the request."""
    tokenized = httpx.post(
        server.url + "/tokenize",
        json={"model": server.model, "messages": body["messages"], "tools": body.get("tools")},
        timeout=30,
    ).json()
    assert tokenized["count"] == prompt_tokens
    prompt = httpx.post(
        server.url + "/detokenize", json={"model": server.model, "tokens": tokenized["tokens"]}, timeout=30
    ).json()["prompt"]
    assert result in prompt


def tool_message(body: dict[str, Any]) -> dict[str, Any]:
    (message,) = [m for m in body["messages"] if m["role"] == "tool"]
    return message


# LangChain


def langchain_weather(calls: list[str]) -> Any:
    @tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        calls.append(city)
        return weather(city)

    return get_weather


def chat_openai(server: VllmServer, recorder: Recorder) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model,
        base_url=server.url + "/v1",
        api_key="none",  # type: ignore[arg-type]  # a str is what users pass; the field is a SecretStr
        temperature=0,
        max_tokens=200,  # type: ignore[call-arg]  # an alias of max_completion_tokens
        max_retries=0,
        logit_bias={int(token): bias for token, bias in no_whitespace().items()},
        stream_usage=True,
        http_client=recorder.sync_client,
    )


def test_langchain_bind_tools_loop(vllm_server: VllmServer, recorder: Recorder) -> None:
    calls: list[str] = []
    get_weather = langchain_weather(calls)
    llm = chat_openai(vllm_server, recorder)
    history: list[BaseMessage] = [HumanMessage(QUESTION)]

    # One call, fixed by the request (vLLM's schema for "required" without parallel calls has
    # maxItems 1): left to its weights, which differ between kinds of CPU, the tiny model may
    # write several calls, or calls until max_tokens.
    ai = llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke(history)
    assert isinstance(ai, AIMessage) and not ai.invalid_tool_calls
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in CITIES and set(call["args"]) == {"city"}
    assert call["id"] and call["id"].startswith("chatcmpl-tool-")
    assert ai.response_metadata["finish_reason"] == "tool_calls"
    assert recorder.bodies[0]["tool_choice"] == "required"
    assert recorder.bodies[0]["tools"][0]["function"]["name"] == "get_weather"

    history.append(ai)
    result = get_weather.invoke(call)  # LangChain's own tool run: a ToolMessage for the call's id
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    assert calls == [call["args"]["city"]] and result.content == weather(calls[0])
    history.append(result)

    final = llm.bind_tools([get_weather]).invoke(history, max_tokens=8)  # "auto": the model answers
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert isinstance(final.content, str) and final.content
    assert final.response_metadata["finish_reason"] in ("stop", "length")
    sent = recorder.bodies[1]
    (assistant,) = [m for m in sent["messages"] if m["role"] == "assistant"]
    (echoed,) = assistant["tool_calls"]
    assert echoed["id"] == call["id"] and json.loads(echoed["function"]["arguments"]) == call["args"]
    assert tool_message(sent) == {"role": "tool", "tool_call_id": call["id"], "content": weather(calls[0])}
    assert final.usage_metadata is not None
    assert_result_in_prompt(vllm_server, sent, weather(calls[0]), final.usage_metadata["input_tokens"])


def test_langchain_streamed_tool_call_chunks(vllm_server: VllmServer, recorder: Recorder) -> None:
    calls: list[str] = []
    get_weather = langchain_weather(calls)
    llm = chat_openai(vllm_server, recorder)
    history: list[BaseMessage] = [HumanMessage(QUESTION)]

    streamed = list(llm.bind_tools([get_weather], tool_choice="get_weather").stream(history))
    chunks = [chunk for chunk in streamed if isinstance(chunk, AIMessageChunk)]
    assert len(chunks) == len(streamed)
    assert recorder.bodies[0]["stream"] is True
    assert recorder.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    pieces = [piece for chunk in chunks for piece in chunk.tool_call_chunks]
    # vLLM's streamed shape: the first piece has the id and the name, later ones argument fragments
    assert len(pieces) > 1 and all(piece["index"] == 0 for piece in pieces)
    assert pieces[0]["name"] == "get_weather" and (pieces[0]["id"] or "").startswith("chatcmpl-tool-")
    assert all(piece["name"] is None and piece["id"] is None for piece in pieces[1:])
    total = functools.reduce(operator.add, chunks)  # LangChain's own accumulation of the chunks
    assert isinstance(total, AIMessageChunk) and not total.invalid_tool_calls
    (piece,) = total.tool_call_chunks
    (call,) = total.tool_calls
    assert piece["name"] == call["name"] == "get_weather" and piece["id"] == call["id"] == pieces[0]["id"]
    assert json.loads(piece["args"] or "") == call["args"] and call["args"]["city"] in CITIES
    assert total.response_metadata["finish_reason"] == "stop"  # vLLM's rule for a named function
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] > 0

    result = get_weather.invoke(call)
    assert calls == [call["args"]["city"]]
    final = functools.reduce(
        operator.add, llm.bind_tools([get_weather]).stream([*history, total, result], max_tokens=8)
    )
    assert isinstance(final, AIMessageChunk) and not final.tool_calls
    assert isinstance(final.content, str) and final.content
    assert tool_message(recorder.bodies[1]) == {"role": "tool", "tool_call_id": call["id"], "content": result.content}


# The OpenAI Agents SDK


def run_agent(server: VllmServer, agent: Agent[Any], recorder: Recorder, streamed: bool) -> tuple[Any, list[Any]]:
    """Run ``agent`` on the question with its model pointed at braid, on asyncio (the SDK's loop):
    the run's result and the names of the run item events streamed (none unless ``streamed``)."""

    async def main() -> tuple[Any, list[Any]]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, http_client=recorder.async_client()
        ) as client:
            agent.model = OpenAIChatCompletionsModel(model=server.model, openai_client=client)
            if not streamed:
                return await Runner.run(agent, QUESTION, max_turns=3), []
            run = Runner.run_streamed(agent, QUESTION, max_turns=3)
            names = [event.name async for event in run.stream_events() if event.type == "run_item_stream_event"]
            return run, names

    set_tracing_disabled(True)
    return asyncio.run(main())


def agents_weather(calls: list[str]) -> Any:
    @function_tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        calls.append(city)
        return weather(city)

    return get_weather


def agent_settings(tool_choice: str, max_tokens: int) -> ModelSettings:
    return ModelSettings(
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=max_tokens,
        include_usage=True,
        extra_body={"logit_bias": no_whitespace()},
    )


def test_agents_sdk_stops_on_the_tools_result(vllm_server: VllmServer, recorder: Recorder) -> None:
    calls: list[str] = []
    agent: Agent[Any] = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[agents_weather(calls)],
        model_settings=agent_settings("get_weather", max_tokens=200),
        tool_use_behavior="stop_on_first_tool",
    )
    result, _ = run_agent(vllm_server, agent, recorder, streamed=False)

    (call_item, output_item) = result.new_items
    assert isinstance(call_item, ToolCallItem) and isinstance(output_item, ToolCallOutputItem)
    raw = call_item.raw_item
    assert getattr(raw, "name", None) == "get_weather"
    arguments = json.loads(getattr(raw, "arguments", ""))
    assert set(arguments) == {"city"} and arguments["city"] in CITIES
    assert getattr(raw, "call_id", "").startswith("chatcmpl-tool-")
    # the tool ran once, on the model's arguments, and its return value ended the run
    assert calls == [arguments["city"]]
    assert result.final_output == output_item.output == weather(arguments["city"])
    (body,) = recorder.bodies  # one model call
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["tools"][0]["function"]["strict"] is True  # the SDK's strict schemas are taken


def test_agents_sdk_sends_the_result_back_streamed(vllm_server: VllmServer, recorder: Recorder) -> None:
    # the SDK's default loop: call, run the tool, send its output back, the model answers (its
    # tool_choice reset to auto after the call, so the tiny model writes text)
    calls: list[str] = []
    agent: Agent[Any] = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[agents_weather(calls)],
        # the forced call takes 47 or 48 tokens (the array of "required"'s schema); the answer is cut
        model_settings=agent_settings("required", max_tokens=64),
    )
    run, names = run_agent(vllm_server, agent, recorder, streamed=True)

    assert names == ["tool_called", "tool_output", "message_output_created"]
    (city,) = calls
    assert city in CITIES
    assert isinstance(run.final_output, str) and run.final_output
    first, second = recorder.bodies
    assert first["stream"] is True and first["tool_choice"] == "required" and "tool_choice" not in second
    (assistant,) = [m for m in second["messages"] if m["role"] == "assistant"]
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": city}
    assert tool_message(second) == {"role": "tool", "tool_call_id": call["id"], "content": weather(city)}
    answer = run.raw_responses[-1]
    assert_result_in_prompt(vllm_server, second, weather(city), answer.usage.input_tokens)


# pydantic-ai


class Weather(BaseModel):
    """The weather asked for."""

    city: City


def test_pydantic_ai_output_type_is_a_forced_tool_call(vllm_server: VllmServer, recorder: Recorder) -> None:
    # with a structured output_type and no text output allowed, pydantic-ai offers one output tool
    # (final_result) with tool_choice "required" and validates the call's arguments into the type

    async def main() -> Any:
        async with openai.AsyncOpenAI(
            base_url=vllm_server.url + "/v1", api_key="none", max_retries=0, http_client=recorder.async_client()
        ) as client:
            model = OpenAIChatModel(vllm_server.model, provider=OpenAIProvider(openai_client=client))
            # one call, by the request (see test_langchain_bind_tools_loop)
            settings = OpenAIChatModelSettings(
                temperature=0, max_tokens=200, logit_bias=no_whitespace(), parallel_tool_calls=False
            )
            agent = PydanticAgent(model, output_type=Weather, model_settings=settings)
            return await agent.run(QUESTION)

    result = asyncio.run(main())
    assert isinstance(result.output, Weather) and result.output.city in CITIES
    (body,) = recorder.bodies
    assert body["tool_choice"] == "required" and body["tools"][0]["function"]["name"] == "final_result"
    (response,) = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    (part,) = response.parts
    assert isinstance(part, ToolCallPart) and part.tool_name == "final_result"
    assert part.args_as_dict() == {"city": result.output.city}
    assert part.tool_call_id.startswith("chatcmpl-tool-")
    assert response.finish_reason == "tool_call" and (response.provider_details or {})["finish_reason"] == "tool_calls"
