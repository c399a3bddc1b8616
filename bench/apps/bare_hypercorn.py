"""A bare ASGI app on hypercorn's trio worker: the floor of what braid's HTTP stack costs.

``POST /per-event`` streams the events with one ASGI body send each, ``POST /per-response``
sends the whole stream in one body send, ``POST /json`` returns the non-streaming body (one
send, with Content-Length). Every route reads the request body first. hypercorn is configured
as ``braid.http.server`` configures it (same keep-alive, no access log). With ``--fast-send`` it serves
with every patch of :mod:`braid.http.patches` installed (the direct socket write of
:mod:`braid.http.patches.fast_send`, the body framing of :mod:`braid.http.patches.h11_body`, ...),
the stack braid itself runs on.

Run: python -m bench.apps.bare_hypercorn --port P --stream FILE --json FILE [--fast-send]
"""

from __future__ import annotations

import hypercorn.config
import hypercorn.trio
import trio

from bench.apps import payload_from_argv
from braid.http.patches import PatchOptions, installed

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def make_app(events: list[bytes], body: bytes):  # type: ignore[no-untyped-def]
    whole = b"".join(events)
    json_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        while True:  # read the whole request body, as a real handler must
            message = await receive()
            if not message.get("more_body", False):
                break
        if path == "/per-event":
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif path == "/per-response":
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await send({"type": "http.response.body", "body": whole, "more_body": False})
        elif path in ("/json", "/health"):
            await send({"type": "http.response.start", "status": 200, "headers": json_headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        else:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    port, events, body, switches = payload_from_argv("--fast-send")
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 75.0
    config.accesslog = None
    # --fast-send: every patch braid serves with; without: hypercorn as it is.
    with installed(PatchOptions() if "--fast-send" in switches else PatchOptions.only()):
        trio.run(hypercorn.trio.serve, make_app(events, body), config)


if __name__ == "__main__":
    main()
