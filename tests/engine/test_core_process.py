"""braid.engine.core_process: what braid's entry point does in the engine-core process before it
hands over to vLLM's (vLLM's own entry point replaced by a recorder here; the real engine core
runs on it in every test of the vLLM tier)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from vllm.v1.engine.core import EngineCoreProc

from braid.engine import core_process, orphan_guard


def test_the_entry_point_watches_its_parent_and_hands_the_gil_on_often(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def vllm_entry(*args: Any, **kwargs: Any) -> None:
        seen["args"], seen["kwargs"] = args, kwargs
        seen["interval"] = sys.getswitchinterval()
        seen["threads"] = [t.name for t in threading.enumerate()]

    watched: list[bool] = []
    monkeypatch.setattr(EngineCoreProc, "run_engine_core", staticmethod(vllm_entry))
    monkeypatch.setattr(core_process, "watch_parent", lambda: watched.append(True))
    before = sys.getswitchinterval()
    try:
        core_process.run_engine_core(1, dp_rank=0)
    finally:
        sys.setswitchinterval(before)
    assert seen["args"] == (1,) and seen["kwargs"] == {"dp_rank": 0}
    assert seen["interval"] == pytest.approx(core_process.SWITCH_INTERVAL)
    assert core_process.SWITCH_INTERVAL < 0.005  # shorter than Python's default
    assert watched == [True]


def test_the_block_swaps_vllms_entry_point_and_puts_it_back() -> None:
    original = EngineCoreProc.__dict__["run_engine_core"]
    with core_process.braid_engine_core():
        assert EngineCoreProc.run_engine_core is core_process.run_engine_core
    assert EngineCoreProc.__dict__["run_engine_core"] is original
    with pytest.raises(RuntimeError), core_process.braid_engine_core():
        raise RuntimeError("vLLM failed to start")
    assert EngineCoreProc.__dict__["run_engine_core"] is original


def test_the_watch_is_the_orphan_guards() -> None:
    assert core_process.watch_parent is orphan_guard.watch_parent
