"""The engine-core process braid starts: vLLM's entry point, with what braid adds to it.

vLLM runs its engine core in a child process whose target is ``EngineCoreProc.run_engine_core``.
Inside :func:`braid_engine_core`'s block (both engine clients start vLLM's engine there), the
processes vLLM starts run :func:`run_engine_core` instead, which does two things before it hands
over to vLLM's entry point:

* **It ends with braid** (:func:`braid.engine.orphan_guard.watch_parent`): a braid killed with
  SIGKILL does not leave its engine core running.
* **It hands the GIL between the engine's threads every** :data:`SWITCH_INTERVAL` **seconds**, not
  Python's default 5 ms. The engine core runs its scheduler and model on its main thread and
  reads requests and writes outputs on two threads of its own (msgpack, ZMQ), all under one GIL.
  While the main thread waits for an I/O thread to hand the GIL back, the model waits, and on a
  CPU its OpenMP worker spins; a wave of adds made it wait at every step. The interval was
  chosen by measurement (docs/performance-log.md, "The engine core's GIL hand-over"). The setting
  is the engine-core process's own: braid's process keeps the default (a shorter one there
  measured no gain).

This module is imported by the engine-core process itself (the target of a spawned process is
found by its module and name). It imports nothing of braid's but :mod:`braid.engine.orphan_guard`,
and vLLM only when it runs; importing it still loads its package, ``braid.engine`` and the
``braid.engine.base`` that package exports, which need neither vLLM nor the server.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from braid.engine.orphan_guard import watch_parent

SWITCH_INTERVAL = 0.0002
"""Seconds a thread of the engine-core process holds the GIL while another waits for it
(``sys.setswitchinterval``; Python's default is 0.005)."""


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """vLLM's ``EngineCoreProc.run_engine_core``, in a process that ends when its parent dies and
    hands the GIL on every :data:`SWITCH_INTERVAL` seconds."""
    from vllm.v1.engine.core import EngineCoreProc

    watch_parent()
    sys.setswitchinterval(SWITCH_INTERVAL)
    EngineCoreProc.run_engine_core(*args, **kwargs)


@contextmanager
def braid_engine_core() -> Iterator[None]:
    """Within the block, vLLM starts its engine-core processes on :func:`run_engine_core`.

    (The block swaps ``EngineCoreProc.run_engine_core`` for this process only, and puts it back
    on exit: vLLM reads it when it creates the process, and a spawned child gets the original.)"""
    from vllm.v1.engine.core import EngineCoreProc

    original = EngineCoreProc.__dict__["run_engine_core"]
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
    try:
        yield
    finally:
        EngineCoreProc.run_engine_core = original


__all__ = ["SWITCH_INTERVAL", "braid_engine_core", "run_engine_core"]
