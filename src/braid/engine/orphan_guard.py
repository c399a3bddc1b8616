"""vLLM's engine-core process ends when braid's process dies, even by SIGKILL.

vLLM starts its engine core as a child process, and nothing in that child watches its parent:
when braid is killed (``kill -9``, the OOM killer, a container runtime's last resort), the engine
core lives on with its memory (on a GPU, its device) until someone kills it by hand, and a braid
started again beside it may not fit.

:func:`guarded_engine_start` makes the engine-core processes that vLLM starts inside its block
run :func:`run_engine_core` instead of vLLM's entry point. That is vLLM's entry point plus one
daemon thread, which checks every :data:`CHECK_EVERY` seconds whether the process is still the
child of the braid that started it. Once it is not (its parent died and it was handed to init or
a subreaper), the thread sends the process SIGTERM, on which vLLM's engine core shuts down as it
does when braid stops it (its executor's workers with it), and SIGKILL :data:`GRACE` seconds
later if it is still there.

Why a thread that looks at the parent's pid, not ``PR_SET_PDEATHSIG``: Linux sends that signal
when the *thread* that started the child ends, and braid starts its engine from a worker thread
that Trio may retire while the engine runs.

This module is imported by the engine-core process itself (the target of a spawned process is
found by its module and name). It imports nothing of braid's itself, and vLLM only when it
runs; importing it still loads its package, ``braid.engine`` and the ``braid.engine.base`` that
package exports, which need neither vLLM nor the server.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHECK_EVERY = 1.0
"""Seconds between two looks at the parent's pid."""
GRACE = 10.0
"""Seconds from SIGTERM to SIGKILL, for an engine core that does not end on SIGTERM."""


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(CHECK_EVERY)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE)
    os.kill(os.getpid(), signal.SIGKILL)


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """vLLM's ``EngineCoreProc.run_engine_core``, in a process that ends when its parent dies."""
    from vllm.v1.engine.core import EngineCoreProc

    threading.Thread(target=_watch, args=(os.getppid(),), name="braid-orphan-guard", daemon=True).start()
    EngineCoreProc.run_engine_core(*args, **kwargs)


@contextmanager
def guarded_engine_start() -> Iterator[None]:
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


__all__ = ["CHECK_EVERY", "GRACE", "guarded_engine_start", "run_engine_core"]
