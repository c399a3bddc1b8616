"""Servers the benchmark sections start as child processes (each one is ``python -m bench.apps.X``).

* ``bare_hypercorn``: a bare ASGI app on hypercorn's trio worker that streams fixed bytes.
* ``fastapi_app``: the same responses from FastAPI on uvicorn (vLLM's HTTP stack).
* ``braid_counting``: braid with the scripted engine, counting its ASGI body sends.

The payloads are captured from braid itself (see :func:`load_payload`), so every server sends
the same bytes per event and per response.
"""

from __future__ import annotations

from pathlib import Path


def load_payload(stream_file: str, json_file: str) -> tuple[list[bytes], bytes]:
    """The SSE events (each ending in ``\\n\\n``, ``data: [DONE]`` last) and the JSON body."""
    raw = Path(stream_file).read_bytes()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    if b"".join(events) != raw:
        raise ValueError(f"{stream_file} is not a sequence of SSE events")
    return events, Path(json_file).read_bytes()


def payload_from_argv(*switches: str) -> tuple[int, list[bytes], bytes, set[str]]:
    """``--port P --stream FILE --json FILE``, the command line of every comparison app, plus the
    app's own on/off ``switches`` (e.g. ``--fast-send``): returns the ones given."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--json", required=True)
    for switch in switches:
        p.add_argument(switch, action="store_true")
    args = p.parse_args()
    events, body = load_payload(args.stream, args.json)
    given = {s for s in switches if getattr(args, s.lstrip("-").replace("-", "_"))}
    return args.port, events, body, given
