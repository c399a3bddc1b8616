"""bench.batch_jobs's parts against ``braid serve`` on the scripted engine: a whole job timed and
checked, and a probe window beside a job that is then cancelled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench import batch_jobs
from bench.vllm_tools import random_token_prompts
from braid.engine.scripted import VOCAB_SIZE
from tools.servers import ServerProcess, run_scripted_braid


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    store = tmp_path_factory.mktemp("batch-jobs")
    flags = ("--storage-dir", str(store), "--token-delay", "0.002", "--max-in-flight-requests", "8")
    with run_scripted_braid(*flags, log=store / "braid.log") as server:
        yield server


def test_the_lines_are_openai_batch_lines() -> None:
    prompts = random_token_prompts(3, 4, 100, seed=1)
    rows = [json.loads(r) for r in batch_jobs.completion_lines(prompts, "m").splitlines()]
    assert [r["custom_id"] for r in rows] == ["req-0", "req-1", "req-2"]
    assert {r["url"] for r in rows} == {"/v1/completions"} and rows[1]["body"]["prompt"] == prompts[1]
    chats = [json.loads(r) for r in batch_jobs.chat_lines(["a", "b"], "m").splitlines()]
    assert chats[1]["body"]["messages"] == [{"role": "user", "content": "b"}]
    assert chats[0]["body"]["max_tokens"] == batch_jobs.TOKENS and chats[0]["body"]["ignore_eos"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_timed_job_runs_every_line(scripted: ServerProcess, chat: bool) -> None:
    prompts = random_token_prompts(40, 8, VOCAB_SIZE, seed=2)
    if chat:
        data, endpoint = batch_jobs.chat_lines([f"line {i}" for i in range(40)], scripted.model), "/v1/chat/completions"
    else:
        data, endpoint = batch_jobs.completion_lines(prompts, scripted.model), "/v1/completions"
    with httpx.Client(timeout=60) as client:
        out = batch_jobs.timed_job(client, scripted, data, endpoint, 40)
    assert out["tokens"] == 40 * batch_jobs.TOKENS and out["wall"] > 0


def test_a_timed_job_that_loses_lines_is_an_error(scripted: ServerProcess) -> None:
    data = batch_jobs.completion_lines(random_token_prompts(5, 8, VOCAB_SIZE, seed=3), scripted.model)
    with httpx.Client(timeout=60) as client, pytest.raises(RuntimeError, match="did not run every line"):
        batch_jobs.timed_job(client, scripted, data + b"not json\n", "/v1/completions", 6)


def test_a_probe_window_beside_a_job_then_cancels_it(scripted: ServerProcess, tmp_path: Path) -> None:
    data = batch_jobs.completion_lines(random_token_prompts(3000, 8, VOCAB_SIZE, seed=4), scripted.model)
    out = batch_jobs._beside_job(scripted, data, seconds=1.0)
    assert len(out["probes"]) >= 2 and all(p > 0 for p in out["probes"]) and out["idle"] > 0
    assert out["rate"] > 0
    with httpx.Client(timeout=10) as client:
        jobs = client.get(scripted.url + "/v1/batches").json()["data"]
    assert jobs[0]["status"] == "cancelled" and jobs[0]["request_counts"]["completed"] < 3000
    assert scripted.unfinished() == 0
