"""Replicas sharing batch jobs (``--store-shared``): two ``braid serve --engine scripted`` on one
real PostgreSQL database, each with its own ``--storage-dir``, reached with the ``openai``
client. A job made on one is run by both; one replica killed mid-job leaves no line undone or
done twice; a cancel made on one stops the lines of both; a job moved from one braid to
replicas and back runs each line once."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.http.test_store_api import KEY_A, _client, _jsonl, _line, _rows, _samples, _serve, _wait
from tools.postgres import Postgres
from tools.servers import ServerProcess

LEASE = 3
SHARED = ("--store-shared", "--batch-chunk-lines", "20", "--batch-lease", str(LEASE))
SLOW = ("--token-delay", "0.02", "--max-in-flight-requests", "8")
"""About 50 lines a second per replica: a job of 600 lasts long enough for the other replica to
find it (every 2 s) and run its share, however loaded the machine."""


def _lines_done(server: ServerProcess) -> float:
    samples = _samples(server)
    return sum(samples.get(f'braid_batch_lines_total{{outcome="{o}"}}', 0.0) for o in ("completed", "failed"))


def _unfinished(server: ServerProcess) -> float:
    samples = _samples(server)
    return samples["braid_engine_unfinished_requests"] + samples["braid_engine_requests_in_flight"]


@pytest.fixture
def database(postgres: Postgres) -> str:
    return postgres.create_database()


@contextmanager
def _pair(tmp_path: Path, database: str, *flags: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ExitStack() as stack:
        yield tuple(  # type: ignore[misc]
            stack.enter_context(_serve(tmp_path / name, *SHARED, *flags, log=f"shared-{name}", database=database))
            for name in ("a", "b")
        )


@pytest.fixture
def pair(tmp_path: Path, database: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with _pair(tmp_path, database, *SLOW) as servers:
        yield servers


def _job(client: openai.OpenAI, total: int) -> Any:
    lines: list[Any] = [_line(f"r{i}", {"prompt": f"p{i}", "max_tokens": 8, "seed": i}) for i in range(total)]
    lines.insert(total // 2, b"not json")  # refused at creation: its row comes from the creator
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(*lines))), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")


def _until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_job_is_shared_and_a_killed_replicas_lines_are_taken_over(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path, database: str
) -> None:
    a, b = pair
    total = 600
    job = _job(_client(a), total)
    # both replicas run lines of the job made on a (b finds it within its look, every 2 s)
    _until(lambda: _lines_done(a) >= 20 and _lines_done(b) >= 20, 30, "both replicas ran lines")
    b.proc.kill()
    b.proc.wait()
    job = _wait(_client(a), job.id, within=90)
    assert job.status == "completed", job
    assert (job.request_counts.total, job.request_counts.completed, job.request_counts.failed) == (total + 1, total, 1)
    rows = _rows(_client(a), job.output_file_id)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))
    errors = _rows(_client(a), job.error_file_id)
    assert len(errors) == 1 and errors[0]["error"]["code"] == "invalid_json"
    # any replica answers for any job: b, back on its disk, serves the job and its files
    with _serve(tmp_path / "b", *SHARED, log="shared-b2", database=database) as again:
        client = _client(again)
        assert client.batches.retrieve(job.id) == job
        assert sorted(r["custom_id"] for r in _rows(client, job.output_file_id)) == sorted(
            f"r{i}" for i in range(total)
        )


def test_a_cancel_on_one_replica_stops_the_lines_of_both(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    job = _job(_client(a), 1500)
    _until(lambda: _lines_done(a) >= 10 and _lines_done(b) >= 10, 30, "both replicas ran lines")
    assert _client(b).batches.cancel(job.id).status == "cancelling"
    job = _wait(_client(a), job.id, until=("cancelled",), within=4 * LEASE + 10)
    assert job.status == "cancelled"
    for server in (a, b):
        assert _unfinished(server) == 0, "an engine request outlived the cancel"
    done, errors = _rows(_client(b), job.output_file_id), _rows(_client(b), job.error_file_id)
    assert 20 <= len(done) < 1500 == job.request_counts.total - 1
    assert len({r["custom_id"] for r in done}) == len(done) == job.request_counts.completed
    # every row either replica wrote is in the job's files (the invalid line's is the creator's)
    time.sleep(LEASE)
    assert _lines_done(a) + _lines_done(b) == len(done) + len(errors) - 1


def test_a_replica_drained_mid_job_gives_its_lines_back(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    total = 600
    job = _job(_client(a), total)
    _until(lambda: _lines_done(a) >= 20 and _lines_done(b) >= 20, 30, "both replicas ran lines")
    b.proc.terminate()  # SIGTERM: b drains, its chunks are given back for a to take at once
    b.proc.wait(30)
    job = _wait(_client(a), job.id, within=90)
    assert (job.status, job.request_counts.completed, job.request_counts.failed) == ("completed", total, 1)
    rows = _rows(_client(a), job.output_file_id)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))


def test_a_shared_job_past_its_window_expires_with_every_line_once(tmp_path: Path, database: str) -> None:
    total = 400
    with _pair(
        tmp_path, database, "--token-delay", "0.05", "--max-in-flight-requests", "8", "--batch-completion-window", "5"
    ) as (a, b):
        job = _wait(_client(a), _job(_client(a), total).id, within=40)
        assert job.status == "expired", job
        done, errors = _rows(_client(b), job.output_file_id), _rows(_client(b), job.error_file_id)
    expired = [e for e in errors if e["error"]["code"] == "batch_expired"]
    assert done and expired and len(done) + len(errors) == total + 1
    assert sorted([r["custom_id"] for r in done] + [e["custom_id"] for e in expired]) == sorted(
        f"r{i}" for i in range(total)
    )
    assert (job.request_counts.completed, job.request_counts.failed) == (len(done), len(errors))


def test_shared_needs_postgresql() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "braid", "serve", "--engine", "scripted", "--store-shared"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "--store-shared needs --store postgresql://" in done.stderr, done.stderr


__all__ = ["KEY_A"]


def test_a_job_moved_to_shared_replicas_and_back_runs_each_line_once(tmp_path: Path, database: str) -> None:
    """One braid runs a job, is restarted with --store-shared (scaled out), then without it:
    each time the rows written so far move with the job (the work files to the database, then
    back), so no line runs twice and the counts stay exact."""
    total = 400
    slack = 16  # lines that may end between a braid's last look at /metrics and its drain

    def run_until(flags: tuple[str, ...], name: str, done: int) -> float:
        """Serve ``a``'s disk with ``flags`` until it has run ``done`` lines; drain; what it ran."""
        with _serve(tmp_path / "a", *flags, *SLOW, log=name, database=database) as server:
            _until(lambda: _lines_done(server) >= done, 60, f"{name} ran {done} lines")
            ran = _lines_done(server)
            server.proc.terminate()
            server.proc.wait(30)
        return ran

    with _serve(tmp_path / "a", *SLOW, log="moved-alone", database=database) as alone:
        job_id = _job(_client(alone), total).id
        _until(lambda: _lines_done(alone) >= 100, 60, "the job ran alone")
        ran = [_lines_done(alone)]
        alone.proc.terminate()
        alone.proc.wait(30)
    ran.append(run_until(SHARED, "moved-shared", 60))
    with _serve(tmp_path / "a", *SLOW, log="moved-back", database=database) as back:
        job = _wait(_client(back), job_id, within=60)
        ran.append(_lines_done(back))
        assert (job.status, job.request_counts.completed, job.request_counts.failed) == ("completed", total, 1)
        rows = _rows(_client(back), job.output_file_id)
        assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))
        assert [e["error"]["code"] for e in _rows(_client(back), job.error_file_id)] == ["invalid_json"]
    # No line ran twice: a line is counted once its row is written, and a line the next braid ran
    # again would be counted twice. (Lines that end between a look and the drain are not counted.)
    assert total - 2 * slack <= sum(ran) <= total, ran


def test_replicas_uploading_at_once_keep_the_total_space_cap(tmp_path: Path, database: str) -> None:
    """Each replica's own count of the stored bytes is only as fresh as its last sweep; the
    upload that would pass the cap is refused by the database's total, on whichever replica."""
    with _pair(tmp_path, database, "--max-storage-bytes", "100000") as (a, b):
        clients = (_client(a), _client(b))
        for client in clients:  # both have swept: each counts what the database holds now
            client.files.list()
        stored = [clients[0].files.create(file=("a", io.BytesIO(b"z" * 60_000)), purpose="batch").id]
        with pytest.raises(openai.APIStatusError) as refused:
            stored.append(clients[1].files.create(file=("b", io.BytesIO(b"z" * 60_000)), purpose="batch").id)
        assert refused.value.status_code == 413 and "--max-storage-bytes" in refused.value.message
        assert [f.id for f in clients[1].files.list()] == stored
        # the room comes back with the file (on the replica that deleted it at once; the other
        # sees it at its next sweep)
        clients[0].files.delete(stored[0])
        clients[0].files.delete(clients[0].files.create(file=("c", io.BytesIO(b"z" * 60_000)), purpose="batch").id)
