"""Serve: run the app on hypercorn's trio backend from braid's own entry point.

Not hypercorn's CLI: its worker processes are daemonic and cannot start vLLM's engine process,
and with ``-w 0`` SIGTERM kills the process with no drain. Here SIGTERM or SIGINT starts a drain,
which takes ``graceful_timeout`` seconds at most, whatever the clients do:

1. At once: the listening sockets close (hypercorn's accept loop ends; a new connection is
   refused, which a proxy retries on another replica), idle keep-alive connections close, and
   ``/health`` and new completions on open connections answer 503 with ``Retry-After``.
2. In-flight and queued requests go on (queued prompts start as slots free up).
3. :data:`DRAIN_FLUSH` seconds before the end, every run still open is failed with
   :class:`~braid.errors.DrainTimeout`: its engine requests are aborted and its queued prompts
   dropped, and its response ends as an error does (a stream: an error event and ``[DONE]``), so
   its client learns why rather than seeing the connection cut.
4. At ``graceful_timeout`` hypercorn cancels what is left (a response still being written) and a
   write still waiting on a client's socket is cut off (:mod:`braid.http.patches.write_deadline`): a
   client that reads nothing does not hold the drain up.

Then :func:`serve` returns, and ``braid serve`` shuts the engine down and exits 0.

hypercorn runs with braid's patches of it (and of trio, h11, h2, quart-trio) installed, those
:attr:`ServerConfig.patch_options` has on: :mod:`braid.http.patches`.
"""

from __future__ import annotations

import logging
import signal

import attrs
import hypercorn.config
import hypercorn.trio
import trio

from braid.errors import DrainTimeout
from braid.http.app import BraidApp
from braid.http.limits import configure_hypercorn
from braid.http.patches import PatchOptions, PatchSettings, installed
from braid.http.patches.accept import ACCEPT_BATCH
from braid.http.patches.write_deadline import WriteDeadlines
from braid.routes.common import DRAINING_RETRY_AFTER
from braid.settings import Settings

log = logging.getLogger("braid")

DRAIN_FLUSH = 0.5
"""Seconds at the end of a drain for the error events of the runs it ends to reach their clients
(a quarter of ``graceful_timeout`` when that is shorter than 2 s)."""


@attrs.frozen
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    graceful_timeout: float = 10.0
    # Longer than nginx's upstream keepalive_timeout (60 s), so the proxy closes idle upstream
    # connections first and never reuses one that hypercorn is closing.
    keep_alive_timeout: float = 75.0
    # Write each response chunk straight to the socket when it has room (braid.http.patches.fast_send).
    # False is `braid serve --stock-send`: that patch off, whatever `patches` says, and no other.
    fast_send: bool = True
    # A connection whose client takes less than 16 KiB of a response in this long is reset
    # (braid.http.patches.write_deadline). The stall timeout's default, so that with the defaults a
    # client that reads nothing loses its engine work and its connection at about the same time.
    write_timeout: float = attrs.field(default=Settings().stall_timeout, validator=attrs.validators.gt(0))
    # The listen queue: connections the kernel completes before the accept loop takes them.
    # hypercorn's default is 100; uvicorn's (vLLM's server) is 2048. A burst of new connections
    # beyond it is dropped by the kernel and retried by clients a second or more later. Linux
    # caps it at net.core.somaxconn (4096 on kernels since 5.4).
    backlog: int = attrs.field(default=2048, validator=attrs.validators.gt(0))
    # Connections one turn of the accept loop takes (braid.http.patches.accept); 1 is trio's own loop,
    # one connection per scheduler round.
    accept_batch: int = attrs.field(default=ACCEPT_BATCH, validator=attrs.validators.gt(0))
    # Which of braid's patches of hypercorn, trio, h11, h2 and quart-trio are on (braid.http.patches).
    patches: PatchOptions = PatchOptions()

    @property
    def patch_options(self) -> PatchOptions:
        """The patches this server installs: ``patches``, less fast send when ``fast_send`` is off."""
        return self.patches if self.fast_send else self.patches.without("fast_send")


class _HypercornConfig(hypercorn.config.Config):
    """hypercorn's Config, with the per-connection options braid's TCP server reads."""

    write_deadlines: WriteDeadlines | None = None


def hypercorn_config(cfg: ServerConfig) -> _HypercornConfig:
    config = _HypercornConfig()
    config.bind = [f"{cfg.host}:{cfg.port}"]
    config.backlog = cfg.backlog
    config.graceful_timeout = cfg.graceful_timeout
    config.keep_alive_timeout = cfg.keep_alive_timeout
    # braid's own access log (braid.http.access_log) sees the forwarded client; hypercorn's would
    # log the proxy. Its error logger is handed over as a logger, so hypercorn adds no handler of
    # its own and its records reach the root logger's, in braid's format (braid.logs), once.
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.write_deadlines = WriteDeadlines(cfg.write_timeout)
    return config


async def serve(
    app: BraidApp,
    cfg: ServerConfig,
    *,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGTERM/SIGINT (or until ``shutdown`` is set), then drain; reports bound URLs.

    Returns when hypercorn has closed every connection: after a drain every engine request that
    the server started has finished or been aborted. A drain takes at most ``graceful_timeout``
    (and what the cancelled requests' aborts take), whatever the clients do.
    """
    config = hypercorn_config(cfg)
    deadlines = config.write_deadlines
    assert deadlines is not None
    flush = min(DRAIN_FLUSH, cfg.graceful_timeout / 4)

    async def end_runs_in_time() -> None:
        await trio.sleep(cfg.graceful_timeout - flush)
        ended = app.state.end_runs(
            DrainTimeout(
                f"The server shut down {cfg.graceful_timeout:g} s after it started draining, before this "
                "request finished; its engine work was aborted.",
                retry_after=DRAINING_RETRY_AFTER,
            )
        )
        if ended:
            log.info("drain: ended %d request(s) still running", ended)

    async def trigger() -> None:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        log.info("signal %s: draining for %.1f s", signum, cfg.graceful_timeout)
                        break
                nursery.cancel_scope.cancel()

            async def on_event(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            if handle_signals:
                nursery.start_soon(on_signal)
            if shutdown is not None:
                nursery.start_soon(on_event, shutdown)
            if not handle_signals and shutdown is None:
                await trio.sleep_forever()
        app.state.draining = True
        drain.start_soon(end_runs_in_time)
        # hypercorn cancels the connections at the same instant, but its writes are shielded.
        deadlines.cut_off(trio.current_time() + cfg.graceful_timeout)

    configure_hypercorn(config, app.state.settings)  # hypercorn reads the headers, by the app's limits
    with installed(cfg.patch_options, PatchSettings(accept_batch=cfg.accept_batch)):
        async with trio.open_nursery() as drain:
            await hypercorn.trio.serve(app, config, shutdown_trigger=trigger, task_status=task_status)
            drain.cancel_scope.cancel()  # every connection is closed: nothing is left to end
