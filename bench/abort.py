"""Abort latency: how long the engine keeps working after a streaming client goes away.

What is measured and how:

* A trial: one streaming ``/v1/completions`` request with 64 prompts (32 random token ids each,
  new prompts every trial, the same list for both servers), ``max_tokens`` 900, ``ignore_eos``,
  sent over a raw socket. Once 64 SSE events have arrived (about one per prompt: every prompt
  is decoding), the socket is closed abruptly (``SO_LINGER`` 0, so the kernel sends a RST).
  Latency = from just before that close to the moment the engine holds no request.
* The signal, the same for both servers: the engine core's own log line
  ``EngineCore waiting for work.`` (vLLM's ``EngineCore._process_input_queue``),
  written when its busy loop finds no work (``has_work()`` false: the scheduler has no
  unfinished request and none left to clear). Only the logger ``vllm.v1.engine.core`` is set to
  DEBUG (``VLLM_LOGGING_CONFIG_PATH``) with ``%(created).6f`` timestamps; the log file is read, so
  nothing polls the server during these trials ("passive" trials).
* In a smaller set of "polled" trials the servers' own gauges are polled (keep-alive client,
  2 ms between scrapes) as ``tools.servers.ServerProcess.unfinished`` reads them: braid
  ``braid_engine_requests_in_flight + braid_engine_unfinished_requests``, vLLM
  ``vllm:num_requests_running + vllm:num_requests_waiting``. The engine-core signal is recorded
  in the same trials, which shows how far each gauge leads or lags the engine.

Why not the gauges alone (read from vLLM 0.32's source):

* ``braid_engine_unfinished_requests`` is the front end's ``OutputProcessor`` count (braid's
  engine-core client, ``braid.engine.vllm_core``, keeps vLLM's ``OutputProcessor``, as
  ``AsyncLLM`` does). An abort removes the request there *before* it sends the abort to the
  engine core, so this gauge can reach 0 while the engine
  core is still running a step for the aborted requests: it can read early.
* ``vllm:num_requests_running/waiting`` are set by ``PrometheusStatLogger.record`` in AsyncLLM's
  output handler from the ``SchedulerStats`` the engine core attaches to every step's outputs
  (``Scheduler.update_from_output`` -> ``make_stats``): once per engine step, not by the periodic
  stats logger (that one only prints a log line every 10 s). After the last abort the scheduler
  still has finished requests to clear, so it runs one more (empty) step whose stats carry 0:
  the gauge reaches 0 one engine-core -> front-end hop after the engine is idle, plus the scrape.
  It reads late by that hop, and a scrape of vLLM's 50 kB exposition costs far more than one of
  braid's 1 kB.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import struct
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Section, Target, percentile, section_main, table
from bench.vllm_tools import WORK, random_token_prompts, start_pair

PROMPTS = 64
PROMPT_LEN = 32
MAX_TOKENS = 900  # 33 prompt tokens + 900 < max_model_len 1024; ~seconds of decoding per request
EVENTS_BEFORE_CLOSE = 64
VOCAB = 2048
IDLE = re.compile(rb"(\d{9,}\.\d+) pid=\d+ DEBUG vllm\.v1\.engine\.core: EngineCore waiting for work\.")
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"t": {"format": "%(created).6f pid=%(process)d %(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "out": {"class": "logging.StreamHandler", "formatter": "t", "level": "DEBUG", "stream": "ext://sys.stdout"}
    },
    "loggers": {
        "vllm": {"handlers": ["out"], "level": "INFO", "propagate": False},
        "vllm.v1.engine.core": {"level": "DEBUG"},
    },
}


def _config(quick: bool) -> tuple[int, int]:
    """(passive trials, polled trials) per server."""
    return (10, 3) if quick else (50, 10)


def _gauges(client: httpx.Client, server: Any) -> float:
    total = 0.0
    names = (
        ("braid_engine_unfinished_requests", "braid_engine_requests_in_flight")
        if server.kind == "braid"
        else ("vllm:num_requests_running", "vllm:num_requests_waiting")
    )
    for line in client.get(server.url + "/metrics").text.splitlines():
        if line and not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] in names:
            total += float(line.rpartition(" ")[2])
    return total


def _idle_after(log: Path, offset: int, t_close: float, within: float = 30.0) -> float:
    """Timestamp of the engine core's first idle line after ``t_close`` (log read from ``offset``)."""
    deadline = time.time() + within
    while True:
        with open(log, "rb") as f:
            f.seek(offset)
            stamps = [float(s) for s in IDLE.findall(f.read())]
        after = [s for s in stamps if s > t_close]
        if after:
            return after[0]
        if time.time() > deadline:
            raise RuntimeError(f"no engine idle line in {log} within {within} s of the close")
        time.sleep(0.002)


def trial(server: Any, prompts: list[list[int]], client: httpx.Client, poll: bool) -> dict[str, float]:
    """One abort trial; times in ms from the close."""
    offset = server.log.stat().st_size
    body = json.dumps(
        {
            "model": server.model,
            "prompt": prompts,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 1.0,
            "stream": True,
        }
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sent = time.time()
    sock.sendall(head + body)
    seen = b""
    while seen.count(b"data: ") < EVENTS_BEFORE_CLOSE:
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError(f"{server.kind}: connection closed early: {seen[:300]!r}")
        seen += data
    if b"[DONE]" in seen:
        raise RuntimeError(f"{server.kind}: the stream ended before the close")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    t_close = time.time()
    sock.close()
    out = {"first_events_ms": (t_close - sent) * 1000, "t_close": t_close}
    if poll:
        scrapes = 0
        while True:
            value = _gauges(client, server)
            scrapes += 1
            if value == 0:
                out["gauge_ms"] = (time.time() - t_close) * 1000
                break
            if time.time() - t_close > 30:
                raise RuntimeError(f"{server.kind}: gauges not 0 after 30 s")
            time.sleep(0.002)
        out["scrapes"] = scrapes
    out["engine_ms"] = (_idle_after(server.log, offset, t_close) - t_close) * 1000
    return out


def _stats(values: list[float]) -> list[str]:
    return [f"{percentile(values, 50):.1f}", f"{percentile(values, 99):.1f}", f"{max(values):.1f}"]


def run(quick: bool) -> Section:
    started = time.monotonic()
    load_before = os.getloadavg()
    passive_n, polled_n = _config(quick)
    WORK.mkdir(parents=True, exist_ok=True)
    log_config = WORK / "vllm-logging-abort.json"
    log_config.write_text(json.dumps(LOG_CONFIG))
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        k: {"passive": [], "polled": []} for k in ("braid", "vllm")
    }
    scrape_ms: dict[str, float] = {}
    with (
        start_pair("abort", env={"VLLM_LOGGING_CONFIG_PATH": str(log_config)}) as (braid, vllm),
        httpx.Client(timeout=30) as client,
    ):
        setup_s = time.monotonic() - started
        servers = {"braid": braid, "vllm": vllm}
        for s in servers.values():
            if not IDLE.search(s.log.read_bytes()):
                raise RuntimeError(f"{s.kind}: the engine core's DEBUG idle line is missing from {s.log}")
            times = []
            for _ in range(10):
                t = time.perf_counter()
                _gauges(client, s)
                times.append((time.perf_counter() - t) * 1000)
            scrape_ms[s.kind] = statistics.median(times)
        # warm-up trial per server, not recorded
        for s in servers.values():
            trial(s, random_token_prompts(PROMPTS, PROMPT_LEN, VOCAB, seed=999), client, poll=False)
            s.wait_idle(within=30)
        schedule = [("passive", i) for i in range(passive_n)] + [("polled", passive_n + i) for i in range(polled_n)]
        for kind_of_trial, i in schedule:
            prompts = random_token_prompts(PROMPTS, PROMPT_LEN, VOCAB, seed=1000 + i)
            order = ("braid", "vllm") if i % 2 == 0 else ("vllm", "braid")
            for name in order:
                s = servers[name]
                results[name][kind_of_trial].append(trial(s, prompts, client, poll=kind_of_trial == "polled"))
                s.wait_idle(within=30)
                time.sleep(0.05)
    total_s = time.monotonic() - started
    load_after = os.getloadavg()
    (WORK / "abort-trials.json").write_text(json.dumps(results))

    rows = []
    for name, label in (("braid", "braid"), ("vllm", "vLLM server")):
        passive = [r["engine_ms"] for r in results[name]["passive"]]
        first = [r["first_events_ms"] for r in results[name]["passive"]]
        rows.append(
            [label, len(passive), *_stats(passive), sum(x > 250 for x in passive), f"{statistics.median(first):.0f}"]
        )
    poll_rows = []
    for name, label in (("braid", "braid"), ("vllm", "vLLM server")):
        polled = results[name]["polled"]
        gauge = [r["gauge_ms"] for r in polled]
        engine = [r["engine_ms"] for r in polled]
        lead = [r["gauge_ms"] - r["engine_ms"] for r in polled]
        poll_rows.append(
            [
                label,
                len(polled),
                *_stats(gauge)[:2],
                *_stats(engine)[:2],
                f"{statistics.median(lead):+.1f}",
                f"{min(lead):+.1f} / {max(lead):+.1f}",
                f"{scrape_ms[name]:.1f}",
            ]
        )
    b_passive = [r["engine_ms"] for r in results["braid"]["passive"]]
    v_passive = [r["engine_ms"] for r in results["vllm"]["passive"]]
    b_p99 = percentile(b_passive, 99)
    b_polled = results["braid"]["polled"]
    targets = (
        Target(
            "braid abort latency p99 (close -> engine core idle)",
            b_p99,
            50,
            False,
            " ms",
            why_missed=f"braid p50 {percentile(b_passive, 50):.0f} / p99 {b_p99:.0f} ms vs vLLM's server "
            f"p50 {percentile(v_passive, 50):.0f} / p99 {percentile(v_passive, 99):.0f} ms on the same "
            f"engine; in polled trials braid's own gauges (its drivers and its OutputProcessor's count) "
            f"reached 0 after a median {statistics.median(r['gauge_ms'] for r in b_polled):.0f} ms of "
            f"{statistics.median(r['engine_ms'] for r in b_polled):.0f} ms to engine idle, so most of the "
            f"time passes before braid's front end has dropped the requests "
            f"(load average {load_before[0]:.1f} at start)",
        ),
    )
    md = [
        f"Mode: {'quick' if quick else 'full'}. {PROMPTS} prompts x {PROMPT_LEN} random token ids per request (new prompts "
        f"each trial, the same for both servers), `max_tokens` {MAX_TOKENS}, streaming; the socket is closed "
        f"(RST, `SO_LINGER` 0) once {EVENTS_BEFORE_CLOSE} SSE events have arrived. Trials alternate between the "
        f"servers; between trials each server is polled until idle, then 50 ms pass.",
        "",
        "Close -> engine core idle (its `EngineCore waiting for work.` DEBUG line, timestamped by the engine core "
        "itself; passive trials, nothing polls the server), ms:",
        "",
        table(["server", "trials", "p50", "p99", "max", "trials > 250 ms", "close after (ms, median)"], rows),
        "",
        "Polled trials: the servers' own gauges polled every 2 ms (`ServerProcess.unfinished`), and the engine-core "
        "signal of the same trials. `gauge − engine` < 0 means the gauge reached 0 before the engine was idle:",
        "",
        table(
            [
                "server",
                "trials",
                "gauge p50",
                "gauge p99",
                "engine p50",
                "engine p99",
                "gauge − engine (median)",
                "min / max",
                "one scrape (ms)",
            ],
            poll_rows,
        ),
        "",
        "How the gauges are updated (vLLM 0.32 source): braid's `braid_engine_unfinished_requests` reads the count of "
        "vLLM's `OutputProcessor` in braid's engine-core client, which an abort clears *before* the abort reaches the "
        "engine core (as `AsyncLLM.abort` does), so it can "
        "read 0 while the engine still runs a step (early); `vllm:num_requests_running/waiting` are set from the "
        "`SchedulerStats` the engine core attaches to every step's outputs (per engine step, not by the 10 s logging "
        "stats logger), so they reach 0 one engine-core -> front-end hop after the idle step, plus the scrape (late). "
        "The two gauges therefore measure different points; the engine core's own idle line is the same point for "
        "both servers and is what the target uses.",
        f"Machine: 2 cores shared with another engineer's runs; load average {load_before[0]:.1f} at start, "
        f"{load_after[0]:.1f} at end. Setup {setup_s:.0f} s; section {total_s:.0f} s.",
    ]
    headlines = (
        f"abort (close -> engine idle, {passive_n} trials): braid p50 {percentile(b_passive, 50):.0f} ms / "
        f"p99 {b_p99:.0f} ms; vLLM server p50 {percentile(v_passive, 50):.0f} ms / p99 {percentile(v_passive, 99):.0f} ms",
    )
    return Section("Abort latency (client disconnect -> engine idle)", "\n".join(md), headlines, targets, ())


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
