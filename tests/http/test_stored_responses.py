"""Stored ``/v1/responses`` answers (issue 31 §2) as users reach them: ``braid serve --engine
scripted`` with its store, the ``openai`` package's client, two API keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tools.servers import ServerProcess, run_scripted_braid

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    storage = tmp_path_factory.mktemp("store")
    with run_scripted_braid(
        "--storage-dir",
        str(storage),
        "--api-key",
        KEY_B,
        "--response-retention",
        "3",
        api_key=KEY_A,
        log=Path("/tmp/braid-stored-responses.log"),
    ) as s:
        yield s


def _client(server: ServerProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_a_stored_response_is_retrieved_and_deleted(server: ServerProcess) -> None:
    a = _client(server)
    r = a.responses.create(input="Hello", max_output_tokens=4)
    got = a.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    # another key's response of that id does not exist
    with pytest.raises(openai.NotFoundError):
        _client(server, KEY_B).responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        _client(server, KEY_B).responses.delete(r.id)
    a.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        a.responses.retrieve(r.id)
    assert info.value.body["param"] == "response_id"  # type: ignore[index]


def test_store_false_keeps_nothing(server: ServerProcess) -> None:
    a = _client(server)
    r = a.responses.create(input="Hello", max_output_tokens=4, store=False)  # type: ignore[call-overload]
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(r.id)


def test_a_streamed_response_is_stored_before_it_completes(server: ServerProcess) -> None:
    a = _client(server)
    with a.responses.stream(model=server.model, input="Hello", max_output_tokens=4) as s:
        for event in s:
            if event.type == "response.completed":
                # retrievable as the stream's last event arrives
                assert a.responses.retrieve(event.response.id).output_text == event.response.output_text
        final = s.get_final_response()
    stored = a.responses.retrieve(final.id)
    # the SDK's accumulated final response adds fields of its own: compare what the server sent
    assert (stored.output_text, [o.id for o in stored.output], stored.usage) == (
        final.output_text,
        [o.id for o in final.output],
        final.usage,
    )


def test_previous_response_id_continues_the_conversation(server: ServerProcess) -> None:
    a = _client(server)
    first = a.responses.create(input="Hello", instructions="Be brief", max_output_tokens=4)
    alone = a.responses.create(input="And then?", max_output_tokens=4, store=False)  # type: ignore[call-overload]
    second = a.responses.create(input="And then?", previous_response_id=first.id, max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None and alone.usage is not None
    # the history (the first input and its answer, not its instructions) is in the prompt
    assert second.usage.input_tokens > alone.usage.input_tokens
    third = a.responses.create(input="More", previous_response_id=second.id, max_output_tokens=4)
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens
    # another key cannot continue it
    with pytest.raises(openai.NotFoundError):
        _client(server, KEY_B).responses.create(input="x", previous_response_id=first.id, max_output_tokens=2)


def test_stored_responses_expire(server: ServerProcess) -> None:
    a = _client(server)
    r = a.responses.create(input="Hello", max_output_tokens=2)
    time.sleep(3.5)  # --response-retention 3
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(r.id)


def test_retrieve_needs_the_key(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/v1/responses/resp_x").status_code == 401
