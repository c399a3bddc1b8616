"""braid.http.limits over real hypercorn and raw sockets: the header block, the body's size and
its arrival time. Each refusal must come while the client is still sending (or stalled), in
vLLM's error shape where the app answers, and must leave no connection behind."""

from __future__ import annotations

import json

import h2.config
import h2.connection
import h2.events
import httpx
import hypercorn.config
import pytest
import trio

from braid.http.limits import configure_hypercorn
from braid.settings import Settings
from tests.helpers import LiveServer, start_server

JSON_HEADERS = b"Content-Type: application/json\r\n"


async def connect(server: LiveServer) -> trio.SocketStream:
    host, _, port = server.url.removeprefix("http://").rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


async def until_closed(stream: trio.SocketStream, within: float) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``within`` s)."""
    received = bytearray()
    with trio.fail_after(within):
        while data := await stream.receive_some():
            received += data
    return bytes(received)


def response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, as (status, headers, body); nothing may follow it."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    assert len(body) == int(headers["content-length"]), raw[:300]
    return int(status_line.split()[1]), headers, body


def vllm_error(body: bytes, code: int) -> dict[str, object]:
    error = json.loads(body)["error"]
    assert list(error) == ["message", "type", "param", "code"] and error["code"] == code
    return error


def post_head(length: int | None, *, extra: bytes = b"") -> bytes:
    framing = b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length
    return b"POST /v1/completions HTTP/1.1\r\nHost: braid\r\n" + JSON_HEADERS + framing + extra + b"\r\n"


# --- body size ------------------------------------------------------------------------------------


async def test_a_declared_body_over_the_limit_is_a_413_before_it_is_sent(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, max_body_bytes=1000)
    stream = await connect(server)
    await stream.send_all(post_head(10**9) + b'{"prompt": "')  # a gigabyte declared, 12 bytes sent
    status, headers, body = response(await until_closed(stream, within=5))
    assert status == 413 and headers["content-type"] == "application/json"
    error = vllm_error(body, 413)
    assert error["type"] == "Request Entity Too Large" and "1000 bytes" in str(error["message"])


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(nursery: trio.Nursery) -> None:
    """No Content-Length: the 413 comes as the chunks pass the limit, with the body unfinished."""
    server = await start_server(nursery, max_body_bytes=1000)
    stream = await connect(server)
    await stream.send_all(post_head(None))
    for _ in range(3):  # 1200 bytes, and no final chunk: only the limit can end the read
        await stream.send_all(b"190\r\n" + b" " * 400 + b"\r\n")
    status, _, body = response(await until_closed(stream, within=5))
    assert status == 413
    assert vllm_error(body, 413)["type"] == "Request Entity Too Large"


async def test_a_chunked_body_within_the_limit_is_served(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, max_body_bytes=1000)
    stream = await connect(server)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    await stream.send_all(post_head(None, extra=b"Connection: close\r\n"))
    await stream.send_all(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    status, _, answer = response(await until_closed(stream, within=5))
    assert status == 200 and json.loads(answer)["choices"]


@pytest.mark.parametrize(("size", "status"), [(1000, 200), (1001, 413), (5 * 2**20, 413)])
async def test_the_limit_holds_for_an_ordinary_client(nursery: trio.Nursery, size: int, status: int) -> None:
    server = await start_server(nursery, max_body_bytes=1000)
    body = json.dumps({"prompt": "hi", "max_tokens": 2, "user": ""}).encode()
    body = body[:-2] + b"u" * (size - len(body)) + b'"}'
    assert len(body) == size
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert server.engine.finished_total == (status == 200)


def test_the_default_body_limit_holds_a_full_batch_of_token_ids() -> None:
    """1024 prompts of 4000 token ids of six digits (the widest a vocabulary needs), as json.dumps writes them."""
    batch = {"prompt": [[262143] * 4000] * 1024, "max_tokens": 1}
    assert len(json.dumps(batch)) < Settings().max_body_bytes


# --- body arrival ---------------------------------------------------------------------------------


async def test_a_body_that_stops_arriving_is_a_408_and_frees_the_connection(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, body_timeout=0.5)
    stream = await connect(server)
    start = trio.current_time()
    await stream.send_all(post_head(1000) + b'{"prompt":')  # 10 of the 1000 bytes, then nothing
    raw = await until_closed(stream, within=5)
    took = trio.current_time() - start
    status, _, body = response(raw)
    assert status == 408
    error = vllm_error(body, 408)
    assert error["type"] == "Request Timeout" and "0.5 s" in str(error["message"])
    assert 0.5 <= took < 2, took


async def test_a_slow_body_that_arrives_in_time_is_served(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, body_timeout=1.0)
    stream = await connect(server)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    await stream.send_all(post_head(len(body), extra=b"Connection: close\r\n"))
    for i in range(0, len(body), 10):
        await trio.sleep(0.05)
        await stream.send_all(body[i : i + 10])
    status, _, _ = response(await until_closed(stream, within=5))
    assert status == 200


# --- header block ---------------------------------------------------------------------------------


async def send_header_block(server: LiveServer, size: int) -> int:
    """A GET whose header block is about ``size`` bytes, sent as a client that is slow to finish it
    would send it: everything but the final blank line first. Returns the status of the answer."""
    stream = await connect(server)
    await stream.send_all(b"GET /health HTTP/1.1\r\nHost: braid\r\nConnection: close\r\nX-Big: " + b"a" * size)
    with trio.move_on_after(0.2):  # an unfinished block over the limit is answered now
        if raw := await stream.receive_some():
            return response(raw + await until_closed(stream, within=5))[0]
    await stream.send_all(b"\r\n\r\n")
    return response(await until_closed(stream, within=5))[0]


@pytest.mark.parametrize(("size", "status"), [(500, 200), (2000, 431)])
async def test_a_header_block_over_the_limit_is_hypercorns_431(nursery: trio.Nursery, size: int, status: int) -> None:
    server = await start_server(nursery, max_header_bytes=1024)
    assert await send_header_block(server, size) == status


def test_the_header_limit_is_hypercorns_and_advertised_on_http2() -> None:
    config = hypercorn.config.Config()
    configure_hypercorn(config, Settings(max_header_bytes=12345))
    assert config.h11_max_incomplete_size == config.h2_max_header_list_size == 12345


async def http2_get_with_header(server: LiveServer, size: int) -> type[h2.events.Event]:
    """GET /health over HTTP/2 (prior knowledge) with a header of ``size`` bytes: the event that
    ends the exchange, StreamEnded (served) or ConnectionTerminated."""
    stream = await connect(server)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":path", "/health"), (":scheme", "http"), (":authority", "braid")]
    conn.send_headers(1, [*headers, ("x-big", "a" * size)], end_stream=True)
    await stream.send_all(conn.data_to_send())
    with trio.fail_after(5):
        while data := await stream.receive_some():
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded | h2.events.ConnectionTerminated):
                    return type(event)
            await stream.send_all(conn.data_to_send())
    raise AssertionError("closed without an answer")


async def test_http2_bounds_the_header_list_at_the_default(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    assert await http2_get_with_header(server, 40 * 1024) is h2.events.StreamEnded
    assert await http2_get_with_header(server, 70 * 1024) is h2.events.ConnectionTerminated


async def test_the_default_header_limit_is_braids_not_hypercorns(nursery: trio.Nursery) -> None:
    """hypercorn alone allows 16 KiB on HTTP/1.1; braid's default is its HTTP/2 limit, 64 KiB."""
    server = await start_server(nursery)
    assert await send_header_block(server, 40 * 1024) == 200
    assert await send_header_block(server, 70 * 1024) == 431
