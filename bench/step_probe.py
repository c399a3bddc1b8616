"""A measuring probe for vLLM's scheduler, loaded into a process by ``sitecustomize`` (bench only).

:func:`install` wraps ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` as soon as that module is
imported, in whatever process imports it (an ``EngineCore`` process of braid or of vLLM's server,
or the offline worker): after every scheduler step that schedules any token it appends one line
``monotonic_time running waiting scheduled_requests scheduled_tokens`` to
``$BRAID_STEP_PROBE/steps-PID.txt``. ``time.monotonic`` is the system-wide ``CLOCK_MONOTONIC`` on
Linux, so a parent can cut a request's steps out of the file by its own start and end times.

It costs one ``write`` per engine step (the steps of the tiny model take milliseconds). Nothing in
``src/`` knows about it: :mod:`bench.batch_profile` writes a two-line ``sitecustomize.py`` into a
directory on ``PYTHONPATH`` of the processes it starts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from typing import Any

TARGET = "vllm.v1.core.sched.scheduler"


def _patch(module: Any) -> None:
    cls = module.Scheduler
    if getattr(cls.schedule, "_braid_probe", False):
        return
    original = cls.schedule
    out_dir = os.environ["BRAID_STEP_PROBE"]
    state: dict[str, Any] = {"pid": None, "file": None}

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        tokens = result.total_num_scheduled_tokens
        if tokens:
            pid = os.getpid()
            if state["pid"] != pid:  # opened lazily, once per process (a fork gets its own file)
                state["pid"] = pid
                state["file"] = open(os.path.join(out_dir, f"steps-{pid}.txt"), "a", buffering=1)
            state["file"].write(
                f"{time.monotonic():.6f} {len(self.running)} {len(self.waiting)} "
                f"{len(result.num_scheduled_tokens)} {tokens}\n"
            )
        return result

    schedule._braid_probe = True  # type: ignore[attr-defined]
    cls.schedule = schedule


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch the scheduler when it is imported (now, if it already is); needs ``BRAID_STEP_PROBE``."""
    if not os.environ.get("BRAID_STEP_PROBE"):
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _Finder())
