"""The work guard (tools/work.py): the front end's counted work stays within its budgets, and a
step planted once per token is caught.

Each workload runs in a process of its own (``tools.work.run_one``); the two runs here take about
20 s together, most of it the chat workload importing vLLM's tool parsers.
"""

from __future__ import annotations

import json

import pytest

from tools import work

pytestmark = pytest.mark.vllm  # the chat workload parses tool calls with vLLM's hermes parser


def test_the_front_end_stays_within_its_work_budgets() -> None:
    over = work.check()
    assert not over, "\n".join(over) + f"\nIf the work is meant: {work.UPDATE_COMMAND}"


def test_one_planted_call_per_token_is_caught() -> None:
    over = work.check(plant=True, only=["stream_batch"])
    assert any(line.startswith("stream_batch: calls/token") for line in over), over


def test_every_budget_is_what_the_rule_gives_for_its_runs() -> None:
    """A budget edited by hand (looser than its runs allow) fails here: each is recomputed."""
    budgets = json.loads(work.BUDGETS.read_text())
    assert budgets["command"] == work.UPDATE_COMMAND
    assert set(budgets["workloads"]) == {w.name for w in work.WORKLOADS}
    for name, entry in budgets["workloads"].items():
        for per in ("token", "req"):
            for metric in ("calls", "steps"):
                assert f"{metric}/{per}" in entry, (name, metric, per)
        for key, b in entry.items():
            if not isinstance(b, dict):
                continue
            metric, per = key.split("/")
            assert len(b["runs"]) == budgets["runs"] >= 3, (name, key)
            want = max(b["runs"]) + work.tolerance(metric, per, b["runs"])
            assert b["budget"] == pytest.approx(want, abs=0.005), (name, key, b)
