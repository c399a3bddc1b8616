"""The Trio side of the engine-core client, without an engine: the per-request output slot, and
the output pump over a fake socket and output processor. The whole client runs against the real
engine in tests/vllm."""

from __future__ import annotations

import collections
import contextlib
import enum
import os
import socket
import types
from collections.abc import Iterator
from typing import Any, cast

import attrs
import pytest
import trio
import trio.testing
import zmq

from braid.engine.base import Ending, EngineOutput, EngineRequest, ModelInfo, SamplingParams
from braid.engine.vllm_common import CPU_ENVIRONMENT, OFFLINE_ENVIRONMENT, HfTokenizer, engine_outputs
from braid.engine.vllm_core import MAX_BURST, OUTPUT_CHUNK, FaultySlot, OutputSlot, VllmCoreEngine
from braid.errors import BraidError, EngineError, EngineUnavailable


class Out:
    """Stands in for vLLM's RequestOutput: ``add`` is what vLLM's collector merges with."""

    def __init__(self, *tokens: int, finished: bool = False) -> None:
        self.tokens = list(tokens)
        self.finished = finished
        self.merges: list[bool] = []
        self.outputs: list[types.SimpleNamespace] = []  # the choices, as far as errors go

    def add(self, other: Out, *, aggregate: bool) -> None:
        self.merges.append(aggregate)
        self.finished = other.finished
        self.tokens = self.tokens + other.tokens if aggregate else other.tokens


async def test_a_ready_output_is_returned_without_yielding_to_the_scheduler() -> None:
    slot = OutputSlot(aggregate=True)
    first = Out(1)
    slot.put(first)
    ran: list[bool] = []

    async def other() -> None:
        ran.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # would run at any schedule point
        got = await slot.get()
        assert ran == []
    assert got == [first] and ran == [True]


async def test_a_cancelled_reader_gets_cancelled_even_with_output_ready() -> None:
    slot = OutputSlot(aggregate=True)
    ready = Out(1, finished=True)  # e.g. vLLM's "abort" output, put as the run cancels its readers
    slot.put(ready)
    with trio.CancelScope() as scope:
        scope.cancel()
        await slot.get()
    assert scope.cancelled_caught
    assert await slot.get() == [ready]


async def test_a_reader_woken_and_cancelled_in_the_same_step_gets_cancelled() -> None:
    slot = OutputSlot(aggregate=True)
    outcome: list[str] = []

    async def reader(scope_box: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            scope_box.append(scope)
            await slot.get()
            outcome.append("output")
        if scope.cancelled_caught:
            outcome.append("cancelled")

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, box)
        await trio.testing.wait_all_tasks_blocked()
        slot.put(Out(1, finished=True))  # wakes the reader ...
        box[0].cancel()  # ... which is cancelled before it runs again
    assert outcome == ["cancelled"]


async def test_outputs_put_while_the_reader_lags_merge_into_one() -> None:
    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(Out(2, 3))
    slot.put(Out(4))
    (got,) = await slot.get()
    assert got.tokens == [1, 2, 3, 4] and got.merges == [True, True]


async def test_the_stream_ends_after_the_finished_output() -> None:
    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(Out(2, finished=True))
    (got,) = await slot.get()
    assert got.tokens == [1, 2] and got.finished
    with pytest.raises(trio.EndOfChannel):
        await slot.get()
    with pytest.raises(trio.EndOfChannel):
        await slot.get()


async def test_final_only_outputs_replace_rather_than_concatenate() -> None:
    slot = OutputSlot(aggregate=False)
    slot.put(Out(1))
    slot.put(Out(1, 2))
    (got,) = await slot.get()
    assert got.tokens == [1, 2] and got.merges == [False]


async def test_a_waiting_reader_is_woken_by_put() -> None:
    slot = OutputSlot(aggregate=True)
    got: list[object] = []

    async def reader() -> None:
        got.extend(await slot.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        out = Out(7)
        slot.put(out)
    assert got == [out]


async def test_cancelling_a_wait_loses_nothing() -> None:
    slot = OutputSlot(aggregate=True)
    with trio.move_on_after(0.01):
        await slot.get()
    slot.put(Out(5))
    (got,) = await slot.get()
    assert got.tokens == [5]


async def test_an_engine_failure_wins_over_pending_output_and_is_mapped() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.engine.exceptions import EngineDeadError

    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(EngineDeadError())
    slot.put(Out(2))  # nothing after the failure counts
    with pytest.raises(EngineUnavailable):
        await slot.get()


async def test_an_unknown_failure_is_an_engine_error() -> None:
    pytest.importorskip("vllm")  # map_error knows vLLM's exception types
    slot = OutputSlot(aggregate=True)
    slot.put(RuntimeError("boom"))
    with pytest.raises(EngineError, match="boom"):
        await slot.get()


# -- the output pump, over a fake ZMQ socket and a fake output processor ----------------------


class FakeSocket:
    """A PULL socket as the pump sees it: a notification fd, ZMQ_EVENTS, non-blocking reads.

    As in ZMQ, reading ZMQ_EVENTS consumes the fd's signal; the fd signals again on a new message.
    """

    def __init__(self) -> None:
        self._signal_r, self._signal_w = socket.socketpair()
        self._signal_r.setblocking(False)
        self.messages: collections.deque[object] = collections.deque()

    def push(self, message: object) -> None:
        self.messages.append(message)
        self._signal_w.send(b"x")

    def getsockopt(self, option: int) -> int:
        if option == zmq.FD:
            return self._signal_r.fileno()
        assert option == zmq.EVENTS
        with contextlib.suppress(BlockingIOError):
            while self._signal_r.recv(4096):
                pass
        return zmq.POLLIN if self.messages else 0

    def recv_multipart(self, copy: bool = True) -> object:
        return self.messages.popleft()


class FakeInputSocket:
    """Records each message: (engine identity, request type, payload), the payload as given
    (the fake encoder passes it through)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, Any]] = []
        self.fail_on: int | None = None  # the index of the send that fails

    def send_multipart(self, message: tuple[bytes, bytes, Any], copy: bool = True) -> None:
        if self.fail_on is not None and len(self.sent) == self.fail_on:
            self.fail_on = None
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        self.sent.append(message)


DEAD = object()


@attrs.define
class FakeResources:
    output_socket: FakeSocket
    engine_manager: object = None
    engine_dead: bool = False

    def validate_alive(self, frames: object) -> None:
        if frames is DEAD:
            raise RuntimeError("engine core reported itself dead")


class FakeEncoder:
    def encode(self, payload: object) -> list[object]:
        return [payload]


class FakeDecoder:
    def decode(self, frames: object) -> object:
        return frames


@attrs.define
class FakeClient:
    resources: FakeResources
    input_socket: FakeInputSocket = attrs.Factory(FakeInputSocket)
    core_engine: bytes = b"\x00\x00"
    encoder: FakeEncoder = attrs.Factory(FakeEncoder)
    decoder: FakeDecoder = attrs.Factory(FakeDecoder)


@attrs.define
class Step:
    """One engine step's message (vLLM's EngineCoreOutputs, as far as the pump reads it)."""

    outputs: list[str] | list[tuple[str, Out]] | list[CoreOutput]  # ids, (id, output), or counted tokens
    utility_output: object = None
    timestamp: float = 0.0
    scheduler_stats: object = None


@attrs.define
class UtilityReply:
    call_id: int
    result: object
    failure_message: str | None = None


@attrs.define
class Processed:
    reqs_to_abort: list[str]


@attrs.define
class FakeOutputProcessor:
    """Records the steps it processes; a step output named ``stop:X`` is finished by a stop
    string here, so the engine core must be told to abort ``X``. Requests are added and aborted
    as vLLM's are: by internal id, a parent's id standing for all its children."""

    steps: list[list[str]] = attrs.Factory(list)
    request_states: dict[str, types.SimpleNamespace] = attrs.Factory(dict)

    def add_request(self, request: object, prompt: object, parent: object, index: int, queue: object) -> None:
        self.request_states[request.request_id] = types.SimpleNamespace(queue=queue, parent=parent)  # type: ignore[attr-defined]

    def abort_requests(self, ids: list[str], internal: bool) -> list[str]:
        assert internal
        gone = []
        for rid in ids:
            if self.request_states.pop(rid, None) is not None:
                gone.append(rid)
            for child, state in list(self.request_states.items()):
                if state.parent is not None and state.parent.request_id == rid:
                    del self.request_states[child]
                    gone.append(child)
        return gone

    def process_outputs(self, outputs: list[str], timestamp: float, stats: object) -> Processed:
        self.steps.append(outputs)
        return Processed([o.removeprefix("stop:") for o in outputs if o.startswith("stop:")])

    def update_scheduler_stats(self, stats: object) -> None:
        pass


class RequestTypes(enum.Enum):
    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"


class FakeInputProcessor:
    """vLLM's InputProcessor as the engine uses it: a core request, then an internal id."""

    def process_inputs(self, request_id: str, prompt: object, params: object, **_: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(request_id=request_id, params=params, sampling_params=params)

    def assign_request_id(self, request: types.SimpleNamespace) -> None:
        request.request_id += "-int"


class FakeParent:
    def __init__(self, request: types.SimpleNamespace) -> None:
        self.request_id = request.request_id
        self.params = request.params

    def get_child_info(self, index: int) -> tuple[str, object]:
        return f"{index}_{self.request_id}", self.params


def make_engine() -> tuple[VllmCoreEngine, FakeSocket, FakeClient, FakeOutputProcessor]:
    sock = FakeSocket()
    client = FakeClient(FakeResources(sock))
    op = FakeOutputProcessor()
    info = ModelInfo(name="m", root="m", max_model_len=16, vocab_size=8)
    kind = types.SimpleNamespace(DELTA="delta", FINAL_ONLY="final")
    engine = VllmCoreEngine(
        client,
        FakeInputProcessor(),
        op,
        (),
        info,
        cast(HfTokenizer, None),  # never used: nothing is tokenized here
        kind,
        types.SimpleNamespace,
        FakeParent,
        RequestTypes,
    )
    return engine, sock, client, op


def sent_kinds(client: FakeClient) -> list[tuple[bytes, object]]:
    return [
        (kind, payload.request_id if kind == RequestTypes.ADD.value else payload)
        for _, kind, payload in client.input_socket.sent
    ]


N2 = EngineRequest("r", (1, 2), SamplingParams(max_tokens=4, n=2), "ab")


async def test_n2_fans_out_and_leaving_early_aborts_every_child() -> None:
    engine, _, client, op = make_engine()
    async with engine.open_request(N2):
        assert set(op.request_states) == {"0_r-int", "1_r-int"}
    assert op.request_states == {}
    assert sent_kinds(client) == [
        (RequestTypes.ADD.value, "0_r-int"),
        (RequestTypes.ADD.value, "1_r-int"),
        (RequestTypes.ABORT.value, ["0_r-int", "1_r-int"]),
    ]


async def test_a_failed_add_leaves_nothing_behind() -> None:
    pytest.importorskip("vllm")  # map_error
    engine, _, client, op = make_engine()
    client.input_socket.fail_on = 1  # the second child's ADD
    with pytest.raises(EngineError):
        async with engine.open_request(N2):
            pytest.fail("the block must not run")
    assert op.request_states == {}
    assert sent_kinds(client) == [
        (RequestTypes.ADD.value, "0_r-int"),
        (RequestTypes.ABORT.value, ["0_r-int", "1_r-int"]),
    ]


async def test_the_pump_processes_steps_and_aborts_what_stop_strings_finished() -> None:
    engine, sock, client, op = make_engine()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        await trio.testing.wait_all_tasks_blocked()
        sock.push(Step(["a", "b"]))
        sock.push(Step(["stop:b"]))
        await trio.testing.wait_all_tasks_blocked()
        assert op.steps == [["a", "b"], ["stop:b"]]
        assert client.input_socket.sent == [(b"\x00\x00", RequestTypes.ABORT.value, ["b"])]
        sock.push(Step(["c"]))  # woken again by the fd after having slept
        await trio.testing.wait_all_tasks_blocked()
        assert op.steps[-1] == ["c"]
        nursery.cancel_scope.cancel()
    assert engine.healthy


@attrs.define
class CoreOutput:
    """One request's part of an engine step, as far as the pump counts tokens."""

    request_id: str
    new_token_ids: list[int]


class CountingProcessor(FakeOutputProcessor):
    def process_outputs(self, outputs: list[Any], timestamp: float, stats: object) -> Processed:
        self.steps.append(outputs)
        return Processed([])


async def test_a_request_is_told_once_after_its_tokens_and_after_the_step_is_processed() -> None:
    engine, sock, _, _ = make_engine()
    op = engine.output_processor = CountingProcessor()
    told: list[int] = []  # the steps processed when it was told
    one = EngineRequest("r", (1, 2), SamplingParams(max_tokens=8), "ab")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        async with engine.open_request(one, ending=Ending(3, lambda: told.append(len(op.steps)))):
            sock.push(Step([CoreOutput("r-int", [5]), CoreOutput("other", [5, 6, 7])]))
            await trio.testing.wait_all_tasks_blocked()
            assert told == []  # another request's tokens do not count
            sock.push(Step([CoreOutput("r-int", [6, 7])]))  # two at once (speculative decoding)
            await trio.testing.wait_all_tasks_blocked()
            assert told == [2]
            sock.push(Step([CoreOutput("r-int", [8])]))
            await trio.testing.wait_all_tasks_blocked()
            assert told == [2]  # once
        # Left before its tokens came: never told, and nothing is kept for it.
        async with engine.open_request(one, ending=Ending(3, lambda: told.append(-1))):
            sock.push(Step([CoreOutput("r-int", [5])]))
            await trio.testing.wait_all_tasks_blocked()
        sock.push(Step([CoreOutput("r-int", [6, 7, 8])]))
        await trio.testing.wait_all_tasks_blocked()
        # n = 2: its children are counted apart, and its owner is told nothing.
        async with engine.open_request(N2, ending=Ending(1, lambda: told.append(-2))):
            sock.push(Step([CoreOutput("0_r-int", [5]), CoreOutput("1_r-int", [5])]))
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert told == [2]
    assert engine._endings == {}


async def test_a_utility_call_is_answered_through_the_pump() -> None:
    engine, sock, client, _ = make_engine()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)

        async def reply() -> None:
            await trio.testing.wait_all_tasks_blocked()
            (_, kind, (client_index, call_id, method, args)) = client.input_socket.sent[-1]
            assert (kind, client_index, method, args) == (RequestTypes.UTILITY.value, 0, "get_supported_tasks", ())
            sock.push(Step([], utility_output=UtilityReply(call_id + 1, types.SimpleNamespace(result="not ours"))))
            sock.push(Step([], utility_output=UtilityReply(call_id, types.SimpleNamespace(result=("generate",)))))

        nursery.start_soon(reply)
        assert await engine.call_utility("get_supported_tasks") == ("generate",)
        nursery.cancel_scope.cancel()


async def test_a_burst_of_steps_lets_other_tasks_run_every_max_burst_steps() -> None:
    engine, sock, _, op = make_engine()
    seen_by_other: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(3 * MAX_BURST + 1):
            sock.push(Step([f"r{i}"]))

        async def other() -> None:
            while len(op.steps) < 3 * MAX_BURST + 1:
                seen_by_other.append(len(op.steps))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(op.steps) == 3 * MAX_BURST + 1
    # The other task ran between bursts. Between two of its turns the pump may run twice (at the
    # end of one scheduler batch and the start of the next), never more.
    assert (
        seen_by_other and max(b - a for a, b in zip([0, *seen_by_other], seen_by_other, strict=False)) <= 2 * MAX_BURST
    )


async def test_a_large_step_is_processed_in_chunks_with_other_tasks_run_between() -> None:
    engine, sock, client, op = make_engine()
    outputs = [f"r{i}" for i in range(3 * OUTPUT_CHUNK)] + ["stop:x", "stop:y"]
    seen_by_other: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        await trio.testing.wait_all_tasks_blocked()
        sock.push(Step(outputs))

        async def other() -> None:
            while sum(map(len, op.steps)) < len(outputs):
                seen_by_other.append(len(op.steps))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [o for step in op.steps for o in step] == outputs  # every output, in order, once
    assert [len(step) for step in op.steps] == [OUTPUT_CHUNK] * 3 + [2]
    assert 0 < max(seen_by_other) < 4  # the other task ran while the step was still being processed
    assert client.input_socket.sent == [(b"\x00\x00", RequestTypes.ABORT.value, ["x", "y"])]


async def test_an_engine_that_reports_itself_dead_fails_open_requests_and_calls() -> None:
    pytest.importorskip("vllm")
    engine, sock, _, op = make_engine()
    slot = OutputSlot(aggregate=True)
    op.request_states["r-1"] = types.SimpleNamespace(queue=slot)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)

        async def call() -> None:
            with pytest.raises(EngineUnavailable):
                await engine.call_utility("get_supported_tasks")

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        sock.push(DEAD)
    assert not engine.healthy and engine.client.resources.engine_dead
    with pytest.raises(EngineUnavailable):
        await slot.get()
    with pytest.raises(EngineUnavailable):
        async with engine.open_request(None):  # type: ignore[arg-type]
            pass


# -- failures are reported by the pump, after the step's processing, read or not --------------


def choice(*tokens: int, finish_reason: str | None = None) -> types.SimpleNamespace:
    return types.SimpleNamespace(token_ids=list(tokens), finish_reason=finish_reason)


@attrs.define
class PuttingOutputProcessor(FakeOutputProcessor):
    """Hands each step's outputs to the requests' slots, as vLLM's output processor does: a step
    output is ``(internal id, Out)``. Records whether a handler ran while it was processing."""

    processing: bool = False

    def process_outputs(self, outputs: list, timestamp: float, stats: object) -> Processed:  # type: ignore[override]
        self.processing = True
        try:
            for rid, out in outputs:
                self.request_states[rid].queue.put(out)
        finally:
            self.processing = False
        return Processed([])


def engine_with_putting_processor() -> tuple[VllmCoreEngine, FakeSocket, PuttingOutputProcessor]:
    engine, sock, _, _ = make_engine()
    op = PuttingOutputProcessor()
    engine.output_processor = op
    return engine, sock, op


ONE = EngineRequest("r", (1, 2), SamplingParams(max_tokens=50), "ab braid:fail@3")


async def test_an_error_output_is_reported_after_processing_without_a_reader() -> None:
    engine, sock, op = engine_with_putting_processor()
    reported: list[tuple[BraidError, bool]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        async with engine.open_request(ONE, lambda err: reported.append((err, op.processing))) as outputs:
            sock.push(Step([("r-int", Out(1))]))
            sock.push(Step([("r-int", Out(2))]))
            sock.push(Step([("r-int", Out(3, finished=True))]))
            op_out = Out(4, finished=True)
            op_out.outputs = [choice(4, finish_reason="error")]
            sock.push(Step([("r-int", op_out)]))
            await trio.testing.wait_all_tasks_blocked()  # nobody reads meanwhile
            assert len(reported) == 1
            error, during_processing = reported[0]
            assert isinstance(error, EngineError) and not during_processing
            with pytest.raises(EngineError) as raised:  # the error replaces the untaken outputs
                await outputs.__anext__()
            assert raised.value is error
        nursery.cancel_scope.cancel()


async def test_a_fault_hook_fires_where_outputs_are_processed() -> None:
    engine, sock, op = engine_with_putting_processor()
    engine.fault_hooks = True
    reported: list[BraidError] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        async with engine.open_request(ONE, reported.append) as outputs:
            for step in range(3):
                out = Out(step)
                out.outputs = [choice(step, step)]  # two tokens a step: over 3 at the second
                sock.push(Step([("r-int", out)]))
                await trio.testing.wait_all_tasks_blocked()
                assert len(reported) == (0 if step == 0 else 1)
            assert "braid:fail@3" in str(reported[0])
            with pytest.raises(EngineError):
                await outputs.__anext__()
        nursery.cancel_scope.cancel()


async def test_a_dying_engine_reports_every_open_request() -> None:
    pytest.importorskip("vllm")
    engine, sock, op = engine_with_putting_processor()
    reported: list[BraidError] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        async with engine.open_request(ONE, reported.append), engine.open_request(N2, reported.append):
            sock.push(DEAD)
            await trio.testing.wait_all_tasks_blocked()
            assert len(reported) == 2 and all(isinstance(e, EngineUnavailable) for e in reported)
    assert not engine.healthy


class Ro(Out):
    """An Out that vllm_common.convert_output can read: one choice, its tokens as the delta."""

    def __init__(self, *tokens: int, finished: bool = False) -> None:
        super().__init__(*tokens, finished=finished)
        self.prompt_token_ids = [7]
        self.prompt_logprobs = None
        self.num_cached_tokens = 0
        self.kv_transfer_params = None

    @property  # type: ignore[override]
    def outputs(self) -> list[types.SimpleNamespace]:
        reason = "length" if self.finished else None
        return [
            types.SimpleNamespace(
                index=0, text="", token_ids=self.tokens, logprobs=None, finish_reason=reason, stop_reason=None
            )
        ]

    @outputs.setter
    def outputs(self, value: object) -> None:
        pass


async def test_outputs_go_to_deliver_without_waking_the_reader_and_the_last_ends_it() -> None:
    delivered: list[EngineOutput] = []

    def deliver(out: EngineOutput) -> bool:
        delivered.append(out)
        return True

    slot = OutputSlot(aggregate=True, deliver=deliver)
    woken: list[object] = []

    async def reader() -> None:
        with pytest.raises(trio.EndOfChannel):
            woken.append(await slot.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        slot.put(Ro(1))
        slot.put(Ro(2))
        await trio.testing.wait_all_tasks_blocked()
        assert slot._wakeup is not None  # still waiting: nothing was left for it
        slot.put(Ro(3, finished=True))  # the last: delivered, and the reader sees the end
    assert woken == []
    assert [o.choices[0].token_ids for o in delivered] == [(1,), (2,), (3,)]
    assert [o.finished for o in delivered] == [False, False, True]


async def test_a_refused_output_waits_and_later_ones_merge_into_it_until_taken() -> None:
    accept = [False]
    delivered: list[tuple[int, ...]] = []

    def deliver(out: EngineOutput) -> bool:
        if accept[0]:
            delivered.append(out.choices[0].token_ids)
        return accept[0]

    slot = OutputSlot(aggregate=True, deliver=deliver)
    slot.put(Ro(1))  # refused (the run's channel is full): it waits
    accept[0] = True
    slot.put(Ro(2))  # something waits: merged, not delivered ahead of it
    (got,) = await slot.get()
    assert got.tokens == [1, 2] and delivered == []
    slot.put(Ro(3, finished=True))  # nothing waits any more: delivered
    assert delivered == [(3,)]
    with pytest.raises(trio.EndOfChannel):
        await slot.get()


# -- observe: each output as vLLM's output processor puts it, before merging or delivery --------


def failed_child(index: int, *tokens: int) -> types.SimpleNamespace:
    """One choice of an n > 1 request ended with an error while the others run on (not finished)."""
    out = types.SimpleNamespace(index=index, text="", token_ids=list(tokens), logprobs=None, stop_reason=None)
    out.finish_reason = "error"
    return types.SimpleNamespace(
        finished=False, outputs=[out], prompt_token_ids=[7], prompt_logprobs=None, num_cached_tokens=0
    )


async def test_observe_sees_each_output_before_it_merges_or_is_delivered() -> None:
    events: list[tuple[str, EngineOutput]] = []
    accept = [False]

    def deliver(out: EngineOutput) -> bool:
        events.append(("deliver", out))
        return accept[0]

    slot = OutputSlot(aggregate=True, deliver=deliver, observe=lambda out: events.append(("observe", out)))
    slot.put(Ro(1))  # refused: it waits
    slot.put(Ro(2, 3))  # merged into what waits: deliver is not asked
    (got,) = await slot.get()
    assert got.tokens == [1, 2, 3]
    accept[0] = True
    slot.put(Ro(4, finished=True))  # delivered, and the reader sees the end
    with pytest.raises(trio.EndOfChannel):
        await slot.get()
    assert [kind for kind, _ in events] == ["observe", "deliver", "observe", "observe", "deliver"]
    assert [out.choices[0].token_ids for kind, out in events if kind == "observe"] == [(1,), (2, 3), (4,)]
    assert events[0][1] is events[1][1] and events[3][1] is events[4][1]  # converted once for both


async def test_failures_are_not_observed_and_a_failed_child_fails_the_slot() -> None:
    observed: list[EngineOutput] = []
    failures: list[OutputSlot] = []
    slot = OutputSlot(aggregate=True, failures=failures, observe=observed.append)
    slot.put(Ro(1))
    slot.put(failed_child(1, 2))  # converting it raises: the slot fails, the output processor goes on
    slot.put(Ro(3))
    assert [o.choices[0].token_ids for o in observed] == [(1,)] and failures == [slot]
    with pytest.raises(EngineError):
        await slot.get()

    finished_error = Out(4, finished=True)
    finished_error.outputs = [choice(4, finish_reason="error")]
    slot = OutputSlot(aggregate=True, failures=[], observe=observed.append)
    slot.put(finished_error)
    faulty = FaultySlot(True, [], None, None, observed.append, 1)
    faulty.put(Ro(5))
    faulty.put(Ro(6))  # the second token: over the fault's 1
    assert [o.choices[0].token_ids for o in observed] == [(1,), (5,)]
    for failed in (slot, faulty):
        with pytest.raises(EngineError):
            await failed.get()


async def test_open_request_observes_its_outputs_until_the_block_is_left() -> None:
    engine, sock, op = engine_with_putting_processor()
    observed: list[EngineOutput] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.pump_outputs)
        async with engine.open_request(ONE, observe=observed.append) as outputs:
            slot = op.request_states["r-int"].queue
            for step in range(1, 3):
                put: list[tuple[str, Out]] = [("r-int", Ro(step))]
                sock.push(Step(put))
            await trio.testing.wait_all_tasks_blocked()  # nobody reads meanwhile
            assert [o.choices[0].token_ids for o in observed] == [(1,), (2,)]
            first = await outputs.__anext__()
            assert first.choices[0].token_ids == (1, 2)
        slot.put(Ro(3, finished=True))  # vLLM's abort output, once the block is left
        assert len(observed) == 2
        nursery.cancel_scope.cancel()


async def test_engine_outputs_observes_each_output_it_yields_but_not_a_fault() -> None:
    # The AsyncLLM client's path: outputs observed as they reach the reader.
    batches = [[Ro(1), Ro(2, 3)], [Ro(4, 5)]]

    async def receive_batch() -> list[Ro]:
        if not batches:
            raise trio.EndOfChannel
        return batches.pop(0)

    observed: list[EngineOutput] = []
    got: list[EngineOutput] = []
    with pytest.raises(EngineError, match="braid:fail@3"):
        async for out in engine_outputs(receive_batch, 3, observed.append):
            assert observed[-1] is out  # observed before it was yielded
            got.append(out)
    assert observed == got and [o.choices[0].token_ids for o in got] == [(1,), (2, 3)]


# -- observe on the real engine (the tiny model, started in this process) -------------------------


@pytest.fixture
def vllm_environment() -> Iterator[None]:
    """open_vllm_engine sets vLLM's environment in this process's os.environ: put it back after."""
    saved = {key: os.environ.get(key) for key in {**OFFLINE_ENVIRONMENT, **CPU_ENVIRONMENT}}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_environment")
async def test_on_the_real_engine_observe_sees_every_step_while_the_reader_lags() -> None:
    from braid.engine.vllm import open_vllm_engine
    from tools.servers import engine_settings, tiny_model_dir

    observed: list[EngineOutput] = []
    lagged = trio.Event()

    def observe(out: EngineOutput) -> None:
        observed.append(out)
        if len(observed) == 8:
            lagged.set()

    prompt = "def main("
    params = SamplingParams(max_tokens=12, n=2, seed=1, ignore_eos=True)
    async with open_vllm_engine(str(tiny_model_dir()), engine_kwargs=engine_settings(0)) as engine:
        request = EngineRequest("observed", tuple(engine.tokenizer.encode(prompt)), params, prompt)
        async with engine.open_request(request, observe=observe) as outputs:
            await lagged.wait()  # the reader lags: 8 outputs were made before it reads
            read = [out async for out in outputs]
    # one output per engine step and choice (vLLM puts each child's own), each one token
    assert all(len(out.choices) == 1 and len(out.choices[0].token_ids) == 1 for out in observed)
    assert max(len(c.token_ids) for c in read[0].choices) > 1  # the reader got several steps merged
    for k in (0, 1):
        seen = [c for out in observed for c in out.choices if c.index == k]
        taken = [c for out in read for c in out.choices if c.index == k]
        assert len(seen) == 12 and seen[-1].finish_reason == "length"
        assert "".join(c.text for c in seen) == "".join(c.text for c in taken)
        assert [t for c in seen for t in c.token_ids] == [t for c in taken for t in c.token_ids]
