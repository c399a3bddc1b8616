"""The quart-trio app: routes and error rendering.

The completions view is :func:`braid.routes.common.completions`, quart-free (the tokenize routes':
:mod:`braid.routes.tokenize`); the route here reads the body (within the limits of
:mod:`braid.http.limits`), calls it, and turns its answer into a quart ``Response`` (a JSON
body, or the ``CompletionStream`` as a ``text/event-stream`` body without quart's response
timeout). The handlers below render what escapes a view: a :class:`~braid.errors.BraidError` as
its JSON error, werkzeug's HTTP errors (e.g. an unknown route) in vLLM's format, anything else
as a 500. API keys (:mod:`braid.http.auth`) and CORS (:mod:`braid.http.cors`) wrap the app's
ASGI callable, so they run before any route is matched; so do the status counter, the access
log and the forwarded-headers fix, in that order outwards.
"""

from __future__ import annotations

import logging
import time

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException

import braid
from braid.engine.base import Engine
from braid.errors import BraidError, error_payload
from braid.http import access_log, auth, cors, counting, forwarded, limits
from braid.http.body import CompletionStream
from braid.metrics import Metrics
from braid.routes import common as view
from braid.routes import tokenize as tokenize_view
from braid.routes.common import AppState, JsonResponse
from braid.settings import Settings
from braid.wire import openapi
from braid.wire import shapes as responses
from braid.wire.completions_response import error_body

log = logging.getLogger("braid")


class _KeepAliveSafeConnection(TrioASGIHTTPConnection):
    """Shields the final body send, so hypercorn can re-arm its keep-alive timer.

    Without it, quart-trio cancels the request nursery while hypercorn is still inside that send,
    which cancels the idle-timer restart, and idle keep-alive connections are never closed.
    """

    async def __call__(self, receive, send):  # type: ignore[no-untyped-def]
        async def send_final_shielded(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await super().__call__(receive, send_final_shielded)


class BraidApp(QuartTrio):
    asgi_http_class = _KeepAliveSafeConnection

    @property
    def state(self) -> AppState:
        return self.extensions["braid"]


ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/health",
        "/version",
        "/metrics",
        "/openapi.json",
    }
)
"""The app's routes, the values of the ``route`` label of ``braid_http_responses_total``."""


def _json(body: bytes, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(body, status=status, mimetype="application/json", headers=dict(headers))


def _answer(result: JsonResponse | CompletionStream, client_id: str | None) -> Response:
    """A view's answer as a quart response. X-Request-Id on every answer: the client's own, else
    the response's id (for a log line that a client's report can be matched to)."""
    if isinstance(result, JsonResponse):
        headers = result.headers
        if not any(name == "X-Request-Id" for name, _ in headers) and client_id is not None:
            headers = (*headers, ("X-Request-Id", client_id))
        return _json(result.body, result.status, headers)
    response = Response(
        result,
        status=200,
        mimetype="text/event-stream",
        headers={
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            "X-Request-Id": client_id or result.response_id,
        },
    )
    response.timeout = None  # quart's 60 s RESPONSE_TIMEOUT would cut long streams
    return response


def create_app(engine: Engine, settings: Settings | None = None, metrics: Metrics | None = None) -> BraidApp:
    settings = settings or Settings()
    info = engine.info
    app = BraidApp("braid")
    limits.configure_quart(app, settings)
    # Around quart's whole ASGI app, before routing: the key check sees every request, and CORS
    # (outermost) answers preflights without a key and labels the 401s too.
    auth.install(app, settings)
    cors.install(app, settings)
    state = AppState(engine, settings, metrics or Metrics())
    # Outside those: a 401, a preflight and a 404 are answers too.
    counting.install(app, state.metrics.http_responses, ROUTES)
    access_log.install(app, settings.access_log)
    # Outermost: the access log shows the forwarded client, and nothing inside sees the proxy.
    forwarded.install(app, settings.forwarded_allow_ips)
    state.metrics.track_engine_unfinished(engine.unfinished_requests)
    state.metrics.track_admission(lambda: state.admission.in_use, lambda: state.admission.queued)
    app.extensions["braid"] = state

    @app.errorhandler(BraidError)
    async def _braid_error(err: BraidError) -> Response:
        return _json(error_body(err), err.status, view.error_headers(err))

    @app.errorhandler(HTTPException)
    async def _http_error(err: HTTPException) -> Response:
        code = err.code or 500
        body = error_payload(err.description or err.name, err.name, None, code)
        # werkzeug's headers but its HTML content type: a 405 must say which methods are allowed
        # (RFC 9110 §15.5.6), as vLLM's (Starlette's) 405 does.
        headers = tuple((k, v) for k, v in err.get_headers() if k.lower() != "content-type")
        return _json(msgspec.json.encode(body), code, headers)

    @app.errorhandler(Exception)
    async def _unexpected(err: Exception) -> Response:
        log.exception("unexpected error", exc_info=err)
        return _json(error_body(BraidError("Internal server error")), 500)

    @app.post("/v1/completions")
    async def completions() -> Response:
        async def read_body() -> bytes:
            return await limits.read_body(request, settings)

        client_id = request.headers.get("X-Request-Id")
        result = await view.completions(
            state,
            read_body,
            content_type=request.headers.get("Content-Type"),
            request_id=client_id,
        )
        return _answer(result, client_id)

    async def chat(batch: bool) -> Response:
        async def read_body() -> bytes:
            return await limits.read_body(request, settings)

        client_id = request.headers.get("X-Request-Id")
        result = await view.chat_completions(
            state, read_body, content_type=request.headers.get("Content-Type"), request_id=client_id, batch=batch
        )
        return _answer(result, client_id)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await chat(batch=False)

    @app.post("/v1/chat/completions/batch")
    async def chat_completions_batch() -> Response:
        return await chat(batch=True)

    async def read_body() -> bytes:
        return await limits.read_body(request, settings)

    @app.post("/tokenize")
    async def tokenize() -> Response:
        result = await tokenize_view.tokenize(state, read_body, content_type=request.headers.get("Content-Type"))
        return _answer(result, request.headers.get("X-Request-Id"))

    @app.post("/detokenize")
    async def detokenize() -> Response:
        result = await tokenize_view.detokenize(state, read_body, content_type=request.headers.get("Content-Type"))
        return _answer(result, request.headers.get("X-Request-Id"))

    @app.get("/v1/models")
    async def models() -> Response:
        card = responses.ModelCard(
            id=info.name,
            object="model",
            created=int(time.time()),
            owned_by="braid",
            root=info.root,
            parent=None,
            max_model_len=info.max_model_len,
            permission=[],
        )
        return _json(msgspec.json.encode(responses.ModelList(object="list", data=[card])))

    @app.get("/health")
    async def health() -> Response:
        if state.draining or not engine.healthy:
            return Response(b"", status=503)
        return Response(b"", status=200)

    @app.get("/version")
    async def version() -> Response:
        return _json(msgspec.json.encode(responses.Version(version=braid.__version__)))

    @app.get("/metrics")
    async def metrics_view() -> Response:
        return Response(state.metrics.render(), mimetype="text/plain; version=0.0.4")

    spec = openapi.encoded(settings, braid.__version__)

    @app.get("/openapi.json")
    async def openapi_view() -> Response:
        return _json(spec)

    return app
