"""Validating a batch's input file, line by line, with the routes' own request validation.

Each line must be ``{"custom_id": str, "method": "POST", "url": <the job's endpoint>, "body":
{...}}``, its ``custom_id`` unique in the file, and its body one the route would take: the same
decoding and checks the route runs before it tokenizes (:func:`braid.wire.completions_request.parse_request`
and :func:`braid.stream.plan.check_limits`, or :func:`braid.wire.chat_request.parse_chat`;
then the model's name, :func:`braid.engine.base.select_model`), and not ``stream: true``.
Blank lines are skipped; line numbers are the file's, from 1.

Each bad line becomes one line of the error file, in OpenAI's batch output shape plus the line
number (a braid extension)::

    {"id": "batch_req_...", "custom_id": "a", "response": {"status_code": 400,
     "request_id": "batch_req_...", "body": <the route's error body>}, "error": null, "line": 3}

and a line that is not a request at all (not JSON, wrong url or method, no or a duplicate
``custom_id``) has ``"response": null`` and ``"error": {"code", "message"}``. The job is
runnable if any line is; otherwise it fails, with the first lines' errors as its ``errors``.

Pure and synchronous (it reads and writes files): the route runs it on a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import attrs
import msgspec

from braid.engine.base import Engine, select_model
from braid.errors import BraidError, InvalidRequest
from braid.settings import Settings
from braid.store.records import BatchEndpoint, BatchError, new_id
from braid.stream.plan import check_limits
from braid.wire.chat_request import parse_chat
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits

MAX_JOB_ERRORS = 100
"""A failed job lists at most this many of its lines' errors in ``errors`` (all are in the error file)."""
MAX_CUSTOM_ID_CHARS = 512


class _Line(msgspec.Struct):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


_LINE = msgspec.json.Decoder(_Line)
_encode = msgspec.json.Encoder().encode

BodyCheck = Callable[[bytes], str | None]
"""Checks one line's body as the route would; returns the model it names (None: the served
model), raises :class:`~braid.errors.BraidError` as the route would answer it."""


def body_check(endpoint: BatchEndpoint, engine: Engine, settings: Settings, limits: Limits) -> BodyCheck:
    """The checks ``endpoint``'s route makes of a body before it tokenizes."""
    info = engine.info

    def completions(body: bytes) -> str | None:
        req = parse_request(body, limits)
        select_model(info, req.model)
        if req.stream:
            raise InvalidRequest("stream is not supported in a batch.", param="stream")
        check_limits(req, info, engine.tokenizer)
        return req.model

    def chat(body: bytes) -> str | None:
        c = parse_chat(
            body,
            limits,
            max_model_len=info.max_model_len,
            batch=False,
            trust_template=settings.trust_request_chat_template,
            parsers=settings.parsers,
        )
        select_model(info, c.body.model)
        if c.body.stream:
            raise InvalidRequest("stream is not supported in a batch.", param="stream")
        return c.body.model

    return completions if endpoint == "/v1/completions" else chat


@attrs.frozen
class Validation:
    """What validating a file found."""

    total: int
    """Lines that are not blank."""
    failed: int
    """Of them, those that cannot run (each is a line of the error file)."""
    error_bytes: int
    """The error file's size (0: no bad line, and no error file)."""
    errors: tuple[BatchError, ...]
    """Why the job fails as a whole; empty when it is runnable."""
    model: str | None
    """The model every runnable line names, when they name one and the same."""

    @property
    def runnable(self) -> int:
        return self.total - self.failed


@attrs.frozen
class Runnable:
    """A line to run: its ``custom_id`` and its body as the client wrote it."""

    number: int
    custom_id: str
    body: bytes


@attrs.frozen
class Refused:
    """A line that cannot run: its error file row (one JSON line) and why."""

    number: int
    custom_id: str | None
    row: bytes
    error: BatchError


def error_row(number: int, custom_id: str | None, code: str, message: str) -> bytes:
    """An error file row for a line that is not a request braid could send to a route."""
    row = {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
           "error": {"code": code, "message": message}, "line": number}  # fmt: skip
    return _encode(row) + b"\n"


def answer_row(number: int, custom_id: str, status: int, body: bytes, request_id: str | None = None) -> bytes:
    """A result file row: the route's answer (``status``, its JSON ``body``) to a line."""
    rid = new_id("batch_req_")
    response = {"status_code": status, "request_id": request_id or rid, "body": msgspec.Raw(body)}
    row = {"id": rid, "custom_id": custom_id, "response": response, "error": None, "line": number}
    return _encode(row) + b"\n"


@attrs.define
class LineChecker:
    """Checks the lines of one file in order (it remembers the ``custom_id``s it has seen)."""

    endpoint: BatchEndpoint
    check: BodyCheck
    seen: set[str] = attrs.Factory(set)
    models: set[str | None] = attrs.Factory(set)

    def __call__(self, number: int, raw: bytes) -> Runnable | Refused:
        try:
            line = _LINE.decode(raw)
        except msgspec.ValidationError as exc:
            return self._refused(number, None, "invalid_request", str(exc))
        except msgspec.DecodeError as exc:
            return self._refused(number, None, "invalid_json", f"The line is not valid JSON: {exc}")
        cid = line.custom_id
        if not cid or len(cid) > MAX_CUSTOM_ID_CHARS:
            return self._refused(
                number,
                cid or None,
                "invalid_custom_id",
                f"custom_id must have 1 to {MAX_CUSTOM_ID_CHARS} characters.",
                "custom_id",
            )
        if cid in self.seen:
            return self._refused(
                number, cid, "duplicate_custom_id", f"The custom_id {cid!r} is used by an earlier line.", "custom_id"
            )
        if line.method != "POST":
            return self._refused(
                number, cid, "invalid_method", f"method must be 'POST', not {line.method!r}.", "method"
            )
        if line.url != self.endpoint:
            return self._refused(
                number,
                cid,
                "invalid_url",
                f"url must be the batch's endpoint {self.endpoint!r}, not {line.url!r}.",
                "url",
            )
        self.seen.add(cid)
        body = bytes(line.body)
        try:
            self.models.add(self.check(body))
        except BraidError as err:
            row = answer_row(number, cid, err.status, msgspec.json.encode(err.body()))
            return Refused(number, cid, row, BatchError("invalid_request", err.message, number, err.param))
        return Runnable(number, cid, body)

    def _refused(self, number: int, cid: str | None, code: str, message: str, param: str | None = None) -> Refused:
        return Refused(number, cid, error_row(number, cid, code, message), BatchError(code, message, number, param))


def numbered_lines(source: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The file's lines that are not blank, with their line numbers (from 1)."""
    for number, raw in enumerate(source, start=1):
        if raw.strip():
            yield number, raw


def validate_file(
    source: Path, errors_to: Path, endpoint: BatchEndpoint, check: BodyCheck, *, max_lines: int
) -> Validation:
    """Validate every line of ``source``, writing the bad ones to ``errors_to`` (see the module)."""
    checker = LineChecker(endpoint, check)
    total = failed = 0
    first: list[BatchError] = []
    with open(source, "rb") as src, open(errors_to, "wb") as out:
        for number, raw in numbered_lines(src):
            total += 1
            if total > max_lines:
                out.truncate(0)
                too_many = BatchError(
                    "too_many_lines", f"The file has more than {max_lines} requests (braid serve --batch-max-lines)."
                )
                return Validation(total, total, 0, (too_many,), None)
            found = checker(number, raw)
            if isinstance(found, Refused):
                failed += 1
                out.write(found.row)
                if len(first) < MAX_JOB_ERRORS:
                    first.append(found.error)
    errors: tuple[BatchError, ...] = ()
    if total == 0:
        errors = (BatchError("empty_file", "The input file has no requests."),)
    elif failed == total:
        errors = tuple(first)
    models = checker.models
    model = next(iter(models)) if len(models) == 1 else None
    return Validation(total, failed, errors_to.stat().st_size, errors, model)


__all__ = [
    "MAX_JOB_ERRORS",
    "BodyCheck",
    "LineChecker",
    "Refused",
    "Runnable",
    "Validation",
    "answer_row",
    "body_check",
    "error_row",
    "numbered_lines",
    "validate_file",
]
