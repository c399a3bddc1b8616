"""The two databases braid's store speaks: SQLite under ``--storage-dir`` (the default) and
PostgreSQL at ``--store postgresql://...``, behind one small connection type.

:mod:`braid.store.db` writes each statement once, in SQLite's dialect with ``?`` placeholders,
and runs it through :meth:`Connection.execute`, whose cursor has ``fetchone``, ``fetchall``,
``rowcount`` and iteration on both. What differs is kept here:

* **placeholders:** PostgreSQL's driver (psycopg) takes ``%s``; each statement is rewritten once
  and cached (the store's statements contain no ``?`` or ``%`` of their own);
* **the schema's types:** an ``INTEGER PRIMARY KEY AUTOINCREMENT`` key becomes an identity
  column, ``INTEGER`` a ``BIGINT``, ``BLOB`` a ``BYTEA`` (:func:`postgres_ddl`);
* **the schema's version:** SQLite's ``user_version``; on PostgreSQL a one-row table
  ``braid_schema``, read and advanced under a transaction-scoped advisory lock, so that replicas
  opening one database at once migrate it once;
* **errors:** a statement the database fails (PostgreSQL unreachable, a disk full) raises
  :class:`~braid.errors.StoreUnavailable`, a 503, never the driver's own exception. A broken
  PostgreSQL connection is opened again for the next statement; the failed one is not retried,
  since it may have been applied.

Threads: a connection is used by one thread at a time (the store's limiter), never by two.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from braid.errors import StoreUnavailable


class StoreError(Exception):
    """The store cannot be opened (a directory braid cannot write, a database it cannot reach,
    a database of a newer braid)."""


class DatabaseHeld(StoreUnavailable):
    """Another braid holds the PostgreSQL database (:meth:`PostgresConnection.hold`)."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What :class:`~braid.store.db.Store` needs of a database."""

    kind: str
    """``"sqlite"`` or ``"postgresql"``."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def schema_version(self) -> int: ...

    def transaction(self) -> AbstractContextManager[None]:
        """The statements run inside as one: all applied, or (an error, raised) none."""

    def migrate(self, migrations: Sequence[Sequence[str]]) -> None:
        """Run the migrations after the database's version, in transactions (a failed one leaves
        the version before it)."""

    def hold(self, *, shared: bool = False) -> None:
        """Take the database for this braid alone, or with ``shared`` with the other replicas of
        ``--store-shared`` only; :class:`DatabaseHeld` when a braid it cannot share with has it."""

    def close(self) -> None: ...


class SqliteConnection:
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        # isolation_level=None: no implicit transactions; each write is one statement, or an
        # explicit transaction (migrate). check_same_thread=False: Trio may hand the calls to
        # different worker threads, one at a time (the store's limiter).
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
            self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL under WAL: a committed transaction survives a crash of braid (not always a
            # power cut); the bytes of the files themselves are what a job's output depends on.
            self._conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the store's database failed: {exc}") from exc

    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.rollback()
            raise
        self.execute("COMMIT")

    def migrate(self, migrations: Sequence[Sequence[str]]) -> None:
        try:
            self._migrate(migrations)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the store's database failed: {exc}") from exc

    def _migrate(self, migrations: Sequence[Sequence[str]]) -> None:
        for number in range(self.schema_version(), len(migrations)):
            with self.transaction():  # a failed migration leaves the previous version
                for statement in migrations[number]:
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {number + 1}")

    def hold(self, *, shared: bool = False) -> None:
        pass  # the database is a file in this braid's own --storage-dir

    def close(self) -> None:
        self._conn.close()


def postgres_ddl(statement: str) -> str:
    """A schema statement of :data:`braid.store.db.MIGRATIONS` in PostgreSQL's types."""
    return (
        statement.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
        .replace("INTEGER", "BIGINT")
        .replace("BLOB", "BYTEA")
    )


_MIGRATION_LOCK = 0x627261696400  # pg_advisory_xact_lock's key for braid's migrations ("braid\0")
_HOLDER_LOCK = 0x627261696401  # pg_try_advisory_lock's key of the braid that uses the database
FILES_LOCK = 0x627261696402
"""pg_advisory_xact_lock's key under which replicas sharing a database add uploaded files, so
that the total-space cap is checked against the database's own total, one upload at a time."""


class PostgresConnection:
    kind = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg  # only for a PostgreSQL store

        self._psycopg = psycopg
        self._url = url
        self._sql: dict[str, str] = {}
        self._lock = threading.Lock()
        self._holding: bool | None = None
        """None: not held; else whether held shared (:meth:`hold`)."""
        self._conn = self._connect()

    def _connect(self) -> Any:
        try:
            conn = self._psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"the store's database cannot be reached: {exc}") from exc
        try:
            # The server's side of this session's TCP keepalives (ignored on a Unix socket): when
            # braid's machine dies, PostgreSQL ends the session, and with it the hold below,
            # within about 25 s instead of the system's two hours, so a braid restarted
            # elsewhere can take the database.
            for name, value in (("idle", 10), ("interval", 5), ("count", 3)):
                conn.execute(f"SET tcp_keepalives_{name} = {value}")
            if self._holding is not None:
                self._hold(conn, self._holding)  # again, on a new connection: the old one's lock went with it
        except BaseException as exc:
            conn.close()
            if isinstance(exc, self._psycopg.Error):
                raise StoreUnavailable(f"the store's database failed: {exc}") from exc
            raise
        return conn

    def hold(self, *, shared: bool = False) -> None:
        """Take the database for as long as the connection lives (and again on each new one):
        for this braid alone, or with ``shared`` beside the other replicas of ``--store-shared``
        (a shared advisory lock, which the exclusive one excludes both ways);
        :class:`DatabaseHeld` when a braid it cannot share with has it. Without
        ``--store-shared``, two braids on one database would each see the other's files and run
        each other's jobs after a restart."""
        with self._lock:
            self._hold(self._conn, shared)
            self._holding = shared

    def _hold(self, conn: Any, shared: bool) -> None:
        take = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        try:
            taken = conn.execute(f"SELECT {take}(%s)", (_HOLDER_LOCK,)).fetchone()[0]
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"the store's database failed: {exc}") from exc
        if not taken:
            if shared:
                raise DatabaseHeld("a braid without --store-shared uses this database (docs/batch.md)")
            raise DatabaseHeld(
                "another braid uses this database; replicas share one with --store-shared (docs/batch.md)"
            )

    def _translate(self, sql: str) -> str:
        found = self._sql.get(sql)
        if found is None:
            found = self._sql[sql] = sql.replace("?", "%s")
        return found

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        with self._lock:
            if self._conn.closed or self._conn.broken:
                self._conn = self._connect()
            try:
                cursor: Cursor = self._conn.execute(self._translate(sql), params)
            except self._psycopg.Error as exc:
                raise StoreUnavailable(f"the store's database failed: {exc}") from exc
            return cursor

    def schema_version(self) -> int:
        if self.execute("SELECT to_regclass('braid_schema')").fetchone()[0] is None:
            return 0
        row = self.execute("SELECT version FROM braid_schema").fetchone()
        return 0 if row is None else int(row[0])

    def migrate(self, migrations: Sequence[Sequence[str]]) -> None:
        with self.transaction():
            # Everything under the lock, the version table's creation too (two CREATE TABLE IF
            # NOT EXISTS at once collide on PostgreSQL): replicas opening at once wait here, and
            # the ones after the first find the version current.
            self.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            self.execute("CREATE TABLE IF NOT EXISTS braid_schema (version BIGINT NOT NULL)")
            version = self.schema_version()
            for number in range(version, len(migrations)):
                for statement in migrations[number]:
                    self.execute(postgres_ddl(statement))
            if version < len(migrations):
                self.execute("DELETE FROM braid_schema")
                self.execute("INSERT INTO braid_schema (version) VALUES (?)", (len(migrations),))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            if self._conn.closed or self._conn.broken:
                self._conn = self._connect()
        try:
            with self._conn.transaction():
                yield
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"the store's database failed: {exc}") from exc

    def close(self) -> None:
        self._conn.close()


def connect(url: str | None, root: Path) -> Connection:
    """The store's database: PostgreSQL at ``url``, else SQLite in ``root/store.db``."""
    if url is None:
        return SqliteConnection(root / "store.db")
    return PostgresConnection(url)


__all__ = [
    "FILES_LOCK",
    "Connection",
    "DatabaseHeld",
    "Cursor",
    "PostgresConnection",
    "SqliteConnection",
    "StoreError",
    "connect",
    "postgres_ddl",
]
