"""vLLM's engine-core process ends when braid's process dies, even by SIGKILL.

vLLM starts its engine core as a child process, and nothing in that child watches its parent:
when braid is killed (``kill -9``, the OOM killer, a container runtime's last resort), the engine
core lives on with its memory (on a GPU, its device) until someone kills it by hand, and a braid
started again beside it may not fit.

:func:`watch_parent`, called in the engine-core process by braid's entry point for it
(:mod:`braid.engine.core_process`), starts one daemon thread, which checks every
:data:`CHECK_EVERY` seconds whether the process is still the child of the braid that started it.
Once it is not (its parent died and it was handed to init or a subreaper), the thread sends the
process SIGTERM, on which vLLM's engine core shuts down as it does when braid stops it (its
executor's workers with it), and SIGKILL :data:`GRACE` seconds later if it is still there.

Why a thread that looks at the parent's pid, not ``PR_SET_PDEATHSIG``: Linux sends that signal
when the *thread* that started the child ends, and braid starts its engine from a worker thread
that Trio may retire while the engine runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time

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


def watch_parent() -> None:
    """In the engine-core process, before vLLM's entry point: end this process once the process
    that started it is gone (see the module)."""
    threading.Thread(target=_watch, args=(os.getppid(),), name="braid-orphan-guard", daemon=True).start()


__all__ = ["CHECK_EVERY", "GRACE", "watch_parent"]
