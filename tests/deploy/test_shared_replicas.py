"""Two braid replicas on the real engine sharing batch jobs on one real PostgreSQL
(``--store-shared``), one killed with SIGKILL mid-job: the other takes its chunks over when their
leases end and ends the job with every line once, each answered by an engine; the killed
replica's engine core does not outlive it (about 60 s on 2 cores, most of it the replicas'
start)."""

from __future__ import annotations

import io
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from bench.vllm_tools import engine_pids
from tests.helpers import process_running
from tools.postgres import Postgres
from tools.servers import ServerProcess, run_braid, tiny_model_dir

pytestmark = pytest.mark.vllm

LINES = 1000


def _done_here(server: ServerProcess) -> float:
    return sum(v for k, v in _samples(server).items() if k.startswith("braid_batch_lines_total"))


def _samples(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=5).raise_for_status().text
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.splitlines() if line and line[0] != "#")}


def test_a_replica_killed_mid_job_leaves_every_line_to_the_other(tmp_path: Path, postgres: Postgres) -> None:
    database = postgres.create_database()
    flags = ("--store", database, "--store-shared", "--batch-chunk-lines", "50", "--batch-lease", "3")
    rng = random.Random(5)
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": [rng.randrange(2048) for _ in range(32)], "max_tokens": 32, "ignore_eos": True},
        }
        for i in range(LINES)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    model = tiny_model_dir()
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        started = [
            pool.submit(
                stack.enter_context,
                run_braid("--storage-dir", str(tmp_path / name), *flags, model_dir=model, log=tmp_path / f"{name}.log"),
            )
            for name in ("a", "b")
        ]
        a, b = (f.result() for f in started)
        client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0)
        source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while _done_here(a) < 50 or _done_here(b) < 50:
            assert time.monotonic() < deadline, "both replicas did not run lines of the job"
            time.sleep(0.1)
        cores = engine_pids(b.proc)
        assert cores, "no engine-core process under the replica"
        b.proc.kill()
        b.proc.wait()
        deadline = time.monotonic() + 300
        while (job := client.batches.retrieve(job.id)).status not in ("completed", "failed", "expired", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job.status == "completed" and job.request_counts is not None
        assert (job.request_counts.completed, job.request_counts.failed) == (LINES, 0)
        assert job.output_file_id is not None
        rows = [json.loads(r) for r in client.files.content(job.output_file_id).text.splitlines()]
        assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(LINES))
        assert all(r["response"]["body"]["usage"]["completion_tokens"] == 32 for r in rows)
        assert a.unfinished() == 0
        # the killed replica's engine core did not outlive it (braid.engine.orphan_guard)
        deadline = time.monotonic() + 30
        while any(map(process_running, cores)):
            assert time.monotonic() < deadline, f"the killed replica's engine core {cores} is still running"
            time.sleep(0.2)
