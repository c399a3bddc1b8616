"""``/v1/batches``: create, retrieve, list, cancel, in OpenAI's shapes, on braid's store.

Views as :mod:`braid.routes.files`'s: the store, the caller's owner id, the request's parts;
an answer, or a :class:`~braid.errors.BraidError`. Another owner's job is a 404.

**Create** checks the body (``endpoint`` one of ``/v1/completions`` and
``/v1/chat/completions``, ``completion_window`` ``24h``, the input file the caller's and of
purpose ``batch``, ``metadata`` within OpenAI's limits), then validates every line of the input
file (:mod:`braid.batch.validate`, on a worker thread) before it answers: the job it returns
is ``in_progress``, its bad lines already counted as failed (their rows go to its error file),
and handed to the runner (:class:`Jobs`); or ``failed``, with its error file, when no line can
run. Its window ends ``--batch-completion-window`` seconds after creation (the client's "24h").

**Cancel** hands an active job to the runner, which aborts its lines' engine work and ends it
``cancelled`` with what was done (it answers ``cancelling`` meanwhile); a cancelled or
cancelling job is answered as it is; a finished one is a 409.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec
import trio

from braid.batch.validate import body_check, validate_file
from braid.engine.base import Engine
from braid.errors import BodyTimeout, BodyTooLarge, Conflict, InvalidRequest, NotFound, SchemaError, StoreUnavailable
from braid.routes.common import JsonResponse
from braid.routes.files import json_ok, page_limit, path_id, query
from braid.settings import Settings
from braid.store.db import Store
from braid.store.records import BatchEndpoint, BatchRecord, BatchTimes, RequestCounts, new_id
from braid.wire import files as wire
from braid.wire.fields import Limits
from braid.wire.openapi import Operation, error_outcomes, json_body, ref

ENDPOINTS: tuple[BatchEndpoint, ...] = ("/v1/completions", "/v1/chat/completions")
WINDOW = "24h"
DEFAULT_PAGE, MAX_PAGE = 20, 100


class Jobs(Protocol):
    """What runs the jobs (:class:`braid.batch.runner.BatchRunner`)."""

    async def start(self, record: BatchRecord) -> None:
        """Store a new job and run it."""

    async def fail(self, record: BatchRecord) -> BatchRecord:
        """Store a new job that cannot run, ended ``failed`` with its error file; the stored record."""

    async def cancel(self, record: BatchRecord) -> BatchRecord:
        """Cancel an active job; the job as stored now (``cancelling`` or ``cancelled``)."""


def _json(value: object) -> JsonResponse:
    return JsonResponse(200, msgspec.json.encode(value))


def _missing(batch_id: str) -> NotFound:
    return NotFound(f"No such batch: {batch_id!r}.", param="batch_id")


async def create(
    store: Store,
    owner: str,
    body: bytes,
    *,
    engine: Engine,
    settings: Settings,
    limits: Limits,
    jobs: Jobs,
    now: int,
) -> JsonResponse:
    """``POST /v1/batches`` (see the module's contract)."""
    req = wire.parse_batch_create(body)
    if req.endpoint not in ENDPOINTS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(ENDPOINTS)}; braid does not batch {req.endpoint!r}.",
            param="endpoint",
        )
    endpoint = req.endpoint
    if req.completion_window != WINDOW:
        raise InvalidRequest(f"completion_window must be {WINDOW!r}.", param="completion_window")
    await store.sweep(now)
    source = await store.get_file(owner, req.input_file_id, now)
    if source is None:
        raise NotFound(f"No such file: {req.input_file_id!r}.", param="input_file_id")
    if source.purpose != "batch":
        raise InvalidRequest("The input file's purpose must be 'batch'.", param="input_file_id")
    batch_id = new_id("batch_")
    work = store.work_path(batch_id, "error")
    check = body_check(endpoint, engine, settings, limits)
    options = store.options
    try:
        source_path = await store.local_path(source.id)
        found = await trio.to_thread.run_sync(
            lambda: validate_file(source_path, work, endpoint, check, max_lines=options.max_batch_lines)
        )
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: work.unlink(missing_ok=True))
        if isinstance(exc, FileNotFoundError):  # deleted a moment ago
            raise NotFound(f"No such file: {req.input_file_id!r}.", param="input_file_id") from None
        raise
    failed = bool(found.errors)
    record = BatchRecord(
        id=batch_id,
        owner=owner,
        endpoint=endpoint,
        input_file_id=source.id,
        completion_window=WINDOW,
        # A job that cannot run is ended by the runner as any job is: its rows become its error file.
        status="in_progress",
        created_at=now,
        expires_at=now + options.batch_window,
        counts=RequestCounts(total=found.total, completed=0, failed=found.failed),
        metadata=tuple((req.metadata or {}).items()),
        errors=found.errors,
        times=BatchTimes(in_progress_at=now),
        model=found.model or engine.info.name,
        output_expires_after=None if req.output_expires_after is None else req.output_expires_after.seconds,
    )
    if failed:
        record = await jobs.fail(record)
    else:
        await jobs.start(record)
    return _json(wire.batch_object(record))


async def retrieve(store: Store, owner: str, batch_id: str, *, now: int) -> JsonResponse:
    """``GET /v1/batches/{id}``."""
    await store.sweep(now)
    record = await store.get_batch(owner, batch_id)
    if record is None:
        raise _missing(batch_id)
    return _json(wire.batch_object(record))


async def list_batches(store: Store, owner: str, args: Mapping[str, str], *, now: int) -> JsonResponse:
    """``GET /v1/batches``: newest first, ``limit`` 1 to 100 (default 20), ``after`` a batch id."""
    limit = page_limit(args, DEFAULT_PAGE, MAX_PAGE)
    await store.sweep(now)
    batches, more = await store.list_batches(owner, after=args.get("after"), limit=limit)
    return _json(wire.batch_list(batches, more))


async def cancel(store: Store, owner: str, batch_id: str, *, jobs: Jobs, now: int) -> JsonResponse:
    """``POST /v1/batches/{id}/cancel``: an active job is cancelled; a cancelled or cancelling
    one is answered as it is; a completed, failed or expired one is a 409."""
    await store.sweep(now)
    record = await store.get_batch(owner, batch_id)
    if record is None:
        raise _missing(batch_id)
    if record.status in ("cancelling", "cancelled"):
        return _json(wire.batch_object(record))
    if record.status in ("completed", "failed", "expired"):
        raise Conflict(f"The batch is {record.status}: it cannot be cancelled.", param="batch_id")
    return _json(wire.batch_object(await jobs.cancel(record)))


_BATCH_ID = path_id("batch_id", "batch_0")

OPERATIONS = (
    Operation(
        "post",
        "/v1/batches",
        "Run a file of requests in the background class; its lines are validated first",
        (
            json_ok("The job: in_progress, or failed when no line can run (see its error file).", wire.BatchObject),
            *error_outcomes(StoreUnavailable, InvalidRequest, SchemaError, NotFound, BodyTooLarge, BodyTimeout),
        ),
        request=json_body(
            ref(wire.BatchCreateBody),
            {"create": {"input_file_id": "file-0", "endpoint": "/v1/completions", "completion_window": WINDOW}},
        ),
        structs=(wire.BatchObject, wire.BatchCreateBody),
    ),
    Operation(
        "get",
        "/v1/batches",
        "The caller's jobs, newest first",
        (json_ok("A page of jobs.", wire.BatchList), *error_outcomes(StoreUnavailable, InvalidRequest)),
        parameters=(
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, "Jobs per page (default 20)."),
            query("after", {"type": "string"}, "The last job id of the previous page."),
        ),
        structs=(wire.BatchList,),
    ),
    Operation(
        "get",
        "/v1/batches/{batch_id}",
        "One of the caller's jobs",
        (json_ok("The job.", wire.BatchObject), *error_outcomes(StoreUnavailable, NotFound)),
        parameters=(_BATCH_ID,),
        structs=(wire.BatchObject,),
    ),
    Operation(
        "post",
        "/v1/batches/{batch_id}/cancel",
        "Cancel a job: its engine work is aborted and it ends cancelled with what was done",
        (
            json_ok("The job, cancelling or cancelled.", wire.BatchObject),
            *error_outcomes(StoreUnavailable, NotFound, Conflict),
        ),
        parameters=(_BATCH_ID,),
        structs=(wire.BatchObject,),
    ),
)
"""The batch routes' OpenAPI entries (documented when the app has a store)."""


__all__ = ["ENDPOINTS", "OPERATIONS", "cancel", "create", "list_batches", "retrieve"]
