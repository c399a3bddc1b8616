"""braid.http.patches.write_deadline: a client that takes nothing is reset, and a drain does not wait for it.

The live tests run braid on real hypercorn with a raw client socket whose receive buffer is tiny
and which never reads a long stream, so the server's write waits on a full socket. The unit tests
drive a WriteDeadlineTCPServer on one end of a trio socketpair, as tests/http/test_fast_send.py
does for the fast path.
"""

from __future__ import annotations

import json
import logging
import socket
import struct

import hypercorn.config
import hypercorn.trio.run
import pytest
import trio
import trio.testing
from hypercorn.events import Closed, RawData

from braid.http.patches import PatchOptions, installed
from braid.http.patches.fast_send import FastSendTCPServer
from braid.http.patches.locked_send import LockedSendTCPServer
from braid.http.patches.write_deadline import SLICE, WriteDeadlines, WriteDeadlineTCPServer
from tests.helpers import open_stalled_client, start_server

# Bounds run against a real server on a machine that may be busy: the slack is far above what
# the behaviour takes (milliseconds past the timeout) and far below "never", which is what the
# defect would take.
SLACK = 3.0
LONG_STREAM = json.dumps(
    {"prompt": ["x", "y", "z", "w"], "stream": True, "max_tokens": 2000, "ignore_eos": True}
).encode()
TCP_ESTABLISHED = 1


def tcp_state(stream: trio.SocketStream) -> int:
    """The kernel's TCP state of a client socket (Linux ``tcp_info.tcpi_state``), read without
    reading the socket: reading would let a stuck server write go on."""
    info = stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return struct.unpack("B", info[:1])[0]


class ResetLogged(logging.Handler):
    """Sets ``event`` at the server's log line for a reset: write_deadline logs it on the Trio
    thread just before it resets and closes the socket, in the same step."""

    def __init__(self, event: trio.Event) -> None:
        super().__init__(logging.INFO)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("reset a connection"):
            self.event.set()


async def wait_reset(stream: trio.SocketStream, within: float) -> float:
    """Seconds until the server has reset the connection (fails after ``within``): woken by the
    server's report of the reset, then checked on the client's own socket."""
    start = trio.current_time()
    logger = logging.getLogger("braid")
    reset = trio.Event()
    handler, level = ResetLogged(reset), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with trio.fail_after(within):
            if tcp_state(stream) == TCP_ESTABLISHED:  # else reset already, at once
                await reset.wait()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    took = trio.current_time() - start
    assert tcp_state(stream) != TCP_ESTABLISHED, "the server logged a reset the client did not get"
    return took


async def test_a_client_that_reads_nothing_is_reset_at_the_stall_timeout(nursery: trio.Nursery) -> None:
    """The write timeout defaults to the stall timeout: the engine work and the connection go
    together, and nothing stays in flight or holds up a drain afterwards."""
    stall = 0.5
    srv = await start_server(nursery, token_delay=0.0, stall_timeout=stall, buffer=8)
    client = await open_stalled_client(srv.url, LONG_STREAM)
    try:
        took = await wait_reset(client, stall + SLACK)
        await srv.wait_idle(SLACK)
        assert took >= stall * 0.9  # not before the client had its time
        assert srv.gauge("braid_engine_requests_in_flight") == 0 and srv.engine.finished_total == 0
        srv.shutdown.set()
        start = trio.current_time()
        with trio.fail_after(SLACK):
            await srv.stopped.wait()
    finally:
        client.socket.close()  # else a failed check leaves the server's write stuck for ever
    print(f"reset {took * 1000:.0f} ms after the request; drain {trio.current_time() - start:.2f} s")


async def test_the_write_timeout_is_its_own_and_aborts_the_run(nursery: trio.Nursery) -> None:
    """A write timeout shorter than the stall timeout resets the connection first, and the
    reset cancels the response as a disconnect does: the engine requests are aborted then."""
    srv = await start_server(nursery, token_delay=0.0, stall_timeout=60.0, write_timeout=0.5)
    client = await open_stalled_client(srv.url, LONG_STREAM)
    try:
        took = await wait_reset(client, 0.5 + SLACK)
        await srv.wait_idle(SLACK)
    finally:
        client.socket.close()
    assert took >= 0.45
    assert srv.engine.aborted_total == 4 and srv.aborts() == {"disconnect": 4}  # a reset is a disconnect
    srv.shutdown.set()


async def test_a_drain_cuts_off_a_write_that_waits(nursery: trio.Nursery) -> None:
    """Both timeouts far away: the drain's graceful period (1 s in tests) ends the write."""
    srv = await start_server(nursery, token_delay=0.0, stall_timeout=60.0)
    client = await open_stalled_client(srv.url, LONG_STREAM)
    try:
        with trio.fail_after(SLACK):  # the server's write is waiting once the drivers are
            await srv.engine.wait_until(lambda: srv.engine.in_flight >= 4)
        await trio.sleep(0.3)
        srv.shutdown.set()
        start = trio.current_time()
        with trio.fail_after(1.0 + SLACK):
            await srv.stopped.wait()
        drained = trio.current_time() - start
        assert tcp_state(client) != TCP_ESTABLISHED
    finally:
        client.socket.close()
    assert drained >= 0.9  # the graceful period first
    assert srv.engine.in_flight == 0 and srv.engine.aborted_total == 4


async def test_a_client_that_keeps_reading_is_not_cut(nursery: trio.Nursery) -> None:
    """Slower than the server writes, with waits longer than the timeout in all, but taking a
    slice well within each timeout: the stream ends whole."""
    srv = await start_server(nursery, token_delay=0.0, stall_timeout=0.4)
    body = json.dumps({"prompt": ["x", "y"], "stream": True, "max_tokens": 1500, "ignore_eos": True}).encode()
    client = await open_stalled_client(srv.url, body)
    got = bytearray()
    start = trio.current_time()
    with trio.fail_after(30):
        while not got.endswith(b"0\r\n\r\n"):
            data = await client.receive_some(4096)
            assert data, "the server closed the stream"
            got += data
            await trio.sleep(0.01)  # at most ~400 KiB/s: the server waits on the socket often
    assert trio.current_time() - start > 0.4  # several timeouts' worth of waiting in all
    assert got.count(b"data: [DONE]") == 1 and b'"error"' not in got
    await client.aclose()
    srv.shutdown.set()


# --- the server class on a socketpair ---------------------------------------------------------------


class RecordingProtocol:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


def make_server(
    stream: trio.SocketStream, deadlines: WriteDeadlines | None, cls: type = WriteDeadlineTCPServer
) -> tuple[WriteDeadlineTCPServer, RecordingProtocol]:
    config = hypercorn.config.Config()
    config.write_deadlines = deadlines  # type: ignore[attr-defined]
    srv = cls(None, config, None, None, stream)
    srv.protocol = RecordingProtocol()
    return srv, srv.protocol


async def small_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """A loopback TCP connection with small buffers (a Unix socketpair cannot be reset)."""
    with trio.socket.socket() as listener:
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = trio.socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
        await client.connect(listener.getsockname())
        server, _ = await listener.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return trio.SocketStream(server), trio.SocketStream(client)


BIG = bytes(range(256)) * 16384  # 4 MiB: far more than the pair's buffers hold


def with_fast_send() -> type:
    """The TCP server class the installer makes of both patches: fast send on the write deadline."""
    with installed(PatchOptions.only("write_deadline", "fast_send")):
        cls = hypercorn.trio.run.TCPServer
    assert cls.__mro__[:4] == (cls, FastSendTCPServer, WriteDeadlineTCPServer, LockedSendTCPServer)
    return cls


@pytest.mark.parametrize("fast", [False, True], ids=["write-deadline", "with-fast-send"])
async def test_a_write_nobody_takes_resets_the_connection(fast: bool) -> None:
    """With fast send stacked on it too: the kernel takes part of the chunk at once, and the
    rest goes through the bounded write."""
    server_end, client_end = await small_pair()
    srv, protocol = make_server(server_end, WriteDeadlines(0.2), with_fast_send() if fast else WriteDeadlineTCPServer)
    start = trio.current_time()
    await srv.protocol_send(RawData(BIG))  # returns: the deadline passed
    assert 0.18 <= trio.current_time() - start < 0.2 + SLACK
    assert protocol.events == [Closed()]
    assert not srv.send_lock.locked()
    assert server_end.socket.fileno() == -1
    with pytest.raises(trio.BrokenResourceError):  # a reset, not an orderly end of stream
        while await client_end.receive_some():
            pass


async def test_each_slice_gets_its_own_deadline() -> None:
    """A reader slower than the writes, taking each slice well within the 0.3 s timeout but
    the whole chunk in more than the timeout."""
    server_end, client_end = await small_pair()
    srv, protocol = make_server(server_end, WriteDeadlines(0.3))
    data = bytes(8 * SLICE)
    got = bytearray()

    async def read_slowly() -> None:  # ~200 KiB/s: a slice in ~0.08 s, all of it in ~0.65 s
        while len(got) < len(data):
            got.extend(await client_end.receive_some(4096))
            await trio.sleep(0.02)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_slowly)
        await srv.protocol_send(RawData(data))
    assert trio.current_time() - start > 0.3
    assert bytes(got) == data and protocol.events == []


async def test_a_cut_off_moves_the_deadline_of_a_waiting_write() -> None:
    server_end, _client_end = await small_pair()
    deadlines = WriteDeadlines(60.0)
    srv, protocol = make_server(server_end, deadlines)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv.protocol_send, RawData(BIG))
        await trio.testing.wait_all_tasks_blocked()
        assert deadlines.waiting == 1
        start = trio.current_time()
        deadlines.cut_off(start + 0.1)
    assert trio.current_time() - start < SLACK
    assert protocol.events == [Closed()] and deadlines.waiting == 0
    assert deadlines.deadline() <= start + 0.1  # and later writes get the cut-off too


async def test_a_peer_that_closes_is_reported_as_closed() -> None:
    server_end, client_end = await small_pair()
    srv, protocol = make_server(server_end, WriteDeadlines(5.0))
    await client_end.aclose()
    await srv.protocol_send(RawData(BIG))
    assert protocol.events == [Closed()]


async def test_outside_cancellation_does_not_cut_a_write() -> None:
    """Shielded as hypercorn's own write: a cancelled sender still writes its whole chunk."""
    server_end, client_end = await small_pair()
    srv, _ = make_server(server_end, WriteDeadlines(5.0))
    sender = trio.CancelScope()

    async def send_big() -> None:
        with sender:
            await srv.protocol_send(RawData(BIG))

    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_big)
        await trio.testing.wait_all_tasks_blocked()
        sender.cancel()
        while len(got) < len(BIG):
            got.extend(await client_end.receive_some(65536))
    assert bytes(got) == BIG


async def test_without_write_deadlines_a_write_is_hypercorns() -> None:
    """A plain hypercorn Config (as a test double or bare_hypercorn passes): no deadline."""
    server_end, client_end = await small_pair()
    srv, protocol = make_server(server_end, None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv.protocol_send, RawData(BIG))
        await trio.sleep(0.5)
        assert srv.send_lock.locked() and protocol.events == []  # still waiting
        await client_end.aclose()
    assert protocol.events == [Closed()]


def test_write_deadlines_refuse_a_timeout_of_zero() -> None:
    with pytest.raises(ValueError):
        WriteDeadlines(0)
