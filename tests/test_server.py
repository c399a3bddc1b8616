"""braid.server: the options it hands hypercorn reach the listening socket and the connections."""

from __future__ import annotations

from functools import partial

import attrs
import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import create_app
from braid.server import ServerConfig, hypercorn_config, serve
from braid.settings import Settings
from tests.helpers import listen_queue


@pytest.mark.parametrize("backlog", [37, None])
async def test_the_listen_backlog_reaches_the_socket(nursery: trio.Nursery, backlog: int | None) -> None:
    cfg = ServerConfig(port=0) if backlog is None else ServerConfig(port=0, backlog=backlog)
    shutdown = trio.Event()
    (url,) = await nursery.start(
        partial(serve, create_app(ScriptedEngine()), cfg, shutdown=shutdown, handle_signals=False)
    )
    port = int(url.rsplit(":", 1)[1])
    # The default is uvicorn's (vLLM's server), not hypercorn's 100.
    assert listen_queue(port)[1] == (backlog or 2048)
    shutdown.set()


def test_the_write_timeout_defaults_to_the_stall_timeout() -> None:
    assert ServerConfig().write_timeout == Settings().stall_timeout
    config = hypercorn_config(ServerConfig(write_timeout=2.5, fast_send=False))
    assert config.write_deadlines is not None and config.write_deadlines.timeout == 2.5
    assert config.fast_send is False


def test_server_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        ServerConfig(write_timeout=0)
    with pytest.raises(ValueError):
        ServerConfig(backlog=0)
    assert attrs.evolve(ServerConfig(), backlog=1).backlog == 1
