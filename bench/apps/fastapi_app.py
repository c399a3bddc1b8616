"""FastAPI on uvicorn (vLLM's HTTP stack, with uvicorn's defaults: uvloop and httptools when
installed), serving the same bytes as the bare app.

``POST /v1/completions`` parses the JSON body, then either streams the events with a
``StreamingResponse`` over an async generator (one ASGI body send per event, as vLLM's server
does) or returns the non-streaming body. The access log is off, as braid's is by default.

Run: python -m bench.apps.fastapi_app --port P --stream FILE --json FILE
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from bench.apps import payload_from_argv


def make_app(events: list[bytes], body: bytes) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(b"")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await request.json()
        if req.get("stream"):

            async def gen():  # type: ignore[no-untyped-def]
                for event in events:
                    yield event

            return StreamingResponse(gen(), media_type="text/event-stream")
        return Response(body, media_type="application/json")

    return app


def main() -> None:
    port, events, body, _ = payload_from_argv()
    uvicorn.run(make_app(events, body), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
