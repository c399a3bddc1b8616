"""``braid batch -i in.jsonl -o out.jsonl``: a batch file run offline, on the server's own code.

The input is ``vllm run-batch``'s format, one request per line (``custom_id``, ``method``,
``url``, ``body``), with ``/v1/completions`` lines as well as ``/v1/chat/completions`` (prompt
lists included). Nothing is served: the command starts the engine, opens a store of its own in a
temporary directory, and runs the file as ``POST /v1/batches`` would run it — the same line
validation, the same runner (:class:`braid.batch.runner.BatchRunner`) feeding the lines to the
routes' own views in the background admission class, the same rows. The output file holds every
line's row, answers and errors alike (as ``vllm run-batch`` writes them), in input order; each
row carries its ``line`` number too (a braid extension, as on the server).

Options: every ``braid serve`` option of the engine and the front end (``--model``, the parsers,
``--max-in-flight-requests``, ...) is taken as ``serve`` takes it; ``--endpoint`` picks the route
when the file's first line does not say (default: that line's ``url``). Progress goes to stderr,
one line a second (a bar when stderr is a terminal). Exit status: 0 when the job ran (some lines
may have failed: see their rows), 1 when it could not start or the file as a whole was refused
(every line's error is in the output), 2 for a usage error. Cancelling (Ctrl-C) aborts the engine
work of the lines running and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import trio

from braid.batch.validate import numbered_lines
from braid.cli.config import engine_options_from, settings_from
from braid.cli.engines import EngineOptions, open_engine
from braid.cli.parser import build_parser
from braid.cli.startup import StartupError, check_model_path, check_parsers, check_vllm, one_line
from braid.engine.vllm_common import check_engine_args
from braid.logs import configure as configure_logs
from braid.routes.batches import ENDPOINTS
from braid.settings import Settings
from braid.store.options import StoreOptions
from braid.store.records import ANONYMOUS, BatchRecord, FileRecord, new_id

FINAL = ("completed", "failed", "expired", "cancelled")
UNBOUNDED = 2**62
"""The offline store's caps: the input is the user's own file on the user's own disk."""


def batch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="braid batch",
        description="Run a batch file (vllm run-batch's format, completions lines too) offline; "
        "every other option is a `braid serve` option (the engine's and the front end's).",
    )
    p.add_argument("-i", "--input-file", required=True, type=Path, help="the JSONL requests")
    p.add_argument("-o", "--output-file", required=True, type=Path, help="where every line's row goes")
    p.add_argument(
        "--endpoint", choices=ENDPOINTS, default=None, help="the route of the lines (default: the first line's url)"
    )
    return p


def first_url(path: Path) -> str | None:
    """The ``url`` of the file's first line that names one, or None."""
    with path.open("rb") as f:
        for _, raw in numbered_lines(f):
            try:
                url = json.loads(raw).get("url")
            except (ValueError, AttributeError):
                continue
            if isinstance(url, str):
                return url
    return None


class Progress:
    """One line a second on ``out``: lines done of the total, and the rate."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()
        self.tty = out.isatty()

    def show(self, record: BatchRecord, *, last: bool = False) -> None:
        c = record.counts
        done = c.completed + c.failed
        rate = done / max(1e-9, time.monotonic() - self.started)
        share = done / c.total if c.total else 1.0
        bar = ("#" * int(share * 30)).ljust(30)
        line = f"[{bar}] {done}/{c.total} lines, {c.failed} failed, {rate:.1f}/s, {record.status}"
        self.out.write(("\r" if self.tty else "") + line + ("\n" if last or not self.tty else ""))
        self.out.flush()


async def run_file(
    settings: Settings, store_options: StoreOptions, engine_options: EngineOptions, source: Path, endpoint: str
) -> tuple[BatchRecord, list[bytes]]:
    """Run ``source`` as one job; the job as it ended and every row, in input order."""
    from braid.http.app import create_app
    from braid.routes import batches
    from braid.store.db import open_store

    progress = Progress(sys.stderr)
    now = int(time.time())
    async with open_store(store_options, now) as store, open_engine(engine_options) as engine:
        app = create_app(engine, settings, store=store)
        runner = app.batches
        assert runner is not None  # create_app makes one whenever it has a store
        file_id = new_id("file-")
        staged = store.temp_path(file_id)
        await trio.to_thread.run_sync(shutil.copyfile, source, staged)
        size = staged.stat().st_size
        await store.add_file(FileRecord(file_id, ANONYMOUS, source.name, "batch", size, now, None), written=staged)
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            body = json.dumps({"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"})
            state = app.state
            created = await batches.create(
                store,
                ANONYMOUS,
                body.encode(),
                engine=engine,
                settings=settings,
                limits=state.limits,
                jobs=runner,
                now=now,
            )
            batch_id = json.loads(created.body)["id"]
            shown = 0.0
            while True:
                record = await store.load_batch(batch_id)
                assert record is not None
                if record.status in FINAL:
                    break
                if time.monotonic() - shown >= 1.0:
                    shown = time.monotonic()
                    progress.show(record)
                await trio.sleep(0.1)
            progress.show(record, last=True)
            nursery.cancel_scope.cancel()
        rows: list[tuple[int, bytes]] = []
        for file in (record.output_file_id, record.error_file_id):
            if file is not None:
                with (await store.local_path(file)).open("rb") as f:
                    rows += [(json.loads(r)["line"], r.rstrip(b"\n") + b"\n") for r in f if r.strip()]
    rows.sort(key=lambda r: r[0])
    return record, [r for _, r in rows]


def batch(argv: list[str]) -> int:
    """``braid batch``: see the module."""
    own, rest = batch_parser().parse_known_args(argv)
    serve_parser = build_parser()
    args = serve_parser.parse_args(["serve", *rest])
    try:
        engine_options = engine_options_from(args)
        check_engine_args(engine_options.vllm_kwargs())
        settings = settings_from(args, {})
    except ValueError as exc:
        serve_parser.error(str(exc))
    configure_logs(args.log_format)
    source: Path = own.input_file
    try:
        if not source.is_file():
            raise StartupError(f"no such input file: {source}")
        check_vllm(engine_options.engine)
        check_model_path(engine_options.model)
        check_parsers(settings.parsers)
        endpoint = own.endpoint or first_url(source) or ENDPOINTS[0]
        if endpoint not in ENDPOINTS:
            raise StartupError(f"the first line's url {endpoint!r} is not one of {', '.join(ENDPOINTS)} (--endpoint)")
    except StartupError as exc:
        print(f"braid: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="braid-batch-") as tmp:
        store_options = StoreOptions(
            storage_dir=tmp, max_file_bytes=UNBOUNDED, max_storage_bytes=UNBOUNDED, max_batch_lines=UNBOUNDED
        )
        try:
            record, rows = trio.run(run_file, settings, store_options, engine_options, source, endpoint)
        except KeyboardInterrupt:
            return 130
        except Exception as exc:  # noqa: BLE001 - one line for the operator, as `braid serve` does
            print(f"braid: the batch could not run: {one_line(exc)}", file=sys.stderr)
            return 1
    own.output_file.write_bytes(b"".join(rows))
    c = record.counts
    print(
        f"braid: {record.status}: {c.completed} of {c.total} lines answered, {c.failed} failed; "
        f"rows in {own.output_file}",
        file=sys.stderr,
    )
    return 0 if record.status == "completed" else 1


__all__ = ["batch", "batch_parser", "first_url", "run_file"]
