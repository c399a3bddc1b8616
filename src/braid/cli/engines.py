"""The engine ``braid serve`` drives: its options, its factory, and the process tuning around it.

``engine="auto"`` (the default) drives vLLM when it is installed and the scripted engine
otherwise. With vLLM and no ``model``, braid builds its default tiny model once (see
:mod:`braid.models.tiny`) and serves it.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import trio

from braid.cli.fields import field_default
from braid.engine.base import Engine
from braid.engine.scripted import ScriptedEngine
from braid.stream.admit import default_reserve

log = logging.getLogger("braid")

EngineKind = Literal["auto", "vllm", "scripted"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("auto", "vllm", "scripted")
EngineClient = Literal["trio", "asyncio"]
ENGINE_CLIENTS: tuple[EngineClient, ...] = ("trio", "asyncio")

# Engine sizing for the tiny default model on a 2-core CPU machine. The parity tier and the
# benchmarks start vLLM's own server with exactly these, so both front ends drive the same engine.
TINY_MODEL_ENGINE_ARGS: dict[str, Any] = {"max_model_len": 1024, "max_num_seqs": 64, "max_num_batched_tokens": 2048}

_VLLM_FIELDS = (
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "tensor_parallel_size",
    "distributed_executor_backend",
    "seed",
    "scheduling_policy",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "kv_events_config",
    "max_cpu_loras",
)
"""The fields that are vLLM engine arguments of the same name, passed on when set."""


def _pairs(values: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((key, value) for key, value in values)


@attrs.frozen
class EngineOptions:
    """Which engine to drive and how: ``braid serve``'s engine options, with their defaults.

    A field left at None is the engine's own choice (vLLM's, or the tiny model's sizing)."""

    engine: EngineKind = attrs.field(default="auto", validator=attrs.validators.in_(ENGINE_KINDS))
    """auto: vLLM when installed, else the scripted engine."""
    token_delay: float = field_default(ScriptedEngine, "token_delay")
    """The scripted engine's seconds per token."""
    model: str | None = None
    """A model path or hub name; None: braid's tiny local model."""
    served_model_name: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    distributed_executor_backend: str | None = None
    seed: int | None = None
    scheduling_policy: str | None = None
    """vLLM's ``--scheduling-policy``: ``priority`` makes the engine order its queue by each
    request's ``priority`` too (braid's admission orders by it either way)."""
    enable_lora: bool | None = None
    """vLLM's ``--enable-lora``: the engine can serve LoRA adapters (``lora_modules``)."""
    max_loras: int | None = None
    """vLLM's ``--max-loras``: adapters in one batch (vLLM's default: 1)."""
    max_lora_rank: int | None = None
    """vLLM's ``--max-lora-rank`` (vLLM's default: 16)."""
    kv_events_config: dict[str, Any] | None = attrs.field(default=None, hash=False)
    """vLLM's ``--kv-events-config``: the engine publishes its KV-cache events (which blocks it
    stored and evicted) on ZMQ, for a router's ``kv_aware`` policy (docs/deploy.md)."""
    max_cpu_loras: int | None = None
    """vLLM's ``--max-cpu-loras``: adapters the engine keeps loaded (vLLM's default: ``max_loras``)."""
    lora_modules: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    """vLLM's ``--lora-modules``: the adapters served, as (name, path); a request's ``model`` selects one."""
    engine_args: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_pairs)
    """Any other AsyncEngineArgs field, as (name, value); these win over the fields above."""
    engine_client: EngineClient = attrs.field(default="trio", validator=attrs.validators.in_(ENGINE_CLIENTS))
    """trio: braid drives vLLM's engine core from its own thread; asyncio: vLLM's AsyncLLM."""
    fault_hooks: bool = False
    """Tests only: a prompt holding ``braid:fail@S`` fails after S tokens."""
    # The same value as Settings.reserve (one flag fills both): admission keeps the slots, and
    # the engine's running cap must grow by as many for them to exist.
    reserve: int | None = None
    """Admission's reserve, added to vLLM's running cap; None: :func:`~braid.stream.admit.default_reserve`."""
    switch_interval: float | None = None
    """The process's GIL switch interval once the engine runs (:func:`set_switch_interval`)."""

    @property
    def default_model(self) -> bool:
        """No model given: braid's tiny model, with :data:`TINY_MODEL_ENGINE_ARGS`."""
        return self.model is None

    def vllm_kwargs(self) -> dict[str, Any]:
        """vLLM's engine arguments: the tiny model's sizing (for it), the fields that are set,
        then ``engine_args``."""
        kwargs: dict[str, Any] = dict(TINY_MODEL_ENGINE_ARGS) if self.default_model else {}
        for name in _VLLM_FIELDS:
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        kwargs.update(self.engine_args)
        return kwargs


def extra_seqs(reserve: int | None) -> Callable[[int], int]:
    """Room for admission's reserve on top of the engine's running cap (braid.stream.admit)."""
    if reserve is not None:
        return lambda _seqs: reserve
    return default_reserve


@asynccontextmanager
async def open_engine(options: EngineOptions) -> AsyncIterator[Engine]:
    """The engine ``options`` name, started; shut down on exit."""
    kind = options.engine
    if kind == "auto":
        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "scripted"
    if kind == "scripted":
        scripted = ScriptedEngine(token_delay=options.token_delay)
        if options.served_model_name or options.max_model_len:
            scripted.info = attrs.evolve(
                scripted.info,
                name=options.served_model_name or scripted.info.name,
                max_model_len=options.max_model_len or scripted.info.max_model_len,
            )
        yield scripted
        return
    from braid.engine.vllm import open_vllm_engine

    model = options.model
    if model is None:
        from braid.models import tiny

        log.info("no --model: using braid's tiny local model (built once, then cached)")
        model = str(await trio.to_thread.run_sync(lambda: tiny.build(tiny.default_dir())))
    async with open_vllm_engine(
        model,
        served_model_name=options.served_model_name or ("braid-tiny" if options.default_model else None),
        engine_kwargs=options.vllm_kwargs(),
        fault_hooks=options.fault_hooks,
        client=options.engine_client,
        extra_seqs=extra_seqs(options.reserve),
        lora_modules=options.lora_modules,
    ) as engine:
        yield engine


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (vLLM, torch, the tokenizer: millions of objects)
    out of the cyclic collector's sight. Otherwise every full collection walks them all, a
    pause of up to seconds on the thread that serves streams and handles disconnects; vLLM's
    own server does the same after its start-up."""
    gc.collect()
    gc.freeze()


def runs_asyncllm(engine: object) -> bool:
    """Whether ``engine`` runs vLLM's output handler on a second thread (the asyncio client)."""
    from braid.engine.vllm import VllmEngine  # imports no vLLM

    return isinstance(engine, VllmEngine)


def set_switch_interval(seconds: float | None, *, two_threads: bool) -> None:
    """``seconds``, or with ``two_threads`` and none given 0.001 s, else Python's own.

    With vLLM, braid's Trio thread and its asyncio thread (vLLM's output handler) both want the
    GIL. A thread that returns from a syscall (a socket send, the wake-up of the other thread)
    waits for it until the holder lets go, at most one switch interval. A client disconnect
    becomes an abort, a call from the Trio thread onto the asyncio loop with several such waits
    on the way, so with Python's default interval an abort reached the engine several intervals
    late. A shorter interval shortens each wait, and its cost in throughput was inside the
    run-to-run noise (docs/performance-log.md, round 2)."""
    if seconds is None and two_threads:
        seconds = 0.001
    if seconds is not None:
        sys.setswitchinterval(seconds)


__all__ = [
    "ENGINE_CLIENTS",
    "ENGINE_KINDS",
    "TINY_MODEL_ENGINE_ARGS",
    "EngineOptions",
    "extra_seqs",
    "freeze_startup_heap",
    "open_engine",
    "runs_asyncllm",
    "set_switch_interval",
]
