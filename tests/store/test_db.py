"""braid's store on a real database: schema, owners, pages, retention, and what a crash leaves
behind. The tests of what the store does run on both of its databases (SQLite in a temporary
directory, and a real PostgreSQL: the ``options`` fixture); those of how each keeps its schema
are their own."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from braid.errors import StoreUnavailable
from braid.store import db
from braid.store.db import MIGRATIONS, SCHEMA_VERSION, Store, StoreError, open_store
from braid.store.options import StoreOptions
from braid.store.records import (
    BatchRecord,
    BatchUsage,
    FileRecord,
    RequestCounts,
    StoredResponse,
    new_id,
    owner_of,
)
from tools.postgres import Postgres

NOW = 1_800_000_000


def _file(
    store: Store, owner: str, *, created: int = NOW, expires: int | None = NOW + 100, data: bytes = b"x"
) -> FileRecord:
    record = FileRecord(new_id("file-"), owner, "in.jsonl", "batch", len(data), created, expires)
    store.temp_path(record.id).write_bytes(data)
    return record


def _options(tmp_path: Path, **kw: Any) -> StoreOptions:
    return StoreOptions(storage_dir=str(tmp_path / "store"), **kw)


MakeOptions = Callable[..., StoreOptions]


@pytest.fixture(params=["sqlite", "postgresql"])
def options(request: pytest.FixtureRequest, tmp_path: Path) -> MakeOptions:
    """The store's options on one of its databases (the same database for every call of a test)."""
    database = request.getfixturevalue("postgres").create_database() if request.param == "postgresql" else None

    def make(**kw: Any) -> StoreOptions:
        return StoreOptions(storage_dir=str(tmp_path / "store"), database=database, **kw)

    return make


async def test_a_new_store_has_the_current_schema_and_wal(tmp_path: Path) -> None:
    async with open_store(_options(tmp_path), NOW):
        pass
    conn = sqlite3.connect(tmp_path / "store" / "store.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    async with open_store(_options(tmp_path), NOW):
        pass
    conn = sqlite3.connect(tmp_path / "store" / "store.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this braid"):
        async with open_store(_options(tmp_path), NOW):
            pass


async def test_a_version_1_database_is_migrated_keeping_its_jobs(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    conn = sqlite3.connect(tmp_path / "store" / "store.db")
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute(
        "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, status, created_at, "
        "expires_at, total, completed, failed, metadata, errors, times) "
        "VALUES ('batch_old', 'o', '/v1/completions', 'file-x', '24h', 'completed', 1, 2, 3, 3, 0, '[]', '[]', '{}')"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    async with open_store(_options(tmp_path), NOW) as store:
        old = await store.get_batch("o", "batch_old")
    assert old is not None and (old.counts, old.usage, old.output_expires_after) == (RequestCounts(3, 3, 0), None, None)
    conn = sqlite3.connect(tmp_path / "store" / "store.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6


async def test_an_unusable_directory_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="--storage-dir"):
        async with open_store(StoreOptions(storage_dir=str(tmp_path / "file" / "store")), NOW):
            pass


async def test_records_survive_a_reopen_and_owners_are_apart(options: MakeOptions) -> None:
    a, b = owner_of("key-a"), owner_of("key-b")
    assert a != b and "key-a" not in a
    async with open_store(options(), NOW) as store:
        f = _file(store, a, data=b"hello")
        await store.add_file(f)
        job = BatchRecord(
            new_id("batch_"), a, "/v1/completions", f.id, "24h", "in_progress", NOW, NOW + 60,
            counts=RequestCounts(3, 1, 1), metadata=(("k", "v"),),
        )  # fmt: skip
        await store.add_batch(job)
        ended = attrs.evolve(job, id=new_id("batch_"), status="completed", usage=BatchUsage(96, 32, 8, 2))
        await store.add_batch(ended)
    async with open_store(options(), NOW) as store:
        assert await store.get_file(a, f.id, NOW) == f
        assert await store.get_file(b, f.id, NOW) is None
        assert store.path(f.id).read_bytes() == b"hello"
        assert store.used_bytes == 5
        assert await store.get_batch(a, job.id) == job
        assert await store.get_batch(a, ended.id) == ended
        assert await store.get_batch(b, job.id) is None
        assert not await store.delete_file(b, f.id)
        assert await store.delete_file(a, f.id)
        assert not store.path(f.id).exists() and store.used_bytes == 0


async def test_pages_follow_the_cursor_both_ways(options: MakeOptions) -> None:
    owner = owner_of("k")
    async with open_store(options(), NOW) as store:
        ids = []
        for i in range(5):
            f = _file(store, owner, created=NOW + i)
            await store.add_file(f)
            ids.append(f.id)
        await store.add_file(_file(store, owner_of("other")))
        page, more = await store.list_files(owner, NOW, purpose=None, after=None, limit=2, newest_first=True)
        assert [f.id for f in page] == ids[:2:-1] and more
        page, more = await store.list_files(owner, NOW, purpose=None, after=ids[3], limit=10, newest_first=True)
        assert [f.id for f in page] == ids[2::-1] and not more
        page, more = await store.list_files(owner, NOW, purpose=None, after=ids[1], limit=10, newest_first=False)
        assert [f.id for f in page] == ids[2:] and not more
        page, _ = await store.list_files(owner, NOW, purpose="batch_output", after=None, limit=10, newest_first=True)
        assert page == []


async def test_sweep_deletes_expired_files_and_leaves_jobs_to_the_runner(options: MakeOptions) -> None:
    owner = owner_of("k")
    async with open_store(options(), NOW) as store:
        old = _file(store, owner, expires=NOW + 10, data=b"old")
        kept = _file(store, owner, expires=None, data=b"kept")
        await store.add_file(old)
        await store.add_file(kept)
        active = BatchRecord(new_id("batch_"), owner, "/v1/completions", kept.id, "24h", "in_progress", NOW, NOW + 10)
        done = attrs.evolve(active, id=new_id("batch_"), status="completed")
        await store.add_batch(active)
        await store.add_batch(done)
        assert await store.get_file(owner, old.id, NOW + 10) is None  # a read never shows an expired file
        assert await store.sweep(NOW + 10) == 1
        assert not store.path(old.id).exists() and store.path(kept.id).exists()
        # once a second at most: a later sweep of the same second has nothing to find, and no
        # thread hop is paid for it (a job polled many times a second)
        later = _file(store, owner, expires=NOW + 11, data=b"later")
        await store.add_file(later)
        calls = 0
        real_call = store._call

        async def counted(fn: Any, *args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await real_call(fn, *args)

        store._call = counted  # type: ignore[method-assign]
        assert await store.sweep(NOW + 10) == 0 and store.path(later.id).exists() and calls == 0
        assert await store.sweep(NOW + 11) == 1 and not store.path(later.id).exists() and calls == 1
        store._call = real_call  # type: ignore[method-assign]
        assert store.used_bytes == 4
        assert await store.get_batch(owner, active.id) == active  # the runner ends a job past its window
        assert await store.active_batches() == [active]
        # a change that must not undo a job's end
        assert not await store.move_batch(attrs.evolve(done, status="cancelling"), unless=("completed",))
        assert await store.get_batch(owner, done.id) == done
        assert await store.move_batch(attrs.evolve(active, status="cancelling"), unless=("completed",))
        await store.set_counts(active.id, 3, 4)
        moved = await store.load_batch(active.id)
        assert moved is not None and moved.status == "cancelling" and moved.counts == RequestCounts(0, 3, 4)


async def test_open_removes_what_a_crash_left(options: MakeOptions) -> None:
    async with open_store(options(), NOW) as store:
        store.temp_path("file-half").write_bytes(b"half an upload")
        store.path("file-orphan").write_bytes(b"bytes moved, row never written")
        f = _file(store, owner_of("k"))
        await store.add_file(f)
    async with open_store(options(), NOW) as store:
        assert not store.temp_path("file-half").exists()
        assert not store.path("file-orphan").exists()
        assert store.path(f.id).exists()


async def test_the_total_cap_counts_stored_and_arriving_bytes(options: MakeOptions) -> None:
    async with open_store(options(max_storage_bytes=10), NOW) as store:
        await store.add_file(_file(store, owner_of("k"), data=b"123456"))
        assert store.reserve(3)
        assert not store.reserve(2)
        store.release(3)
        assert store.reserve(4)


async def test_responses_are_kept_per_owner_until_they_expire(options: MakeOptions) -> None:
    a, b = owner_of("key-a"), owner_of("key-b")
    async with open_store(options(), NOW) as store:
        await store.put_response(StoredResponse("resp_1", a, NOW, NOW + 10, b'{"x":1}', b"[]"), NOW)
        await store.put_response(StoredResponse("resp_1", b, NOW, NOW + 10, b'{"x":2}', b"[]"), NOW)
        assert (await store.get_response(a, "resp_1", NOW)).body == b'{"x":1}'  # type: ignore[union-attr]
        assert (await store.get_response(b, "resp_1", NOW)).body == b'{"x":2}'  # type: ignore[union-attr]
        # the same owner and id again: replaced
        await store.put_response(StoredResponse("resp_1", a, NOW, NOW + 10, b'{"x":3}', b"[]"), NOW)
        assert (await store.get_response(a, "resp_1", NOW)).body == b'{"x":3}'  # type: ignore[union-attr]
        assert await store.get_response(a, "resp_1", NOW + 10) is None  # expired: never read
        assert await store.delete_response(b, "resp_1") and not await store.delete_response(b, "resp_1")
        # a write sweeps what expired: the table does not grow past the retention
        await store.put_response(StoredResponse("resp_2", a, NOW + 20, NOW + 30, b"{}", b"[]"), NOW + 20)
        count = await store._call(lambda: store._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
        assert count == 1


async def test_stored_responses_stay_under_their_space_cap(options: MakeOptions) -> None:
    """Past ``max_response_bytes`` the oldest responses (any owner's) make room; one larger than
    the cap alone is not stored; the count survives deletes, sweeps and a reopen."""
    a, b = owner_of("key-a"), owner_of("key-b")
    capped = options(max_response_bytes=300)

    def record(n: int, owner: str, size: int = 100, expires: int = NOW + 100) -> StoredResponse:
        return StoredResponse(f"resp_{n}", owner, NOW, expires, b"x" * (size - 2), b"[]")

    async with open_store(capped, NOW) as store:
        for n in range(3):
            assert await store.put_response(record(n, a if n % 2 else b), NOW)
        assert store.response_bytes == 300
        assert await store.put_response(record(3, a), NOW)  # the oldest (resp_0, b's) goes
        assert await store.get_response(b, "resp_0", NOW) is None
        assert await store.get_response(a, "resp_3", NOW) is not None and store.response_bytes == 300
        assert not await store.put_response(record(4, a, size=301), NOW)  # too large alone
        assert await store.get_response(a, "resp_4", NOW) is None and store.response_bytes == 300
        # replacing one counts the old one out
        assert await store.put_response(record(3, a, size=50), NOW) and store.response_bytes == 250
        assert await store.delete_response(a, "resp_3") and store.response_bytes == 200
        await store.put_response(record(5, b, expires=NOW + 1), NOW)
        assert store.response_bytes == 300
        await store.sweep(NOW + 1)  # resp_5 expired
        assert store.response_bytes == 200
    async with open_store(capped, NOW) as store:
        assert store.response_bytes == 200


# --- PostgreSQL's own ---------------------------------------------------------------------------


async def test_postgresql_keeps_its_schema_version_and_refuses_a_newer_one(tmp_path: Path, postgres: Postgres) -> None:
    import psycopg

    options = StoreOptions(storage_dir=str(tmp_path / "store"), database=postgres.create_database())
    async with open_store(options, NOW):
        pass
    assert options.database is not None
    with psycopg.connect(options.database, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM braid_schema").fetchall() == [(SCHEMA_VERSION,)]
        conn.execute("UPDATE braid_schema SET version = version + 1")
    with pytest.raises(StoreError, match="newer than this braid"):
        async with open_store(options, NOW):
            pass


async def test_braids_opening_one_postgresql_database_at_once_migrate_it_once_and_one_keeps_it(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema is migrated once however many open it together; then one braid holds the
    database (until jobs are shared between replicas) and the others are told so, in one line."""
    import psycopg

    monkeypatch.setattr(db, "HOLD_WAIT", 0.3)
    database = postgres.create_database()
    opened: list[int] = []
    refused: list[str] = []

    async def braid(n: int) -> None:
        try:
            async with open_store(StoreOptions(storage_dir=str(tmp_path / f"r{n}"), database=database), NOW):
                opened.append(n)
                await trio.sleep(1.0)  # held past the others' wait
        except StoreError as exc:
            refused.append(str(exc))

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(braid, n)
    assert len(opened) == 1 and len(refused) == 3
    assert all("another braid uses this database" in message for message in refused), refused
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM braid_schema").fetchall() == [(SCHEMA_VERSION,)]
    # A braid that finds the database held waits for it (a restart while the old session lingers).
    monkeypatch.setattr(db, "HOLD_WAIT", 5.0)
    async with trio.open_nursery() as nursery:
        async with open_store(StoreOptions(storage_dir=str(tmp_path / "first"), database=database), NOW):
            nursery.start_soon(braid, 4)
            await trio.sleep(0.5)
            assert opened == opened[:1]  # still waiting
    assert len(opened) == 2 and len(refused) == 3


async def test_shared_replicas_open_one_database_together_and_exclude_a_lone_braid(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "HOLD_WAIT", 0.3)
    database = postgres.create_database()

    def options(name: str, shared: bool) -> StoreOptions:
        return StoreOptions(storage_dir=str(tmp_path / name), database=database, shared=shared)

    async with open_store(options("a", True), NOW), open_store(options("b", True), NOW):
        with pytest.raises(StoreError, match="replicas share one with --store-shared"):
            async with open_store(options("lone", False), NOW):
                pass
    async with open_store(options("lone", False), NOW):
        with pytest.raises(StoreError, match="a braid without --store-shared uses this database"):
            async with open_store(options("a", True), NOW):
                pass
    with pytest.raises(ValueError, match="--store-shared needs --store postgresql://"):
        StoreOptions(shared=True)


@pytest.fixture
async def shared_store(tmp_path: Path, postgres: Postgres) -> AsyncIterator[Store]:
    """A store of ``--store-shared``, on a database of its own."""
    options = StoreOptions(storage_dir=str(tmp_path / "s"), database=postgres.create_database(), shared=True)
    async with open_store(options, NOW) as store:
        yield store


def _active_job(batch_id: str) -> BatchRecord:
    return BatchRecord(batch_id, "o", "/v1/completions", "file-x", "24h", "in_progress", NOW, NOW + 10)


async def test_shared_chunks_are_claimed_once_and_taken_over_when_their_lease_ends(
    tmp_path: Path, shared_store: Store
) -> None:
    store = shared_store
    job = _active_job("batch_x")
    await store.add_batch(job)
    assert await store.add_chunks("batch_x", 3)
    assert await store.add_chunks("batch_x", 5)  # a second replica starting the job changes nothing
    claims = [await store.claim_chunk("batch_x", holder, 30) for holder in ("a", "b", "a")]
    assert claims == [0, 1, 2] and await store.claim_chunk("batch_x", "c", 30) is None
    assert await store.chunks_left("batch_x", "a") == (3, 1)
    await store.release_chunks("batch_x", "b")
    assert await store.claim_chunk("batch_x", "c", 0.2) == 1  # given back: taken at once
    await trio.sleep(0.3)
    assert await store.claim_chunk("batch_x", "d", 30) == 1  # c's lease ran out
    await store.chunk_done("batch_x", 1, "c")  # c lost it: nothing changes
    assert await store.chunks_left("batch_x", "d") == (3, 2)
    # rows are kept once, and the counts grow by the new ones only
    await store.add_rows("batch_x", [(1, True, b"r1\n"), (2, False, b"e2\n")])
    await store.add_rows("batch_x", [(1, False, b"again\n"), (3, True, b"r3\n")])
    loaded = await store.load_batch("batch_x")
    assert loaded is not None and loaded.counts == RequestCounts(0, 2, 1)
    assert await store.row_lines("batch_x", 1, 3) == {1, 2}
    out, err = tmp_path / "out", tmp_path / "err"
    assert await store.write_rows("batch_x", out, err) == (2, 1)
    assert out.read_bytes() == b"r1\nr3\n" and err.read_bytes() == b"e2\n"
    assert await store.claim_chunk("batch_x", "a", 30, end=True) == -1
    assert await store.claim_chunk("batch_x", "b", 30, end=True) is None
    await store.put_batch(attrs.evolve(job, status="completed"))
    await store.drop_shared("batch_x")
    assert await store.chunks_left("batch_x", "a") == (0, 0)
    # a replica that found the job active a moment before it ended does not run it again
    assert not await store.add_chunks("batch_x", 3)
    assert await store.claim_chunk("batch_x", "e", 30) is None


async def test_adopted_rows_are_kept_once_and_make_the_counts_exact_while_the_job_is_active(
    tmp_path: Path, shared_store: Store
) -> None:
    store = shared_store
    job = _active_job("batch_y")
    # counts as one braid alone left them: 3 rows in its work files, whatever a replica adds
    await store.add_batch(attrs.evolve(job, counts=RequestCounts(5, 2, 1)))
    assert not await store.was_shared("batch_y")
    await store.add_rows("batch_y", [(2, True, b"r2 replica\n"), (4, True, b"r4\n")])
    await store.adopt_rows("batch_y", [(1, True, b"r1\n"), (2, True, b"r2\n"), (3, False, b"e3\n")])
    loaded = await store.load_batch("batch_y")
    assert loaded is not None and loaded.counts == RequestCounts(5, 3, 1)
    assert await store.was_shared("batch_y")
    out, err = tmp_path / "out", tmp_path / "err"
    assert await store.write_rows("batch_y", out, err) == (3, 1)
    assert out.read_bytes() == b"r1\nr2 replica\nr4\n" and err.read_bytes() == b"e3\n"
    # a job that has ended gets no rows and keeps its counts
    await store.put_batch(attrs.evolve(job, status="completed", counts=RequestCounts(5, 4, 1)))
    await store.drop_shared("batch_y")
    await store.adopt_rows("batch_y", [(5, True, b"r5\n")])
    loaded = await store.load_batch("batch_y")
    assert loaded is not None and loaded.counts == RequestCounts(5, 4, 1)
    assert not await store.was_shared("batch_y")


async def test_an_unreachable_postgresql_is_one_clear_error(tmp_path: Path) -> None:
    options = StoreOptions(storage_dir=str(tmp_path / "store"), database=f"postgresql://nobody@/x?host={tmp_path}")
    with pytest.raises(StoreError, match="--store"):
        async with open_store(options, NOW):
            pass


def test_store_must_be_sqlite_or_a_postgresql_url() -> None:
    assert StoreOptions(database="sqlite").database is None
    with pytest.raises(ValueError, match="postgresql://") as refused:
        StoreOptions(database="mysql://braid:secret@db/x")
    assert "secret" not in str(refused.value)


async def test_a_lost_postgresql_connection_is_a_503_then_opened_again(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    options = StoreOptions(storage_dir=str(tmp_path / "store"), database=postgres.create_database())
    owner = owner_of("k")
    async with open_store(options, NOW) as store:
        f = _file(store, owner)
        await store.add_file(f)
        pid = await store._call(lambda: store._conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        errors: list[None] = []
        store.on_error = lambda: errors.append(None)
        with pytest.raises(StoreUnavailable, match="database"):
            await store.get_file(owner, f.id, NOW)
        assert await store.get_file(owner, f.id, NOW) == f  # the next statement connects again
        assert len(errors) == 1
        # a file whose row cannot be written leaves no bytes behind
        pid = await store._call(lambda: store._conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        lost = _file(store, owner)
        with pytest.raises(StoreUnavailable):
            await store.add_file(lost)
        assert not store.path(lost.id).exists() and store.used_bytes == f.bytes
        assert await store.get_file(owner, f.id, NOW) == f  # connected again
        # and holds the database again: another braid is still refused
        monkeypatch.setattr(db, "HOLD_WAIT", 0.0)
        with pytest.raises(StoreError, match="another braid"):
            async with open_store(StoreOptions(storage_dir=str(tmp_path / "b"), database=options.database), NOW):
                pass


async def test_on_postgresql_a_files_bytes_are_in_the_database_for_a_braid_on_another_disk(
    tmp_path: Path, postgres: Postgres
) -> None:
    import psycopg

    database = postgres.create_database()
    owner = owner_of("k")
    big = bytes(range(256)) * (db.PART_BYTES * 5 // 2 // 256)  # two whole parts and a half
    async with open_store(StoreOptions(storage_dir=str(tmp_path / "a"), database=database), NOW) as store:
        files = [_file(store, owner, data=big), _file(store, owner, data=b""), _file(store, owner, expires=NOW + 5)]
        for f in files:
            await store.add_file(f)

    def parts(file_id: str) -> int:
        with psycopg.connect(database) as conn:
            (count,) = conn.execute("SELECT count(*) FROM file_parts WHERE file_id = %s", (file_id,)).fetchall()
            return int(count[0])

    assert [parts(f.id) for f in files] == [3, 1, 1]
    async with open_store(StoreOptions(storage_dir=str(tmp_path / "b"), database=database), NOW) as other:
        assert not other.path(files[0].id).exists()  # not on this disk until read
        assert (await other.local_path(files[0].id)).read_bytes() == big
        assert (await other.local_path(files[1].id)).read_bytes() == b""
        assert other.used_bytes == len(big) + 1
        assert await other.delete_file(owner, files[0].id)
        assert await other.sweep(NOW + 5) == 1
        assert [parts(f.id) for f in files] == [0, 1, 0]
        assert not (await other.local_path(files[0].id)).exists()  # gone from the database too
        assert list((tmp_path / "b" / "tmp").iterdir()) == []  # a fetch of nothing leaves nothing


async def test_on_sqlite_the_bytes_stay_in_files_only(tmp_path: Path) -> None:
    async with open_store(_options(tmp_path), NOW) as store:
        f = _file(store, owner_of("k"), data=b"abc")
        await store.add_file(f)
        assert await store.local_path(f.id) == store.path(f.id)
    conn = sqlite3.connect(tmp_path / "store" / "store.db")
    assert conn.execute("SELECT count(*) FROM file_parts").fetchone()[0] == 0
