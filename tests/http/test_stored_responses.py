"""Stored ``/v1/responses`` answers (issue 31 §2) as users reach them: ``braid serve --engine
scripted`` with its store, the ``openai`` package's client, two API keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.parity.responses_compare import parse_event_stream
from tools.servers import ServerProcess, run_scripted_braid

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A braid whose store is on SQLite, or on a real PostgreSQL (``--store``)."""
    storage = tmp_path_factory.mktemp("store")
    database = () if request.param == "sqlite" else ("--store", request.getfixturevalue("postgres").create_database())
    with run_scripted_braid(
        "--storage-dir",
        str(storage),
        *database,
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


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose engine takes 50 ms a token: a background response runs long enough to be
    seen queued and to be cancelled."""
    storage = tmp_path_factory.mktemp("slow-store")
    with run_scripted_braid(
        "--storage-dir", str(storage), "--token-delay", "0.05", api_key=KEY_A, log=Path("/tmp/braid-bg-responses.log")
    ) as s:
        yield s


def _wait(client: openai.OpenAI, response_id: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        r = client.responses.retrieve(response_id)
        if r.status not in ("queued", "in_progress"):
            return r
        assert time.monotonic() < deadline, f"still {r.status} after {within} s"
        time.sleep(0.05)


def test_a_background_response_answers_queued_then_completes(slow: ServerProcess) -> None:
    a = _client(slow)
    r = a.responses.create(input="Hello", max_output_tokens=10, background=True, extra_body={"ignore_eos": True})
    assert r.status == "queued" and r.background and r.output == [] and r.usage is None
    done = _wait(a, r.id)
    assert done.status == "incomplete" and done.usage is not None and done.usage.output_tokens == 10
    assert done.output_text and done.id == r.id
    with pytest.raises(openai.BadRequestError) as info:
        a.responses.cancel(r.id)  # over: vLLM's "Cannot cancel a synchronous response."
    assert info.value.body["param"] == "response_id"  # type: ignore[index]


def test_a_background_response_is_cancelled_and_its_engine_work_aborted(slow: ServerProcess) -> None:
    a = _client(slow)
    r = a.responses.create(input="Hello", max_output_tokens=2000, background=True, extra_body={"ignore_eos": True})
    time.sleep(0.3)  # generating now
    cancelled = a.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    time.sleep(0.5)
    assert a.responses.retrieve(r.id).status == "cancelled"
    metrics = httpx.get(slow.url + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"}).text
    assert "braid_engine_requests_in_flight 0.0" in metrics
    aborted = [line for line in metrics.splitlines() if line.startswith("braid_engine_aborts_total{")]
    assert any(not line.endswith(" 0.0") for line in aborted), aborted


def test_background_without_store_is_refused(slow: ServerProcess) -> None:
    a = _client(slow)
    with pytest.raises(openai.BadRequestError) as info:
        a.responses.create(input="Hi", background=True, store=False)  # type: ignore[call-overload]
    assert info.value.body["param"] == "background"  # type: ignore[index]


def _post_stream(server: ServerProcess, body: dict[str, Any]) -> Any:
    return httpx.stream(
        "POST",
        server.url + "/v1/responses",
        json={"stream": True, "background": True, **body},
        headers={"Authorization": f"Bearer {KEY_A}"},
        timeout=60,
    )


def _events_of(chunks: Iterator[bytes], until: int | None = None) -> list[tuple[str | None, Any]]:
    raw = b""
    for chunk in chunks:
        raw += chunk
        if until is not None and raw.count(b"\n\n") >= until:
            break
    return parse_event_stream(raw[: raw.rindex(b"\n\n") + 2] if b"\n\n" in raw else b"")


def test_a_streamed_background_response_goes_on_without_its_client(slow: ServerProcess) -> None:
    a = _client(slow)
    with _post_stream(slow, {"input": "Hello", "max_output_tokens": 30, "ignore_eos": True}) as r:
        assert r.status_code == 200
        first = _events_of(r.iter_raw(), until=5)
    # the client left after 5 events; the run goes on and is stored when done
    response_id = first[0][1]["response"]["id"]
    assert first[0][1]["response"]["background"] is True
    done = _wait(a, response_id)
    assert done.status == "incomplete" and done.usage is not None and done.usage.output_tokens == 30


def test_a_background_stream_is_resumed_after_a_sequence_number(slow: ServerProcess) -> None:
    a = _client(slow)
    with _post_stream(slow, {"input": "Hello", "max_output_tokens": 40, "ignore_eos": True}) as r:
        head = _events_of(r.iter_raw(), until=6)
    response_id = head[0][1]["response"]["id"]
    with httpx.stream(
        "GET",
        f"{slow.url}/v1/responses/{response_id}",
        params={"stream": "true", "starting_after": "3"},
        headers={"Authorization": f"Bearer {KEY_A}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        rest = _events_of(r.iter_raw())
    numbers = [d["sequence_number"] for _, d in rest]
    assert numbers == list(range(4, 4 + len(numbers)))  # from 4 on, none missing
    assert rest[-1][0] == "response.completed"
    # the events before 4 are the ones the first client saw
    assert [d["sequence_number"] for _, d in head[:4]] == [0, 1, 2, 3]
    text = "".join(d["delta"] for n, d in head[:4] + rest if n == "response.output_text.delta")
    assert text == a.responses.retrieve(response_id).output_text
    # once the run is over its events are gone: retrieve the response instead
    r2 = httpx.get(
        f"{slow.url}/v1/responses/{response_id}",
        params={"stream": "true"},
        headers={"Authorization": f"Bearer {KEY_A}"},
    )
    assert r2.status_code == 400 and r2.json()["error"]["param"] == "response_id"


def test_a_cancelled_background_stream_ends_without_completing(slow: ServerProcess) -> None:
    a = _client(slow)
    with _post_stream(slow, {"input": "Hello", "max_output_tokens": 2000, "ignore_eos": True}) as r:
        chunks = r.iter_raw()
        head = _events_of(chunks, until=4)
        a.responses.cancel(head[0][1]["response"]["id"])
        tail = _events_of(chunks)
    assert "response.completed" not in [n for n, _ in head + tail]
    assert a.responses.retrieve(head[0][1]["response"]["id"]).status == "cancelled"


def test_deleting_a_running_background_response_cancels_it(slow: ServerProcess) -> None:
    a = _client(slow)
    r = a.responses.create(input="Hello", max_output_tokens=2000, background=True, extra_body={"ignore_eos": True})
    time.sleep(0.3)
    a.responses.delete(r.id)
    time.sleep(0.5)  # its run is over and stored nothing
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(r.id)
    metrics = httpx.get(slow.url + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"}).text
    assert "braid_engine_requests_in_flight 0.0" in metrics
