"""Final send: the last body send of a response is shielded, so hypercorn re-arms its keep-alive timer.

quart-trio runs a request in a nursery of its own, and cancels it once the app has been told the
request is over. hypercorn tells it (an ``http.disconnect``) while it closes the request's stream
inside the response's last send, before it re-arms the connection's keep-alive timer in that
same send. hypercorn's timer (``TrioSingleTask``) checkpoints in its restart (a lock, then
``nursery.start``), so the cancellation landed there and left the timer unarmed, and such an idle
keep-alive connection was never closed (tests/http/test_cancellation.py covers it).

:class:`ShieldedFinalSendConnection` is quart-trio's HTTP connection with that send shielded.
:mod:`braid.http.patches.keep_alive` removes the same failure from the other side: its timer's
restart has no checkpoint, and none comes between the ``http.disconnect`` and the restart. So
either patch alone keeps idle connections closing, and with both off they stay open
(tests/http/patches/test_install.py). The patch puts the class where quart looks it up for every
request, quart-trio's ``QuartTrio.asgi_http_class`` (``braid.http.app.BraidApp`` inherits it).
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from quart_trio.asgi import TrioASGIHTTPConnection

from braid.http.patches.patch import Patch, Upstream, stacked


class ShieldedFinalSendConnection(TrioASGIHTTPConnection):
    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        async def send_final_shielded(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await super().__call__(receive, send_final_shielded)


PATCH = Patch(
    name="final_send",
    module=__name__,
    why="quart-trio's cancellation of a finished request can leave hypercorn's keep-alive timer unarmed",
    target=Upstream("quart_trio.app", "QuartTrio.asgi_http_class"),
    apply=stacked(ShieldedFinalSendConnection, TrioASGIHTTPConnection),
    relies_on=(Upstream("quart_trio.asgi", "TrioASGIHTTPConnection.__call__"),),
)

__all__ = ["PATCH", "ShieldedFinalSendConnection"]
