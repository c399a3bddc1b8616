"""OpenAI's shapes for ``/v1/files`` and ``/v1/batches``: the objects braid sends, and the body
of ``POST /v1/batches``.

The objects follow the ``openai`` package's types (``openai.types.FileObject``, ``Batch``,
``FileDeleted``, ``BatchRequestCounts``, ``BatchError``); lists are OpenAI's cursor pages
(``data``, ``first_id``, ``last_id``, ``has_more``), which the client pages through with
``after``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from braid.errors import InvalidRequest, SchemaError
from braid.store.records import BatchRecord, BatchUsage, FileRecord


class FileObject(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: Literal["processed"]
    status_details: None = None


class FileList(msgspec.Struct, forbid_unknown_fields=True):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    object: Literal["file"]
    deleted: bool


class RequestCountsObject(msgspec.Struct, forbid_unknown_fields=True):
    total: int
    completed: int
    failed: int


class BatchErrorObject(msgspec.Struct, forbid_unknown_fields=True):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(msgspec.Struct, forbid_unknown_fields=True):
    object: Literal["list"]
    data: list[BatchErrorObject]


class InputTokensDetails(msgspec.Struct, forbid_unknown_fields=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, forbid_unknown_fields=True):
    reasoning_tokens: int


class BatchUsageObject(msgspec.Struct, forbid_unknown_fields=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchObject(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCountsObject
    metadata: dict[str, str] | None
    model: str | None
    usage: BatchUsageObject | None
    """The tokens of the job's answered lines, once it has ended (null before, and when it failed)."""


class BatchList(msgspec.Struct, forbid_unknown_fields=True):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


MIN_EXPIRY, MAX_EXPIRY = 3600, 30 * 86_400
"""The range of a file's ``expires_after[seconds]`` and a batch's ``output_expires_after.seconds``, as OpenAI's."""


class ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's expiration policy: ``seconds`` after ``anchor`` (``"created_at"``, the only one)."""

    anchor: str
    seconds: int


class BatchCreateBody(msgspec.Struct):
    """The body of ``POST /v1/batches``. Unknown fields are ignored, as vLLM ignores them."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None
    """When the job's output and error files expire, after their creation (at most the server's
    ``--file-retention``)."""


MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

_CREATE = msgspec.json.Decoder(BatchCreateBody)


def parse_batch_create(body: bytes) -> BatchCreateBody:
    """Decode ``POST /v1/batches``; :class:`~braid.errors.SchemaError` for a body that is not
    one, :class:`~braid.errors.InvalidRequest` for metadata beyond OpenAI's limits. The
    endpoint, window and input file are checked by the route, which knows what it serves."""
    try:
        b = _CREATE.decode(body)
    except msgspec.ValidationError as exc:
        raise SchemaError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise SchemaError(f"The body is not valid JSON: {exc}") from None
    if b.metadata is not None:
        if len(b.metadata) > MAX_METADATA_PAIRS:
            raise InvalidRequest(f"metadata may have at most {MAX_METADATA_PAIRS} pairs.", param="metadata")
        for k, v in b.metadata.items():
            if len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
                raise InvalidRequest(
                    f"metadata keys may have at most {MAX_METADATA_KEY} characters and values {MAX_METADATA_VALUE}.",
                    param="metadata",
                )
    after = b.output_expires_after
    if after is not None:
        if after.anchor != "created_at":
            raise InvalidRequest("output_expires_after.anchor must be 'created_at'.", param="output_expires_after")
        if not MIN_EXPIRY <= after.seconds <= MAX_EXPIRY:
            raise InvalidRequest(
                f"output_expires_after.seconds must be between {MIN_EXPIRY} and {MAX_EXPIRY}.",
                param="output_expires_after",
            )
    return b


def file_object(f: FileRecord) -> FileObject:
    return FileObject(
        id=f.id,
        object="file",
        bytes=f.bytes,
        created_at=f.created_at,
        expires_at=f.expires_at,
        filename=f.filename,
        purpose=f.purpose,
        status="processed",
    )


def batch_object(b: BatchRecord) -> BatchObject:
    t = b.times
    errors = None
    if b.errors:
        data = [BatchErrorObject(code=e.code, message=e.message, param=e.param, line=e.line) for e in b.errors]
        errors = BatchErrors(object="list", data=data)
    return BatchObject(
        id=b.id,
        object="batch",
        endpoint=b.endpoint,
        errors=errors,
        input_file_id=b.input_file_id,
        completion_window=b.completion_window,
        status=b.status,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        created_at=b.created_at,
        in_progress_at=t.in_progress_at,
        expires_at=b.expires_at,
        finalizing_at=t.finalizing_at,
        completed_at=t.completed_at,
        failed_at=t.failed_at,
        expired_at=t.expired_at,
        cancelling_at=t.cancelling_at,
        cancelled_at=t.cancelled_at,
        request_counts=RequestCountsObject(b.counts.total, b.counts.completed, b.counts.failed),
        metadata=dict(b.metadata) if b.metadata else None,
        model=b.model,
        usage=None if b.usage is None else _usage(b.usage),
    )


def _usage(u: BatchUsage) -> BatchUsageObject:
    return BatchUsageObject(
        input_tokens=u.input_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=u.cached_tokens),
        output_tokens=u.output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=u.reasoning_tokens),
        total_tokens=u.input_tokens + u.output_tokens,
    )


def _page(cls: Any, data: list[Any], has_more: bool) -> Any:
    """One page of a list route, as OpenAI's: the page's first and last ids, and whether more follow."""
    return cls(
        object="list",
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


def file_list(files: list[FileRecord], has_more: bool) -> FileList:
    page: FileList = _page(FileList, [file_object(f) for f in files], has_more)
    return page


def batch_list(batches: list[BatchRecord], has_more: bool) -> BatchList:
    page: BatchList = _page(BatchList, [batch_object(b) for b in batches], has_more)
    return page


__all__ = [
    "BatchCreateBody",
    "BatchList",
    "BatchObject",
    "FileDeleted",
    "FileList",
    "FileObject",
    "batch_list",
    "batch_object",
    "file_list",
    "file_object",
    "parse_batch_create",
]
