"""What braid reads of a request before the view has it, and the bounds on each part.

* **The header block** is read by hypercorn, which buffers at most ``Settings.max_header_bytes``
  of one that is still unfinished; past that it answers a 431 with an empty body itself and
  closes the connection. No app code runs. h11 checks between socket reads, so a block that
  arrives whole in one read (hypercorn reads up to 64 KiB at a time) may be larger: the bound is
  on memory, not exact. On HTTP/2 hypercorn only advertises the value: h2 enforces its own fixed
  64 KiB header list (the default here, so that one header block passes on both protocols) and
  ends the connection over it.
  How long a header block may take is bounded only by hypercorn's idle timer (``--keep-alive``),
  which runs until a whole request head has arrived.
* **The body** is read by quart into memory as it arrives, and :func:`read_body` waits for all
  of it:

  * a body over ``Settings.max_body_bytes`` is a 413 (:class:`~braid.errors.BodyTooLarge`),
    decided while reading: at once when ``Content-Length`` declares it, else as soon as the
    chunks received pass the limit. Quart keeps at most the limit and one chunk, and drops
    what still arrives;
  * a body that is not all there ``Settings.body_timeout`` seconds after the read began is a
    408 (:class:`~braid.errors.BodyTimeout`).

  Either way the error is sent with the body unread, so hypercorn closes the connection after
  it (HTTP/1.1 cannot find the next request): a client that stalls or over-sends holds no
  connection afterwards.
"""

from __future__ import annotations

import hypercorn.config
from quart import Quart, Request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from braid.errors import BodyTimeout, BodyTooLarge
from braid.settings import Settings


def configure_quart(app: Quart, settings: Settings) -> None:
    """Set quart's own body limits, which it reads when each request arrives."""
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["BODY_TIMEOUT"] = settings.body_timeout


def configure_hypercorn(config: hypercorn.config.Config, settings: Settings) -> None:
    """Bound the header block on HTTP/1.1, and advertise the bound on HTTP/2."""
    config.h11_max_incomplete_size = settings.max_header_bytes
    config.h2_max_header_list_size = settings.max_header_bytes


async def read_body(request: Request, settings: Settings) -> bytes:
    """The whole request body, or :class:`~braid.errors.BodyTooLarge` /
    :class:`~braid.errors.BodyTimeout` (the app must have been set up by :func:`configure_quart`)."""
    try:
        return await request.get_data(cache=False, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        raise BodyTooLarge(
            f"The request body is larger than the limit of {settings.max_body_bytes} bytes "
            "(braid serve --max-body-bytes)."
        ) from None
    except RequestTimeout:
        raise BodyTimeout(
            f"The request body did not arrive within {settings.body_timeout:g} s (braid serve --body-timeout)."
        ) from None


__all__ = ["configure_hypercorn", "configure_quart", "read_body"]
