"""braid.http.patches.fast_send: the direct socket write keeps hypercorn's send contract.

The server under test is a real FastSendTCPServer on one end of a trio socketpair, with a fake
protocol that records what hypercorn's protocol would be told. Small kernel buffers force the
partial-write and full-buffer paths.
"""

from __future__ import annotations

import socket

import httpx
import hypercorn.config
import hypercorn.trio.run
import trio
import trio.testing
from hypercorn.events import Closed, RawData
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.fast_send import FastSendTCPServer
from tests.helpers import parse_sse, start_server

BIG = bytes(range(256)) * 16384  # 4 MiB: far more than a small socket buffer takes at once


class RecordingProtocol:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


def make_server(stream: object) -> tuple[FastSendTCPServer, RecordingProtocol]:
    srv = FastSendTCPServer(None, hypercorn.config.Config(), None, None, stream)  # type: ignore[arg-type]
    srv.protocol = RecordingProtocol()  # type: ignore[assignment]
    return srv, srv.protocol  # type: ignore[return-value]


def small_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return trio.SocketStream(a), trio.SocketStream(b)


async def read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        data = await stream.receive_some(65536)
        assert data, f"EOF after {len(got)} of {n} bytes"
        got += data
    return bytes(got)


async def test_a_chunk_the_kernel_takes_is_sent_without_a_checkpoint() -> None:
    server_end, client_end = small_pair()
    srv, _ = make_server(server_end)
    with trio.CancelScope() as scope:
        scope.cancel()
        # Already cancelled: any checkpoint (hypercorn's lock, its send_all) would raise here.
        await srv.protocol_send(RawData(b"data: 1\n\n"))
    assert not scope.cancelled_caught
    assert await read_exactly(client_end, 9) == b"data: 1\n\n"
    assert not srv.send_lock.locked()


async def test_the_stock_path_does_checkpoint() -> None:
    """The control for the test above: hypercorn's own path raises Cancelled in a cancelled scope."""
    server_end, _client_end = small_pair()
    srv, _ = make_server(server_end)
    with trio.CancelScope() as scope:
        scope.cancel()
        await TCPServer.protocol_send(srv, RawData(b"data: 1\n\n"))
    assert scope.cancelled_caught


async def test_partial_write_sends_the_rest_in_order_before_the_next_chunk() -> None:
    server_end, client_end = small_pair()
    srv, protocol = make_server(server_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv.protocol_send, RawData(BIG))
        await trio.testing.wait_all_tasks_blocked()
        assert srv.send_lock.locked()  # the rest is waiting for room, holding the lock
        nursery.start_soon(srv.protocol_send, RawData(b"TAIL"))
        await trio.testing.wait_all_tasks_blocked()
        got = await read_exactly(client_end, len(BIG) + 4)
    assert got == BIG + b"TAIL"
    assert protocol.events == []
    assert not srv.send_lock.locked()


async def test_a_cancelled_partial_write_still_finishes_the_chunk() -> None:
    """hypercorn shields every send: a cancelled task must not leave half a chunk on the wire."""
    server_end, client_end = small_pair()
    srv, _ = make_server(server_end)
    sender = trio.CancelScope()

    async def send_big() -> None:
        with sender:
            await srv.protocol_send(RawData(BIG))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_big)
        await trio.testing.wait_all_tasks_blocked()
        sender.cancel()
        got = await read_exactly(client_end, len(BIG))
    assert got == BIG
    assert not srv.send_lock.locked()


async def test_a_full_buffer_waits_on_hypercorns_path() -> None:
    server_end, client_end = small_pair()
    raw = server_end.socket._sock  # type: ignore[attr-defined]
    filled = bytearray()
    while True:
        try:
            n = raw.send(b"f" * 4096)
        except BlockingIOError:
            break
        filled += b"f" * n
    srv, _ = make_server(server_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv.protocol_send, RawData(b"after"))
        await trio.testing.wait_all_tasks_blocked()
        assert srv.send_lock.locked()  # stock path: parked in send_all under the lock
        got = await read_exactly(client_end, len(filled) + 5)
    assert got == bytes(filled) + b"after"


async def test_a_closed_peer_is_reported_as_closed_not_raised() -> None:
    server_end, client_end = small_pair()
    srv, protocol = make_server(server_end)
    await client_end.aclose()
    await srv.protocol_send(RawData(b"data: 1\n\n"))
    assert any(isinstance(e, Closed) for e in protocol.events)


async def test_a_closed_peer_during_the_rest_is_reported_as_closed() -> None:
    server_end, client_end = small_pair()
    srv, protocol = make_server(server_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv.protocol_send, RawData(BIG))
        await trio.testing.wait_all_tasks_blocked()
        await client_end.aclose()
    assert any(isinstance(e, Closed) for e in protocol.events)
    assert not srv.send_lock.locked()


class RecordingStream:
    """Not a trio.SocketStream (as a TLS stream is not): fast send must leave it alone."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.sent.append(bytes(data))


async def test_other_streams_take_the_stock_path() -> None:
    stream = RecordingStream()
    srv, _ = make_server(stream)
    await srv.protocol_send(RawData(b"abc"))
    assert stream.sent == [b"abc"]


async def test_non_data_events_take_the_stock_path() -> None:
    server_end, client_end = small_pair()
    srv, protocol = make_server(server_end)
    await srv.protocol_send(Closed())  # hypercorn: close the stream, then tell the protocol
    assert await client_end.receive_some() == b""
    assert protocol.events == [Closed()]


async def test_a_served_stream_is_the_same_with_and_without_fast_send(nursery: trio.Nursery) -> None:
    body = {
        "prompt": ["a", "b"],
        "stream": True,
        "max_tokens": 40,
        "ignore_eos": True,
        "seed": 1,
        "stream_options": {"include_usage": True},
    }

    async def fetch(fast: bool) -> list[object]:
        srv = await start_server(nursery, fast_send=fast)
        assert issubclass(hypercorn.trio.run.TCPServer, FastSendTCPServer) is fast
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            r = await client.post("/v1/completions", json=body)
        srv.shutdown.set()
        with trio.fail_after(5):  # the patches are process-wide: the next server installs its own
            await srv.stopped.wait()
        assert r.status_code == 200
        events = parse_sse(r.content)
        for e in events:  # ids and timestamps differ between requests
            if isinstance(e, dict):
                e.pop("id"), e.pop("created")
        return events

    def per_choice(events: list[object]) -> dict[int, list[object]]:
        # Interleaving across choices depends on scheduling; each choice's own order may not.
        out: dict[int, list[object]] = {}
        for e in events:
            if isinstance(e, dict) and e["choices"]:
                out.setdefault(e["choices"][0]["index"], []).append(e)
        return out

    stock = await fetch(False)
    fast = await fetch(True)
    assert per_choice(fast) == per_choice(stock)
    assert fast[-2] == stock[-2] and fast[-2]["usage"]["completion_tokens"] == 80  # type: ignore[index]
    assert fast[-1] == "[DONE]" and len(fast) == 2 * 40 + 2  # 80 token events, usage, [DONE]
