"""The store's options (``braid serve``'s storage flags), with their defaults in one place."""

from __future__ import annotations

import os
from pathlib import Path

import attrs


def default_storage_dir() -> str:
    """``$XDG_DATA_HOME/braid``, else ``~/.local/share/braid`` (the XDG base directory default)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "braid")


DAY = 86_400
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def _database(value: str | None) -> str | None:
    if value is None or value in ("", "sqlite"):
        return None
    if not value.startswith(POSTGRES_SCHEMES):
        # The scheme only: the rest of a URL may hold a password.
        raise ValueError(f"--store must be sqlite or a postgresql:// URL, not {value.partition(':')[0]!r}")
    return value


@attrs.frozen
class StoreOptions:
    storage_dir: str = attrs.field(factory=default_storage_dir, converter=lambda p: str(Path(p).expanduser()))
    """Where the files' bytes (``files/``; with PostgreSQL, a copy of those in the database), a
    running job's results (``jobs/``) and, unless ``database`` says otherwise, the database
    (``store.db``) live."""
    database: str | None = attrs.field(default=None, converter=_database)
    """``--store``: None (or "sqlite") for SQLite in ``storage_dir``; a ``postgresql://`` URL
    (libpq's, as psql takes it) for PostgreSQL (:mod:`braid.store.sql`)."""
    max_file_bytes: int = attrs.field(default=200 * 2**20, validator=attrs.validators.gt(0))
    """An upload larger than this is refused (413) while it arrives (OpenAI's batch input limit: 200 MB)."""
    max_storage_bytes: int = attrs.field(default=10 * 2**30, validator=attrs.validators.gt(0))
    """All files' bytes together, every owner's; an upload that would pass it is refused (413)."""
    file_retention: int = attrs.field(default=30 * DAY, validator=attrs.validators.gt(0))
    """Seconds a file is kept after it is made (OpenAI's default for batch files: 30 days)."""
    batch_window: int = attrs.field(default=DAY, validator=attrs.validators.gt(0))
    """Seconds a job's ``completion_window`` ("24h") lasts; shorter to test expiry."""
    max_batch_lines: int = attrs.field(default=50_000, validator=attrs.validators.gt(0))
    """Lines one batch's input file may have (OpenAI's limit)."""
    batch_group_lines: int = attrs.field(default=32, validator=attrs.validators.gt(0))
    """Consecutive lines of a job run as one group, under one admission ticket
    (:mod:`braid.batch.group`); 1: every line a request of its own."""
    shared: bool = False
    """``--store-shared``: braids on one PostgreSQL database share its batch jobs, each claiming a
    job's lines a chunk at a time with a lease (:mod:`braid.batch.shared`); without it one braid
    holds the database alone."""
    batch_chunk_lines: int = attrs.field(default=256, validator=attrs.validators.gt(0))
    """Lines of a job claimed at once by a replica when ``shared``."""
    batch_lease: int = attrs.field(default=30, validator=attrs.validators.ge(3))
    """Seconds a replica's claim on a chunk lasts unless renewed (every third of it): how long
    the lines of a replica that died wait before another takes them over."""
    response_retention: int = attrs.field(default=30 * DAY, validator=attrs.validators.gt(0))
    """Seconds a stored ``/v1/responses`` answer is kept after it was made (OpenAI keeps them
    30 days); on disk, swept as files are, so stored responses never grow braid's memory."""
    max_response_bytes: int = attrs.field(default=2**30, validator=attrs.validators.gt(0))
    """All stored ``/v1/responses`` answers together (every key's, with their conversations):
    storing one more first deletes the oldest ones, so clients cannot fill the disk within the
    retention; one larger than this alone is not stored."""

    def __attrs_post_init__(self) -> None:
        if self.shared and self.database is None:
            raise ValueError("--store-shared needs --store postgresql://... (replicas share jobs in one database)")


__all__ = ["DAY", "POSTGRES_SCHEMES", "StoreOptions", "default_storage_dir"]
