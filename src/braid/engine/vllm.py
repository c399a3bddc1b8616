"""The vLLM engine. :func:`open_vllm_engine` drives vLLM's engine core from the Trio thread by
default (:mod:`.vllm_core`); with ``client="asyncio"`` it runs ``AsyncLLM`` on an asyncio thread
that braid owns (see :mod:`.asyncio_bridge`), described here.

``open_vllm_engine(...)`` constructs the engine *on* its loop (AsyncLLM starts its output handler
on the running loop), yields a :class:`VllmEngine`, and shuts the engine down and joins the thread
on exit. Each engine request is ``AsyncLLM.generate`` with ``RequestOutputKind.DELTA``, pumped
through the bridge: leaving :meth:`VllmEngine.open_request` early closes the generator, which
makes vLLM abort the request, and the block is left only once that has run.

vLLM is imported lazily, and the CPU workarounds braid needs (``VLLM_TARGET_DEVICE=cpu``,
``TORCH_COMPILE_DISABLE=1``, offline hub) are set by
:func:`~braid.engine.vllm_common.prepare_environment` before the first import. On a GPU machine
the same code drives the ``vllm`` package. What both clients share is in :mod:`.vllm_common`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from braid.engine.asyncio_bridge import AsyncioThread, open_asyncio_thread
from braid.engine.base import (
    Deliver,
    Ending,
    Engine,
    EngineOutput,
    EngineRequest,
    FailureHandler,
    LoraAdapter,
    ModelInfo,
    Observe,
    SamplingParams,
)
from braid.engine.core_process import braid_engine_core
from braid.engine.vllm_common import (
    CPU_ENGINE_ARGS,
    LORA_OFF,
    HfTokenizer,
    check_engine_args,
    check_lora_prompt_logprobs,
    check_structured,
    check_vllm_version,
    engine_outputs,
    fail_after,
    installed_vllm_version,
    is_cpu_build,
    load_adapters,
    lora_adapters,
    lora_load_error,
    map_error,
    prepare_environment,
    vllm_lora_request,
    vllm_sampling_params,
)
from braid.engine.vllm_core import open_core_engine
from braid.engine.vllm_stats import engine_families
from braid.errors import ENGINE_DOWN, EngineUnavailable, InvalidRequest
from braid.metrics import EngineFamilies


@attrs.define(eq=False)
class VllmEngine:
    """braid's Engine over ``AsyncLLM``.

    With ``fault_hooks`` (``braid serve --fault-hooks``, for tests only), a prompt whose text holds
    ``braid:fail@S`` fails with :class:`~braid.errors.EngineError` once more than ``S`` tokens have
    arrived, as in the scripted engine; vLLM still generates for it until then, so its abort path is
    exercised.

    This client sees a failure only when its reader gets there: the bridge's pump stops taking a
    request's outputs from ``AsyncLLM`` while its reader lags (see :mod:`.asyncio_bridge`), and
    ``AsyncLLM`` hands an error over only as the next output. So it never calls ``on_failure``;
    behind a client that reads nothing a failed batch is aborted by the stall timeout. The default
    client (:mod:`.vllm_core`) reports failures as it processes them.

    For the same reason ``observe`` sees the outputs as they reach the reader, not one per engine
    step: ``AsyncLLM`` merges the deltas of a request whose outputs wait (its output collector)
    before braid sees them. Each output is observed once, in order, before it is yielded.
    """

    bridge: AsyncioThread
    llm: Any
    info: ModelInfo
    tokenizer: HfTokenizer
    _kind: Any = None  # vllm's RequestOutputKind
    _params_cls: Any = None
    fault_hooks: bool = False

    @property
    def healthy(self) -> bool:
        return not self.llm.errored

    def unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    @property
    def families(self) -> EngineFamilies | None:
        """vLLM's ``vllm:*`` families, which ``AsyncLLM``'s own Prometheus logger keeps (None when
        its stats are off), for braid's ``/metrics``."""
        return engine_families() if self.llm.logger_manager is not None else None

    def _params(self, p: SamplingParams, *, final_only: bool = False) -> Any:
        return vllm_sampling_params(self._params_cls, self._kind, p, final_only=final_only)

    def check_structured(self, params: SamplingParams) -> None:
        # The input processor is only read here (its config and tokenizer), so calling it from
        # the Trio thread while the asyncio thread uses it is safe.
        check_structured(self.llm.input_processor, self._params_cls, params)

    async def add_lora(self, adapter: LoraAdapter, *, inplace: bool = False) -> None:
        """Load a LoRA adapter into the engine (``AsyncLLM.add_lora``; see
        :class:`braid.engine.base.LoraLoader`)."""
        if self.llm.input_processor.lora_config is None:
            raise InvalidRequest(LORA_OFF)
        lora_request = vllm_lora_request(adapter, inplace=inplace)

        async def add() -> bool:
            return bool(await self.llm.add_lora(lora_request))

        try:
            await self.bridge.run(add)
        except Exception as exc:
            raise lora_load_error(adapter, map_error(exc)) from exc

    def abort_requests(self, request_ids: Sequence[str]) -> None:
        # One AsyncLLM.abort for the batch: vLLM drops them from its output processor and sends
        # the engine core one abort message. The pumps' own aborts then find nothing left to do.
        if request_ids:
            self.bridge.start_soon(self.llm.abort, list(request_ids))

    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: FailureHandler | None = None,
        deliver: Deliver | None = None,  # not used: outputs cross from the asyncio thread to the reader
        *,
        observe: Observe | None = None,  # as outputs are received, already merged by vLLM (see the class)
        ending: Ending | None = None,  # not used: the slots are handed on when the request ends
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        if self.llm.errored:
            raise EngineUnavailable(ENGINE_DOWN)
        check_lora_prompt_logprobs(self.llm.input_processor, request.params)
        try:
            params = self._params(request.params, final_only=request.final_only)
        except (ValueError, TypeError) as exc:
            raise map_error(exc) from exc
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        if request.prompt_text is not None:
            prompt["prompt"] = request.prompt_text  # type: ignore[assignment]
        llm = self.llm
        lora_request = vllm_lora_request(request.lora)

        def start() -> AsyncIterator[Any]:
            return llm.generate(
                prompt,
                params,
                request.request_id,
                lora_request=lora_request,
                priority=request.priority,
                reasoning_ended=request.reasoning_ended,
                reasoning_parser_kwargs=None
                if request.reasoning_parser_kwargs is None
                else dict(request.reasoning_parser_kwargs),
            )

        async with self.bridge.open_stream(start, map_error) as stream:
            agen = engine_outputs(stream.receive_batch, fail_after(request, self.fault_hooks), observe)
            try:
                yield agen
            finally:
                await agen.aclose()


def _freeze_vllm_env() -> None:
    """Cache vLLM's environment settings from here on, as its EngineCore process does for itself.

    Uncached, every ``vllm.envs.X`` is an ``os.getenv``, and the output processor reads several
    for every output of every request, a visible share of the asyncio thread under load.
    braid sets all of vLLM's environment before the engine starts and never changes it after.
    """
    from vllm import envs

    if hasattr(envs, "enable_envs_cache"):
        envs.enable_envs_cache()


ENGINE_CLIENTS = ("trio", "asyncio")


def vllm_version() -> str:
    """The installed vLLM's version (what ``vllm serve``'s ``GET /version`` reports)."""
    from vllm import __version__

    return str(__version__)


def _model_info_maker(model: str, names: Any) -> Callable[[Any], Awaitable[tuple[ModelInfo, HfTokenizer]]]:
    async def make(mc: Any) -> tuple[ModelInfo, HfTokenizer]:
        """ModelInfo from vLLM's model config (read after the engine's handshake, which may lower
        max_model_len), and braid's own tokenizer instance (loaded in a worker thread)."""

        def load_tokenizer() -> HfTokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=mc.trust_remote_code)
            return HfTokenizer(tok, mc.get_vocab_size(), trust_remote_code=mc.trust_remote_code)

        tokenizer = await trio.to_thread.run_sync(load_tokenizer)
        info = ModelInfo(
            name=names if isinstance(names, str) else names[0],
            root=model,
            max_model_len=mc.max_model_len,
            vocab_size=mc.get_vocab_size(),
            max_logprobs=mc.max_logprobs,
            engine_version=vllm_version(),
        )
        return info, tokenizer

    return make


@asynccontextmanager
async def open_vllm_engine(
    model: str,
    *,
    served_model_name: str | None = None,
    engine_kwargs: Mapping[str, Any] | None = None,
    fault_hooks: bool = False,
    client: str = "trio",
    extra_seqs: Callable[[int], int] | None = None,
    lora_modules: Sequence[tuple[str, str]] = (),
) -> AsyncIterator[Engine]:
    """Start vLLM's engine for ``model``; shut it down on exit.

    ``lora_modules``: the LoRA adapters to serve, as (name, path) (vLLM's ``--lora-modules``;
    the engine needs ``enable_lora``), loaded before the engine is yielded and listed in its
    ``info.adapters``.

    ``extra_seqs``: room added to the engine's running cap for admission's reserve (see
    :func:`braid.engine.vllm_core.open_core_engine`); the asyncio client ignores it.

    ``client="trio"`` (the default) drives vLLM's engine core from the Trio thread
    (:mod:`braid.engine.vllm_core`); ``"asyncio"`` runs vLLM's own ``AsyncLLM`` on an asyncio
    thread through the bridge, which depends on less of vLLM's internals. Engine arguments that
    braid would not honour are refused (``ValueError``) before anything starts.
    """
    if client not in ENGINE_CLIENTS:
        raise ValueError(f"client must be one of {ENGINE_CLIENTS}, not {client!r}")
    check_engine_args(engine_kwargs or {})
    check_vllm_version(installed_vllm_version())
    names = served_model_name or (engine_kwargs or {}).get("served_model_name") or model
    adapters = lora_adapters(lora_modules, names if isinstance(names, str) else names[0])
    if adapters and not (engine_kwargs or {}).get("enable_lora"):
        raise ValueError("--lora-modules needs --enable-lora")
    cpu = is_cpu_build()
    prepare_environment(cpu=cpu)
    kwargs: dict[str, Any] = {"model": model, "enforce_eager": cpu}
    if cpu:
        kwargs.update(CPU_ENGINE_ARGS)
    kwargs.update(engine_kwargs or {})
    if served_model_name:
        kwargs["served_model_name"] = served_model_name
    make_info = _model_info_maker(model, kwargs.get("served_model_name") or model)
    if client == "trio":
        async with open_core_engine(
            kwargs, make_info=make_info, fault_hooks=fault_hooks, extra_seqs=extra_seqs
        ) as core:
            _freeze_vllm_env()
            if adapters:
                await load_adapters(core.add_lora, adapters)
                core.info = attrs.evolve(core.info, adapters=adapters)
            yield core
        return
    async with _open_asyncllm(kwargs, make_info, fault_hooks) as engine:
        if adapters:
            await load_adapters(engine.add_lora, adapters)
            engine.info = attrs.evolve(engine.info, adapters=adapters)
        yield engine


@asynccontextmanager
async def _open_asyncllm(kwargs: dict[str, Any], make_info: Any, fault_hooks: bool) -> AsyncIterator[VllmEngine]:
    """``AsyncLLM`` on a new asyncio thread."""

    def imports() -> tuple[Any, Any, Any, Any]:
        from vllm import AsyncEngineArgs
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncEngineArgs, VSamplingParams, RequestOutputKind, AsyncLLM

    engine_args_cls, params_cls, kind_cls, llm_cls = await trio.to_thread.run_sync(imports)
    async with open_asyncio_thread() as bridge:

        async def make() -> Any:
            with braid_engine_core():  # braid.engine.core_process
                return llm_cls.from_engine_args(engine_args_cls(**kwargs))

        llm = await bridge.run(make)
        _freeze_vllm_env()
        try:
            info, tokenizer = await make_info(llm.model_config)
            info = attrs.evolve(info, max_num_seqs=llm.vllm_config.scheduler_config.max_num_seqs)
            yield VllmEngine(bridge, llm, info, tokenizer, kind_cls, params_cls, fault_hooks)
        finally:
            # On the loop thread: shutdown() cancels vLLM's output handler task, which is only
            # safe from the loop that runs it.
            async def stop() -> None:
                llm.shutdown()

            with trio.CancelScope(shield=True):
                await bridge.run(stop)
