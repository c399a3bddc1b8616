"""braid's error hierarchy, and how each error is shown to a client.

::

    BraidError                  (500 InternalServerError)
    ├── InvalidRequest          (400 BadRequestError)   a request braid will not run
    │   ├── SchemaError         (400 "Bad Request")     the body does not fit the schema
    │   ├── InvalidUserInput    (400 InvalidUserInput)  a LoRA load or unload vLLM refuses
    │   └── EngineRejected      (400 BadRequestError)   the engine refused it after the 200
    ├── Unauthorized            (401 Unauthorized)      no valid API key (braid.http.auth)
    ├── NotFound                (404 NotFoundError)     no such file or job (for this key)
    │   └── ModelNotFound       (404 NotFoundError)
    ├── Conflict                (409 ConflictError)     a job's state forbids the change
    ├── EngineError             (500 InternalServerError) generation failed mid-way
    ├── EngineUnavailable       (503 ServiceUnavailableError) the engine is dead or draining
    │   └── DrainTimeout        (503 ServiceUnavailableError) the drain's time ran out mid-request
    ├── TooManyRequests         (429 TooManyRequestsError) the admission queue is full
    ├── StreamStalled           (408 RequestTimeout)    the client stopped reading
    ├── DeadlineExceeded        (408 RequestTimeout)    --request-timeout passed
    ├── BodyTooLarge            (413 "Request Entity Too Large") the body is over the limit
    │   └── StorageFull         (413 "Request Entity Too Large") an upload would pass the store's cap
    └── BodyTimeout             (408 "Request Timeout")  the body did not arrive in time

An error with ``retry_after`` set is answered with that ``Retry-After`` header (seconds).

Every error renders to vLLM's body ``{"error": {"message", "type", "param", "code"}}``, where
``code`` is the integer HTTP status and ``type`` is vLLM's string for that class of error; for
the errors of the HTTP edge that vLLM's server leaves to its framework, the status's phrase, as
vLLM renders an ``HTTPException``.
"""

from __future__ import annotations

from typing import ClassVar, TypedDict


class BraidError(Exception):
    """Base class. ``param`` names the offending request field, when there is one."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    def body(self) -> ErrorBody:
        return error_payload(self.message, self.type, self.param, self.status)


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(TypedDict):
    error: ErrorDetail


def error_payload(message: str, type: str, param: str | None, code: int) -> ErrorBody:
    """vLLM's error body; ``code`` is the integer HTTP status."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class InvalidRequest(BraidError):
    status = 400
    type = "BadRequestError"


class SchemaError(InvalidRequest):
    """The body is not JSON, not an object, or a field has the wrong type (vLLM's pydantic path)."""

    type = "Bad Request"


class InvalidUserInput(InvalidRequest):
    """A ``/v1/load_lora_adapter`` or ``/v1/unload_lora_adapter`` that vLLM's server refuses with
    this type (a name missing, taken, or the model's own: :mod:`braid.engine.adapters`)."""

    type = "InvalidUserInput"


class EngineRejected(InvalidRequest):
    """The engine rejected a request that braid had already admitted (lazy validation)."""


class Unauthorized(BraidError):
    """The request carries no key, or a wrong one, and keys are configured (:mod:`braid.http.auth`)."""

    status = 401
    type = "Unauthorized"


class NotFound(BraidError):
    """No such object, or not this API key's (the two are not told apart)."""

    status = 404
    type = "NotFoundError"


class ModelNotFound(NotFound):
    pass


class Conflict(BraidError):
    """The object's state forbids the change (e.g. cancelling a finished batch)."""

    status = 409
    type = "ConflictError"


class EngineError(BraidError):
    """Generation failed inside the engine."""


class EngineUnavailable(BraidError):
    status = 503
    type = "ServiceUnavailableError"


ENGINE_DOWN = "The engine is not running."
""":class:`EngineUnavailable`'s message when the engine has died (or never started)."""


class DrainTimeout(EngineUnavailable):
    """The server's drain (``--graceful-timeout``) ran out before the request finished; its engine
    work was aborted. Nothing was wrong with the request: another replica can run it."""


class StoreUnavailable(BraidError):
    """The store's database failed a statement (PostgreSQL unreachable, a disk full): the files,
    batches and stored responses routes answer 503 until it is back, with ``Retry-After`` 5 s
    unless said otherwise (the next statement opens a new connection)."""

    status = 503
    type = "ServiceUnavailableError"

    def __init__(self, message: str, *, retry_after: int | None = 5) -> None:
        super().__init__(message, retry_after=retry_after)


class TooManyRequests(BraidError):
    """Admission's queue is full (:mod:`braid.stream.admit`); decided before the body is tokenized."""

    status = 429
    type = "TooManyRequestsError"


class DeadlineExceeded(BraidError):
    """The request's deadline (``--request-timeout``, from its arrival) passed; its engine work was aborted."""

    status = 408
    type = "RequestTimeout"


class StreamStalled(BraidError):
    """The client stopped reading for longer than the stall timeout; its engine work was aborted."""

    status = 408
    type = "RequestTimeout"


class BodyTooLarge(BraidError):
    """The request body is larger than ``Settings.max_body_bytes`` (declared or as it arrived)."""

    status = 413
    type = "Request Entity Too Large"


class StorageFull(BodyTooLarge):
    """An upload would take the store past its total-space cap (``--max-storage-bytes``)."""

    def __init__(self) -> None:
        super().__init__(
            "braid's file storage is full (braid serve --max-storage-bytes): delete files you no longer need."
        )


class BodyTimeout(BraidError):
    """The request body had not all arrived ``Settings.body_timeout`` seconds into reading it."""

    status = 408
    type = "Request Timeout"
