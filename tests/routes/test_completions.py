"""braid.routes.completions.completions called directly: no quart, no sockets, one trio run per test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from braid.engine.base import EngineOutput, EngineRequest
from braid.engine.scripted import ScriptedEngine
from braid.metrics import Metrics
from braid.routes.body import CompletionStream
from braid.routes.common import AppState, JsonResponse
from braid.routes.completions import completions
from braid.settings import Settings
from tests.helpers import aborts, parse_sse

JSON = "application/json"


def state(engine: ScriptedEngine | None = None, **settings: Any) -> AppState:
    engine = engine or ScriptedEngine(token_delay=0.0)
    return AppState(engine, Settings(**settings), Metrics(), new_id=lambda: "0123456789abcdef", now=lambda: 1234.5)


def started(st: AppState) -> float:
    """Engine requests the app's runs have started."""
    return st.metrics.registry.get_sample_value("braid_engine_requests_total") or 0.0


def body(**fields: Any) -> bytes:
    return json.dumps({"prompt": ["Hello", "World"], "max_tokens": 3, "temperature": 0, **fields}).encode()


def read(data: bytes) -> Callable[[], Awaitable[bytes]]:
    """The request body as the view reads it (after its cheap checks)."""

    async def read_body() -> bytes:
        return data

    return read_body


async def send(stream: CompletionStream) -> bytes:
    """Send a stream as quart sends a response body; what the client received."""
    sent = b""
    async with stream as body:
        async for data in body:
            sent += data
    return sent


async def test_a_valid_request_runs_to_one_json_body() -> None:
    st = state()
    r = await completions(st, read(body()), content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == 200
    data = json.loads(r.body)
    assert (data["id"], data["created"], data["model"]) == ("cmpl-0123456789abcdef", 1234, "scripted")
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert all(c["finish_reason"] in {"stop", "length"} for c in data["choices"])
    assert st.engine.in_flight == 0  # type: ignore[attr-defined]


async def test_the_request_id_header_names_the_response_and_wins_over_the_body() -> None:
    r = await completions(
        state(), read(body(request_id="from-body")), content_type=f"{JSON}; charset=utf-8", request_id="abc"
    )
    assert isinstance(r, JsonResponse) and json.loads(r.body)["id"] == "cmpl-abc"
    r = await completions(state(), read(body(request_id="from-body")), content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and json.loads(r.body)["id"] == "cmpl-from-body"


@pytest.mark.parametrize(
    ("payload", "content_type", "status", "message"),
    [
        (body(n=0), JSON, 400, "n must be between 1 and 256"),
        (b"{not json", JSON, 400, ""),
        (body(), "text/plain", 400, "Unsupported Media Type: Only 'application/json' is allowed"),
        (body(), None, 400, "Unsupported Media Type: Only 'application/json' is allowed"),
        (body(model="other"), JSON, 404, "The model `other` does not exist."),
        (body(max_tokens=10**6), JSON, 400, "cannot be greater than max_model_len"),
    ],
    ids=["n=0", "not-json", "text-plain", "no-content-type", "unknown-model", "max_tokens-over-context"],
)
async def test_a_refused_request_is_a_json_error_before_any_engine_request(
    payload: bytes, content_type: str | None, status: int, message: str
) -> None:
    st = state()
    r = await completions(st, read(payload), content_type=content_type, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == status
    error = json.loads(r.body)["error"]
    assert error["code"] == status and message in error["message"]
    assert st.engine.in_flight == 0 and started(st) == 0  # type: ignore[attr-defined]


async def test_a_draining_server_refuses_with_503() -> None:
    st = state()
    st.draining = True
    r = await completions(st, read(body()), content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == 503
    assert json.loads(r.body)["error"]["message"] == "The server is shutting down."


@pytest.mark.parametrize(
    ("hook", "status", "type_"),
    [("braid:fail@1", 500, "InternalServerError"), ("braid:invalid", 400, "BadRequestError")],
)
async def test_a_failed_run_is_its_own_json_error_not_a_group(hook: str, status: int, type_: str) -> None:
    st = state()
    r = await completions(st, read(body(prompt=["ok", f"x {hook}"], max_tokens=5)), content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == status
    error = json.loads(r.body)["error"]
    assert (error["code"], error["type"]) == (status, type_)
    assert st.engine.in_flight == 0  # type: ignore[attr-defined]


async def test_a_stream_is_returned_unstarted_and_sends_as_quart_sends_a_body() -> None:
    st = state()
    r = await completions(st, read(body(stream=True)), content_type=JSON, request_id=None)
    assert isinstance(r, CompletionStream)
    assert started(st) == 0  # the run opens in __aenter__
    events = parse_sse(await send(r))
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert {e["choices"][0]["index"] for e in events if isinstance(e, dict)} == {0, 1}
    assert started(st) == 2 and st.engine.in_flight == 0  # type: ignore[attr-defined]


async def test_cancellation_propagates_after_every_engine_request_is_aborted() -> None:
    engine = ScriptedEngine(token_delay=1.0)
    with trio.move_on_after(0.05) as scope:
        await completions(state(engine), read(body(max_tokens=50, ignore_eos=True)), content_type=JSON, request_id=None)
    assert scope.cancelled_caught
    assert engine.in_flight == 0 and sorted(engine.aborted_ids) == [
        "cmpl-0123456789abcdef-0",
        "cmpl-0123456789abcdef-1",
    ]


class _BrokenEngine(ScriptedEngine):
    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: object = None,
        deliver: object = None,
        observe: object = None,
        ending: object = None,
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        raise RuntimeError("a bug")
        yield  # pragma: no cover


async def test_a_bug_in_a_run_is_raised_unwrapped() -> None:
    with pytest.raises(RuntimeError, match="a bug"):
        await completions(state(_BrokenEngine()), read(body(prompt="one")), content_type=JSON, request_id=None)


@pytest.mark.parametrize(("content_type", "draining", "status"), [("text/plain", False, 400), (JSON, True, 503)])
async def test_a_request_refused_before_its_body_is_needed_reads_no_body(
    content_type: str, draining: bool, status: int
) -> None:
    st = state()
    st.draining = draining

    async def no_read() -> bytes:
        pytest.fail("the body was read for a request refused without it")

    r = await completions(st, no_read, content_type=content_type, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == status


async def test_a_full_queue_is_a_429_with_retry_after_before_the_body_is_read() -> None:
    st = state(ScriptedEngine(token_delay=1.0), max_in_flight=1, max_queued=0)
    busy = st.admission.admit()
    await busy.acquire(1)

    async def no_read() -> bytes:
        pytest.fail("the body was read for a request refused by admission")

    r = await completions(st, no_read, content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == 429
    assert dict(r.headers)["Retry-After"] == str(st.admission.retry_after)
    error = json.loads(r.body)["error"]
    assert (error["code"], error["type"]) == (429, "TooManyRequestsError")
    assert st.metrics.registry.get_sample_value("braid_admission_rejected_total") == 1
    assert (st.admission.queued, st.admission.in_use) == (0, 1)


async def test_a_draining_server_says_when_to_retry() -> None:
    st = state()
    st.draining = True
    r = await completions(st, read(body()), content_type=JSON, request_id=None)
    assert r.status == 503 and "Retry-After" in dict(r.headers)  # type: ignore[union-attr]


async def test_n_above_the_slots_is_a_400_naming_n_and_leaves_no_ticket() -> None:
    st = state(max_in_flight=4)
    r = await completions(st, read(body(n=5, temperature=1.0)), content_type=JSON, request_id=None)
    assert isinstance(r, JsonResponse) and r.status == 400
    assert json.loads(r.body)["error"]["param"] == "n"
    assert (st.admission.queued, st.admission.in_use) == (0, 0)


async def test_a_batch_larger_than_the_slots_is_served_whole() -> None:
    st = state(max_in_flight=3)
    prompts = [f"p{i}" for i in range(10)]
    r = await completions(
        st, read(body(prompt=prompts, n=2, temperature=1.0, stream=True)), content_type=JSON, request_id=None
    )
    assert isinstance(r, CompletionStream)
    events = parse_sse(await send(r))
    assert events.count("[DONE]") == 1
    finished = {e["choices"][0]["index"] for e in events if isinstance(e, dict) and e["choices"][0]["finish_reason"]}
    assert finished == set(range(20))
    assert (st.admission.queued, st.admission.in_use) == (0, 0)


async def test_a_stream_never_started_gives_its_queue_place_back() -> None:
    import gc

    st = state(max_in_flight=1)
    r = await completions(st, read(body(stream=True)), content_type=JSON, request_id=None)
    assert st.admission.queued == 1
    del r
    gc.collect()
    assert st.admission.queued == 0
    assert aborts(st.metrics.registry) == {"queue": 2}  # its two prompts never reached the engine


async def test_latencies_start_when_the_request_arrives_body_read_included(
    autojump_clock: trio.testing.MockClock,
) -> None:
    st = state(ScriptedEngine(token_delay=0.25))

    async def slow_body() -> bytes:
        await trio.sleep(2.0)
        return body(max_tokens=2, ignore_eos=True, stream=True)

    r = await completions(st, slow_body, content_type=JSON, request_id=None)
    assert isinstance(r, CompletionStream)
    await trio.sleep(1.0)  # quart has not started the stream yet
    await send(r)
    registry = st.metrics.registry
    assert registry.get_sample_value("braid_time_to_first_token_seconds_sum") == pytest.approx(2 * 3.25)
    assert registry.get_sample_value("braid_e2e_request_latency_seconds_sum") == pytest.approx(2 * 3.5)


async def test_a_drain_cancelling_a_stream_counts_drain(autojump_clock: trio.testing.MockClock) -> None:
    st = state(ScriptedEngine(token_delay=0.25))
    r = await completions(
        st, read(body(max_tokens=1000, ignore_eos=True, stream=True)), content_type=JSON, request_id=None
    )
    assert isinstance(r, CompletionStream)
    with trio.move_on_after(1.0):
        async with r as stream:
            async for _ in stream:
                st.draining = True
    assert aborts(st.metrics.registry) == {"drain": 2}


@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_timeout_ends_the_request_with_a_408(
    stream: bool, autojump_clock: trio.testing.MockClock
) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    st = state(engine, request_timeout=1.5)
    r = await completions(
        st, read(body(max_tokens=1000, ignore_eos=True, stream=stream)), content_type=JSON, request_id=None
    )
    if stream:
        assert isinstance(r, CompletionStream)
        events = parse_sse(await send(r))
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 408
    else:
        assert isinstance(r, JsonResponse) and r.status == 408
        assert json.loads(r.body)["error"]["type"] == "RequestTimeout"
    assert trio.current_time() == pytest.approx(1.5)
    assert engine.in_flight == 0 and engine.aborted_total == 2


async def test_an_over_long_request_id_header_is_a_400() -> None:
    st = state()
    r = await completions(st, read(body()), content_type=JSON, request_id="x" * 257)
    assert isinstance(r, JsonResponse) and r.status == 400
    assert "X-Request-Id" in json.loads(r.body)["error"]["message"]
    assert (st.admission.queued, started(st)) == (0, 0)
    ok = await completions(st, read(body()), content_type=JSON, request_id="x" * 256)
    assert ok.status == 200  # type: ignore[union-attr]
