"""Batch jobs (issue 30's measurements): a job's rate against the engine alone and ``vllm run-batch``,
an interactive stream beside a running job, and a job that survives ``kill -9``.

What is measured and how:

* **Rate.** ``LINES`` lines (10,000; 2,000 with ``--quick``), each one prompt of 32 random token
  ids, 32 tokens out (``ignore_eos``, temperature 1). Seven systems, each round once, the order
  rotating from round to round (the machine is shared and drifts):

  - *braid, completions job*: the lines as ``/v1/completions`` lines, uploaded to braid (defaults:
    the background class, ``--batch-max-slots`` 0 = every slot but the reserve), timed from
    ``POST /v1/batches`` until the job is seen ``completed`` (polled every 0.2 s), validation
    included; every output row is checked (a 200 with 32 tokens).
  - *braid, jobs-only replica*: the same file on a second braid started with
    ``--max-in-flight-requests`` :data:`JOBS_ONLY_IN_FLIGHT`, what docs/batch.md proposes for a
    replica that serves jobs and no interactive users: the background class may then keep
    that many lines in vLLM's engine, most of them waiting in its queue, so the engine refills
    its own seats; an interactive request there would wait behind them (no isolation). Its
    chat job too.
  - *vLLM's server* (a reference, not a target): the same token ids posted at once as JSON
    ``/v1/completions`` requests of 1,000 prompts, so its engine's queue is never empty: what an
    online server with its engine core in a process of its own reaches on this machine.
  - *the engine alone*: ``LLM.generate`` of the same token ids in a worker process (start-up
    excluded).
  - *braid, chat job* and *vllm run-batch*: the same prompts as text (the token ids decoded) in one
    ``/v1/chat/completions`` file, run by braid's job and by ``vllm run-batch``'s own ``run_batch``
    on an engine built once (``bench.vllm_tools``'s ``run_batch`` worker: start-up excluded; its
    wall includes writing its output file, as braid's includes its own).

  All on ``tools.servers.engine_settings()`` (``max_num_seqs`` 64). Output tok/s is lines × 32 /
  wall.
* **A stream beside a job.** While a job of the same lines runs on braid, a streamed one-prompt
  interactive request every 0.5 s; its time to the first token (ms), against the same probe beside
  an equal all-interactive load (``bench.classes``'s window: 4 clients posting 64-prompt requests);
  without ``--quick``, again for braid with ``--batch-max-slots`` 16 and 32 (the curve of the
  probe's wait and the job's rate over the cap). The job's rate is its lines done per second in
  the probe window.
* **kill -9.** braid with a storage directory runs a 2,000-line job; once about a third is done,
  braid and its engine core get SIGKILL; braid is started again on the same directory and the job
  is followed to its end. The output file must hold every ``custom_id`` exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx

from bench.classes import window
from bench.common import Section, Target, percentile, section_main, table
from bench.vllm_tools import WORK, Worker, engine_pids, random_token_prompts

PROMPT_LEN = 32
TOKENS = 32
VOCAB = 2048
SEED = 30
PROBE_EVERY = 0.5
KILL_LINES = 2000
CAPS = (16, 32)
JOBS_ONLY_IN_FLIGHT = 1024
"""``--max-in-flight-requests`` of the jobs-only braid: about 15 waves of vLLM's 68 seats queued."""
ENDED = ("completed", "failed", "expired", "cancelled")
POLL = 0.2
"""Seconds between two polls of a job's status: each is a request braid serves beside the job (at
20 a second they took 7 % of braid's thread); a client of the Batch API polls every few seconds."""


def completion_lines(prompts: list[list[int]], model: str) -> bytes:
    body = {"model": model, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0}
    return b"".join(
        json.dumps(
            {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": {**body, "prompt": p}}
        ).encode()
        + b"\n"
        for i, p in enumerate(prompts)
    )


def chat_lines(texts: list[str], model: str) -> bytes:
    body = {"model": model, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0}
    return b"".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {**body, "messages": [{"role": "user", "content": t}]},
            }
        ).encode()
        + b"\n"
        for i, t in enumerate(texts)
    )


def _texts(prompts: list[list[int]]) -> list[str]:
    from transformers import AutoTokenizer

    from tools.servers import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    return [tokenizer.decode(p) for p in prompts]


def start_job(client: httpx.Client, server: Any, data: bytes, endpoint: str) -> str:
    """Upload ``data`` and create a job of it; the job's id."""
    upload = client.post(server.url + "/v1/files", files={"file": ("lines.jsonl", data)}, data={"purpose": "batch"})
    file_id = upload.raise_for_status().json()["id"]
    created = client.post(
        server.url + "/v1/batches",
        json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"},
    )
    job = created.raise_for_status().json()
    if job["status"] != "in_progress":
        raise RuntimeError(f"the job did not start: {job}")
    return str(job["id"])


def wait_job(client: httpx.Client, server: Any, job_id: str, within: float = 3600.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        job: dict[str, Any] = client.get(server.url + f"/v1/batches/{job_id}").raise_for_status().json()
        if job["status"] in ENDED:
            return job
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job is still {job['status']} after {within} s")
        time.sleep(POLL)


def output_rows(client: httpx.Client, server: Any, job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["output_file_id"] is None:
        return []
    text = client.get(server.url + f"/v1/files/{job['output_file_id']}/content").raise_for_status().text
    return [json.loads(line) for line in text.splitlines()]


def timed_job(client: httpx.Client, server: Any, data: bytes, endpoint: str, lines: int) -> dict[str, Any]:
    """One whole job: its wall (create to seen completed) and its output tokens, every row checked."""
    upload = client.post(server.url + "/v1/files", files={"file": ("lines.jsonl", data)}, data={"purpose": "batch"})
    file_id = upload.raise_for_status().json()["id"]
    t0 = time.perf_counter()
    created = client.post(
        server.url + "/v1/batches",
        json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"},
    )
    job = wait_job(client, server, created.raise_for_status().json()["id"])
    wall = time.perf_counter() - t0
    rows = output_rows(client, server, job)
    bad = [r for r in rows if r["response"]["status_code"] != 200]
    tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in rows if not bad)
    if job["status"] != "completed" or len(rows) != lines or bad or tokens != lines * TOKENS:
        raise RuntimeError(f"the job did not run every line: {job['status']}, {len(rows)} rows, {len(bad)} bad")
    for f in (file_id, job["output_file_id"]):
        client.delete(server.url + f"/v1/files/{f}")
    return {"wall": wall, "tokens": tokens}


def server_requests(server: Any, prompts: list[list[int]], per_request: int = 1000) -> float:
    """The prompts sent to a server at once as JSON completions requests of ``per_request`` prompts
    (a server's best case: its engine's queue never runs dry); the wall until the last answer.
    Every prompt must come back with its tokens."""

    def one(chunk: list[list[int]]) -> int:
        body = {"model": server.model, "prompt": chunk, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1}
        with httpx.Client(timeout=600) as c:
            answer = c.post(server.url + "/v1/completions", json=body).raise_for_status().json()
        return int(answer["usage"]["completion_tokens"])

    chunks = [prompts[i : i + per_request] for i in range(0, len(prompts), per_request)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(chunks)) as pool:
        tokens = sum(pool.map(one, chunks))
    wall = time.perf_counter() - t0
    if tokens != len(prompts) * TOKENS:
        raise RuntimeError(f"the server made {tokens} tokens, not {len(prompts) * TOKENS}")
    return wall


def _rates(quick: bool, rounds: int, lines: int) -> dict[str, list[float]]:
    """Output tok/s of each system, a value per round."""
    from tools.servers import run_braid, run_vllm, tiny_model_dir

    prompts = random_token_prompts(lines, PROMPT_LEN, VOCAB, SEED)
    chat_path = WORK / "batch-jobs-chat.jsonl"
    systems = (
        "braid-completions",
        "offline",
        "braid-chat",
        "run-batch",
        "deep-completions",
        "vllm-server",
        "deep-chat",
    )
    rates: dict[str, list[float]] = {s: [] for s in systems}
    with ExitStack() as stack:
        braid = stack.enter_context(
            run_braid(
                "--storage-dir", str(WORK / "batch-jobs-store"), model_dir=tiny_model_dir(), log=WORK / "batch-jobs.log"
            )
        )
        # a replica for jobs only: lines fill vLLM's own queue (docs/batch.md, "A replica for jobs only")
        deep = stack.enter_context(
            run_braid(
                "--storage-dir",
                str(WORK / "batch-jobs-store-deep"),
                "--max-in-flight-requests",
                str(JOBS_ONLY_IN_FLIGHT),
                model_dir=tiny_model_dir(),
                log=WORK / "batch-jobs-deep.log",
            )
        )
        vllm = stack.enter_context(run_vllm(model_dir=tiny_model_dir(), log=WORK / "batch-jobs-vllm.log"))
        client = stack.enter_context(httpx.Client(timeout=600))
        completions = completion_lines(prompts, braid.model)
        chats = chat_lines(_texts(prompts), braid.model)
        chat_path.write_bytes(chats)
        offline = stack.enter_context(Worker("offline", WORK / "batch-jobs-offline.log"))
        runner = stack.enter_context(Worker("run_batch", WORK / "batch-jobs-run-batch.log"))
        # warm-up, not recorded: the engines' first batches of each size are slow
        warm = max(256, lines // 20)
        timed_job(client, braid, completion_lines(prompts[:warm], braid.model), "/v1/completions", warm)
        timed_job(client, deep, completion_lines(prompts[:warm], deep.model), "/v1/completions", warm)
        offline.call(op="generate", prompt_token_ids=prompts[:warm], max_tokens=TOKENS)
        warm_path = WORK / "batch-jobs-warm.jsonl"
        warm_path.write_bytes(chat_lines(_texts(prompts[:warm]), braid.model))
        runner.call(input=str(warm_path), output=str(WORK / "batch-jobs-warm-out.jsonl"))
        server_requests(vllm, prompts[:warm])
        for r in range(rounds):
            for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
                if system == "braid-completions":
                    wall = timed_job(client, braid, completions, "/v1/completions", lines)["wall"]
                elif system == "deep-completions":
                    wall = timed_job(client, deep, completions, "/v1/completions", lines)["wall"]
                elif system == "deep-chat":
                    wall = timed_job(client, deep, chats, "/v1/chat/completions", lines)["wall"]
                elif system == "vllm-server":
                    wall = server_requests(vllm, prompts)
                elif system == "braid-chat":
                    wall = timed_job(client, braid, chats, "/v1/chat/completions", lines)["wall"]
                elif system == "offline":
                    out = offline.call(op="generate", prompt_token_ids=prompts, max_tokens=TOKENS)
                    if out["output_tokens"] != lines * TOKENS:
                        raise RuntimeError(f"offline made {out['output_tokens']} tokens")
                    wall = out["walls"][0]
                else:
                    out_path = WORK / "batch-jobs-run-batch-out.jsonl"
                    wall = runner.call(input=str(chat_path), output=str(out_path))["wall"]
                    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
                    done = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in rows if r["response"])
                    if done != lines * TOKENS:
                        raise RuntimeError(f"run-batch made {done} tokens")
                rates[system].append(lines * TOKENS / wall)
                print(f"round {r} {system}: {wall:.2f} s", file=sys.stderr, flush=True)
    return rates


def _beside_job(server: Any, data: bytes, seconds: float) -> dict[str, Any]:
    """The probe beside a running job: its TTFTs, and the job's lines per second meanwhile; the job
    is cancelled after the window."""
    with httpx.Client(timeout=600) as client:
        idle = _probe(client, server)
        job_id = start_job(client, server, data, "/v1/completions")
        time.sleep(2.0)  # the job's lines fill the slots
        before = client.get(server.url + f"/v1/batches/{job_id}").json()["request_counts"]["completed"]
        t0 = time.perf_counter()
        probes = []
        while time.perf_counter() - t0 < seconds:
            tick = time.perf_counter()
            probes.append(_probe(client, server))
            time.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - tick)))
        after = client.get(server.url + f"/v1/batches/{job_id}").json()["request_counts"]["completed"]
        rate = (after - before) / (time.perf_counter() - t0)
        client.post(server.url + f"/v1/batches/{job_id}/cancel").raise_for_status()
        wait_job(client, server, job_id, within=60)
        server.wait_idle(within=30)
    return {"idle": idle, "probes": probes, "rate": rate}


def _probe(client: httpx.Client, server: Any) -> float:
    body = {"model": server.model, "prompt": "hello there", "max_tokens": 8, "stream": True}
    t0 = time.perf_counter()
    with client.stream("POST", server.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return (time.perf_counter() - t0) * 1000
    raise RuntimeError(f"no token from the probe (status {r.status_code})")


def _isolation(quick: bool, rounds: int, seconds: float) -> dict[str, list[dict[str, Any]]]:
    from tools.servers import run_braid, tiny_model_dir

    # more lines than a window takes: the job still runs when the probes end
    prompts = random_token_prompts(20_000, PROMPT_LEN, VOCAB, SEED + 1)
    results: dict[str, list[dict[str, Any]]] = {}
    for cap in (0, *(() if quick else CAPS)):
        flags = ("--storage-dir", str(WORK / f"batch-jobs-iso-{cap}"), "--batch-max-slots", str(cap))
        with run_braid(*flags, model_dir=tiny_model_dir(), log=WORK / f"batch-jobs-iso-{cap}.log") as braid:
            data = completion_lines(prompts, braid.model)
            window(braid, False, 1.0, seed=0)  # warm-up
            if cap:  # the curve: one window beside a job per cap
                results[f"job-{cap}"] = [_beside_job(braid, data, seconds)]
                continue
            for r in range(rounds):
                for kind in ("job", "interactive")[:: 1 if r % 2 == 0 else -1]:
                    res = (
                        _beside_job(braid, data, seconds)
                        if kind == "job"
                        else window(braid, False, seconds, seed=r + 1)
                    )
                    results.setdefault(f"{kind}-0", []).append(res)
    return results


def _kill_9(lines: int) -> dict[str, Any]:
    """A job through braid's death by SIGKILL (engine core too) and a restart on the same storage."""
    from tools.servers import run_braid, tiny_model_dir

    store = WORK / "batch-jobs-kill"
    prompts = random_token_prompts(lines, PROMPT_LEN, VOCAB, SEED + 2)
    flags = ("--storage-dir", str(store))
    with httpx.Client(timeout=600) as client:
        with run_braid(*flags, model_dir=tiny_model_dir(), log=WORK / "batch-jobs-kill-1.log") as braid:
            job_id = start_job(client, braid, completion_lines(prompts, braid.model), "/v1/completions")
            t0 = time.perf_counter()
            while True:
                done = client.get(braid.url + f"/v1/batches/{job_id}").json()["request_counts"]["completed"]
                if done >= lines // 3:
                    break
                time.sleep(POLL)
            victims = [braid.pid, *engine_pids(braid)]
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            braid.proc.wait()
            before_kill = time.perf_counter() - t0
        time.sleep(1.0)  # the killed engine core's memory and ports are released
        with run_braid(*flags, model_dir=tiny_model_dir(), log=WORK / "batch-jobs-kill-2.log") as braid:
            t1 = time.perf_counter()
            job = wait_job(client, braid, job_id)
            after_restart = time.perf_counter() - t1
            rows = output_rows(client, braid, job)
    ids = [r["custom_id"] for r in rows]
    return {
        "done_at_kill": done,
        "status": job["status"],
        "rows": len(rows),
        "unique": len(set(ids)),
        "missing": len({f"req-{i}" for i in range(lines)} - set(ids)),
        "twice": len(ids) - len(set(ids)),
        "ok_rows": sum(1 for r in rows if r["response"]["status_code"] == 200),
        "before_kill_s": before_kill,
        "after_restart_s": after_restart,
    }


def _iso_row(label: str, results: list[dict[str, Any]], rate_unit: str) -> list[object]:
    probes = [p for r in results for p in r["probes"]]
    return [
        label,
        len(probes),
        f"{statistics.median(r['idle'] for r in results):.0f}",
        f"{percentile(probes, 50):.0f}",
        f"{percentile(probes, 90):.0f}",
        f"{max(probes):.0f}",
        f"{statistics.median(r['rate'] for r in results):.0f} {rate_unit}",
    ]


def run(quick: bool) -> Section:
    lines = 2000 if quick else 10_000
    rounds = 1 if quick else 2
    seconds = 6.0 if quick else 12.0
    load = os.getloadavg()[0]
    rates = _rates(quick, rounds, lines)
    iso = _isolation(quick, rounds, seconds)
    killed = _kill_9(KILL_LINES)

    med = {s: statistics.median(v) for s, v in rates.items()}
    rate_rows = [
        [
            "braid, completions job",
            f"{med['braid-completions']:,.0f}",
            f"{lines * TOKENS / med['braid-completions']:.1f}",
        ],
        [
            f"braid, jobs-only replica (`--max-in-flight-requests {JOBS_ONLY_IN_FLIGHT}`), completions job",
            f"{med['deep-completions']:,.0f}",
            f"{lines * TOKENS / med['deep-completions']:.1f}",
        ],
        ["engine alone (`LLM.generate`)", f"{med['offline']:,.0f}", f"{lines * TOKENS / med['offline']:.1f}"],
        [
            "vLLM's server, the same prompts at once as requests of 1,000 (reference)",
            f"{med['vllm-server']:,.0f}",
            f"{lines * TOKENS / med['vllm-server']:.1f}",
        ],
        ["braid, chat job", f"{med['braid-chat']:,.0f}", f"{lines * TOKENS / med['braid-chat']:.1f}"],
        ["`vllm run-batch`, chat lines", f"{med['run-batch']:,.0f}", f"{lines * TOKENS / med['run-batch']:.1f}"],
        [
            "braid, jobs-only replica, chat job",
            f"{med['deep-chat']:,.0f}",
            f"{lines * TOKENS / med['deep-chat']:.1f}",
        ],
    ]
    iso_rows = [
        _iso_row("braid, beside a job (default cap)", iso["job-0"], "lines/s"),
        _iso_row("braid, beside an interactive load", iso["interactive-0"], "prompts/s"),
    ]
    iso_rows += [
        _iso_row(f"braid `--batch-max-slots {c}`, beside a job", iso[f"job-{c}"], "lines/s")
        for c in CAPS
        if f"job-{c}" in iso
    ]
    job_p50 = percentile([p for r in iso["job-0"] for p in r["probes"]], 50)
    fg_p50 = percentile([p for r in iso["interactive-0"] for p in r["probes"]], 50)
    kill_ok = killed["status"] == "completed" and killed["missing"] == 0 and killed["twice"] == 0
    md = "\n".join(
        [
            f"Mode: {'quick' if quick else 'full'}; load average {load:.1f} at the start.",
            "",
            f"**Rate**: {lines:,} lines of one 32-token prompt, 32 tokens out, {rounds} round(s), median.",
            "",
            table(["system", "output tok/s", "wall (s)"], rate_rows),
            "",
            f"**A stream beside a job**: a streamed one-prompt request every {PROBE_EVERY:g} s for {seconds:g} s.",
            "",
            table(
                ["braid, beside", "probes", "idle TTFT (ms)", "p50 (ms)", "p90 (ms)", "worst (ms)", "the load's rate"],
                iso_rows,
            ),
            "",
            f"**kill -9** of braid and its engine core once {killed['done_at_kill']} of {KILL_LINES:,} lines were "
            f"counted done ({killed['before_kill_s']:.1f} s in), then a restart on the same storage: the job ended "
            f"{killed['status']} {killed['after_restart_s']:.1f} s after the restart with {killed['rows']:,} rows "
            f"({killed['ok_rows']:,} answered 200), {killed['missing']} custom_id missing, {killed['twice']} twice.",
        ]
    )
    return Section(
        title="Batch jobs: rate, a stream beside a job, kill -9",
        markdown=md,
        headlines=(
            f"batch_jobs: {lines:,}-line job {med['braid-completions'] / med['offline']:.2f}× the engine alone "
            f"(vLLM's server, the prompts at once: {med['vllm-server'] / med['offline']:.2f}×), "
            f"chat job {med['braid-chat'] / med['run-batch']:.2f}× vllm run-batch; on a jobs-only replica "
            f"{med['deep-completions'] / med['offline']:.2f}× and {med['deep-chat'] / med['run-batch']:.2f}×; "
            "stream TTFT p50 beside a job "
            f"{job_p50:.0f} ms vs {fg_p50:.0f} ms beside interactive load; kill -9: "
            f"{'every line once' if kill_ok else 'FAILED'}",
        ),
        targets=(
            Target(
                "completions job output tok/s / the engine alone",
                med["braid-completions"] / med["offline"],
                0.9,
                higher_is_better=True,
                unit="×",
                why_missed="see the batch jobs section",
            ),
            Target(
                "chat job output tok/s / vllm run-batch",
                med["braid-chat"] / med["run-batch"],
                1.0,
                higher_is_better=True,
                unit="×",
                why_missed="see the batch jobs section",
            ),
            Target(
                "stream's TTFT p50 beside a job / beside interactive load",
                job_p50 / fg_p50,
                2.0,
                higher_is_better=False,
                unit="×",
                why_missed="see the batch jobs section",
            ),
            Target("kill -9 mid-job: custom_ids missing or twice", killed["missing"] + killed["twice"], 0, False),
        ),
    )


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
