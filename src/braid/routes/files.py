"""``/v1/files``: upload, list, retrieve, content, delete, in OpenAI's shapes, on braid's store.

Each view takes the store, the caller's owner id (``braid.http.auth``: a hash of its API key, or
the anonymous owner) and the request's parts, and returns its answer or raises a
:class:`~braid.errors.BraidError` (answered as vLLM's JSON error). Another owner's id is a 404,
exactly as an unknown one. Quart is not imported: :mod:`braid.http.storage` serves these.

An upload (:func:`upload`) is written to disk as it arrives, never held whole: bounded by
``--max-file-bytes`` (413 as soon as it passes it), by ``--max-storage-bytes`` with every
other file and upload (413), and by the body timeout between two chunks (a stalled client is a
408). Only ``purpose: "batch"`` is taken. Whatever ends an upload early (an error, the client
gone, cancellation) removes what was written of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import attrs
import msgspec
import trio

from braid.errors import BodyTimeout, BodyTooLarge, InvalidRequest, NotFound, StorageFull, StoreUnavailable
from braid.routes.common import JsonResponse
from braid.store.db import Store
from braid.store.records import FileRecord, new_id
from braid.wire import files as wire
from braid.wire.files import MAX_EXPIRY, MIN_EXPIRY
from braid.wire.multipart import FileData, FileStart, FormReader, boundary_of
from braid.wire.openapi import JsonSchema, Operation, Outcome, error_outcomes, ref

FORM_OVERHEAD = 64 * 1024
"""Bytes a multipart body may carry beyond its file (boundaries, part headers, small fields)."""
MAX_FILENAME_CHARS = 255
MAX_FILE_LIST = 10_000
"""The largest (and default) page of ``GET /v1/files``, as OpenAI's."""
READ_CHUNK = 256 * 1024


def _json(value: object, status: int = 200) -> JsonResponse:
    return JsonResponse(status, msgspec.json.encode(value))


def _missing(file_id: str) -> NotFound:
    return NotFound(f"No such file: {file_id!r}.", param="file_id")


def clean_filename(name: str) -> str:
    """The client's name as shown back: control characters dropped, at most 255 characters. It
    is only ever data (files are stored under their id), never a path."""
    cleaned = "".join(c for c in name if c.isprintable())
    return cleaned[:MAX_FILENAME_CHARS] or "upload"


def _expiry(fields: Mapping[str, str], now: int, retention: int) -> int:
    """When the file expires: ``--file-retention`` after now, or sooner if the client asks
    (``expires_after[anchor]=created_at``, ``expires_after[seconds]``), never later."""
    seconds = fields.get("expires_after[seconds]")
    if seconds is None:
        return now + retention
    anchor = fields.get("expires_after[anchor]", "created_at")
    if anchor != "created_at":
        raise InvalidRequest("expires_after[anchor] must be 'created_at'.", param="expires_after")
    try:
        value = int(seconds)
    except ValueError:
        raise InvalidRequest("expires_after[seconds] must be an integer.", param="expires_after") from None
    if not MIN_EXPIRY <= value <= MAX_EXPIRY:
        raise InvalidRequest(
            f"expires_after[seconds] must be between {MIN_EXPIRY} and {MAX_EXPIRY}.", param="expires_after"
        )
    return now + min(value, retention)


@attrs.define
class _Upload:
    """The bytes of one upload as they are written, and what they hold of the store's cap."""

    store: Store
    reserved: int = 0
    written: int = 0
    filename: str | None = None

    def take(self, size: int) -> None:
        cap = self.store.options.max_file_bytes
        if self.written + size > cap:
            raise BodyTooLarge(f"The file is larger than the limit of {cap} bytes (braid serve --max-file-bytes).")
        if not self.store.reserve(size):
            raise StorageFull()
        self.reserved += size
        self.written += size


async def upload(
    store: Store,
    owner: str,
    *,
    content_type: str | None,
    content_length: int | None,
    chunks: AsyncIterator[bytes],
    now: int,
    idle_timeout: float,
) -> JsonResponse:
    """``POST /v1/files``: store the form's file part (``purpose`` must be ``batch``); 200 with
    the file object. See the module's contract for the bounds."""
    boundary = boundary_of(content_type)
    cap = store.options.max_file_bytes
    if content_length is not None and content_length > cap + FORM_OVERHEAD:
        raise BodyTooLarge(f"The file is larger than the limit of {cap} bytes (braid serve --max-file-bytes).")
    await store.sweep(now)
    file_id = new_id("file-")
    temp = store.temp_path(file_id)
    reader = FormReader(boundary)
    state = _Upload(store)
    try:
        async with await trio.open_file(temp, "xb") as out:

            async def write(events: list[FileStart | FileData]) -> None:
                for event in events:
                    if isinstance(event, FileStart):
                        state.filename = clean_filename(event.filename)
                    else:
                        state.take(len(event.data))
                        await out.write(event.data)

            while True:
                with trio.move_on_after(idle_timeout) as waited:
                    chunk = await anext(chunks, None)
                if waited.cancelled_caught:
                    raise BodyTimeout(f"The upload sent nothing for {idle_timeout:g} s (braid serve --body-timeout).")
                if chunk is None:
                    break
                await write(reader.feed(chunk))
            await write(reader.end())
        purpose = reader.fields.get("purpose")
        if purpose is None:
            raise InvalidRequest("The form needs a 'purpose' field.", param="purpose")
        if purpose != "batch":
            raise InvalidRequest(
                f"purpose must be 'batch' (braid keeps files for batches), not {purpose!r}.", param="purpose"
            )
        if state.filename is None:
            raise InvalidRequest("The form needs a 'file' part.", param="file")
        record = FileRecord(
            id=file_id,
            owner=owner,
            filename=state.filename,
            purpose="batch",
            bytes=state.written,
            created_at=now,
            expires_at=_expiry(reader.fields, now, store.options.file_retention),
        )
        await store.add_file(record, capped=True)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: temp.unlink(missing_ok=True))
        raise
    finally:
        store.release(state.reserved)
    return _json(wire.file_object(record))


async def retrieve(store: Store, owner: str, file_id: str, *, now: int) -> JsonResponse:
    """``GET /v1/files/{id}``: the file object; 404 when the caller has no such file."""
    record = await store.get_file(owner, file_id, now)
    if record is None:
        raise _missing(file_id)
    return _json(wire.file_object(record))


async def delete(store: Store, owner: str, file_id: str) -> JsonResponse:
    """``DELETE /v1/files/{id}``: gone at once, bytes and all; 404 when the caller has no such file."""
    if not await store.delete_file(owner, file_id):
        raise _missing(file_id)
    return _json(wire.FileDeleted(id=file_id, object="file", deleted=True))


def _int_arg(args: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}.", param=name)
    return value


def page_limit(args: Mapping[str, str], default: int, high: int) -> int:
    """A list route's ``limit`` query argument (1 to ``high``)."""
    return _int_arg(args, "limit", default, 1, high)


async def list_files(store: Store, owner: str, args: Mapping[str, str], *, now: int) -> JsonResponse:
    """``GET /v1/files``: the caller's files, ``order`` (``desc`` newest first, the default, or
    ``asc``), ``limit`` (1 to 10,000, default 10,000), ``after`` (a file id), ``purpose``."""
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", param="order")
    limit = page_limit(args, MAX_FILE_LIST, MAX_FILE_LIST)
    await store.sweep(now)
    files, more = await store.list_files(
        owner, now, purpose=args.get("purpose"), after=args.get("after"), limit=limit, newest_first=order == "desc"
    )
    return _json(wire.file_list(files, more))


@attrs.frozen
class FileContent:
    """A file's bytes to send: ``open`` holds the file open, so a delete meanwhile does not cut the answer."""

    record: FileRecord
    handle: trio.abc.AsyncResource
    size: int

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes, in pieces of :data:`READ_CHUNK`; closes the file when done or abandoned."""
        handle = self.handle
        try:
            while True:
                data = await handle.read(READ_CHUNK)  # type: ignore[attr-defined]
                if not data:
                    return
                yield data
        finally:
            with trio.CancelScope(shield=True):
                await handle.aclose()


async def content(store: Store, owner: str, file_id: str, *, now: int) -> FileContent:
    """``GET /v1/files/{id}/content``: the file's bytes, opened here (404 when the caller has no
    such file, or it was deleted a moment ago)."""
    record = await store.get_file(owner, file_id, now)
    if record is None:
        raise _missing(file_id)
    try:
        handle = await trio.open_file(await store.local_path(file_id), "rb")
    except FileNotFoundError:
        raise _missing(file_id) from None
    return FileContent(record, handle, record.bytes)


def path_id(name: str, example: str) -> JsonSchema:
    """An object's id in the path (``{file_id}``, ``{batch_id}``)."""
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "example": example}


def query(name: str, schema: JsonSchema, description: str) -> JsonSchema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def json_ok(description: str, struct: type[msgspec.Struct]) -> Outcome:
    return Outcome(200, description, {"application/json": {"schema": ref(struct)}})


_FILE_ID = path_id("file_id", "file-0")
_MISSING = error_outcomes(StoreUnavailable, NotFound)
_UPLOAD_FORM: JsonSchema = {
    "type": "object",
    "required": ["purpose", "file"],
    "properties": {
        "purpose": {"const": "batch"},
        "file": {"type": "string", "contentMediaType": "application/octet-stream"},
        "expires_after[anchor]": {"const": "created_at"},
        "expires_after[seconds]": {"type": "integer", "minimum": MIN_EXPIRY, "maximum": MAX_EXPIRY},
    },
}

OPERATIONS = (
    Operation(
        "post",
        "/v1/files",
        "Upload a file (multipart form, purpose batch), kept until it expires (--file-retention)",
        (
            json_ok("The file object.", wire.FileObject),
            *error_outcomes(StoreUnavailable, InvalidRequest, BodyTooLarge, BodyTimeout),
        ),
        request={"required": True, "content": {"multipart/form-data": {"schema": _UPLOAD_FORM}}},
        structs=(wire.FileObject,),
    ),
    Operation(
        "get",
        "/v1/files",
        "The caller's files",
        (json_ok("A page of file objects.", wire.FileList), *error_outcomes(StoreUnavailable, InvalidRequest)),
        parameters=(
            query("order", {"enum": ["asc", "desc"]}, "desc (newest first, the default) or asc."),
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_FILE_LIST}, "Files per page."),
            query("after", {"type": "string"}, "The last file id of the previous page."),
            query("purpose", {"type": "string"}, "Only files of this purpose."),
        ),
        structs=(wire.FileList,),
    ),
    Operation(
        "get",
        "/v1/files/{file_id}",
        "One of the caller's files",
        (json_ok("The file object.", wire.FileObject), *_MISSING),
        parameters=(_FILE_ID,),
        structs=(wire.FileObject,),
    ),
    Operation(
        "delete",
        "/v1/files/{file_id}",
        "Delete one of the caller's files",
        (json_ok("The file is deleted.", wire.FileDeleted), *_MISSING),
        parameters=(_FILE_ID,),
        structs=(wire.FileDeleted,),
    ),
    Operation(
        "get",
        "/v1/files/{file_id}/content",
        "A file's bytes (a batch's output and error files too)",
        (
            Outcome(
                200,
                "The bytes as uploaded or written.",
                {"application/octet-stream": {"schema": {"type": "string"}}},
                ("Content-Length",),
            ),
            *_MISSING,
        ),
        parameters=(_FILE_ID,),
    ),
)
"""The file routes' OpenAPI entries (documented when the app has a store)."""


__all__ = [
    "OPERATIONS",
    "FileContent",
    "clean_filename",
    "content",
    "delete",
    "json_ok",
    "list_files",
    "page_limit",
    "path_id",
    "query",
    "retrieve",
    "upload",
]
