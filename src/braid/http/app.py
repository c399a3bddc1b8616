"""The quart-trio app: routes, error rendering, and the completions view.

The view is the whole data path in order: validate (:mod:`braid.request`), tokenize
(:mod:`braid.tokenize`), plan (:mod:`braid.plan`), run (:mod:`braid.run`), merge
(:mod:`braid.merge`), encode (:mod:`braid.encode`). Everything that can fail before generation
fails here, as a JSON error, before a 200 is committed; later failures become an SSE error event
(streams) or a JSON error (non-streaming responses, which are sent only when complete).
"""

from __future__ import annotations

import logging
import time
import uuid

import attrs
import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException

import braid
from braid.encode import error_body
from braid.engine.base import Engine
from braid.errors import BraidError, EngineUnavailable, ModelNotFound, SchemaError, error_payload
from braid.http.body import CompletionStream
from braid.merge import ResponseCollector, StreamMerger
from braid.metrics import Metrics
from braid.plan import check_limits, make_plan
from braid.request import Limits, parse_request
from braid.run import CompletionRun
from braid.tokenize import encode_prompts

log = logging.getLogger("braid")


@attrs.frozen
class Settings:
    max_prompts: int = 1024
    max_choices: int = 4096
    buffer: int = 64
    # Both > 0: a heartbeat of 0 would make every stream's clock spin (braid.run).
    stall_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    heartbeat: float = attrs.field(default=15.0, validator=attrs.validators.gt(0))
    # vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens
    prompt_tokens_details: bool = False


@attrs.define(eq=False)
class AppState:
    engine: Engine
    settings: Settings
    metrics: Metrics
    limits: Limits
    draining: bool = False
    # One large batch tokenizes on a worker thread at a time (the tokenizer's worker copy is
    # not shared between threads; see braid.tokenize).
    tokenize_limiter: trio.CapacityLimiter = attrs.Factory(lambda: trio.CapacityLimiter(1))


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


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status=status, mimetype="application/json")


def create_app(engine: Engine, settings: Settings | None = None, metrics: Metrics | None = None) -> BraidApp:
    settings = settings or Settings()
    info = engine.info
    limits = Limits(
        max_prompts=settings.max_prompts,
        max_choices=settings.max_choices,
        max_logprobs=info.max_logprobs,
        vocab_size=info.vocab_size,
    )
    app = BraidApp("braid")
    state = AppState(engine, settings, metrics or Metrics(), limits)
    unfinished = getattr(engine, "unfinished_requests", None)
    if unfinished is not None:
        state.metrics.track_engine_unfinished(unfinished)
    app.extensions["braid"] = state

    @app.errorhandler(BraidError)
    async def _braid_error(err: BraidError) -> Response:
        return _json(error_body(err), err.status)

    @app.errorhandler(HTTPException)
    async def _http_error(err: HTTPException) -> Response:
        code = err.code or 500
        body = error_payload(err.description or err.name, err.name, None, code)
        return _json(msgspec.json.encode(body), code)

    @app.errorhandler(Exception)
    async def _unexpected(err: Exception) -> Response:
        log.exception("unexpected error", exc_info=err)
        return _json(error_body(BraidError("Internal server error")), 500)

    @app.post("/v1/completions")
    async def completions() -> Response:
        if request.mimetype != "application/json":
            raise SchemaError("Unsupported Media Type: Only 'application/json' is allowed")
        if state.draining or not engine.healthy:
            raise EngineUnavailable("The server is shutting down." if state.draining else "The engine is not running.")
        body = await request.get_data(cache=False)
        req = parse_request(body, limits)  # type: ignore[arg-type]
        if req.model is not None and req.model != info.name:
            raise ModelNotFound(f"The model `{req.model}` does not exist.", param="model")
        rid = request.headers.get("X-Request-Id") or req.request_id
        # The response id may be the client's own; the engine's ids must be unique, because a
        # batch abort names the requests to drop by them (two clients may send the same id).
        unique = uuid.uuid4().hex
        check_limits(req, info, engine.tokenizer)  # before tokenizing: an over-long text costs nothing
        encoded = await encode_prompts(req, engine.tokenizer, state.tokenize_limiter)
        plan = make_plan(
            req, info, engine.tokenizer, request_id=f"cmpl-{rid or unique}", created=int(time.time()),
            engine_request_id=f"cmpl-{rid}-{unique[:8]}" if rid else None, encoded=encoded,
            cached_tokens=settings.prompt_tokens_details,
        )
        run = CompletionRun(engine, plan, state.metrics, buffer=settings.buffer, stall_timeout=settings.stall_timeout)
        if plan.stream:
            stream = CompletionStream(run, StreamMerger(plan, engine.tokenizer), heartbeat=settings.heartbeat)
            response = Response(
                stream,
                status=200,
                mimetype="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
            response.timeout = None  # quart's 60 s RESPONSE_TIMEOUT would cut long streams
            return response
        collector = ResponseCollector(plan, engine.tokenizer)
        async with run:
            while True:
                try:
                    collector.feed(await run.receive_ready())
                except trio.EndOfChannel:
                    break
        return _json(collector.body())

    @app.get("/v1/models")
    async def models() -> Response:
        card = {
            "id": info.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "braid",
            "root": info.root,
            "parent": None,
            "max_model_len": info.max_model_len,
            "permission": [],
        }
        return _json(msgspec.json.encode({"object": "list", "data": [card]}))

    @app.get("/health")
    async def health() -> Response:
        if state.draining or not engine.healthy:
            return Response(b"", status=503)
        return Response(b"", status=200)

    @app.get("/version")
    async def version() -> Response:
        return _json(msgspec.json.encode({"version": braid.__version__}))

    @app.get("/metrics")
    async def metrics_view() -> Response:
        return Response(state.metrics.render(), mimetype="text/plain; version=0.0.4")

    return app
