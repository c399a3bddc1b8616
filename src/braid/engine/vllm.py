"""The vLLM engine. :func:`open_vllm_engine` drives vLLM's engine core from the Trio thread by
default (:mod:`.vllm_core`); with ``client="asyncio"`` it runs ``AsyncLLM`` on an asyncio thread
that braid owns (see :mod:`.asyncio_bridge`), described here.

``open_vllm_engine(...)`` constructs the engine *on* its loop (AsyncLLM starts its output handler
on the running loop), yields a :class:`VllmEngine`, and shuts the engine down and joins the thread
on exit. Each engine request is ``AsyncLLM.generate`` with ``RequestOutputKind.DELTA``, pumped
through the bridge: leaving :meth:`VllmEngine.open_request` early closes the generator, which
makes vLLM abort the request, and the block is left only once that has run.

vLLM is imported lazily, and the CPU workarounds braid needs (``VLLM_TARGET_DEVICE=cpu``,
``TORCH_COMPILE_DISABLE=1``, offline hub) are set by :func:`prepare_environment` before the first
import. On a GPU machine the same code drives the ``vllm`` package.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from braid.engine.asyncio_bridge import AsyncioThread, open_asyncio_thread
from braid.engine.base import ChoiceDelta, EngineOutput, EngineRequest, Logprob, ModelInfo, SamplingParams, TopLogprobs
from braid.errors import BraidError, EngineError, EngineRejected, EngineUnavailable


# What vLLM needs on a CPU machine. tools/servers.py gives vLLM's
# own server the same, so the parity tier and the benchmarks compare like with like.
OFFLINE_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    # vLLM torch.compiles its logprobs op even with enforce_eager, which stalls the first request
    # that asks for logprobs (docs/performance.md).
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # the "uni" executor is silently replaced by "mp" unless this is 0
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
CPU_ENGINE_ARGS = {"enforce_eager": True, "dtype": "float32", "distributed_executor_backend": "uni"}


def prepare_environment(*, cpu: bool) -> None:
    """Set the environment vLLM reads at import time (values already set by the user win)."""
    for key, value in {**OFFLINE_ENVIRONMENT, **(CPU_ENVIRONMENT if cpu else {})}.items():
        os.environ.setdefault(key, value)


def is_cpu_build() -> bool:
    try:
        from importlib.metadata import version

        version("vllm-cpu")
        return True
    except Exception:  # noqa: BLE001 - not installed under that name
        return False


log = logging.getLogger("braid.engine")

_PROBES = ("Hello, world!", " leading space\tand tab\n", "naïve café 東京 🙂", "def f(x):\n    return x")


class HfTokenizer:
    """braid's Tokenizer protocol over a Hugging Face tokenizer (braid's own instance).

    ``encode_many`` (braid.tokenize's worker thread) uses a private copy of the Rust backend, so
    it shares no state with the Trio thread's instance, and the backend releases the GIL while it
    encodes a batch. The copy is used only if it encodes like ``encode`` on a few probes (a
    tokenizer class may add its own steps in Python); otherwise, and for slow tokenizers, the
    worker loops ``encode`` over a deep copy of the whole tokenizer.
    """

    def __init__(self, tok: Any, vocab_size: int) -> None:
        self._tok = tok
        self.vocab_size = vocab_size
        # vLLM's own rule (its Hugging Face tokenizer wrapper): the longest vocabulary entry, as stored.
        self.max_chars_per_token = max((len(t) for t in tok.get_vocab()), default=1)
        self._worker_backend: Any = None
        self._worker_tok: Any = None
        backend = getattr(tok, "_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_batch") and hasattr(backend, "to_str"):
            try:
                copy_ = type(backend).from_str(backend.to_str())
                if all(
                    copy_.encode(p, add_special_tokens=s).ids == tok.encode(p, add_special_tokens=s)
                    for p in _PROBES
                    for s in (True, False)
                ):
                    self._worker_backend = copy_
            except Exception:  # noqa: BLE001 - an exotic backend: take the slow path below
                log.warning("the tokenizer's backend cannot be copied; large batches tokenize more slowly")
        if self._worker_backend is None:
            try:
                self._worker_tok = copy.deepcopy(tok)
            except Exception:  # noqa: BLE001
                # Encoding alone does not change a tokenizer's state; sharing it is the last resort.
                log.warning("the tokenizer cannot be copied; the tokenizing thread shares it")
                self._worker_tok = tok

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_many(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        if self._worker_backend is not None:
            return [e.ids for e in self._worker_backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        tok = self._worker_tok
        return [list(tok.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id])


def _top(d: Mapping[int, Any] | None) -> TopLogprobs | None:
    if d is None:
        return None
    return {t: Logprob(lp.logprob, lp.rank, lp.decoded_token or "") for t, lp in d.items()}


def _convert(ro: Any) -> EngineOutput:
    choices = []
    for o in ro.outputs:
        if o.finish_reason == "error":
            raise EngineError("Internal server error")
        logprobs = None if o.logprobs is None else tuple(_top(d) or {} for d in o.logprobs)
        choices.append(ChoiceDelta(o.index, o.text, tuple(o.token_ids), logprobs, o.finish_reason, o.stop_reason))
    prompt_lps = None if ro.prompt_logprobs is None else tuple(_top(d) for d in ro.prompt_logprobs)
    return EngineOutput(tuple(ro.prompt_token_ids or ()), tuple(choices), bool(ro.finished), prompt_lps, ro.num_cached_tokens)


def map_error(exc: BaseException) -> BaseException:
    """vLLM's exceptions -> braid's error types (see braid.errors)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, BraidError):
        return exc
    if isinstance(exc, EngineDeadError):
        return EngineUnavailable("The engine is not running.")
    if isinstance(exc, ValueError | TypeError | OverflowError):
        return EngineRejected(str(exc), param=getattr(exc, "parameter", None))
    return EngineError(f"The engine failed: {type(exc).__name__}: {exc}")


def vllm_sampling_params(params_cls: Any, kind: Any, p: SamplingParams, *, final_only: bool = False) -> Any:
    """braid's validated SamplingParams -> vLLM's (``kind`` is vLLM's RequestOutputKind).

    Every field goes to vLLM under its own name; braid's tuples become the lists (``logit_bias``:
    the dict) that vLLM's checks expect.
    """
    kwargs = attrs.asdict(p, recurse=False)
    for name, value in kwargs.items():
        if isinstance(value, tuple):
            kwargs[name] = list(value)
    if p.logit_bias is not None:
        kwargs["logit_bias"] = dict(p.logit_bias)
    # FINAL_ONLY for a non-streaming response, as vLLM's own server does: one output per
    # request instead of one per step, each of which crosses to the Trio thread.
    return params_cls(**kwargs, output_kind=kind.FINAL_ONLY if final_only else kind.DELTA)


_FAIL = re.compile(r"braid:fail@(\d+)")


def fail_after(request: EngineRequest, fault_hooks: bool) -> int | None:
    """The ``S`` of a ``braid:fail@S`` fault hook in the prompt text (``--fault-hooks`` only)."""
    fail = _FAIL.search(request.prompt_text or "") if fault_hooks else None
    return int(fail.group(1)) if fail else None


async def engine_outputs(
    receive_batch: Callable[[], Awaitable[Sequence[Any]]], fail_after: int | None
) -> AsyncIterator[EngineOutput]:
    """vLLM's RequestOutputs (``receive_batch`` raises ``trio.EndOfChannel`` at the end) as braid's
    EngineOutputs, failing as the fault hook says once more than ``fail_after`` tokens came."""
    produced = 0  # tokens of the longest choice so far
    while True:
        try:
            batch = await receive_batch()
        except trio.EndOfChannel:
            return
        for ro in batch:
            out = _convert(ro)
            if fail_after is not None:
                produced += max((len(c.token_ids) for c in out.choices), default=0)
                if produced > fail_after:
                    raise EngineError(f"injected failure after {fail_after} tokens (braid:fail@{fail_after})")
            yield out


@attrs.define(eq=False)
class VllmEngine:
    """braid's Engine over ``AsyncLLM``.

    With ``fault_hooks`` (``braid serve --fault-hooks``, for tests only), a prompt whose text holds
    ``braid:fail@S`` fails with :class:`~braid.errors.EngineError` once more than ``S`` tokens have
    arrived, as in the scripted engine; vLLM still generates for it until then, so its abort path is
    exercised.
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

    def _params(self, p: SamplingParams, *, final_only: bool = False) -> Any:
        return vllm_sampling_params(self._params_cls, self._kind, p, final_only=final_only)

    def abort_requests(self, request_ids: Sequence[str]) -> None:
        # One AsyncLLM.abort for the batch: vLLM drops them from its output processor and sends
        # the engine core one abort message. The pumps' own aborts then find nothing left to do.
        if request_ids:
            self.bridge.start_soon(self.llm.abort, list(request_ids))

    @asynccontextmanager
    async def open_request(self, request: EngineRequest) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        if self.llm.errored:
            raise EngineUnavailable("The engine is not running.")
        try:
            params = self._params(request.params, final_only=request.final_only)
        except (ValueError, TypeError) as exc:
            raise map_error(exc) from exc
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        if request.prompt_text is not None:
            prompt["prompt"] = request.prompt_text  # type: ignore[assignment]
        llm = self.llm

        def start() -> AsyncIterator[Any]:
            return llm.generate(prompt, params, request.request_id)

        async with self.bridge.open_stream(start, map_error) as stream:
            agen = engine_outputs(stream.receive_batch, fail_after(request, self.fault_hooks))
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


def _model_info_maker(model: str, names: Any) -> Callable[[Any], Awaitable[tuple[ModelInfo, HfTokenizer]]]:
    async def make(mc: Any) -> tuple[ModelInfo, HfTokenizer]:
        """ModelInfo from vLLM's model config (read after the engine's handshake, which may lower
        max_model_len), and braid's own tokenizer instance (loaded in a worker thread)."""

        def load_tokenizer() -> HfTokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=mc.trust_remote_code)
            return HfTokenizer(tok, mc.get_vocab_size())

        tokenizer = await trio.to_thread.run_sync(load_tokenizer)
        info = ModelInfo(
            name=names if isinstance(names, str) else names[0],
            root=model,
            max_model_len=mc.max_model_len,
            vocab_size=mc.get_vocab_size(),
            max_logprobs=mc.max_logprobs,
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
) -> AsyncIterator[Any]:
    """Start vLLM's engine for ``model``; shut it down on exit.

    ``client="trio"`` (the default) drives vLLM's engine core from the Trio thread
    (:mod:`braid.engine.vllm_core`); ``"asyncio"`` runs vLLM's own ``AsyncLLM`` on an asyncio
    thread through the bridge, which depends on less of vLLM's internals.
    """
    if client not in ENGINE_CLIENTS:
        raise ValueError(f"client must be one of {ENGINE_CLIENTS}, not {client!r}")
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
        from braid.engine.vllm_core import open_core_engine

        async with open_core_engine(kwargs, make_info=make_info, fault_hooks=fault_hooks) as core:
            _freeze_vllm_env()
            yield core
        return
    async with _open_asyncllm(kwargs, make_info, fault_hooks) as engine:
        yield engine


@asynccontextmanager
async def _open_asyncllm(kwargs: dict[str, Any], make_info: Any, fault_hooks: bool) -> AsyncIterator[VllmEngine]:
    """``AsyncLLM`` on a new asyncio thread."""

    def imports() -> tuple[Any, Any, Any, Any]:
        from vllm import AsyncEngineArgs, SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncEngineArgs, VSamplingParams, RequestOutputKind, AsyncLLM

    engine_args_cls, params_cls, kind_cls, llm_cls = await trio.to_thread.run_sync(imports)
    async with open_asyncio_thread() as bridge:

        async def make() -> Any:
            return llm_cls.from_engine_args(engine_args_cls(**kwargs))

        llm = await bridge.run(make)
        _freeze_vllm_env()
        try:
            info, tokenizer = await make_info(llm.model_config)
            yield VllmEngine(bridge, llm, info, tokenizer, kind_cls, params_cls, fault_hooks)
        finally:
            # On the loop thread: shutdown() cancels vLLM's output handler task, which is only
            # safe from the loop that runs it.
            async def stop() -> None:
                llm.shutdown()

            with trio.CancelScope(shield=True):
                await bridge.run(stop)
