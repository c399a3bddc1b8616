"""braid.http.patches.accept: the accept loop takes every waiting connection in one turn."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import hypercorn.trio.run
import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import create_app
from braid.http.patches import PatchOptions, PatchSettings, installed
from braid.http.patches.accept import BatchAcceptListener
from braid.http.server import ServerConfig, serve
from tests.helpers import listen_queue


@contextmanager
def waiting_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections the kernel has completed and nobody has accepted yet: blocking
    connects from this thread, while the Trio loop (and the server in it) cannot run."""
    socks = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


async def listener_on_port() -> tuple[trio.socket.SocketType, int]:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock, sock.getsockname()[1]


async def test_waiting_connections_are_taken_without_a_checkpoint() -> None:
    sock, port = await listener_on_port()
    listener = BatchAcceptListener(sock, batch=8)
    with waiting_connections(port, 5):
        with trio.CancelScope() as scope:
            scope.cancel()
            # Already cancelled: trio's accept would raise at once; these were waiting.
            streams = [await listener.accept() for _ in range(5)]
            await listener.accept()  # nothing waits: trio's accept, which checkpoints
        assert scope.cancelled_caught
    assert all(isinstance(s, trio.SocketStream) for s in streams)
    for s in streams:
        await s.aclose()
    await listener.aclose()


async def test_a_batch_ends_with_trios_accept_even_when_more_wait() -> None:
    sock, port = await listener_on_port()
    listener = BatchAcceptListener(sock, batch=3)
    with waiting_connections(port, 6):
        with trio.CancelScope() as scope:
            scope.cancel()
            taken = 0
            for _ in range(6):
                await listener.accept()
                taken += 1
        assert scope.cancelled_caught and taken == 3  # the fourth took trio's path and yielded
        # ...and after that turn, the next batch starts
        assert [await listener.accept() for _ in range(3)]
    await listener.aclose()


async def test_the_patch_gives_hypercorn_a_view_of_trio_and_restores_it() -> None:
    assert hypercorn.trio.run.trio is trio
    with installed(PatchOptions.only("accept"), PatchSettings(accept_batch=16)):
        view = hypercorn.trio.run.trio
        assert view is not trio and view.open_nursery is trio.open_nursery
        sock, _ = await listener_on_port()
        listener = view.SocketListener(sock)
        assert isinstance(listener, BatchAcceptListener) and listener._batch == 16
        await listener.aclose()
    assert hypercorn.trio.run.trio is trio
    with installed(PatchOptions.only("accept"), PatchSettings(accept_batch=1)):
        assert hypercorn.trio.run.trio is trio  # trio's own loop


@pytest.mark.parametrize("batch", [64, 1])
async def test_a_served_burst_is_accepted_in_a_few_rounds(nursery: trio.Nursery, batch: int) -> None:
    """40 connections wait in the listen queue; after 5 scheduler rounds the batched loop has
    taken them all, trio's own (batch 1, the control) about one per round."""
    shutdown = trio.Event()
    cfg = ServerConfig(port=0, accept_batch=batch)
    (url,) = await nursery.start(
        partial(serve, create_app(ScriptedEngine()), cfg, shutdown=shutdown, handle_signals=False)
    )
    port = int(url.rsplit(":", 1)[1])
    with waiting_connections(port, 40):
        assert listen_queue(port)[0] == 40
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        waiting = listen_queue(port)[0]
    if batch > 1:
        assert waiting == 0
    else:
        assert waiting >= 30
    shutdown.set()
