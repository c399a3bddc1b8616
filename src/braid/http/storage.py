"""The store's routes on the quart app: ``/v1/files``, ``/v1/batches`` and the stored
``/v1/responses/{id}`` (retrieve, delete).

Each handler reads the request's parts (its owner from ``braid.http.auth``'s :data:`OWNER`,
or the anonymous owner without keys), calls its quart-free view in :mod:`braid.routes.files`
or :mod:`braid.routes.batches`, and answers; a :class:`~braid.errors.BraidError` is answered
by the app's error handler, as every route's.

An upload's body is not read by quart into memory: :class:`BraidRequest` gives ``POST
/v1/files`` a body without a declared-length check, whose unread part is still bounded by
``--max-body-bytes`` (quart's own check), and the view consumes it as it arrives, bounded by
the file caps (:mod:`braid.routes.files`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from quart import Response, request
from quart_trio.wrappers.request import TrioRequest

from braid.errors import SchemaError
from braid.http import limits
from braid.http.auth import OWNER
from braid.routes import batches, files
from braid.routes import responses as responses_api
from braid.routes.batches import Jobs
from braid.routes.common import AppState, JsonResponse, require_json
from braid.store.db import Store
from braid.store.records import ANONYMOUS

UPLOAD_PATH = "/v1/files"


class BraidRequest(TrioRequest):
    """quart-trio's request; an upload's body has no declared-length check (see the module)."""

    def __init__(self, method: str, scheme: str, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(method, scheme, path, *args, **kwargs)
        if method == "POST" and path == UPLOAD_PATH:
            self.body = self.body_class(None, kwargs.get("max_content_length"))


def _owner() -> str:
    return str(request.scope.get(OWNER, ANONYMOUS))


def _answer(result: JsonResponse) -> Response:
    return Response(result.body, status=result.status, mimetype="application/json", headers=dict(result.headers))


async def _chunks() -> AsyncGenerator[bytes, None]:
    async for chunk in request.body:
        yield chunk


def install(app: Any, state: AppState, store: Store, jobs: Jobs) -> None:
    """Serve the store's routes on ``app``, with ``state``'s engine, settings and clock; ``jobs``
    runs the batches."""
    settings = state.settings

    def now() -> int:
        return int(state.now())

    @app.post("/v1/files")
    async def upload() -> Response:
        length = request.headers.get("Content-Length")
        chunks = _chunks()
        try:
            result = await files.upload(
                store,
                _owner(),
                content_type=request.headers.get("Content-Type"),
                content_length=int(length) if length and length.isdigit() else None,
                chunks=chunks,
                now=now(),
                idle_timeout=settings.body_timeout,
            )
        finally:
            await chunks.aclose()
        return _answer(result)

    @app.get("/v1/files")
    async def list_files() -> Response:
        return _answer(await files.list_files(store, _owner(), request.args, now=now()))

    @app.get("/v1/files/<file_id>")
    async def retrieve_file(file_id: str) -> Response:
        return _answer(await files.retrieve(store, _owner(), file_id, now=now()))

    @app.delete("/v1/files/<file_id>")
    async def delete_file(file_id: str) -> Response:
        return _answer(await files.delete(store, _owner(), file_id))

    @app.get("/v1/files/<file_id>/content")
    async def file_content(file_id: str) -> Response:
        found = await files.content(store, _owner(), file_id, now=now())
        response = Response(
            found.chunks(),
            status=200,
            mimetype="application/octet-stream",
            headers={"Content-Length": str(found.size)},
        )
        response.timeout = None  # a large file on a slow link: the write deadline guards a stalled reader
        return response

    @app.post("/v1/batches")
    async def create_batch() -> Response:
        require_json(request.headers.get("Content-Type"))
        body = await limits.read_body(request, settings)
        result = await batches.create(
            store,
            _owner(),
            body,
            engine=state.engine,
            settings=settings,
            limits=state.limits,
            jobs=jobs,
            now=now(),
        )
        return _answer(result)

    @app.get("/v1/batches")
    async def list_batches() -> Response:
        return _answer(await batches.list_batches(store, _owner(), request.args, now=now()))

    @app.get("/v1/batches/<batch_id>")
    async def retrieve_batch(batch_id: str) -> Response:
        return _answer(await batches.retrieve(store, _owner(), batch_id, now=now()))

    @app.post("/v1/batches/<batch_id>/cancel")
    async def cancel_batch(batch_id: str) -> Response:
        return _answer(await batches.cancel(store, _owner(), batch_id, jobs=jobs, now=now()))

    @app.get("/v1/responses/<response_id>")
    async def retrieve_response(response_id: str) -> Response:
        if request.args.get("stream", "").lower() != "true":
            return _answer(await responses_api.retrieve_response(store, _owner(), response_id, now()))
        after = request.args.get("starting_after")
        if after is not None and not after.lstrip("-").isdigit():
            raise SchemaError("starting_after must be an integer.", param="query.starting_after")
        events = responses_api.stream_background(state, _owner(), response_id, None if after is None else int(after))
        response = Response(
            events,
            status=200,
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": response_id},
        )
        response.timeout = None  # as every stream: quart's response timeout would cut it
        return response

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        return _answer(await responses_api.cancel_response(state, store, _owner(), response_id, now()))

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        return _answer(await responses_api.delete_response(state, store, _owner(), response_id))


__all__ = ["BraidRequest", "install"]
