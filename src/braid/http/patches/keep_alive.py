"""The keep-alive timer, restarted without waiting for the scheduler.

hypercorn's trio ``TCPServer`` re-arms its keep-alive timer (``TrioSingleTask``) when a connection
opens and after every response, and stops it when a request arrives. Each re-arm takes a
``trio.Lock`` and starts the timer's task with ``nursery.start``, which returns only once that
task has run: about two scheduler rounds, during which the connection reads nothing. A new
connection pays them before its request is read, and under load a round runs every busy stream
once (tens of milliseconds with hundreds of streams).

:class:`KeepAliveTimer` has the same two methods. It makes the timer task's cancel scope itself
and starts the task with ``start_soon``: a restart or a stop never waits and is never cancelled
half-way (so a cancelled response task cannot leave the timer unarmed, the failure that
:mod:`braid.http.patches.final_send` also prevents, from quart-trio's side). A scope cancelled
before its task enters it cancels the task at its first checkpoint, so a stop right after a
restart stops it. :class:`KeepAliveTCPServer` gives each connection one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches.patch import Patch, Upstream, stacked


async def _run_in(scope: trio.CancelScope, action: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await action()


class KeepAliveTimer:
    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None

    async def restart(self, task_group: Any, action: Callable[[], Awaitable[None]]) -> None:
        """Cancel the running timer, if any, and start ``action`` in ``task_group``'s nursery."""
        if self._scope is not None:
            self._scope.cancel()
        self._scope = trio.CancelScope()
        task_group._nursery.start_soon(_run_in, self._scope, action)

    async def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None


class KeepAliveTCPServer(TCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = KeepAliveTimer()  # type: ignore[assignment]  # the same two methods, no waits


PATCH = Patch(
    name="keep_alive",
    module=__name__,
    why="re-arming hypercorn's keep-alive timer waits two scheduler rounds, before each request is read",
    target=Upstream("hypercorn.trio.run", "TCPServer"),
    apply=stacked(KeepAliveTCPServer, TCPServer),
    relies_on=(
        Upstream("hypercorn.trio.tcp_server", "TCPServer.idle_task", instance=True),
        # the two methods hypercorn calls on its timer, which KeepAliveTimer has too
        Upstream("hypercorn.trio.worker_context", "TrioSingleTask.restart"),
        Upstream("hypercorn.trio.worker_context", "TrioSingleTask.stop"),
        Upstream("hypercorn.trio.task_group", "TaskGroup._nursery", instance=True),
    ),
)

__all__ = ["PATCH", "KeepAliveTCPServer", "KeepAliveTimer"]
