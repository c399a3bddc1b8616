"""The quart-trio app: routes and error rendering.

Every POST route is declared by its module in :mod:`braid.routes` (its path, its quart-free view,
its OpenAPI entry) and served here the same way: the route reads the body (within the limits of
:mod:`braid.http.limits`), calls the view, and turns its answer into a quart ``Response`` (a JSON
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
from typing import TYPE_CHECKING

import msgspec
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

import braid
from braid.batch.runner import BatchRunner
from braid.engine.adapters import AdapterRegistry
from braid.engine.base import Engine, LoraLoader
from braid.errors import BraidError, error_payload
from braid.http import access_log, auth, cors, counting, forwarded, limits, orca, request_id, storage
from braid.http import load as load_tracking
from braid.http.auth import BACKGROUND, OWNER
from braid.metrics import EngineFamilies, Metrics
from braid.routes import (
    anthropic,
    batches,
    chat,
    completions,
    files,
    invocations,
    load,
    lora,
    tokenize,
    tokenizer_info,
)
from braid.routes import responses as responses_api
from braid.routes.common import AppState, JsonResponse, Route, ViewResult, error_headers
from braid.settings import Settings
from braid.store.db import Store
from braid.store.records import ANONYMOUS
from braid.wire import openapi
from braid.wire import shapes as responses
from braid.wire.output import error_body

if TYPE_CHECKING:
    from braid.engine.vllm_parsers import Parsers

log = logging.getLogger("braid")


class BraidApp(QuartTrio):
    # No asgi_http_class of its own: braid.http.patches.final_send replaces quart-trio's while a
    # server runs, and BraidApp inherits it.
    request_class = storage.BraidRequest

    @property
    def state(self) -> AppState:
        return self.extensions["braid"]

    @property
    def batches(self) -> BatchRunner | None:
        """The batch runner when the app has a store: the server runs it (:meth:`BatchRunner.run`)."""
        return self.extensions.get("braid.batches")


POST_ROUTES: tuple[Route, ...] = (
    *completions.ROUTES,
    *chat.ROUTES,
    *tokenize.ROUTES,
    *invocations.ROUTES,
    *responses_api.ROUTES,
    *anthropic.ROUTES,
)
"""Every POST route of the API, each declared beside its view (its path, view and OpenAPI entry)."""

OPERATIONS: tuple[openapi.Operation, ...] = (
    *(r.operation for r in POST_ROUTES),
    *openapi.SERVER_OPERATIONS,
    *load.OPERATIONS,
)
"""What ``GET /openapi.json`` documents: every route of the app."""

ROUTES = frozenset(op.path for op in OPERATIONS)
"""The app's routes, the values of the ``route`` label of ``braid_http_responses_total``; with
``--enable-tokenizer-info-endpoint``, ``/tokenizer_info`` too, and the LoRA routes when runtime
updating is allowed (:func:`operations`)."""


STORE_OPERATIONS: tuple[openapi.Operation, ...] = (
    *files.OPERATIONS,
    *batches.OPERATIONS,
    *responses_api.STORED_OPERATIONS,
)
"""The routes on braid's store (``/v1/files``, ``/v1/batches``, stored responses), served with a store."""


def operations(settings: Settings, store: bool = False) -> tuple[openapi.Operation, ...]:
    """The routes an app with ``settings`` serves: :data:`OPERATIONS`, and the optional ones its
    options (and a ``store``) turn on (served, documented and counted only then)."""
    optional = (tokenizer_info.OPERATION,) if settings.serving.tokenizer_info_endpoint else ()
    lora_operations = lora.OPERATIONS if settings.runtime_lora_updating else ()
    store_operations = STORE_OPERATIONS if store else ()
    return (*OPERATIONS, *optional, *lora_operations, *store_operations)


def _json(body: bytes, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(body, status=status, mimetype="application/json", headers=dict(headers))


def _answer(result: ViewResult, client_id: str | None) -> Response:
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


def _serve(app: BraidApp, state: AppState, route: Route) -> None:
    """Serve ``route``: read its body within the limits, call its view, answer what it returns."""
    view = route.view
    settings = state.settings

    async def read_body() -> bytes:
        body = await limits.read_body(request, settings)
        if route.adapt_body is not None:
            body = route.adapt_body(body, request.headers.get)
        return body

    async def handler() -> Response:
        client_id = request.headers.get("X-Request-Id")
        owner = {"owner": str(request.scope.get(OWNER, ANONYMOUS))} if route.owned else {}
        result = await view(
            state,
            read_body,
            content_type=request.headers.get("Content-Type"),
            request_id=client_id,
            background=bool(request.scope.get(BACKGROUND, False)),
            **owner,  # type: ignore[arg-type]
        )
        if route.reports_load and isinstance(result, JsonResponse) and result.status == 200:
            report = orca.load_header(request.headers.get(orca.FORMAT_HEADER), state.metrics)
            if report:
                result = JsonResponse(result.status, result.body, (*result.headers, *report))
        return _answer(result, client_id)

    app.add_url_rule(route.path, route.path, handler, methods=["POST"])


def _serve_lora(app: BraidApp, state: AppState, registry: AdapterRegistry | None) -> None:
    """vLLM's LoRA load and unload routes (braid.routes.lora); a success is a sentence."""

    async def read_body() -> bytes:
        return await limits.read_body(request, state.settings)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter() -> Response:
        text = await lora.load_lora_adapter(registry, read_body, content_type=request.headers.get("Content-Type"))
        return Response(text, status=200, mimetype="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter() -> Response:
        text = await lora.unload_lora_adapter(registry, read_body, content_type=request.headers.get("Content-Type"))
        return Response(text, status=200, mimetype="text/plain")


def _parsers(engine: Engine, settings: Settings) -> Parsers | None:
    """The parsers the server's flags name, loaded with the model's tokenizer (vLLM imported only
    then); ParserConfigError, one line, for a parser the model's tokenizer cannot serve."""
    if not settings.parsers.active:
        return None
    from braid.engine.vllm_parsers import load_parsers

    return load_parsers(settings.parsers, engine.tokenizer.parser_tokenizer(), engine.info.name)


def create_app(
    engine: Engine, settings: Settings | None = None, metrics: Metrics | None = None, store: Store | None = None
) -> BraidApp:
    """The app on ``engine``. With a ``store`` (``braid serve`` always opens one), ``/v1/files``
    and ``/v1/batches`` are served too (:mod:`braid.http.storage`); the caller owns the store
    and closes it after the app has stopped serving."""
    settings = settings or Settings()
    app = BraidApp("braid")
    limits.configure_quart(app, settings)
    # Innermost: only requests the app takes count in GET /load (not a 401, as in vLLM).
    server_load = load.ServerLoad(tracking=settings.server_load_tracking)
    load_tracking.install(app, server_load)
    # Around quart's whole ASGI app, before routing: the key check sees every request, and CORS
    # (outermost) answers preflights without a key and labels the 401s too.
    auth.install(app, settings)
    cors.install(app, settings)
    # Outside CORS: a preflight and a 401 carry the id too, as vLLM's (its outermost middleware).
    request_id.install(app, settings.serving.request_id_headers)
    state = AppState(engine, settings, metrics or Metrics(), parsers=_parsers(engine, settings), store=store)
    served = operations(settings, store=store is not None)
    # Outside those: a 401, a preflight and a 404 are answers too.
    counting.install(app, state.metrics.http_responses, frozenset(op.path for op in served))
    access_log.install(app, settings.access_log)
    # Outermost: the access log shows the forwarded client, and nothing inside sees the proxy.
    forwarded.install(app, settings.forwarded_allow_ips)
    state.metrics.track_engine_unfinished(engine.unfinished_requests)
    state.metrics.track_admission(lambda: state.admission.in_use, lambda: state.admission.queued)
    # vLLM's own families (vllm:*) when the engine keeps them; braid's waiting requests (those in
    # admission's ring, waiting for engine slots) count in vllm:num_requests_waiting.
    families: EngineFamilies | None = getattr(engine, "families", None)
    if families is not None:
        state.metrics.track_engine(families, lambda: state.admission.waiting)
    app.extensions["braid"] = state
    if settings.runtime_lora_updating:
        _serve_lora(app, state, AdapterRegistry(engine) if isinstance(engine, LoraLoader) else None)

    @app.errorhandler(BraidError)
    async def _braid_error(err: BraidError) -> Response:
        return _json(error_body(err), err.status, error_headers(err))

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

    for route in POST_ROUTES:
        _serve(app, state, route)
    if store is not None:
        store.on_error = state.metrics.store_errors.inc
        runner = BatchRunner(state, store)
        state.spawn = runner.spawn
        state.metrics.track_batches(lambda: runner.active)
        app.extensions["braid.batches"] = runner
        storage.install(app, state, store, runner)

    @app.get("/v1/models")
    async def models() -> Response:
        info = engine.info  # now: adapters come and go (braid.engine.adapters)
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
        # The LoRA adapters after the model, as vLLM lists them: their path as root, the model as parent.
        adapters = [
            responses.ModelCard(
                id=a.name,
                object="model",
                created=card.created,
                owned_by="braid",
                root=a.path,
                parent=a.parent,
                max_model_len=None,
                permission=[],
            )
            for a in info.adapters
        ]
        return _json(msgspec.json.encode(responses.ModelList(object="list", data=[card, *adapters])))

    @app.get("/health")
    async def health() -> Response:
        if state.draining or not engine.healthy:
            return Response(b"", status=503)
        return Response(b"", status=200)

    @app.get("/load")
    async def load_view() -> Response:
        return _json(load.load_body(server_load))

    @app.get("/get_load")
    async def router_load_view() -> Response:
        return _json(load.router_load_body(server_load))

    version_body = msgspec.json.encode(
        responses.Version(version=engine.info.engine_version or braid.__version__, braid_version=braid.__version__)
    )

    @app.get("/version")
    async def version() -> Response:
        return _json(version_body)

    if settings.serving.tokenizer_info_endpoint:
        info_body: list[bytes] = []  # built on the first request: the tokenizer never changes

        @app.get(tokenizer_info.PATH)
        async def tokenizer_info_view() -> Response:
            if not info_body:
                info_body.append(tokenizer_info.tokenizer_info_body(engine.tokenizer))
            return _json(info_body[0])

    @app.get("/metrics")
    async def metrics_view() -> Response:
        return Response(state.metrics.render(), mimetype="text/plain; version=0.0.4")

    spec = openapi.encoded(settings, braid.__version__, served)

    @app.get("/openapi.json")
    async def openapi_view() -> Response:
        return _json(spec)

    return app
