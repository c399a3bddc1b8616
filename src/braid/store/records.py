"""What braid's store holds, as typed records: files, batch jobs, and who owns them.

Records are frozen values; :mod:`braid.store.db` turns them into rows and back, and the wire
modules (:mod:`braid.wire.files`) into OpenAI's shapes. Times are Unix seconds (ints), as
OpenAI's objects carry them.

**Owners.** Every record belongs to the API key that created it, stored as :func:`owner_of` the
key: a domain-separated SHA-256, never the key itself, so the store's file names no key. A
server without keys has one owner, :data:`ANONYMOUS`. A key that is removed from the server's
list leaves its records unreachable until they expire; a key added back finds them again.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Literal

import attrs

ANONYMOUS = "anonymous"
"""The owner of every record on a server without API keys."""

_OWNER_DOMAIN = b"braid.store.owner\x00"


def owner_of(key: str | bytes) -> str:
    """The owner id of an API key: hex SHA-256 of a braid-specific prefix and the key. Not the
    digest the key guard compares (``braid.http.auth``), so the store holds nothing that guard
    would accept in any form."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(_OWNER_DOMAIN + raw).hexdigest()


def new_id(prefix: str) -> str:
    """An unguessable id: ``prefix`` and 24 random bytes in URL-safe base64 without padding
    (192 bits from the OS's CSPRNG), as OpenAI's ids look (``file-...``, ``batch_...``)."""
    return prefix + secrets.token_urlsafe(24)


FilePurpose = Literal["batch", "batch_output"]
"""What braid keeps files for: a batch's input (uploaded) or its output and error files (written)."""


@attrs.frozen
class FileRecord:
    """One stored file: its metadata; its bytes are under the store's directory, named by ``id``."""

    id: str
    owner: str
    filename: str
    """The client's name for it, shown back and never used as a path."""
    purpose: FilePurpose
    bytes: int
    created_at: int
    expires_at: int | None
    """When it is deleted (``--file-retention`` after it was made); None: kept until deleted."""


BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
"""OpenAI's batch lifecycle."""

ACTIVE_STATUSES: tuple[BatchStatus, ...] = ("validating", "in_progress", "finalizing", "cancelling")
"""A job in one of these has work (or its end) still to come."""

BatchEndpoint = Literal["/v1/completions", "/v1/chat/completions"]
"""The routes a batch's lines may name (one per job)."""


@attrs.frozen
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@attrs.frozen
class BatchError:
    """Why a job failed as a whole (OpenAI's ``errors.data`` entries): a malformed file, nothing runnable."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


@attrs.frozen
class BatchTimes:
    """When a job entered each state it has been in (None: not yet, or never)."""

    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None


@attrs.frozen
class BatchUsage:
    """The tokens of a job's answered lines (OpenAI's batch ``usage``), summed when it ends."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


@attrs.frozen
class BatchRecord:
    """One batch job."""

    id: str
    owner: str
    endpoint: BatchEndpoint
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    """When the job's completion window closes: its unfinished lines are then ``expired``."""
    counts: RequestCounts = RequestCounts()
    metadata: tuple[tuple[str, str], ...] = ()
    """The client's key-value pairs, in the order given (at most 16)."""
    errors: tuple[BatchError, ...] = ()
    times: BatchTimes = BatchTimes()
    output_file_id: str | None = None
    error_file_id: str | None = None
    model: str | None = None
    """The model the lines name, when they all name the same one."""
    usage: BatchUsage | None = None
    """Set when the job ends (its output file's rows summed); None before, or for a failed job."""
    output_expires_after: int | None = None
    """Seconds the job's output and error files are kept after they are made (the client's
    ``output_expires_after``; None: the server's ``--file-retention``, which also caps it)."""


@attrs.frozen
class StoredResponse:
    """A ``/v1/responses`` answer kept for ``GET /v1/responses/{id}`` and ``previous_response_id``."""

    id: str
    owner: str
    created_at: int
    expires_at: int
    """When it is deleted (``--response-retention`` after it was made)."""
    body: bytes
    """The ``response`` object as it was answered (JSON)."""
    messages: bytes
    """The conversation it answered, as chat messages (a JSON list): the next turn's history."""


__all__ = [
    "ACTIVE_STATUSES",
    "ANONYMOUS",
    "BatchEndpoint",
    "BatchError",
    "BatchRecord",
    "BatchStatus",
    "BatchTimes",
    "BatchUsage",
    "FilePurpose",
    "FileRecord",
    "RequestCounts",
    "StoredResponse",
    "new_id",
    "owner_of",
]
