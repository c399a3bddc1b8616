"""The ``openai`` package's Responses client against braid on the real engine (issue 31 §5).

``client.responses.create`` and ``client.responses.stream`` pointed at the tier's braid (the one
engine the vLLM tier shares; pythonic's tool parser and gemma4's reasoning parser, tools/servers.py
TOOL_FLAGS): the client's own models parse every answer and event, so a field of the wrong shape
fails here. The tiny model cannot choose a tool, so the tool round trip forces the call's text
with a ``structured_outputs`` regex (an ``extra_body`` field vLLM's route takes too); the call is
then parsed by vLLM's parser through braid, and its output goes back as the client sends it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.helpers import VllmServer

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = {"structured_outputs": {"regex": r"\[get_weather\(city='Paris'\)\]"}}


@pytest.fixture(scope="module")
def client(vllm_server: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_create_answers_a_response(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="braid-tiny", input="Hello there", instructions="Be brief", max_output_tokens=8, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == "Be brief"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert r.output_text and r.output_text == item.content[0].text  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8


def test_stream_events_add_up_to_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="braid-tiny", input="Hello there", max_output_tokens=8, temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    # (not compared with a whole response: two greedy requests need not agree, docs/architecture.md)
    assert final.usage is not None and final.usage.output_tokens <= 8


def test_a_tool_call_round_trip(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.responses.create(
        model="braid-tiny",
        input=question,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=30,
        temperature=0,
        extra_body=CALL,
    )
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    follow = client.responses.create(
        model="braid-tiny",
        input=[
            *question,
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete") and follow.output_text


def test_a_streamed_tool_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="braid-tiny",
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=30,
        temperature=0,
        extra_body=CALL,
    ) as s:
        events = list(s)
        final = s.get_final_response()
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(args) == json.loads(call.arguments) == {"city": "Paris"}
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added and added[0].item.id == call.id
