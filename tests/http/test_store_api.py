"""``/v1/files`` and ``/v1/batches`` as users reach them: ``braid serve --engine scripted`` in a
subprocess, the official ``openai`` client, two API keys, bad inputs, expiry, and a restart
after ``kill -9`` that keeps everything."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import schemathesis

from tools.postgres import Postgres, run_postgres
from tools.servers import ServerProcess, run_scripted_braid

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


def _client(server: ServerProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def _jsonl(*lines: Any) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def _line(cid: str, body: dict[str, Any], url: str = "/v1/completions") -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def _wait(client: openai.OpenAI, batch_id: str, *, within: float = 30.0, until: tuple[str, ...] = ()) -> Any:
    """The job once it has ended (or reached a status of ``until``), polled every 50 ms."""
    ended = until or ("completed", "failed", "expired", "cancelled")
    deadline = time.monotonic() + within
    while True:
        job = client.batches.retrieve(batch_id)
        if job.status in ended:
            return job
        assert time.monotonic() < deadline, f"the batch is still {job.status} after {within} s: {job}"
        time.sleep(0.05)


def _rows(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(r) for r in client.files.content(file_id).text.splitlines()]


def _serve(storage: Path, *flags: str, log: str, database: str | None = None) -> Any:
    store = ("--store", database) if database else ()
    return run_scripted_braid(
        "--storage-dir",
        str(storage),
        *store,
        "--api-key",
        KEY_B,
        *flags,
        api_key=KEY_A,
        log=Path(f"/tmp/braid-{log}.log"),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str | None:
    """``--store`` for a test that runs on both of the store's databases (None: SQLite)."""
    if request.param == "sqlite":
        return None
    postgres: Postgres = request.getfixturevalue("postgres")
    return postgres.create_database()


def _samples(server: ServerProcess) -> dict[str, float]:
    """``/metrics`` as sample (name and labels, as written) to value."""
    answer = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"}, timeout=5)
    lines = answer.raise_for_status().text.splitlines()
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def server(storage: Path) -> Iterator[ServerProcess]:
    flags = ("--max-file-bytes", "65536", "--max-storage-bytes", "400000", "--batch-max-lines", "50")
    with _serve(storage, *flags, log="store-api") as srv:
        yield srv


def test_files_round_trip_with_the_openai_client(server: ServerProcess, storage: Path) -> None:
    client = _client(server)
    data = _jsonl(_line("a", {"prompt": "hi", "max_tokens": 2}))
    made = client.files.create(file=("../../etc/passwd", io.BytesIO(data)), purpose="batch")
    assert made.id.startswith("file-") and len(made.id) > 30
    assert (made.bytes, made.purpose, made.filename, made.status) == (
        len(data),
        "batch",
        "../../etc/passwd",
        "processed",
    )
    assert made.expires_at is not None and made.expires_at - made.created_at == 30 * 86_400
    # the client's name is data: the bytes are under the id, in the storage directory
    assert (storage / "files" / made.id).read_bytes() == data
    assert client.files.retrieve(made.id) == made
    assert client.files.content(made.id).content == data
    assert made.id in [f.id for f in client.files.list()]
    assert made.id not in [f.id for f in client.files.list(purpose="batch_output")]
    deleted = client.files.delete(made.id)
    assert (deleted.id, deleted.deleted) == (made.id, True)
    assert not (storage / "files" / made.id).exists()
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(made.id)


def test_file_pages_follow_after(server: ServerProcess) -> None:
    client = _client(server, KEY_B)
    ids = [client.files.create(file=(f"{i}.jsonl", io.BytesIO(b"{}\n")), purpose="batch").id for i in range(3)]
    listed = [f.id for f in client.files.list(limit=1)]  # the client pages with after=last_id
    assert listed[:3] == ids[::-1]
    ascending = [f.id for f in client.files.list(limit=2, order="asc")]
    assert [i for i in ascending if i in ids] == ids
    page = client.files.list(limit=2, order="asc", after=ids[0])
    assert page.data[0].id == ids[1]
    for i in ids:
        client.files.delete(i)


def test_two_keys_see_nothing_of_each_other(server: ServerProcess) -> None:
    a, b = _client(server, KEY_A), _client(server, KEY_B)
    mine = a.files.create(file=("in.jsonl", io.BytesIO(_jsonl(_line("x", {"prompt": "p"})))), purpose="batch")
    job = a.batches.create(input_file_id=mine.id, endpoint="/v1/completions", completion_window="24h")
    for call in (
        lambda: b.files.retrieve(mine.id),
        lambda: b.files.content(mine.id),
        lambda: b.files.delete(mine.id),
        lambda: b.batches.retrieve(job.id),
        lambda: b.batches.cancel(job.id),
        lambda: b.batches.create(input_file_id=mine.id, endpoint="/v1/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert mine.id not in [f.id for f in b.files.list()]
    assert job.id not in [j.id for j in b.batches.list()]
    assert a.files.retrieve(mine.id).id == mine.id  # still there for its owner


def _raw(server: ServerProcess, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY_A}", **kw.pop("headers", {})}
    return httpx.request(method, server.url + path, headers=headers, timeout=30, **kw)


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == status
    return body


def test_bad_uploads_are_clear_4xx(server: ServerProcess) -> None:
    files = {"file": ("in.jsonl", b"{}\n")}
    assert "purpose" in _error(_raw(server, "POST", "/v1/files", files=files), 400)["message"]
    assert (
        _error(_raw(server, "POST", "/v1/files", files=files, data={"purpose": "fine-tune"}), 400)["param"] == "purpose"
    )
    assert (
        _error(_raw(server, "POST", "/v1/files", data={"purpose": "batch"}, files={"x": (None, "y")}), 400)["param"]
        == "file"
    )
    assert "multipart" in _error(_raw(server, "POST", "/v1/files", json={"purpose": "batch"}), 400)["message"]
    two = [("file", ("a", b"1")), ("file", ("b", b"2"))]
    _error(_raw(server, "POST", "/v1/files", files=two, data={"purpose": "batch"}), 400)
    too_big = {"file": ("big.jsonl", b"x" * 70_000)}
    assert (
        "--max-file-bytes"
        in _error(_raw(server, "POST", "/v1/files", files=too_big, data={"purpose": "batch"}), 413)["message"]
    )

    # sent in chunks without a length: refused as it passes the cap, not after
    def chunks() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
        for _ in range(100):
            yield b"y" * 1024
        yield b"\r\n--b--\r\n"

    chunked = _raw(
        server, "POST", "/v1/files", content=chunks(), headers={"Content-Type": "multipart/form-data; boundary=b"}
    )
    _error(chunked, 413)
    cut = _raw(server, "POST", "/v1/files", content=b"--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch",
               headers={"Content-Type": "multipart/form-data; boundary=b"})  # fmt: skip
    _error(cut, 400)
    _error(_raw(server, "GET", "/v1/files/file-nope"), 404)
    _error(_raw(server, "GET", "/v1/files", params={"limit": "0"}), 400)
    _error(_raw(server, "GET", "/v1/files", params={"order": "sideways"}), 400)
    assert _raw(server, "PUT", "/v1/files").status_code == 405


def test_the_total_space_cap(server: ServerProcess) -> None:
    client = _client(server, KEY_B)
    made = []
    with pytest.raises(openai.APIStatusError) as exc:
        for i in range(10):  # 60 KB each against a 400 KB cap, whatever else the module stored
            made.append(client.files.create(file=(f"{i}", io.BytesIO(b"z" * 60_000)), purpose="batch").id)
    assert exc.value.status_code == 413 and "--max-storage-bytes" in exc.value.message
    assert 1 <= len(made) < 7
    for file_id in made:
        client.files.delete(file_id)
    client.files.delete(client.files.create(file=("again", io.BytesIO(b"z" * 60_000)), purpose="batch").id)


def test_a_batch_with_bad_lines_names_each_in_its_error_file(server: ServerProcess) -> None:
    client = _client(server)
    data = _jsonl(
        _line("ok-1", {"model": server.model, "prompt": ["a", "b"], "max_tokens": 3}),
        _line("bad-body", {"prompt": "x", "max_tokens": -1}),
        b"this is not json",
        b"",
        _line("ok-1", {"prompt": "dup"}),
        _line("wrong-url", {"prompt": "x"}, url="/v1/chat/completions"),
        {"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {}},
        _line("streamed", {"prompt": "x", "stream": True}),
        _line("other-model", {"model": "gpt-4", "prompt": "x"}),
        {"method": "POST", "url": "/v1/completions", "body": {}},
        _line("ok-2", {"prompt": "fine", "max_tokens": 1}),
    )
    source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    job = client.batches.create(
        input_file_id=source.id, endpoint="/v1/completions", completion_window="24h", metadata={"run": "7"}
    )
    assert job.id.startswith("batch_") and job.status == "in_progress" and job.metadata == {"run": "7"}
    assert job.request_counts is not None and (job.request_counts.total, job.request_counts.failed) == (10, 8)
    assert job.model == server.model and job.expires_at is not None and job.expires_at - job.created_at == 86_400
    assert job.usage is None  # summed when the job ends
    job = _wait(client, job.id)
    assert job.status == "completed" and job.completed_at is not None and job.finalizing_at is not None
    assert (job.request_counts.total, job.request_counts.failed, job.request_counts.completed) == (10, 8, 2)
    done = _rows(client, job.output_file_id)
    assert sorted((r["line"], r["custom_id"], r["response"]["status_code"]) for r in done) == [
        (1, "ok-1", 200),
        (11, "ok-2", 200),
    ]
    by_id = {r["custom_id"]: r["response"]["body"] for r in done}
    assert len(by_id["ok-1"]["choices"]) == 2 and by_id["ok-1"]["object"] == "text_completion"
    assert by_id["ok-2"]["usage"]["completion_tokens"] == 1
    # the job's usage is its answered lines' usage, summed
    assert job.usage is not None
    assert (job.usage.input_tokens, job.usage.output_tokens, job.usage.total_tokens) == (
        sum(b["usage"]["prompt_tokens"] for b in by_id.values()),
        sum(b["usage"]["completion_tokens"] for b in by_id.values()),
        sum(b["usage"]["total_tokens"] for b in by_id.values()),
    )
    assert job.usage.output_tokens > 0 and job.usage.output_tokens_details.reasoning_tokens == 0
    rows = _rows(client, job.error_file_id)
    by_line = {r["line"]: r for r in rows}
    assert sorted(by_line) == [2, 3, 5, 6, 7, 8, 9, 10]
    assert by_line[2]["response"]["status_code"] == 400 and by_line[2]["custom_id"] == "bad-body"
    assert by_line[2]["response"]["body"]["error"]["param"] == "max_tokens"
    assert by_line[3]["error"]["code"] == "invalid_json" and by_line[3]["custom_id"] is None
    assert by_line[5]["error"]["code"] == "duplicate_custom_id"
    assert by_line[6]["error"]["code"] == "invalid_url"
    assert by_line[7]["error"]["code"] == "invalid_method"
    assert by_line[8]["response"]["body"]["error"]["param"] == "stream"
    assert by_line[9]["response"]["status_code"] == 404
    assert by_line[10]["error"]["code"] == "invalid_request"
    assert all(r["id"].startswith("batch_req_") for r in rows)
    error_file = client.files.retrieve(job.error_file_id)
    assert error_file.purpose == "batch_output" and error_file.bytes == len(
        client.files.content(job.error_file_id).content
    )

    with pytest.raises(openai.ConflictError):
        client.batches.cancel(job.id)


def test_output_expires_after_sets_the_output_files_expiry(server: ServerProcess) -> None:
    client = _client(server)
    data = _jsonl(_line("a", {"prompt": "p", "max_tokens": 2}), b"not json")
    source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    job = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    job = _wait(client, job.id)
    assert job.status == "completed" and job.output_file_id and job.error_file_id
    for file_id in (job.output_file_id, job.error_file_id):
        made = client.files.retrieve(file_id)
        assert made.expires_at is not None and made.expires_at - made.created_at == 7200
    # without it, the server's retention (30 days by default)
    plain = _wait(
        client, client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h").id
    )
    made = client.files.retrieve(plain.output_file_id or "")
    assert made.expires_at is not None and made.expires_at - made.created_at == 30 * 86_400


def test_a_line_the_engine_fails_is_the_only_one_answered_with_the_error(server: ServerProcess) -> None:
    # Lines run in groups under one ticket (braid.batch.group); an engine failure there must be
    # the failing line's answer alone, and a line that cannot share its group's run still runs.
    client = _client(server)
    lines = [_line(f"r{i}", {"prompt": f"p{i}", "max_tokens": 6, "seed": i}) for i in range(20)]
    lines[7] = _line("fails", {"prompt": "braid:fail@2", "max_tokens": 6, "ignore_eos": True})
    lines[12] = _line("two", {"prompt": "p12", "max_tokens": 3, "n": 2})
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(*lines))), purpose="batch")
    job = _wait(
        client, client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h").id
    )
    assert job.status == "completed" and job.request_counts is not None
    assert (job.request_counts.completed, job.request_counts.failed) == (19, 1)
    errors = _rows(client, job.error_file_id)
    assert [(r["custom_id"], r["line"], r["response"]["status_code"]) for r in errors] == [("fails", 8, 500)]
    assert "braid:fail@2" in errors[0]["response"]["body"]["error"]["message"]
    done = {r["custom_id"]: r for r in _rows(client, job.output_file_id)}
    assert sorted(done) == sorted(line["custom_id"] for line in lines if line["custom_id"] != "fails")
    assert len(done["two"]["response"]["body"]["choices"]) == 2
    assert len({r["response"]["body"]["id"] for r in done.values()}) == 19  # each line's own response


def test_chat_lines_are_checked_as_the_chat_route_checks_them(server: ServerProcess) -> None:
    client = _client(server)
    data = _jsonl(
        _line(
            "c1", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}, "/v1/chat/completions"
        ),
        _line("c2", {"messages": "not a list"}, "/v1/chat/completions"),
        _line("c3", {"prompt": "completions body"}, "/v1/chat/completions"),
    )
    source = client.files.create(file=("chat.jsonl", io.BytesIO(data)), purpose="batch")
    job = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert job.status == "in_progress" and job.request_counts is not None and job.request_counts.failed == 2
    job = _wait(client, job.id)
    assert job.status == "completed" and job.request_counts.completed == 1
    rows = _rows(client, job.error_file_id)
    assert [(r["line"], r["response"]["status_code"]) for r in rows] == [(2, 400), (3, 400)]
    (answer,) = _rows(client, job.output_file_id)
    assert answer["custom_id"] == "c1" and answer["response"]["body"]["object"] == "chat.completion"


def test_a_batch_with_nothing_runnable_fails(server: ServerProcess) -> None:
    client = _client(server)
    source = client.files.create(file=("bad.jsonl", io.BytesIO(b"nope\n[]\n")), purpose="batch")
    job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    assert job.status == "failed" and job.failed_at is not None
    assert job.errors is not None and job.errors.data is not None
    assert [(e.line, e.code) for e in job.errors.data] == [(1, "invalid_json"), (2, "invalid_request")]
    assert [r["line"] for r in _rows(client, job.error_file_id)] == [1, 2] and job.output_file_id is None
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(job.id)
    empty = client.files.create(file=("empty.jsonl", io.BytesIO(b"\n\n")), purpose="batch")
    job = client.batches.create(input_file_id=empty.id, endpoint="/v1/completions", completion_window="24h")
    assert job.status == "failed" and job.errors is not None and job.errors.data is not None
    assert job.errors.data[0].code == "empty_file" and job.error_file_id is None
    many = client.files.create(
        file=("many.jsonl", io.BytesIO(_jsonl(*(_line(str(i), {"prompt": "p"}) for i in range(51))))), purpose="batch"
    )
    job = client.batches.create(input_file_id=many.id, endpoint="/v1/completions", completion_window="24h")
    assert job.status == "failed" and job.errors is not None and job.errors.data is not None
    assert job.errors.data[0].code == "too_many_lines"


def test_bad_batch_requests_are_clear_4xx(server: ServerProcess) -> None:
    client = _client(server)
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(_line("a", {"prompt": "p"})))), purpose="batch")
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"input_file_id": source.id, "endpoint": "/v1/embeddings", "completion_window": "24h"}, 400, "endpoint"),
        (
            {"input_file_id": source.id, "endpoint": "/v1/completions", "completion_window": "1h"},
            400,
            "completion_window",
        ),
        (
            {"input_file_id": "file-nope", "endpoint": "/v1/completions", "completion_window": "24h"},
            404,
            "input_file_id",
        ),
        ({"endpoint": "/v1/completions", "completion_window": "24h"}, 400, None),
        (
            {
                "input_file_id": source.id,
                "endpoint": "/v1/completions",
                "completion_window": "24h",
                "metadata": {str(i): "v" for i in range(17)},
            },
            400,
            "metadata",
        ),  # fmt: skip
    ]
    window = {"input_file_id": source.id, "endpoint": "/v1/completions", "completion_window": "24h"}
    for after in ({"anchor": "last_active_at", "seconds": 3600}, {"anchor": "created_at", "seconds": 60}):
        cases.append(({**window, "output_expires_after": after}, 400, "output_expires_after"))
    for body, status, param in cases:
        assert _error(_raw(server, "POST", "/v1/batches", json=body), status)["param"] == param, body
    _error(_raw(server, "POST", "/v1/batches", content=b"{", headers={"Content-Type": "application/json"}), 400)
    _error(_raw(server, "POST", "/v1/batches", content=b"{}", headers={"Content-Type": "text/plain"}), 400)
    _error(_raw(server, "GET", "/v1/batches/batch_nope"), 404)
    _error(_raw(server, "POST", "/v1/batches/batch_nope/cancel"), 404)
    _error(_raw(server, "GET", "/v1/batches", params={"limit": "101"}), 400)


def test_batch_pages_follow_after(server: ServerProcess) -> None:
    client = _client(server, KEY_B)
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(_line("a", {"prompt": "p"})))), purpose="batch")
    ids = [
        client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h").id
        for _ in range(3)
    ]
    page = client.batches.list(limit=2)
    assert [j.id for j in page.data] == ids[:0:-1] and page.has_more
    assert [j.id for j in client.batches.list(limit=2, after=ids[1]).data][:1] == [ids[0]]
    assert [j.id for j in client.batches.list(limit=1)][:3] == ids[::-1]


def test_expiry_of_jobs_and_files(tmp_path: Path) -> None:
    flags = ("--batch-completion-window", "2", "--file-retention", "4", "--token-delay", "0.1")
    with _serve(tmp_path, *flags, "--metrics-public", log="store-expiry") as server:
        client = _client(server)
        lines = [
            _line("quick", {"prompt": "p", "max_tokens": 1}),
            _line("slow", {"prompt": "p", "max_tokens": 100, "ignore_eos": True}),
        ]
        source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(*lines))), purpose="batch")
        job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
        assert job.status == "in_progress" and job.expires_at == job.created_at + 2
        job = _wait(client, job.id, within=5)
        assert job.status == "expired" and job.expired_at is not None
        assert [r["custom_id"] for r in _rows(client, job.output_file_id)] == ["quick"]
        (late,) = _rows(client, job.error_file_id)
        assert (late["custom_id"], late["error"]["code"]) == ("slow", "batch_expired")
        server.wait_idle(within=5)  # the slow line's engine request was aborted
        samples = _samples(server)
        assert samples['braid_batch_lines_total{outcome="completed"}'] == 1.0
        assert samples['braid_batch_lines_total{outcome="failed"}'] == 1.0  # the expired line
        assert samples['braid_batch_jobs_ended_total{status="expired"}'] == 1.0
        assert samples['braid_batch_jobs_ended_total{status="completed"}'] == 0.0
        assert samples["braid_batch_jobs_running"] == 0.0
        time.sleep(max(0.0, source.created_at + 4 - time.time()) + 0.1)
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(source.id)
        client.files.list()  # a sweep: the bytes go too
        assert not (tmp_path / "files" / source.id).exists()


def test_cancel_aborts_the_engine_work_and_keeps_what_was_done(tmp_path: Path) -> None:
    flags = ("--token-delay", "0.05", "--max-in-flight-requests", "4", "--metrics-public")
    with _serve(tmp_path, *flags, log="store-cancel") as server:
        client = _client(server)
        # ignore_eos: a sampled end of text must not make a long line short (the test needs it running)
        lines = [
            _line(f"r{i}", {"prompt": "p", "max_tokens": 4 if i < 4 else 40, "ignore_eos": True}) for i in range(40)
        ]
        source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(*lines))), purpose="batch")
        job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 10
        while server.unfinished() < 4:  # lines are running in the engine
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        cancelling = client.batches.cancel(job.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
        job = _wait(client, job.id, within=5)
        assert job.status == "cancelled" and job.cancelled_at is not None
        assert server.wait_idle(within=2) < 2
        done = [r["custom_id"] for r in _rows(client, job.output_file_id)]
        assert 1 <= len(done) < 40 and len(set(done)) == len(done)
        assert job.request_counts is not None and job.request_counts.completed == len(done)
        assert client.batches.cancel(job.id).status == "cancelled"


def test_kill_9_and_restart_keep_files_and_jobs(tmp_path: Path, database: str | None) -> None:
    data = _jsonl(_line("a", {"prompt": "p"}), b"bad")
    with _serve(tmp_path, log="store-restart", database=database) as server:
        client = _client(server)
        source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        job = _wait(
            client,
            client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h").id,
        )
        server.proc.kill()
        server.proc.wait()
    with _serve(tmp_path, log="store-restart", database=database) as server:
        client = _client(server)
        assert client.files.retrieve(source.id) == source
        assert client.files.content(source.id).content == data
        assert client.batches.retrieve(job.id) == job
        assert "invalid_json" in client.files.content(job.error_file_id).text
        with pytest.raises(openai.NotFoundError):
            _client(server, KEY_B).batches.retrieve(job.id)


def _job_killed_after(server: ServerProcess, data: bytes, completed: int) -> tuple[Any, Any]:
    """A completions job of ``data`` made on ``server`` (its input file and the job), then the
    server killed with SIGKILL once ``completed`` lines are done."""
    client = _client(server)
    source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 20
    while (progress := client.batches.retrieve(job.id).request_counts) is None or progress.completed < completed:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.proc.kill()
    server.proc.wait()
    return source, job


def test_a_job_killed_mid_way_resumes_with_every_line_once(tmp_path: Path, database: str | None) -> None:
    total = 300
    flags = ("--token-delay", "0.01", "--max-in-flight-requests", "8")
    lines = [_line(f"r{i}", {"prompt": f"p{i}", "max_tokens": 8, "seed": i}) for i in range(total)]
    with _serve(tmp_path, *flags, log="store-resume", database=database) as server:
        job = _job_killed_after(server, _jsonl(*lines), 40)[1]
    written = (tmp_path / "jobs" / f"{job.id}.output.jsonl").read_bytes().count(b"\n")
    assert 40 <= written < total
    with _serve(tmp_path, *flags, log="store-resume", database=database) as server:
        client = _client(server)
        job = _wait(client, job.id, within=60)
        assert job.status == "completed" and job.request_counts.completed == total and job.request_counts.failed == 0
        rows = _rows(client, job.output_file_id)
        assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))
        assert all(r["response"]["status_code"] == 200 for r in rows)
        assert job.error_file_id is None


def test_on_postgresql_a_braid_on_another_disk_serves_the_files_and_ends_the_job(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The files' bytes are in PostgreSQL: killed mid-job and started again on an empty disk (a
    replaced machine), braid serves the input file, runs the job to its end with every line
    once (the lines whose rows were on the lost disk run again), and a third braid on yet another
    disk serves the job's output."""
    total = 120
    flags = ("--token-delay", "0.01", "--max-in-flight-requests", "8")
    database = postgres.create_database()
    lines = [_line(f"r{i}", {"prompt": f"p{i}", "max_tokens": 8, "seed": i}) for i in range(total)]
    data = _jsonl(*lines)
    with _serve(tmp_path / "a", *flags, log="store-disk", database=database) as server:
        source, job = _job_killed_after(server, data, 20)
    with _serve(tmp_path / "b", *flags, log="store-disk", database=database) as server:
        client = _client(server)
        assert client.files.content(source.id).content == data
        job = _wait(client, job.id, within=60)
    assert job.status == "completed" and job.request_counts.completed == total and job.request_counts.failed == 0
    with _serve(tmp_path / "c", log="store-disk", database=database) as server:
        rows = _rows(_client(server), job.output_file_id)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))
    assert not (tmp_path / "c" / "files" / source.id).exists()  # only what was read is copied here


def test_a_postgresql_outage_is_a_503_and_a_job_goes_on_after_it(tmp_path: Path) -> None:
    """PostgreSQL stops under a running job: the store's routes answer 503 in vLLM's error shape
    (not a 500, not a hang), the job is not failed, and once the database is back the job ends
    with every line once."""
    total = 120
    flags = ("--token-delay", "0.01", "--max-in-flight-requests", "8")
    lines = [_line(f"r{i}", {"prompt": f"p{i}", "max_tokens": 8, "seed": i}) for i in range(total)]
    with (
        run_postgres() as postgres,
        _serve(tmp_path, *flags, log="store-outage", database=postgres.create_database()) as server,
    ):
        client = _client(server)
        source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(*lines))), purpose="batch")
        job = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
        _wait(client, job.id, until=("in_progress",))
        postgres.stop()
        answer = _raw(server, "GET", f"/v1/batches/{job.id}")
        assert _error(answer, 503)["type"] == "ServiceUnavailableError" and answer.headers["Retry-After"] == "5"
        assert _error(_raw(server, "GET", "/v1/files"), 503)["message"].startswith("the store's database")
        time.sleep(1.0)  # the job's lines go on; its next write to the store fails
        postgres.start()
        job = _wait(client, job.id, within=60)
        assert job.status == "completed" and job.request_counts.completed == total
        rows = _rows(client, job.output_file_id)
        assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(total))
        assert _samples(server)["braid_store_errors_total"] >= 3  # the two 503s and the job's write


def test_the_store_routes_are_documented_and_counted_by_template(server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {KEY_A}"}
    doc = httpx.get(server.url + "/openapi.json", headers=auth, timeout=5).json()
    store_paths = {
        "/v1/files": {"get", "post"},
        "/v1/files/{file_id}": {"get", "delete"},
        "/v1/files/{file_id}/content": {"get"},
        "/v1/batches": {"get", "post"},
        "/v1/batches/{batch_id}": {"get"},
        "/v1/batches/{batch_id}/cancel": {"post"},
        "/v1/responses/{response_id}": {"get", "delete"},
        "/v1/responses/{response_id}/cancel": {"post"},
    }
    assert {p: set(doc["paths"][p]) for p in store_paths} == store_paths
    schemathesis.openapi.from_dict(doc).validate()
    # a key is required on every store route, and a missing object is a declared 404
    assert "401" in doc["paths"]["/v1/files/{file_id}"]["get"]["responses"]
    assert "404" in doc["paths"]["/v1/batches/{batch_id}"]["get"]["responses"]
    before = _samples(server)
    for path in ("/v1/files/file-nope", "/v1/batches/batch_nope", "/v1/files/file-nope/content", "/v1/responses/x"):
        assert httpx.get(server.url + path, headers=auth, timeout=5).status_code == 404
    after = _samples(server)

    def grew(route: str) -> float:
        name = f'braid_http_responses_total{{route="{route}",status="404"}}'
        return after.get(name, 0.0) - before.get(name, 0.0)

    routes = (
        "/v1/files/{file_id}",
        "/v1/batches/{batch_id}",
        "/v1/files/{file_id}/content",
        "/v1/responses/{response_id}",
    )
    assert [grew(r) for r in routes] == [1.0, 1.0, 1.0, 1.0]
