"""vLLM's engine core, driven from the Trio thread: no asyncio loop, no second Python thread.

``AsyncLLM`` is three parts on one asyncio loop: the input processor (vLLM's own validation, and
the ``EngineCoreRequest``), the output processor (detokenising, stop strings, logprobs, merging
deltas for a reader that lags) and a ZMQ client of the engine-core process. braid keeps the first
two as vLLM wrote them and replaces only the loop. The client's sockets are plain pyzmq sockets;
Trio waits on the output socket's notification fd. So one engine step's outputs are decoded,
detokenised and handed to the request tasks on the thread that serves HTTP, with no wake-up
crossing between threads and no second thread competing for the GIL (what
:mod:`.asyncio_bridge` costs at every token).

Ownership and cancellation (:func:`open_core_engine`):

* The engine-core process is started in a worker thread (vLLM's handshake blocks), and the
  engine's nursery owns two tasks: the **output pump** and the **process watcher**. Leaving the
  ``async with`` cancels both, then shuts the process down and closes the sockets.
* If the engine dies (the process exits, or it reports itself dead), every open request fails
  with :class:`~braid.errors.EngineUnavailable`, ``healthy`` turns false and new requests are
  refused; the server itself keeps running, so it can say 503.
* A request's failure (an output that finished with an error, the engine dying, a fault hook) is
  reported to its ``on_failure`` handler by the pump right after the step's processing returns,
  whether or not its reader is there to take it (:class:`OutputSlot`): a run aborts its batch
  then, not when a reader blocked behind a stalled client would get to it.
* Leaving an :meth:`VllmCoreEngine.open_request` block before the last output aborts the
  request then and there: vLLM's output processor drops it and the abort message is on the
  socket before ``__aexit__`` returns (nothing is awaited, so nothing needs shielding).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from copy import copy
from typing import Any

import attrs
import trio

from braid.engine.base import (
    Deliver,
    Ending,
    EngineOutput,
    EngineRequest,
    FailureHandler,
    LoraAdapter,
    ModelInfo,
    Observe,
    SamplingParams,
)
from braid.engine.core_process import braid_engine_core
from braid.engine.faults import injected_failure
from braid.engine.vllm_common import (
    LORA_OFF,
    HfTokenizer,
    check_lora_prompt_logprobs,
    check_structured,
    convert_output,
    engine_outputs,
    fail_after,
    lora_load_error,
    map_error,
    vllm_lora_request,
    vllm_sampling_params,
)
from braid.engine.vllm_stats import VllmStats, engine_families
from braid.errors import ENGINE_DOWN, BraidError, EngineError, EngineUnavailable, InvalidRequest
from braid.metrics import EngineFamilies

log = logging.getLogger("braid.engine")

MAX_BURST = 8  # engine steps the output pump processes before it lets other tasks run
OUTPUT_CHUNK = 128  # outputs of one step processed between checkpoints (vLLM's own chunk size)


class OutputSlot:
    """One request's hand-off from the output pump to its reader (vLLM's ``RequestOutputCollector``
    for Trio; vLLM's output processor calls :meth:`put`, on the Trio thread).

    With a ``deliver`` function (the run's, see :mod:`braid.engine.base`), an output that finds
    nothing waiting is converted and handed to it right here, inside vLLM's output processing:
    the reader is not woken, unless it was the last output (then it wakes to see the end). When
    ``deliver`` refuses, the output waits for the reader as below.

    With an ``observe`` function, every output that is not a failure is converted here once and
    handed to it, before it is merged into what waits or delivered (``deliver`` then gets the
    same converted output). vLLM puts one output per engine step (per child, for ``n > 1``), so
    ``observe`` sees each step's delta however far the reader lags.

    While the reader lags, streamed deltas merge into one output (``RequestOutput.add``), so what
    waits is at most one output per request however slow the reader is. A failure (an exception
    put here when the engine died, an output that finished with an error, or one choice's error
    found when an output is converted here) replaces what waits
    and ends the slot: the next :meth:`get` raises it, and the slot is queued on ``failures`` for
    the pump to report (:meth:`report`) once the step's processing has returned, because the
    handler aborts requests and vLLM's output processor must not be re-entered.
    """

    __slots__ = (
        "_aggregate",
        "_delivered_last",
        "_ended",
        "_error",
        "_failures",
        "_output",
        "_wakeup",
        "deliver",
        "observe",
        "on_failure",
    )

    def __init__(
        self,
        aggregate: bool,
        failures: list[OutputSlot] | None = None,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,
        observe: Observe | None = None,
    ) -> None:
        self._aggregate = aggregate
        self._output: Any = None
        self._error: BraidError | None = None
        self._wakeup: trio.Event | None = None
        self._ended = False
        self._delivered_last = False  # the finished output went to ``deliver``: the reader sees the end
        self._failures = failures
        self.on_failure = on_failure
        self.deliver = deliver
        self.observe = observe

    def put(self, output: Any) -> None:
        if self._error is not None:
            return  # nothing after a failure counts
        if isinstance(output, BaseException):
            self.fail(map_error(output))
            return
        if output.finished and any(o.finish_reason == "error" for o in output.outputs):
            self.fail(EngineError("Internal server error"))
            return
        held = self._output
        deliver = self.deliver if held is None else None
        observe = self.observe
        if observe is not None or deliver is not None:
            try:
                converted = convert_output(output)
            except EngineError as exc:
                # One choice's error while the others run on (n > 1): the request has failed.
                self.fail(exc)
                return
            if observe is not None:
                observe(converted)
            if deliver is not None and deliver(converted):
                if output.finished:
                    self._delivered_last = True
                    self._wake()
                return
        if held is None:
            self._output = output
        else:
            held.add(output, aggregate=self._aggregate)
        self._wake()

    def fail(self, error: BraidError) -> None:
        """End the slot with ``error`` (its reader raises it next) and queue it to be reported."""
        if self._error is not None:
            return
        self._error = error
        self._output = None
        if self._failures is not None:
            self._failures.append(self)
        self._wake()

    def report(self) -> None:
        """Call the request's failure handler (the pump, after the step's processing)."""
        handler, self.on_failure = self.on_failure, None
        if handler is not None and self._error is not None:
            handler(self._error)

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def get(self) -> list[Any]:
        """The output that waits, as a one-item list (waits for one if there is none); after
        the finished output, ``trio.EndOfChannel``; after a failure, the failure.

        A cancelled reader gets ``Cancelled`` even when an output is ready; the output stays.
        """
        if self._ended:
            raise trio.EndOfChannel
        while self._output is None and self._error is None and not self._delivered_last:
            self._wakeup = wakeup = trio.Event()
            await wakeup.wait()
        # A reader that is cancelled gets Cancelled, not what is ready: when a run fails, braid
        # aborts the batch (vLLM then puts an "abort" output in every slot) and cancels the
        # readers in the same step, and those are aborted requests, not finished ones.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._error is not None:
            self._ended = True
            raise self._error
        if self._output is None:  # the last output was delivered
            self._ended = True
            raise trio.EndOfChannel
        out, self._output = self._output, None
        self._ended = out.finished
        return [out]


class FaultySlot(OutputSlot):
    """An :class:`OutputSlot` whose request fails once more than ``fail_after`` tokens were
    generated (``braid:fail@S`` with ``--fault-hooks``): the fault fires where outputs are
    processed, as a real engine error would, not where a reader takes them."""

    __slots__ = ("_fail_after", "_produced")

    def __init__(
        self,
        aggregate: bool,
        failures: list[OutputSlot],
        on_failure: FailureHandler | None,
        deliver: Deliver | None,
        observe: Observe | None,
        fail_after: int,
    ) -> None:
        super().__init__(aggregate, failures, on_failure, deliver, observe)
        self._fail_after = fail_after
        self._produced = 0  # tokens of the longest choice so far

    def put(self, output: Any) -> None:
        if not isinstance(output, BaseException) and self._error is None:
            self._produced += max((len(o.token_ids) for o in output.outputs), default=0)
            if self._produced > self._fail_after:
                self.fail(injected_failure(self._fail_after))
                return
        super().put(output)


def _core_client_class() -> type:
    """vLLM's ``MPClient`` in its synchronous form, minus its liveness thread.

    The base class starts the engine-core process, binds the sockets and does the handshake; its
    subclasses only add how outputs are read (a thread, or an asyncio task). braid reads them
    from Trio, and watches the process from Trio too: vLLM's monitor thread would close the
    sockets from under the pump when the engine dies.
    """
    from vllm.v1.engine.core_client import MPClient

    class TrioCoreClient(MPClient):  # type: ignore[misc, valid-type]
        def start_engine_core_monitor(self) -> None:
            pass

    return TrioCoreClient


@attrs.define(eq=False)
class VllmCoreEngine:
    """braid's Engine over vLLM's input processor, output processor and engine-core process.

    ``fault_hooks`` as for :class:`~braid.engine.vllm.VllmEngine`.
    """

    client: Any  # TrioCoreClient
    input_processor: Any
    output_processor: Any
    supported_tasks: tuple[str, ...]
    info: ModelInfo
    tokenizer: HfTokenizer
    _kind: Any  # vllm's RequestOutputKind
    _params_cls: Any
    _parent_cls: Any  # vllm's ParentRequest (n > 1)
    _request_types: Any  # vllm's EngineCoreRequestType
    fault_hooks: bool = False
    stats: VllmStats | None = None
    """vLLM's Prometheus stat logger, fed by the output pump (:mod:`.vllm_stats`)."""
    _dead: BaseException | None = None
    _utility: dict[int, tuple[trio.Event, list[Any]]] = attrs.field(factory=dict)
    _failures: list[OutputSlot] = attrs.field(factory=list)  # failed slots not yet reported
    _endings: dict[str, list[Any]] = attrs.field(factory=dict)
    """Requests whose owner waits to hear that their end is near: internal id -> [tokens still
    to come before it is told, its call] (:class:`~braid.engine.base.Ending`)."""

    @property
    def healthy(self) -> bool:
        return self._dead is None

    def unfinished_requests(self) -> int:
        return int(self.output_processor.get_num_unfinished_requests())

    @property
    def families(self) -> EngineFamilies | None:
        """vLLM's ``vllm:*`` families, for braid's ``/metrics`` (None when stats are off)."""
        return engine_families() if self.stats is not None else None

    # -- to the engine core ------------------------------------------------------------------

    def _send(self, kind: Any, payload: Any) -> None:
        client = self.client
        # ZMQ queues the message (no high-water mark on these sockets), so this never blocks.
        client.input_socket.send_multipart(
            (client.core_engine, kind.value, *client.encoder.encode(payload)), copy=False
        )

    def _abort_in_core(self, ids: Sequence[str]) -> None:
        if ids and self._dead is None:
            self._send(self._request_types.ABORT, list(ids))

    def abort_requests(self, request_ids: Sequence[str]) -> None:
        # External ids: vLLM maps each to its internal ids (all children of an n > 1 request).
        if request_ids:
            self._abort_in_core(self.output_processor.abort_requests(list(request_ids), internal=False))

    async def call_utility(self, method: str, *args: Any) -> Any:
        """Call an engine-core utility method (``get_supported_tasks``, ...) and wait for its result."""
        if self._dead is not None:
            raise map_error(self._dead)
        call_id = uuid.uuid1().int >> 64
        done, box = self._utility[call_id] = (trio.Event(), [])
        self._send(self._request_types.UTILITY, (0, call_id, method, args))
        try:
            await done.wait()
        finally:
            self._utility.pop(call_id, None)
        result = box[0]
        if isinstance(result, BaseException):
            raise map_error(result) from result
        return result

    async def add_lora(self, adapter: LoraAdapter, *, inplace: bool = False) -> None:
        """Load a LoRA adapter into the engine core (its ``add_lora`` utility; see
        :class:`braid.engine.base.LoraLoader`)."""
        if self.input_processor.lora_config is None:
            raise InvalidRequest(LORA_OFF)
        try:
            await self.call_utility("add_lora", vllm_lora_request(adapter, inplace=inplace))
        except BraidError as exc:
            raise lora_load_error(adapter, exc) from exc

    # -- requests ------------------------------------------------------------------------------

    def check_structured(self, params: SamplingParams) -> None:
        check_structured(self.input_processor, self._params_cls, params)

    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,
        *,
        observe: Observe | None = None,
        ending: Ending | None = None,
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        if self._dead is not None:
            raise EngineUnavailable(ENGINE_DOWN)
        try:
            check_lora_prompt_logprobs(self.input_processor, request.params)
            params = vllm_sampling_params(self._params_cls, self._kind, request.params, final_only=request.final_only)
            prompt: dict[str, Any] = {"prompt_token_ids": list(request.prompt_token_ids)}
            if request.prompt_text is not None:
                prompt["prompt"] = request.prompt_text
            core_request = self.input_processor.process_inputs(
                request.request_id,
                prompt,
                params,
                supported_tasks=self.supported_tasks,
                arrival_time=time.time(),
                lora_request=vllm_lora_request(request.lora),
                priority=request.priority,
            )
            if request.reasoning_ended is not None:
                core_request.reasoning_ended = request.reasoning_ended
            if request.reasoning_parser_kwargs is not None:
                core_request.reasoning_parser_kwargs = dict(request.reasoning_parser_kwargs)
            self.input_processor.assign_request_id(core_request)
        except Exception as exc:
            raise map_error(exc) from exc
        internal_id = core_request.request_id
        fault = fail_after(request, self.fault_hooks)
        slot = (
            OutputSlot(not request.final_only, self._failures, on_failure, deliver, observe)
            if fault is None
            else FaultySlot(not request.final_only, self._failures, on_failure, deliver, observe, fault)
        )
        try:
            self._add(core_request, request.prompt_text, slot)
        except Exception as exc:
            # Whatever part of it got in (n > 1: some children) must not stay behind.
            with contextlib.suppress(Exception):
                self._forget(internal_id)
            raise map_error(exc) from exc
        if ending is not None and request.params.n == 1:
            # (n > 1: its children are counted apart; their owner is told when they have ended.)
            self._endings[internal_id] = [ending.after, ending.call]
        agen = engine_outputs(slot.get, None)
        try:
            yield agen
        finally:
            # The block is left: the abort's own final output must not reach the run.
            slot.deliver = slot.observe = None
            self._endings.pop(internal_id, None)
            await agen.aclose()
            # A finished request is gone from the output processor already; this finds nothing.
            self._forget(internal_id)

    def _forget(self, internal_id: str) -> None:
        """Drop a request (all its children) from the output processor and the engine core."""
        self._abort_in_core(self.output_processor.abort_requests([internal_id], internal=True))

    def _add(self, core_request: Any, prompt_text: str | None, slot: OutputSlot) -> None:
        op = self.output_processor
        add = self._request_types.ADD
        core_request.client_index = 0
        n = core_request.params.n
        if n == 1:
            op.add_request(core_request, prompt_text, None, 0, slot)
            self._send(add, core_request)
            return
        # n > 1: one engine request per choice, joined again by vLLM's ParentRequest, as AsyncLLM does.
        parent = self._parent_cls(core_request)
        children = []
        for index in range(n):
            child_id, child_params = parent.get_child_info(index)
            child = core_request if index == n - 1 else copy(core_request)
            child.request_id = child_id
            child.sampling_params = child_params
            children.append(child)
            op.add_request(child, prompt_text, parent, index, slot)
        for child in children:
            self._send(add, child)

    # -- from the engine core ------------------------------------------------------------------

    async def pump_outputs(self) -> None:
        """Read the engine core's outputs for as long as the engine lives (cancel to stop).

        Everything that is ready is processed before the next wait (up to ``MAX_BURST`` steps
        between checkpoints), so the request tasks wake once per burst, with the deltas of
        several engine steps merged if they came together.
        """
        import zmq

        client = self.client
        sock = client.resources.output_socket
        fd = sock.getsockopt(zmq.FD)
        decode = client.decoder.decode
        validate_alive = client.resources.validate_alive
        op = self.output_processor
        stats = self.stats
        try:
            while True:
                # The fd only says "look again": ZMQ_EVENTS is the truth, and reading it also
                # re-arms the fd, so check it until it says no message waits, then sleep.
                burst = 0
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    if burst == MAX_BURST:
                        # An engine that produces faster than this thread processes must not
                        # starve the readers and the HTTP side: let them run, then go on.
                        burst = 0
                        await trio.lowlevel.checkpoint()
                        continue
                    burst += 1
                    frames = sock.recv_multipart(copy=False)
                    validate_alive(frames)
                    outputs = decode(frames)
                    if outputs.utility_output is not None:
                        self._utility_result(outputs.utility_output)
                        continue
                    step = outputs.outputs
                    # As AsyncLLM does: one IterationStats per message that has outputs.
                    iteration = stats.iteration() if stats is not None and step else None
                    for start in range(0, len(step), OUTPUT_CHUNK):
                        if start:
                            # A step of a 1024-prompt batch: let the streams run between chunks.
                            await trio.lowlevel.checkpoint()
                        chunk = step[start : start + OUTPUT_CHUNK]
                        processed = op.process_outputs(chunk, outputs.timestamp, iteration)
                        # Requests the output processor finished itself (stop strings).
                        self._abort_in_core(processed.reqs_to_abort)
                        if self._failures:
                            # Only now, outside the output processor: the handlers abort.
                            self._report_failures()
                        if self._endings:
                            self._count_endings(chunk)
                    op.update_scheduler_stats(outputs.scheduler_stats)
                    if stats is not None:
                        stats.record(outputs.scheduler_stats, iteration)
                await trio.lowlevel.wait_readable(fd)
        except Exception as exc:
            log.exception("the engine's output pump failed; the engine is now unavailable")
            # The engine core may still be alive (a decoding or processing error): without its
            # reader, it must not go on generating every open request to the end.
            with contextlib.suppress(Exception):
                self._abort_in_core(list(op.request_states))
            self.mark_dead(exc)

    def _count_endings(self, chunk: Sequence[Any]) -> None:
        """Count one step's new tokens against the requests that wait to hear their end is near,
        and tell those that have reached it (after the step's processing: the calls grant slots)."""
        endings = self._endings
        due = []
        for core_output in chunk:
            watch = endings.get(core_output.request_id)
            if watch is None:
                continue
            watch[0] -= len(core_output.new_token_ids)
            if watch[0] <= 0:
                del endings[core_output.request_id]
                due.append(watch[1])
        for call in due:
            try:
                call()
            except Exception:  # one owner's bug must not stop the pump for every request
                log.exception("a request's owner failed when told its end was near")

    def _utility_result(self, output: Any) -> None:
        waiter = self._utility.get(output.call_id)
        if waiter is None:
            return  # its caller was cancelled
        done, box = waiter
        if output.failure_message is not None:
            box.append(RuntimeError(output.failure_message))
        else:
            box.append(output.result.result if output.result is not None else None)
        done.set()

    async def watch_processes(self) -> None:
        """Wait for any engine-core process to exit; that is the engine dying (cancel to stop)."""
        manager = self.client.resources.engine_manager
        processes = list(getattr(manager, "processes", ()) or ())
        if not processes:
            await trio.sleep_forever()
        async with trio.open_nursery() as nursery:
            for proc in processes:
                nursery.start_soon(self._wait_exit, proc, nursery.cancel_scope)

    async def _wait_exit(self, proc: Any, scope: trio.CancelScope) -> None:
        await trio.lowlevel.wait_readable(proc.sentinel)
        log.error(
            "the engine-core process %s exited (code %s); the engine is now unavailable", proc.name, proc.exitcode
        )
        self.mark_dead(RuntimeError(f"engine-core process {proc.name} exited with code {proc.exitcode}"))
        scope.cancel()

    def _report_failures(self) -> None:
        failed = list(self._failures)
        self._failures.clear()
        for slot in failed:
            slot.report()

    def mark_dead(self, cause: BaseException) -> None:
        """The engine is gone: fail every open request and every utility call, refuse new ones."""
        if self._dead is not None:
            return
        from vllm.v1.engine.exceptions import EngineDeadError

        dead = EngineDeadError()
        dead.__cause__ = cause
        self._dead = dead
        self.client.resources.engine_dead = True
        for state in list(self.output_processor.request_states.values()):
            if state.queue is not None:
                state.queue.put(dead)
        for done, box in self._utility.values():
            box.append(dead)
            done.set()
        self._report_failures()


@asynccontextmanager
async def open_core_engine(
    engine_args: dict[str, Any],
    *,
    make_info: Any,
    fault_hooks: bool = False,
    extra_seqs: Callable[[int], int] | None = None,
) -> AsyncIterator[VllmCoreEngine]:
    """Start vLLM's engine core for ``engine_args`` (``AsyncEngineArgs`` keywords) and drive it
    from this Trio thread; stop it on exit. ``make_info(model_config)`` gives ModelInfo and the
    tokenizer (awaitable).

    ``extra_seqs(max_num_seqs)``: how many sequences to add to the scheduler's running cap as
    configured (the operator's ``max_num_seqs`` or vLLM's default for the platform), for the
    admission reserve (``braid.stream.admit``); ModelInfo reports both."""

    def start() -> tuple[Any, ...]:
        from vllm import AsyncEngineArgs
        from vllm import SamplingParams as VSamplingParams
        from vllm.renderers import renderer_from_config
        from vllm.sampling_params import RequestOutputKind
        from vllm.transformers_utils.config import maybe_register_config_serialize_by_value
        from vllm.v1.engine import EngineCoreRequestType
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.engine.output_processor import OutputProcessor
        from vllm.v1.engine.parallel_sampling import ParentRequest
        from vllm.v1.executor import Executor

        maybe_register_config_serialize_by_value()
        config = AsyncEngineArgs(**engine_args).create_engine_config()
        seqs = config.scheduler_config.max_num_seqs
        extra = extra_seqs(seqs) if extra_seqs is not None else 0
        if extra:
            # Built again rather than patched: vLLM derives other settings from the cap.
            config = AsyncEngineArgs(**{**engine_args, "max_num_seqs": seqs + extra}).create_engine_config()
        renderer = renderer_from_config(config)
        inputs = InputProcessor(config, renderer)
        # Statistics on, as AsyncLLM has them unless disable_log_stats: the engine core computes
        # the scheduler's, the output processor the requests', and vLLM's Prometheus logger
        # (VllmStats) turns them into the vllm:* families of braid's /metrics.
        log_stats = not engine_args.get("disable_log_stats", False)
        outputs = OutputProcessor(
            renderer.tokenizer, log_stats=log_stats, stream_interval=config.scheduler_config.stream_interval
        )
        with braid_engine_core():  # braid.engine.core_process
            client = _core_client_class()(
                asyncio_mode=False,
                vllm_config=config,
                executor_class=Executor.get_class(config),
                log_stats=log_stats,
                renderer=renderer,
            )
        stats = VllmStats(config) if log_stats else None
        return (
            extra,
            stats,
            config,
            renderer,
            inputs,
            outputs,
            client,
            VSamplingParams,
            RequestOutputKind,
            ParentRequest,
            EngineCoreRequestType,
        )

    (
        extra,
        stats,
        config,
        renderer,
        inputs,
        outputs,
        client,
        params_cls,
        kind,
        parent_cls,
        request_types,
    ) = await trio.to_thread.run_sync(start)
    try:
        info, tokenizer = await make_info(config.model_config)
        info = attrs.evolve(info, max_num_seqs=config.scheduler_config.max_num_seqs, reserved_seqs=extra)
        engine = VllmCoreEngine(
            client,
            inputs,
            outputs,
            (),
            info,
            tokenizer,
            kind,
            params_cls,
            parent_cls,
            request_types,
            fault_hooks,
            stats,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.pump_outputs)
            nursery.start_soon(engine.watch_processes)
            engine.supported_tasks = tuple(await engine.call_utility("get_supported_tasks"))
            try:
                yield engine
            finally:
                nursery.cancel_scope.cancel()
                # Closed from here on: no new requests, no sends on sockets about to be closed,
                # and a reader still waiting gets an error instead of waiting for ever.
                engine.mark_dead(RuntimeError("the engine was shut down"))
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(client.shutdown)
            finally:
                await trio.to_thread.run_sync(renderer.shutdown)
