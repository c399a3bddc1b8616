"""Sizing: braid's own memory per in-flight prompt (the front end's, not the engine's KV cache).

braid runs as ``braid serve --engine scripted --token-delay 0.05`` (20 tokens/s per prompt, so a
request stays in flight for the measurement), admission unbounded. For each shape the server's
RSS is read at idle, then with the load in flight (every prompt generating, every client
reading), then again when all of it has ended; the growth divided by the prompts in flight is
what one prompt costs braid. Shapes: one large streamed batch, one large non-streamed batch (its
choices are collected in memory until the end), and many one-prompt streams on their own
connections (a connection's and a request's cost, not only a prompt's).

docs/deploy.md quotes the numbers; the engine's memory (weights, KV cache) is vLLM's, sized by
vLLM's own flags.
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.apps.proc import free_port, server
from bench.common import Section, rss_bytes, section_main, table

TOKEN_DELAY = 0.05
MiB = 1024 * 1024


def _stream(url: str, body: dict[str, object], started: threading.Event, stop: threading.Event) -> None:
    with httpx.Client(timeout=120) as client, client.stream("POST", url + "/v1/completions", json=body) as r:
        chunks = r.iter_raw()
        next(chunks)
        started.set()
        for _ in chunks:
            if stop.is_set():
                return


def _post(url: str, body: dict[str, object], started: threading.Event, stop: threading.Event) -> None:
    started.set()  # a non-streamed request is in flight as soon as it is sent
    with httpx.Client(timeout=120) as client:
        client.post(url + "/v1/completions", json=body)


def _measure(url: str, pid: int, shape: str, quick: bool) -> list[object]:
    prompts = 256 if quick else 1024
    tokens = 60  # 3 s of generation at 20 tokens/s
    if shape == "one streamed batch":
        bodies = [{"prompt": [f"p{i}" for i in range(prompts)], "max_tokens": tokens, "stream": True}]
    elif shape == "one non-streamed batch":
        bodies = [{"prompt": [f"p{i}" for i in range(prompts)], "max_tokens": tokens}]
    else:
        prompts //= 4
        bodies = [{"prompt": f"p{i}", "max_tokens": tokens, "stream": True} for i in range(prompts)]
    for body in bodies:
        body["ignore_eos"] = True
    idle = rss_bytes(pid)
    stop = threading.Event()
    threads = []
    for body in bodies:
        started = threading.Event()
        target = _stream if body.get("stream") else _post
        t = threading.Thread(target=target, args=(url, body, started, stop), daemon=True)
        t.start()
        threads.append((t, started))
    for _, started in threads:
        started.wait(30)
    time.sleep(1.0)  # every prompt generating, a third of the way through
    loaded = rss_bytes(pid)
    in_flight = float(
        next(
            line.split()[-1]
            for line in httpx.get(url + "/metrics").text.splitlines()
            if line.startswith("braid_engine_requests_in_flight ")
        )
    )
    for t, _ in threads:
        t.join(60)
    after = rss_bytes(pid)
    per_prompt = (loaded - idle) / max(in_flight, 1)
    return [
        shape,
        int(in_flight),
        f"{idle / MiB:.1f}",
        f"{loaded / MiB:.1f}",
        f"{per_prompt / 1024:.1f}",
        f"{after / MiB:.1f}",
    ]


def run(quick: bool) -> Section:
    rows = []
    for shape in ("one streamed batch", "one non-streamed batch", "one-prompt streams"):
        # a fresh server per shape: the allocator keeps what an earlier shape grew
        port = free_port()
        argv = ["braid", "serve", "--engine", "scripted", "--token-delay", str(TOKEN_DELAY), "--port", str(port)]
        with server("sizing", argv, port, cpu=None) as proc:
            rows.append(_measure(f"http://127.0.0.1:{port}", proc.pid, shape, quick))
    md = table(
        ["shape", "prompts in flight", "RSS idle (MiB)", "RSS loaded (MiB)", "KiB per prompt", "RSS after (MiB)"], rows
    )
    worst = max(float(str(r[4])) for r in rows)
    return Section(
        "Sizing: braid's memory per in-flight prompt",
        md + "\n\nScripted engine, so this is the front end alone; the engine's memory is vLLM's.",
        headlines=(f"sizing: at most {worst:.1f} KiB of braid's memory per in-flight prompt",),
    )


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
