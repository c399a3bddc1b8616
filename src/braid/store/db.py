"""braid's store: metadata in SQLite (or PostgreSQL: ``--store``), file bytes in ``--storage-dir``
(on PostgreSQL, in the database too, ``files/`` keeping a copy of those read here).

The one :class:`Store` of a server is opened by :func:`open_store` for the server's lifetime
(``braid serve`` opens it beside the engine and closes it after the drain); it starts no task of
its own. Layout of the storage directory::

    store.db, store.db-wal, store.db-shm   SQLite in WAL mode: files, batches, responses
                                           (not there with --store postgresql://...)
    files/<id>                             a file's bytes, named by its (random) id (on
                                           PostgreSQL, a copy of the database's file_parts)
    tmp/                                   uploads still arriving (emptied at open)
    jobs/<batch id>.{output,error}.jsonl   a running job's results, appended as they come

**Threads.** The connection is used by one worker thread at a time: every call goes through
``trio.to_thread.run_sync`` under the store's own limiter of 1, so SQL never runs on the event
loop and never on two threads at once. A call is not abandoned when the calling task is
cancelled (Trio waits for the thread), so a statement is never cut in half.

**Schema.** Versioned (:mod:`braid.store.sql`: SQLite's ``user_version``, or a table on
PostgreSQL): :data:`MIGRATIONS` holds each version's statements, written in SQLite's dialect and
applied in order at open. A database newer than this braid is refused at open
(:class:`StoreError`), never guessed at. A statement the database fails raises
:class:`~braid.errors.StoreUnavailable` (503).

**Consistency.** A file's bytes are written under ``tmp/``, moved into ``files/`` and only then
its row inserted; deleting removes the row first, then the bytes. A crash between the two steps
leaves bytes without a row, which the store deletes at open. Expired files are deleted by
:meth:`Store.sweep`: at open, and before each upload, list and new job (no background task of
its own); reads never return an expired file. Jobs are never deleted (their rows are small);
their files expire as every file does.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from braid.errors import StorageFull, StoreUnavailable
from braid.store.options import StoreOptions
from braid.store.records import (
    ACTIVE_STATUSES,
    BatchError,
    BatchRecord,
    BatchTimes,
    BatchUsage,
    FileRecord,
    RequestCounts,
    StoredResponse,
)
from braid.store.sql import FILES_LOCK, Connection, DatabaseHeld, StoreError, connect

T = TypeVar("T")

log = logging.getLogger("braid.store")

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: files and batches. ``seq`` orders lists (newest first) and is the ``after`` cursor's
    # position; ids are random and say nothing about order.
    (
        """CREATE TABLE files (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            owner TEXT NOT NULL,
            filename TEXT NOT NULL,
            purpose TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER
        )""",
        "CREATE INDEX files_by_owner ON files (owner, seq)",
        "CREATE INDEX files_by_expiry ON files (expires_at) WHERE expires_at IS NOT NULL",
        """CREATE TABLE batches (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            owner TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            input_file_id TEXT NOT NULL,
            completion_window TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            total INTEGER NOT NULL,
            completed INTEGER NOT NULL,
            failed INTEGER NOT NULL,
            metadata TEXT NOT NULL,
            errors TEXT NOT NULL,
            times TEXT NOT NULL,
            output_file_id TEXT,
            error_file_id TEXT,
            model TEXT
        )""",
        "CREATE INDEX batches_by_owner ON batches (owner, seq)",
        "CREATE INDEX batches_by_status ON batches (status)",
    ),
    # 2: a job's token usage, summed when it ends (JSON; NULL before).
    ("ALTER TABLE batches ADD COLUMN usage TEXT",),
    # 3: stored /v1/responses answers. An id is the owner's (a client may name its response:
    # request_id), so two owners' responses may share one.
    (
        """CREATE TABLE responses (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            owner TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            body BLOB NOT NULL,
            messages BLOB NOT NULL,
            UNIQUE (owner, id)
        )""",
        "CREATE INDEX responses_by_expiry ON responses (expires_at)",
    ),
    # 4: a job's output_expires_after (seconds; NULL: the server's file retention).
    ("ALTER TABLE batches ADD COLUMN output_expires_after INTEGER",),
    # 5: a file's bytes, in parts of PART_BYTES, written with its row (PostgreSQL only: there a
    # braid on another disk serves the files; on SQLite the database and files/ share a disk,
    # and the table stays empty).
    (
        """CREATE TABLE file_parts (
            file_id TEXT NOT NULL,
            part INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (file_id, part)
        )""",
    ),
    # 6: jobs shared by replicas (--store-shared, PostgreSQL only; empty otherwise). A job's lines
    # in chunks claimed with a lease (chunk -1: its end, claimed by the replica that finalizes),
    # and its rows, one per line, whichever replica ran it.
    (
        """CREATE TABLE batch_chunks (
            batch_id TEXT NOT NULL,
            chunk INTEGER NOT NULL,
            holder TEXT,
            lease_until INTEGER NOT NULL,
            done INTEGER NOT NULL,
            PRIMARY KEY (batch_id, chunk)
        )""",
        """CREATE TABLE batch_rows (
            batch_id TEXT NOT NULL,
            line INTEGER NOT NULL,
            ok INTEGER NOT NULL,
            row BLOB NOT NULL,
            PRIMARY KEY (batch_id, line)
        )""",
    ),
)
"""Each schema version's statements; the database's ``user_version`` is how many have run."""

SCHEMA_VERSION = len(MIGRATIONS)

PART_BYTES = 1 << 20
"""Bytes of a file per row of ``file_parts``: a part is one statement's parameter, and a file is
never held whole in memory, on its way in or out."""


_RESPONSE_SIZE = "length(body) + length(messages)"
"""A stored response's bytes, as the cap counts them."""

_FILE_COLUMNS = "id, owner, filename, purpose, bytes, created_at, expires_at"
_BATCH_COLUMNS = (
    "id, owner, endpoint, input_file_id, completion_window, status, created_at, expires_at, "
    "total, completed, failed, metadata, errors, times, output_file_id, error_file_id, model, usage, "
    "output_expires_after"
)


_PART = "SELECT data FROM file_parts WHERE file_id = ? AND part = ?"
_NOW_MS = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
"""The database's clock in ms (PostgreSQL's): the one clock every replica's lease is read by."""


def _file(row: Sequence[Any]) -> FileRecord:
    return FileRecord(*row)


def _batch_row(b: BatchRecord) -> tuple[Any, ...]:
    return (
        b.id,
        b.owner,
        b.endpoint,
        b.input_file_id,
        b.completion_window,
        b.status,
        b.created_at,
        b.expires_at,
        b.counts.total,
        b.counts.completed,
        b.counts.failed,
        json.dumps([list(kv) for kv in b.metadata]),
        json.dumps([attrs.asdict(e) for e in b.errors]),
        json.dumps(attrs.asdict(b.times)),
        b.output_file_id,
        b.error_file_id,
        b.model,
        None if b.usage is None else json.dumps(attrs.asdict(b.usage)),
        b.output_expires_after,
    )


def _batch(row: Sequence[Any]) -> BatchRecord:
    (id_, owner, endpoint, input_file_id, window, status, created, expires, total, completed, failed) = row[:11]
    metadata, errors, times, output_file_id, error_file_id, model, usage, output_expires_after = row[11:]
    return BatchRecord(
        id=id_,
        owner=owner,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=window,
        status=status,
        created_at=created,
        expires_at=expires,
        counts=RequestCounts(total, completed, failed),
        metadata=tuple((k, v) for k, v in json.loads(metadata)),
        errors=tuple(BatchError(**e) for e in json.loads(errors)),
        times=BatchTimes(**json.loads(times)),
        output_file_id=output_file_id,
        error_file_id=error_file_id,
        model=model,
        usage=None if usage is None else BatchUsage(**json.loads(usage)),
        output_expires_after=output_expires_after,
    )


def _migrate(conn: Connection) -> None:
    version = conn.schema_version()
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the store's database has schema version {version}, newer than this braid's {SCHEMA_VERSION}: "
            "run a newer braid, or point --storage-dir (--store) elsewhere"
        )
    conn.migrate(MIGRATIONS)


class Store:
    """braid's store (see the module's contract). Made by :func:`open_store`."""

    def __init__(self, conn: Connection, root: Path, options: StoreOptions) -> None:
        self._conn = conn
        self.root = root
        self.options = options
        self._limiter = trio.CapacityLimiter(1)
        self._files = root / "files"
        self._tmp = root / "tmp"
        self._jobs = root / "jobs"
        self._reserved = 0
        """Bytes of uploads still arriving, counted against the total-space cap."""
        self._used = 0
        """Bytes of every stored file (kept with the rows: :meth:`add_file`, :meth:`_drop_files`)."""
        self._response_bytes = 0
        """Bytes of every stored response (kept with the rows, on the store's thread)."""
        self._swept_at = -1
        """The ``now`` of the last sweep: a sweep at the same second has nothing more to delete."""
        self._parts = conn.kind == "postgresql"
        """Whether files' bytes are in the database too (``file_parts``), ``files/`` their copy here."""
        self.on_error: Callable[[], object] = lambda: None
        """Called once per call the database failed (the app counts them: ``braid_store_errors_total``)."""

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except StoreUnavailable:
            self.on_error()
            raise

    # --- bytes ------------------------------------------------------------------------------

    def path(self, file_id: str) -> Path:
        """Where a file's bytes are. Ids are made by braid (:func:`~braid.store.records.new_id`,
        URL-safe base64), never by a client, so an id is always one plain file name."""
        return self._files / file_id

    async def local_path(self, file_id: str) -> Path:
        """Where a file's bytes are on this machine, to be read. On PostgreSQL, ``files/`` is a
        copy: a file it lacks (this braid's disk is not the one that stored it) is fetched from
        the database first, a part at a time, and kept. :class:`FileNotFoundError` from the
        caller's open when the file has no bytes (deleted a moment ago)."""
        target = self.path(file_id)
        if not self._parts:
            return target

        def fetch() -> Path:
            if target.exists():
                return target
            partial = self._tmp / f"{file_id}.{secrets.token_hex(4)}"
            try:
                with open(partial, "wb") as out:
                    part = 0
                    while (row := self._conn.execute(_PART, (file_id, part)).fetchone()) is not None:
                        out.write(row[0])
                        part += 1
                if part:  # else no bytes: the caller's open raises FileNotFoundError
                    os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
            return target

        return await self._call(fetch)

    def temp_path(self, file_id: str) -> Path:
        """Where a file's bytes are written before the file exists (:meth:`add_file` moves them)."""
        return self._tmp / file_id

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes of an upload against the total-space cap; False (nothing
        counted) if they do not fit."""
        if self._used + self._reserved + size > self.options.max_storage_bytes:
            return False
        self._reserved += size
        return True

    def release(self, size: int) -> None:
        """Uncount bytes :meth:`reserve` counted (the upload ended, stored or not)."""
        self._reserved -= size

    @property
    def used_bytes(self) -> int:
        return self._used

    # --- files ------------------------------------------------------------------------------

    async def add_file(self, record: FileRecord, *, written: Path | None = None, capped: bool = False) -> None:
        """Store a file whose bytes are at ``written`` (default: its :meth:`temp_path`): the bytes
        are moved into place, then the row is inserted (on PostgreSQL with the bytes' parts, in
        one transaction: a file is never listed whose bytes another braid cannot read).

        ``capped`` (an upload, which :meth:`reserve` counted against this braid's view of the
        total): with ``--store-shared``, the cap is checked again against the database's total,
        under a lock the replicas share, and a file that would pass it raises
        :class:`~braid.errors.StorageFull`, stored nowhere. (Each replica's own view is only as
        fresh as its last sweep, so two uploads at once on two replicas could both fit it.)"""
        source = written or self.temp_path(record.id)
        check = capped and self.options.shared

        def add() -> None:
            os.replace(source, self.path(record.id))
            try:
                with self._conn.transaction():
                    if check:
                        self._check_cap(record.bytes)
                    if self._parts:
                        self._put_parts(record.id, self.path(record.id))
                    self._conn.execute(
                        f"INSERT INTO files ({_FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", attrs.astuple(record)
                    )
            except (StoreUnavailable, StorageFull):
                # No row: the bytes must not stay (the open's sweep would find them only at the
                # next start, and they count against no cap meanwhile).
                self.path(record.id).unlink(missing_ok=True)
                raise
            self._used += record.bytes

        await self._call(add)

    def _check_cap(self, size: int) -> None:
        """In an open transaction: wait for the replicas' files lock (held to the transaction's
        end, so the next upload counts this one), then refuse ``size`` more bytes past the cap."""
        self._conn.execute("SELECT pg_advisory_xact_lock(?)", (FILES_LOCK,))
        (used,) = self._conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM files").fetchone()
        self._used = int(used)
        if self._used + size > self.options.max_storage_bytes:
            raise StorageFull()

    def _put_parts(self, file_id: str, path: Path) -> None:
        """A file's bytes into ``file_parts`` (at least one part: an empty file has one empty
        part, so "no part" always means "no bytes")."""
        with open(path, "rb") as source:
            part = 0
            while True:
                data = source.read(PART_BYTES)
                if part and not data:
                    return
                self._conn.execute(
                    "INSERT INTO file_parts (file_id, part, data) VALUES (?, ?, ?)", (file_id, part, data)
                )
                part += 1
                if len(data) < PART_BYTES:
                    return

    def _drop_parts(self, rows: Sequence[Sequence[Any]]) -> None:
        if self._parts:
            for file_id, _ in rows:
                self._conn.execute("DELETE FROM file_parts WHERE file_id = ?", (file_id,))

    async def get_file(self, owner: str, file_id: str, now: int) -> FileRecord | None:
        """The owner's file of this id, unless it expired; None otherwise (another owner's
        file is None too: its existence is not told)."""
        row = await self._call(
            lambda: self._conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM files WHERE id = ? AND owner = ? AND (expires_at IS NULL OR expires_at > ?)",
                (file_id, owner, now),
            ).fetchone()
        )
        return None if row is None else _file(row)

    async def list_files(
        self, owner: str, now: int, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[FileRecord], bool]:
        """One page of the owner's files (not expired) and whether more follow it. ``after``:
        an id of the owner's from a previous page (one that is gone or unknown starts from the
        beginning, as an empty cursor)."""
        # An unknown cursor compares every row with itself one step back: the first page.
        sign, order, unknown = ("<", "DESC", "seq + 1") if newest_first else (">", "ASC", "seq - 1")

        def page() -> list[Any]:
            sql = f"SELECT {_FILE_COLUMNS} FROM files WHERE owner = ? AND (expires_at IS NULL OR expires_at > ?)"
            args: list[Any] = [owner, now]
            if purpose is not None:
                sql += " AND purpose = ?"
                args.append(purpose)
            if after is not None:
                sql += f" AND seq {sign} COALESCE((SELECT seq FROM files WHERE id = ? AND owner = ?), {unknown})"
                args += [after, owner]
            sql += f" ORDER BY seq {order} LIMIT ?"
            args.append(limit + 1)
            return self._conn.execute(sql, args).fetchall()

        rows = await self._call(page)
        return [_file(r) for r in rows[:limit]], len(rows) > limit

    async def delete_file(self, owner: str, file_id: str) -> bool:
        """Delete the owner's file (row, then bytes); False when the owner has none of this id."""

        def delete() -> bool:
            with self._conn.transaction():
                row = self._conn.execute(
                    "DELETE FROM files WHERE id = ? AND owner = ? RETURNING id, bytes", (file_id, owner)
                ).fetchone()
                if row is None:
                    return False
                self._drop_parts([row])
            self._unlink([row])
            return True

        return await self._call(delete)

    def _unlink(self, rows: Sequence[Sequence[Any]]) -> None:
        for file_id, size in rows:
            self._used -= size
            self.path(file_id).unlink(missing_ok=True)

    # --- responses --------------------------------------------------------------------------

    async def put_response(self, record: StoredResponse, now: int) -> bool:
        """Keep a response (one of the same owner and id is replaced, as a client that names
        its responses reuses a name), after deleting the expired ones: every write sweeps, so
        the table holds at most what the retention lets in. Past ``max_response_bytes`` the
        oldest responses are deleted to make room. False: not stored (larger than the cap
        alone)."""
        row = (record.id, record.owner, record.created_at, record.expires_at, record.body, record.messages)
        size = len(record.body) + len(record.messages)
        cap = self.options.max_response_bytes

        def put() -> bool:
            conn = self._conn
            freed = conn.execute(f"DELETE FROM responses WHERE expires_at <= ? RETURNING {_RESPONSE_SIZE}", (now,))
            gone = sum(r[0] for r in freed.fetchall())
            same = conn.execute(
                f"DELETE FROM responses WHERE id = ? AND owner = ? RETURNING {_RESPONSE_SIZE}",
                (record.id, record.owner),
            )
            gone += sum(r[0] for r in same.fetchall())
            self._response_bytes -= gone
            if size > cap:
                return False
            while self._response_bytes + size > cap:
                oldest = conn.execute(
                    f"DELETE FROM responses WHERE seq = (SELECT MIN(seq) FROM responses) RETURNING {_RESPONSE_SIZE}"
                ).fetchall()
                if not oldest:
                    break
                self._response_bytes -= sum(r[0] for r in oldest)
            conn.execute(
                "INSERT INTO responses (id, owner, created_at, expires_at, body, messages) VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
            self._response_bytes += size
            return True

        return await self._call(put)

    async def get_response(self, owner: str, response_id: str, now: int) -> StoredResponse | None:
        """The owner's response of this id, unless it expired; None otherwise (another owner's
        is None too)."""
        row = await self._call(
            lambda: self._conn.execute(
                "SELECT id, owner, created_at, expires_at, body, messages FROM responses "
                "WHERE id = ? AND owner = ? AND expires_at > ?",
                (response_id, owner, now),
            ).fetchone()
        )
        return None if row is None else StoredResponse(row[0], row[1], row[2], row[3], bytes(row[4]), bytes(row[5]))

    async def delete_response(self, owner: str, response_id: str) -> bool:
        """Delete the owner's response; False when the owner has none of this id."""

        def delete() -> bool:
            row = self._conn.execute(
                f"DELETE FROM responses WHERE id = ? AND owner = ? RETURNING {_RESPONSE_SIZE}", (response_id, owner)
            ).fetchone()
            if row is None:
                return False
            self._response_bytes -= row[0]
            return True

        return await self._call(delete)

    # --- batches ----------------------------------------------------------------------------

    async def add_batch(self, record: BatchRecord) -> None:
        row = _batch_row(record)
        marks = ", ".join("?" * len(row))
        await self._call(lambda: self._conn.execute(f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES ({marks})", row))

    async def put_batch(self, record: BatchRecord) -> None:
        """Replace a job's row with ``record`` (same id)."""
        row = _batch_row(record)
        sets = ", ".join(f"{c.strip()} = ?" for c in _BATCH_COLUMNS.split(","))
        await self._call(lambda: self._conn.execute(f"UPDATE batches SET {sets} WHERE id = ?", (*row, record.id)))

    async def get_batch(self, owner: str, batch_id: str) -> BatchRecord | None:
        row = await self._call(
            lambda: self._conn.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)
            ).fetchone()
        )
        return None if row is None else _batch(row)

    async def load_batch(self, batch_id: str) -> BatchRecord | None:
        """A job whoever owns it (the runner's view)."""
        row = await self._call(
            lambda: self._conn.execute(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,)).fetchone()
        )
        return None if row is None else _batch(row)

    async def active_batches(self) -> list[BatchRecord]:
        """Every owner's jobs that have work or their end still to come, oldest first."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        rows = await self._call(
            lambda: self._conn.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status IN ({marks}) ORDER BY seq", ACTIVE_STATUSES
            ).fetchall()
        )
        return [_batch(r) for r in rows]

    async def set_counts(self, batch_id: str, completed: int, failed: int) -> None:
        """A job's progress, and nothing else of its row."""
        await self._call(
            lambda: self._conn.execute(
                "UPDATE batches SET completed = ?, failed = ? WHERE id = ?", (completed, failed, batch_id)
            )
        )

    async def move_batch(self, record: BatchRecord, *, unless: tuple[str, ...]) -> bool:
        """Replace a job's row with ``record`` unless its status now is one of ``unless`` (then
        nothing changes, and False): a change that must not undo one made meanwhile."""
        row = _batch_row(record)
        sets = ", ".join(f"{c.strip()} = ?" for c in _BATCH_COLUMNS.split(","))
        marks = ", ".join("?" * len(unless))

        def move() -> bool:
            cur = self._conn.execute(
                f"UPDATE batches SET {sets} WHERE id = ? AND status NOT IN ({marks})", (*row, record.id, *unless)
            )
            return cur.rowcount == 1

        return await self._call(move)

    def work_path(self, batch_id: str, kind: str) -> Path:
        """A running job's output (``kind`` "output") or error ("error") lines, appended as they
        come; they become the job's files when it ends (:mod:`braid.batch.runner`)."""
        return self._jobs / f"{batch_id}.{kind}.jsonl"

    async def file_exists(self, file_id: str) -> bool:
        row = await self._call(lambda: self._conn.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone())
        return row is not None

    async def list_batches(self, owner: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        """One page of the owner's jobs, newest first, and whether more follow (``after`` as for files)."""

        def page() -> list[Any]:
            sql = f"SELECT {_BATCH_COLUMNS} FROM batches WHERE owner = ?"
            args: list[Any] = [owner]
            if after is not None:
                sql += " AND seq < COALESCE((SELECT seq FROM batches WHERE id = ? AND owner = ?), seq + 1)"
                args += [after, owner]
            sql += " ORDER BY seq DESC LIMIT ?"
            args.append(limit + 1)
            return self._conn.execute(sql, args).fetchall()

        rows = await self._call(page)
        return [_batch(r) for r in rows[:limit]], len(rows) > limit

    # --- jobs shared by replicas (--store-shared: PostgreSQL) --------------------------------

    async def add_chunks(self, batch_id: str, chunks: int) -> bool:
        """A job's chunks ``0 .. chunks - 1`` and its end (-1), unclaimed, unless they exist
        (every replica that starts the job adds them); False, adding none, when the job has
        ended (a replica that found it active a moment ago must not run it again)."""

        def add() -> bool:
            # The end is added with the rest, in one transaction: when it exists, they all do.
            # Read before the status: the replica that ends a job stores its status, then drops
            # its chunks, so chunks found missing here with the status still active mean a new job.
            if self._conn.execute(
                "SELECT 1 FROM batch_chunks WHERE batch_id = ? AND chunk = -1", (batch_id,)
            ).fetchone():
                return True
            status = self._conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if status is None or status[0] not in ACTIVE_STATUSES:
                return False
            with self._conn.transaction():
                for chunk in range(-1, chunks):
                    self._conn.execute(
                        "INSERT INTO batch_chunks (batch_id, chunk, holder, lease_until, done) "
                        "VALUES (?, ?, NULL, 0, 0) ON CONFLICT DO NOTHING",
                        (batch_id, chunk),
                    )
            return True

        return await self._call(add)

    async def claim_chunk(self, batch_id: str, holder: str, lease: float, *, end: bool = False) -> int | None:
        """Claim for ``lease`` seconds the first chunk of the job not done and free (never
        claimed, released, or its lease run out), or with ``end`` the job's end; None when none
        is. Replicas claiming at once each get another (``SKIP LOCKED``); time is the
        database's, so the replicas' clocks need not agree."""
        which = "chunk = -1" if end else "chunk >= 0"
        sql = (
            f"UPDATE batch_chunks SET holder = ?, lease_until = {_NOW_MS} + ? "
            "WHERE batch_id = ? AND chunk = (SELECT chunk FROM batch_chunks "
            f"WHERE batch_id = ? AND {which} AND done = 0 AND (holder IS NULL OR lease_until < {_NOW_MS}) "
            "ORDER BY chunk LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING chunk"
        )
        args = (holder, int(lease * 1000), batch_id, batch_id)
        row = await self._call(lambda: self._conn.execute(sql, args).fetchone())
        return None if row is None else int(row[0])

    async def renew_chunks(self, batch_id: str, holder: str, lease: float) -> None:
        """Extend the leases of every chunk of the job that ``holder`` holds and has not done."""
        await self._call(
            lambda: self._conn.execute(
                f"UPDATE batch_chunks SET lease_until = {_NOW_MS} + ? WHERE batch_id = ? AND holder = ? AND done = 0",
                (int(lease * 1000), batch_id, holder),
            )
        )

    async def release_chunks(self, batch_id: str, holder: str) -> None:
        """Give up ``holder``'s chunks of the job not done, for another replica to take at once."""
        await self._call(
            lambda: self._conn.execute(
                "UPDATE batch_chunks SET holder = NULL, lease_until = 0 WHERE batch_id = ? AND holder = ? AND done = 0",
                (batch_id, holder),
            )
        )

    async def chunk_done(self, batch_id: str, chunk: int, holder: str) -> None:
        """Every line of the chunk has its row. (A holder whose lease was taken over changes
        nothing: the new holder marks it.)"""
        await self._call(
            lambda: self._conn.execute(
                "UPDATE batch_chunks SET done = 1 WHERE batch_id = ? AND chunk = ? AND holder = ?",
                (batch_id, chunk, holder),
            )
        )

    async def chunks_left(self, batch_id: str, holder: str) -> tuple[int, int]:
        """The job's chunks not done, and of them those another replica holds a live lease on."""
        row = await self._call(
            lambda: self._conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE holder IS NOT NULL AND holder <> ? "
                f"AND lease_until >= {_NOW_MS}) FROM batch_chunks WHERE batch_id = ? AND chunk >= 0 AND done = 0",
                (holder, batch_id),
            ).fetchone()
        )
        return int(row[0]), int(row[1])

    async def add_rows(self, batch_id: str, rows: Sequence[tuple[int, bool, bytes]], *, count: bool = True) -> None:
        """A job's rows (line number, answered 200, the row), each kept once: a line whose row
        exists (its chunk taken over from a replica that had run it) keeps the first. With
        ``count``, the job's counts grow by the rows that were new, in the same transaction."""

        def add() -> None:
            with self._conn.transaction():
                added = self._insert_rows(batch_id, rows)
                completed = sum(ok for (ok,) in added)
                failed = len(added) - completed
                if count and (completed or failed):
                    self._conn.execute(
                        "UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?",
                        (completed, failed, batch_id),
                    )

        await self._call(add)

    def _insert_rows(self, batch_id: str, rows: Sequence[tuple[int, bool, bytes]]) -> list[tuple[int]]:
        """In an open transaction: a job's rows, each kept once (a line that has a row keeps it);
        the ``ok`` of each row that was new. One statement for the rows, not one each (shared
        jobs are PostgreSQL's only)."""
        return self._conn.execute(
            "INSERT INTO batch_rows (batch_id, line, ok, row) "
            "SELECT ?, * FROM unnest(?::bigint[], ?::bigint[], ?::bytea[]) "
            "ON CONFLICT DO NOTHING RETURNING ok",
            (batch_id, [r[0] for r in rows], [int(r[1]) for r in rows], [r[2] for r in rows]),
        ).fetchall()

    async def adopt_rows(self, batch_id: str, rows: Sequence[tuple[int, bool, bytes]]) -> None:
        """Rows a braid wrote for a job before it shared it (its work files), kept as
        :meth:`add_rows` keeps them; the job's counts become its rows' (they counted the same
        rows, and any a replica added meanwhile). Nothing, if the job has ended."""

        def adopt() -> None:
            with self._conn.transaction():
                # The job's row locked first: a job ended meanwhile (its rows written to its files
                # and dropped) must not get rows or counts again.
                status = self._conn.execute(
                    "SELECT status FROM batches WHERE id = ? FOR UPDATE", (batch_id,)
                ).fetchone()
                if status is None or status[0] not in ACTIVE_STATUSES:
                    return
                for start in range(0, len(rows), 1000):
                    self._insert_rows(batch_id, rows[start : start + 1000])
                self._conn.execute(
                    "UPDATE batches SET completed = (SELECT count(*) FROM batch_rows WHERE batch_id = ? AND ok = 1), "
                    "failed = (SELECT count(*) FROM batch_rows WHERE batch_id = ? AND ok = 0) WHERE id = ?",
                    (batch_id, batch_id, batch_id),
                )

        await self._call(adopt)

    async def was_shared(self, batch_id: str) -> bool:
        """Whether replicas sharing the job have left chunks or rows of it (the job is then
        run by one braid: its rows are taken out with :meth:`write_rows`)."""
        row = await self._call(
            lambda: self._conn.execute(
                "SELECT EXISTS (SELECT 1 FROM batch_chunks WHERE batch_id = ?) "
                "OR EXISTS (SELECT 1 FROM batch_rows WHERE batch_id = ?)",
                (batch_id, batch_id),
            ).fetchone()
        )
        return bool(row[0])

    async def row_lines(self, batch_id: str, first: int, end: int) -> set[int]:
        """The line numbers in ``first .. end - 1`` that have a row."""
        rows = await self._call(
            lambda: self._conn.execute(
                "SELECT line FROM batch_rows WHERE batch_id = ? AND line >= ? AND line < ?", (batch_id, first, end)
            ).fetchall()
        )
        return {int(r[0]) for r in rows}

    async def write_rows(self, batch_id: str, out_path: Path, err_path: Path) -> tuple[int, int]:
        """The job's rows, in line order, written to ``out_path`` (200s) and ``err_path`` (the
        rest), a page at a time; how many of each."""

        def write() -> tuple[int, int]:
            counts = [0, 0]
            after = -(2**62)
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                while True:
                    page = self._conn.execute(
                        "SELECT line, ok, row FROM batch_rows WHERE batch_id = ? AND line > ? ORDER BY line LIMIT 1000",
                        (batch_id, after),
                    ).fetchall()
                    if not page:
                        return counts[1], counts[0]
                    for _, ok, row in page:
                        (out if ok else err).write(bytes(row))
                        counts[bool(ok)] += 1
                    after = page[-1][0]

        return await self._call(write)

    async def drop_shared(self, batch_id: str) -> None:
        """A finished job's chunks and rows (its files hold the rows now)."""

        def drop() -> None:
            with self._conn.transaction():
                self._conn.execute("DELETE FROM batch_rows WHERE batch_id = ?", (batch_id,))
                self._conn.execute("DELETE FROM batch_chunks WHERE batch_id = ?", (batch_id,))

        await self._call(drop)

    # --- retention ----------------------------------------------------------------------------

    async def sweep(self, now: int) -> int:
        """Delete expired files (rows, then bytes) and expired responses; return how many files went. (A job past its window
        is the runner's to end: :mod:`braid.batch.runner`.)"""

        if now <= self._swept_at:
            # Nothing has expired since (a row's expiry is fixed and every retention is at
            # least a second): a job's status polled many times a second costs no thread hop.
            await trio.lowlevel.checkpoint()
            return 0

        def sweep() -> int:
            with self._conn.transaction():
                rows = self._conn.execute(
                    "DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? RETURNING id, bytes", (now,)
                ).fetchall()
                self._drop_parts(rows)
            self._unlink(rows)
            freed = self._conn.execute(
                f"DELETE FROM responses WHERE expires_at <= ? RETURNING {_RESPONSE_SIZE}", (now,)
            ).fetchall()
            self._response_bytes -= sum(r[0] for r in freed)
            if self.options.shared:
                # Other replicas store and delete too: the caps count what the database holds.
                self._count_bytes()
            self._swept_at = max(self._swept_at, now)
            return len(rows)

        return await self._call(sweep)

    def _open_sweep(self) -> None:
        """At open: empty ``tmp/`` (uploads a crash cut short), delete bytes without a row, and
        count the bytes stored."""
        for leftover in self._tmp.iterdir():
            leftover.unlink(missing_ok=True)
        known = {fid for (fid,) in self._conn.execute("SELECT id FROM files")}
        for stored in self._files.iterdir():
            if stored.name not in known:
                stored.unlink(missing_ok=True)
        self._count_bytes()

    def _count_bytes(self) -> None:
        """The bytes of every file and every stored response, as the database has them."""
        files = self._conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM files").fetchone()
        self._used = int(files[0])
        total = self._conn.execute(f"SELECT COALESCE(SUM({_RESPONSE_SIZE}), 0) FROM responses").fetchone()
        self._response_bytes = int(total[0])

    @property
    def response_bytes(self) -> int:
        """Bytes of the stored responses (bodies and conversations)."""
        return self._response_bytes

    def close(self) -> None:
        self._conn.close()


@asynccontextmanager
async def open_store(options: StoreOptions, now: int) -> AsyncIterator[Store]:
    """Open (creating it if need be) the store under ``options.storage_dir``, migrate its schema,
    sweep it, and close it on exit. :class:`StoreError` for a directory braid cannot use or a
    database it cannot read."""
    root = Path(options.storage_dir)

    def prepare() -> Connection:
        try:
            for d in (root, root / "files", root / "tmp", root / "jobs"):
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StoreError(f"cannot use the storage directory {root} (--storage-dir): {exc}") from None
        try:
            conn = connect(options.database, root)
        except StoreUnavailable as exc:
            where = "--store" if options.database else f"the storage directory {root} (--storage-dir)"
            raise StoreError(f"cannot use {where}: {exc.message}") from None
        try:
            _migrate(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, StoreUnavailable):
                raise StoreError(f"cannot open the store: {exc.message}") from None
            raise
        return conn

    conn = await trio.to_thread.run_sync(prepare)
    try:
        await _hold(conn, options.shared)
        store = Store(conn, root, options)
        await trio.to_thread.run_sync(store._open_sweep)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(conn.close)
        if isinstance(exc, StoreUnavailable):
            raise StoreError(f"cannot open the store: {exc.message}") from None
        raise
    try:
        await store.sweep(now)
        yield store
    finally:
        with trio.CancelScope(shield=True):
            await store._call(store.close)


HOLD_WAIT = 30.0
"""Seconds :func:`open_store` waits for a PostgreSQL database another braid holds: long enough
for PostgreSQL to end the session of a braid whose machine died (its keepalives: about 25 s)."""


async def _hold(conn: Connection, shared: bool) -> None:
    deadline = trio.current_time() + HOLD_WAIT
    told = False
    while True:
        try:
            await trio.to_thread.run_sync(lambda: conn.hold(shared=shared))
            return
        except DatabaseHeld:
            left = deadline - trio.current_time()
            if left <= 0:
                raise
            if not told:
                log.warning("another braid holds the store's database (--store); waiting up to %g s", HOLD_WAIT)
                told = True
            await trio.sleep(min(1.0, left))


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Store", "StoreError", "open_store"]
