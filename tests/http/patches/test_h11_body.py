"""DirectBodyH11Protocol (braid.http.patches.h11_body) writes exactly the bytes hypercorn's H11Protocol writes."""

from __future__ import annotations

import types

import h11
import hypercorn.protocol
import pytest
import trio
from hypercorn.config import Config
from hypercorn.events import RawData
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.protocol.h11 import H11Protocol

from braid.http.patches import PatchOptions, installed
from braid.http.patches.h11_body import DirectBodyH11Protocol

CHUNKED = [(b"content-type", b"text/event-stream")]
SIZED = [(b"content-type", b"application/json"), (b"content-length", b"9")]


def _wire(cls: type[H11Protocol], request: bytes, headers: list[tuple[bytes, bytes]], bodies: list[bytes]) -> bytes:
    sent: list[bytes] = []

    async def send(event: object) -> None:
        assert isinstance(event, RawData)
        sent.append(event.data)

    async def main() -> None:
        context = types.SimpleNamespace(event_class=trio.Event)
        proto = cls(None, Config(), context, None, None, False, None, None, send)  # type: ignore[arg-type]
        proto.connection.receive_data(request)
        while not isinstance(proto.connection.next_event(), h11.EndOfMessage):
            pass  # the request line, its headers, its (empty) body
        await proto.stream_send(Response(1, headers, 200))
        for data in bodies:
            await proto.stream_send(Body(1, data))
        await proto.stream_send(EndBody(1))

    trio.run(main)
    return b"".join(sent)


@pytest.mark.parametrize(
    ("request_line", "headers", "bodies"),
    [
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            CHUNKED,
            [b"data: 1\n\n", b"", b"data: 2\n\n" * 40],
        ),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", SIZED, [b"{", b"", b'"a": 1}\n']),
        (b"POST / HTTP/1.0\r\nContent-Length: 0\r\n\r\n", CHUNKED, [b"data: 1\n\n", b"data: 2\n\n"]),
    ],
    ids=["chunked", "content-length", "http-1.0"],
)
def test_the_bytes_are_hypercorns(request_line: bytes, headers: list[tuple[bytes, bytes]], bodies: list[bytes]) -> None:
    stock = _wire(H11Protocol, request_line, headers, bodies)
    assert _wire(DirectBodyH11Protocol, request_line, headers, bodies) == stock
    assert all(b in stock for b in bodies)


def test_a_chunk_is_framed_by_braid_only_while_the_response_is_chunked() -> None:
    framed: list[int] = []

    original = H11Protocol.stream_send

    async def counting(self: H11Protocol, event: object) -> None:
        if isinstance(event, Body):
            framed.append(len(event.data))
        await original(self, event)  # type: ignore[arg-type]

    H11Protocol.stream_send = counting  # type: ignore[method-assign]
    try:
        _wire(
            DirectBodyH11Protocol, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", CHUNKED, [b"ab", b"cd"]
        )
        assert framed == []  # chunked: h11 never saw a Body
        sized_2 = [(b"content-length", b"2")]
        _wire(DirectBodyH11Protocol, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", sized_2, [b"ab"])
        assert framed == [2]  # Content-Length: h11's own writer counts the bytes
    finally:
        H11Protocol.stream_send = original  # type: ignore[method-assign]


def test_the_patch_installs_and_restores() -> None:
    with installed(PatchOptions.only("h11_body")):
        assert hypercorn.protocol.H11Protocol is DirectBodyH11Protocol
    assert hypercorn.protocol.H11Protocol is H11Protocol
    with installed(PatchOptions().without("h11_body")):
        assert hypercorn.protocol.H11Protocol is H11Protocol
