"""Cancellation through real hypercorn: every engine request of a batch ends when the batch does."""

from __future__ import annotations

import socket
from functools import partial

import httpx
import pytest
import trio

from tests.helpers import LiveServer, open_stalled_client, parse_sse, start_server

PROMPTS_64 = [f"prompt {i}" for i in range(64)]
LONG = {"max_tokens": 2000, "ignore_eos": True}
# Timing bounds run against a real server on a machine that may be busy, so they are generous:
# each is far above what the behaviour takes (milliseconds) and far below what the defect it
# targets would take (a LONG request generates for 10 s or more, the stall timeout is 30 s).
ABORTED_WITHIN = 2.0


async def _stream_events_until(chunks, count: int) -> list[object]:  # type: ignore[no-untyped-def]
    buf = b""
    async for raw in chunks:
        buf += raw
        if buf.count(b"\n\n") >= count:
            break
    return parse_sse(buf[: buf.rindex(b"\n\n") + 2])


async def test_stream_disconnect_aborts_all_64(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS_64, "stream": True, **LONG}) as r:
            events = await _stream_events_until(r.aiter_raw(), 100)
            assert len(events) >= 100 and srv.engine.in_flight == 64
        # leaving the block closes the connection mid-stream
        took = await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.aborted_total == 64 and len(set(srv.engine.aborted_ids)) == 64
    assert srv.aborts() == {"disconnect": 64}
    print(f"stream disconnect -> idle in {took * 1000:.1f} ms")
    srv.shutdown.set()


async def test_stream_error_in_prompt_17_aborts_siblings_at_once(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.005)
    prompts = list(PROMPTS_64)
    prompts[17] = "prompt 17 braid:fail@5"
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream("POST", "/v1/completions", json={"prompt": prompts, "stream": True, **LONG}) as r:
            # Not reading: the siblings must be aborted by the failure itself, not by the consumer.
            with trio.fail_after(5):
                await srv.engine.wait_until(lambda: srv.engine.failed_total > 0)
            took = await srv.wait_idle(ABORTED_WITHIN)
            events = parse_sse(await r.aread())
    assert srv.engine.failed_total == 1 and srv.engine.aborted_total == 63
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    err = events[-2]
    assert err["error"]["code"] == 500 and err["error"]["type"] == "InternalServerError"
    assert not any(isinstance(e, dict) and "usage" in e and not e.get("choices") for e in events)
    print(f"sibling failure -> idle in {took * 1000:.1f} ms")
    srv.shutdown.set()


async def test_non_stream_error_is_one_error_response(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.001)
    prompts = ["a", "b braid:fail@3", "c", "d"]
    async with httpx.AsyncClient(base_url=srv.url) as client:
        r = await client.post("/v1/completions", json={"prompt": prompts, **LONG})
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "InternalServerError"
    assert srv.engine.in_flight == 0 and srv.engine.aborted_total == 3
    assert srv.aborts() == {"error": 3}
    srv.shutdown.set()


async def test_non_stream_disconnect_aborts_all(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)
    async with httpx.AsyncClient(base_url=srv.url) as client, trio.open_nursery() as inner:
        inner.start_soon(partial(client.post, "/v1/completions", json={"prompt": PROMPTS_64, **LONG}))
        # the client gives up once all 64 are generating (not after a fixed time: a busy machine
        # may take longer to start them)
        with trio.fail_after(10):
            await srv.engine.wait_until(lambda: srv.engine.in_flight >= 64)
        inner.cancel_scope.cancel()
    took = await srv.wait_idle(ABORTED_WITHIN)
    assert srv.engine.aborted_total == 64 and srv.aborts() == {"disconnect": 64}
    print(f"non-stream disconnect -> idle in {took * 1000:.1f} ms")
    srv.shutdown.set()


async def test_client_that_stops_reading_is_aborted_after_stall_timeout(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.0, stall_timeout=0.3, buffer=8)
    host, port = srv.url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    body = b'{"prompt": ["x","y","z","w"], "stream": true, "max_tokens": 2000, "ignore_eos": true}'
    await stream.send_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    # never read: once the socket buffers fill, the drivers stall and abort their requests
    with trio.fail_after(10):
        await srv.engine.wait_until(lambda: srv.engine.aborted_total >= 4)
    assert srv.engine.in_flight == 0 and srv.engine.finished_total == 0
    assert srv.aborts() == {"stall": 4}
    await stream.aclose()
    srv.shutdown.set()


async def test_idle_stream_sends_heartbeat_comments(nursery: trio.Nursery) -> None:
    # tokens 0.3 s apart, heartbeat 0.05 s: a ping comes in each gap unless the loop stalls
    srv = await start_server(nursery, token_delay=0.3, heartbeat=0.05)
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream(
            "POST", "/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 3, "ignore_eos": True}
        ) as r:
            events = parse_sse(await r.aread())
    assert ":" in events and events[-1] == "[DONE]"
    assert sum(1 for e in events if isinstance(e, dict)) == 3
    srv.shutdown.set()


async def test_a_drain_ends_streams_that_outlast_it_with_an_error_event(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01)  # graceful_timeout is 1 s
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream(
            "POST", "/v1/completions", json={"prompt": PROMPTS_64[:8], "stream": True, **LONG}
        ) as r:
            chunks = r.aiter_raw()
            buf = b"".join([c async for c in _until(chunks, 10)])
            srv.shutdown.set()
            start = trio.current_time()
            async for raw in chunks:
                buf += raw
            waited = trio.current_time() - start
    events = parse_sse(buf)
    # ended 0.25 s before the drain's end (braid.http.server.DRAIN_FLUSH, a quarter of 1 s), not
    # before; the upper bound is loose for a busy machine, and far below the 20 s of the streams
    assert 0.7 <= waited <= 10.0
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert (error["code"], error["type"]) == (503, "ServiceUnavailableError") and "shut down" in error["message"]
    assert all("error" not in e for e in events[:-2] if isinstance(e, dict))
    assert srv.engine.in_flight == 0 and srv.engine.aborted_total == 8
    assert srv.aborts() == {"drain": 8}  # ended by the drain's DrainTimeout
    with trio.fail_after(5):
        await srv.stopped.wait()


async def _until(chunks, count: int):  # type: ignore[no-untyped-def]
    """Yield raw chunks until ``count`` SSE events have arrived."""
    seen = 0
    async for raw in chunks:
        yield raw
        seen += raw.count(b"\n\n")
        if seen >= count:
            return


async def test_health_is_503_while_draining(server: LiveServer, client: httpx.AsyncClient) -> None:
    server.app.state.draining = True
    assert (await client.get("/health")).status_code == 503
    r = await client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"


async def test_idle_keep_alive_connection_is_closed_by_the_server(nursery: trio.Nursery) -> None:
    """quart-trio cancels hypercorn's keep-alive timer unless the final send is shielded."""
    from braid.engine.scripted import ScriptedEngine
    from braid.http.app import create_app
    from braid.http.server import ServerConfig, serve

    app = create_app(ScriptedEngine())
    shutdown = trio.Event()
    cfg = ServerConfig(port=0, keep_alive_timeout=0.3, graceful_timeout=0.5)
    (url,) = await nursery.start(partial(serve, app, cfg, shutdown=shutdown, handle_signals=False))
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    got = b""
    with trio.fail_after(10):  # the timeout is 0.3 s; without the fix the connection stays open
        while True:
            data = await stream.receive_some()
            if not data:
                break  # the server closed the idle connection
            got += data
    assert got.startswith(b"HTTP/1.1 200")
    shutdown.set()


async def test_quarts_response_timeout_does_not_cut_streams(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.05)
    srv.app.config["RESPONSE_TIMEOUT"] = 0.2
    async with httpx.AsyncClient(base_url=srv.url) as client:
        async with client.stream(
            "POST", "/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 10, "ignore_eos": True}
        ) as r:
            events = parse_sse(await r.aread())
    assert events[-1] == "[DONE]" and sum(1 for e in events if isinstance(e, dict)) == 10
    srv.shutdown.set()


@pytest.mark.parametrize("fail_at", [20, 250])
async def test_a_failure_aborts_the_batch_while_the_client_reads_nothing(nursery: trio.Nursery, fail_at: int) -> None:
    """The issue's case: a 64-prompt stream, prompt 40 failing, a client that never calls recv.
    Every driver is blocked behind the full stream buffer when the engine fails the prompt; the
    63 siblings must be aborted then (they used to run on until the 30 s stall timeout)."""
    import json

    srv = await start_server(nursery, token_delay=0.005)
    prompts = list(PROMPTS_64)
    prompts[40] = f"prompt 40 braid:fail@{fail_at}"
    body = json.dumps({"prompt": prompts, "stream": True, "max_tokens": 400, "ignore_eos": True}).encode()
    stream = await open_stalled_client(srv.url, body)
    try:
        with trio.fail_after(10):  # the failure comes at fail_at x 5 ms of engine time
            await srv.engine.wait_until(lambda: srv.engine.failed_total > 0)
        failed_at = trio.current_time()
        took = await srv.wait_idle(0.1)
    finally:
        await stream.aclose()  # else a failed check leaves the server's send blocked for ever
    assert srv.engine.aborted_total == 63 and srv.engine.finished_total == 0
    assert srv.gauge("braid_engine_errors_total") == 1 and srv.aborts() == {"error": 63}
    print(f"fail@{fail_at}: in flight 0 within {took * 1000:.1f} ms of the failure (at {failed_at:.2f} s)")
    srv.shutdown.set()
