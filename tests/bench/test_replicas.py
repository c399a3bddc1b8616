"""bench.replicas, run small: two replicas on the real engine (the session's fleet:
tests/conftest.py), one conversation pair of two turns through each setup."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replicas import measure
from tools.router import Replicas

pytestmark = pytest.mark.vllm


def test_each_setup_runs_the_workload_and_reads_the_prefix_cache(tmp_path: Path, fleet: Replicas) -> None:
    rows = measure(chats=2, turns=2, logs=tmp_path, pair=fleet)
    assert list(rows) == ["1 replica", "2 replicas, round_robin", "2 replicas, cache_aware", "2 replicas, kv_aware"]
    for name, run in rows.items():
        assert run.requests_per_s > 0 and run.tokens_per_s > 0 and 0 < run.ttft_p50_ms <= run.ttft_p95_ms, (name, run)
        assert 0 <= run.hit_rate <= 1, (name, run)
    # a conversation's second turn finds its first turn's system prompt where the policy sent it
    for name in ("1 replica", "2 replicas, cache_aware", "2 replicas, kv_aware"):
        assert rows[name].hit_rate > 0.2, rows
