"""The batch runner: every active job's lines through the routes' own steps, in the background class.

One :class:`BatchRunner` per server, made with the app when it has a store and run by ``braid
serve`` in the server's nursery (:meth:`BatchRunner.run`), beside hypercorn; it is cancelled
when the server has drained. What it does:

* **Feeding.** Each active job has a task that reads its input file and starts its lines in
  groups of up to ``group_lines`` consecutive lines as room frees up: at most ``in_flight``
  lines of every job together are in the pipeline (admitted and waiting in admission's
  background queue, or running), which is the background class's slots, a margin and one group
  being gathered, so a freed slot always finds a line waiting. A group runs its lines under one
  ticket and one run, each line prepared by its route's own steps and answered as soon as its
  own prompts end (:mod:`braid.batch.group`): no line waits for another (no chunk barrier), and
  the ticket holds the next line's prompt ready when a slot frees, as a batch request's does.
  The ticket is of the background class: the same validation, admission, engine requests and
  aborts as a client's request of a background key. A line the group gives back (it cannot
  share the group's run, or the run failed) runs alone, as one call of its route's view
  (:func:`braid.routes.completions.completions`, :func:`braid.routes.chat.chat_completions`),
  so an error is the answer of the line that caused it.
* **Results.** A 200 is appended to the job's output lines, any other answer to its error lines
  (OpenAI's batch output rows, with the line number), as each finishes; the counts follow.
  A 429 (the background queue is full of other clients' work) is retried after its Retry-After;
  a 503 (draining, engine dead) stops the job's task with nothing written for the line, so it
  runs again after the restart.
* **Crash-safe.** Rows are appended whole; at start a job's task reads the ``custom_id`` of every
  whole row already written (a torn last row is cut off) and skips those lines, so after
  ``kill -9`` and a restart every line appears exactly once across the output and error files.
* **The end.** When every line has a row the job is ``finalizing``, its rows become its output
  and error files (ids made from the job's, so a crash while finalizing redoes it, not twice),
  and it is ``completed``. Cancel (:meth:`BatchRunner.cancel`) cancels the job's task: its lines'
  engine requests are aborted as a disconnected client's are, and the job ends ``cancelled``
  with the rows written so far. A job whose window ends is ended the same way, ``expired``.
* **Shared.** With ``--store-shared`` the same steps run a job's lines a claimed chunk at a time,
  their rows going to the database instead of the work files, and the replica that claims the
  job's end writes them out and ends it (:mod:`braid.batch.shared`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, cast

import attrs
import msgspec
import trio

from braid.batch.group import run_group
from braid.batch.shared import DISCOVER_EVERY, Chunks, chunk_lines, chunks_of, count_lines, read_rows
from braid.batch.validate import LineChecker, Refused, Runnable, answer_row, error_row, numbered_lines
from braid.errors import EngineUnavailable, StoreUnavailable, TooManyRequests
from braid.routes import chat, completions
from braid.routes.common import AppState, JsonResponse, Prepare, View
from braid.store.db import Store
from braid.store.records import ACTIVE_STATUSES, BatchError, BatchRecord, BatchUsage, FileRecord, RequestCounts

log = logging.getLogger("braid.batch")

READ_LINES = 256
"""Lines read from an input file per worker-thread call."""
COUNTS_EVERY = 0.5
"""Seconds between two writes of a running job's counts to the store."""
GATHER_ROWS = 0.02
"""Seconds the writer waits for more rows when it has few, so that rows go to disk in batches."""
STORE_RETRY = 5.0
"""Seconds before a job that stopped because the store's database failed is run again."""
MIN_IN_FLIGHT, EXTRA_IN_FLIGHT = 8, 16


_Item = tuple[int, bool, bytes]
"""A row on its way to the writer: its line number, whether the line was answered 200, the row."""


class _Done(msgspec.Struct):
    line: int


_DONE = msgspec.json.Decoder(_Done)


class _CustomId(msgspec.Struct):
    custom_id: str | None = None


_CUSTOM_ID = msgspec.json.Decoder(_CustomId)


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = 0


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _Body(msgspec.Struct):
    usage: _Usage | None = None


class _Response(msgspec.Struct):
    body: _Body | None = None


class _Row(msgspec.Struct):
    response: _Response | None = None


_ROW = msgspec.json.Decoder(_Row)


def usage_of(path: Path) -> BatchUsage:
    """The tokens of a job's output rows, summed (OpenAI's batch ``usage``); for a worker thread.
    Summed once, from the file, when the job ends: the file is what a restart keeps, so no count
    is kept elsewhere that a crash could make differ from it."""
    input_tokens = cached = output = reasoning = 0
    if path.exists():
        with open(path, "rb") as f:
            for raw in f:
                response = _ROW.decode(raw).response
                usage = response.body.usage if response is not None and response.body is not None else None
                if usage is None:
                    continue
                input_tokens += usage.prompt_tokens
                output += usage.completion_tokens
                if usage.prompt_tokens_details is not None:
                    cached += usage.prompt_tokens_details.cached_tokens or 0
                if usage.completion_tokens_details is not None:
                    reasoning += usage.completion_tokens_details.reasoning_tokens or 0
    return BatchUsage(input_tokens, cached, output, reasoning)


def _kept_for(record: BatchRecord, retention: int) -> int:
    """Seconds a job's output and error files are kept: the client's ``output_expires_after``,
    never more than the server's file retention."""
    asked = record.output_expires_after
    return retention if asked is None else min(asked, retention)


def _any_body(body: bytes) -> None:
    """The body check of a line whose body was checked at the job's creation (see ``_feed``)."""
    return None


async def _next_rows(receive: trio.MemoryReceiveChannel[_Item]) -> list[_Item] | None:
    """The rows ready now, at least one; None once the channel has ended. With few, it waits
    for more rather than pay a thread hop for each engine step's few. (Rows held here when the
    job is cancelled are lost as those still in the channel are: their lines are not done.)"""
    try:
        rows = [await receive.receive()]
    except trio.EndOfChannel:
        return None
    if not _take_ready(receive, rows) and len(rows) < READ_LINES // 4:
        await trio.sleep(GATHER_ROWS)
        _take_ready(receive, rows)
    return rows


def _take_ready(receive: trio.MemoryReceiveChannel[_Item], rows: list[_Item]) -> bool:
    """Add every row ready now to ``rows``; True when the channel has ended."""
    while True:
        try:
            rows.append(receive.receive_nowait())
        except trio.WouldBlock:
            return False
        except trio.EndOfChannel:
            return True


def _derived_id(batch_id: str, kind: str) -> str:
    """A job's output or error file id: as unguessable as the job's, and the same every time, so
    that finalizing again after a crash finds the file it made."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:32]


def read_done(path: Path) -> tuple[set[int], int]:
    """The line numbers of the whole rows of a job's result file, and how many rows. A last
    row without its newline (a crash while it was written) is cut off the file. (Line numbers,
    not ``custom_id``s: a duplicate's error row carries the id of the line it repeats, which
    must still run; among the runnable lines the two are one to one.)"""
    done: set[int] = set()
    if not path.exists():
        return done, 0
    with open(path, "r+b") as f:
        data = f.read()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            f.truncate(whole)
    rows = 0
    for raw in data[:whole].splitlines():
        if raw.strip():
            done.add(_DONE.decode(raw).line)
            rows += 1
    return done, rows


def _steps(endpoint: str) -> tuple[Prepare, View]:
    """A job's route: how a line is prepared (to share a group's run) and answered alone."""
    if endpoint == "/v1/completions":
        return completions.prepare, completions.completions
    return chat.prepare, chat.chat_completions


def _read_chunk(
    path: Path, first: int, end: int, known: tuple[int, int] = (1, 0)
) -> tuple[list[tuple[int, bytes]], tuple[int, int]]:
    """The lines numbered ``first .. end - 1`` of a file that are not blank, and where line
    ``end`` starts (its number and byte offset); for a worker thread. ``known``: where a line at
    or before ``first`` starts, read from there (a replica claims a job's chunks mostly in order,
    so each read starts where the last ended, not at the top of the file)."""
    number, offset = known if known[0] <= first else (1, 0)
    found = []
    with open(path, "rb") as source:
        source.seek(offset)
        while number < end:
            raw = source.readline()
            if not raw:
                break
            if number >= first and raw.strip():
                found.append((number, raw))
            number += 1
            offset += len(raw)
    return found, (number, offset)


def open_binary(path: Path, mode: str) -> BinaryIO:
    """``open`` in binary mode, for a worker thread."""
    return cast(BinaryIO, open(path, mode))  # the caller closes it


def default_in_flight(state: AppState, group_lines: int) -> int:
    """Lines in the pipeline at once: the background class's room, a margin, and the group the
    reader is gathering (see the module), so that the lines of the groups started keep every
    background slot busy while the reader waits for a group to fill."""
    room = state.admission.background_room
    if room == 0:
        return 64 + group_lines
    return max(MIN_IN_FLIGHT, room + min(EXTRA_IN_FLIGHT, room)) + group_lines


@attrs.define(eq=False)
class _Room:
    """The places of lines in the pipeline, every job's together: taken a group at a time, first
    come first served, and given back a line at a time."""

    free: int
    _waiting: deque[tuple[int, trio.Event]] = attrs.Factory(deque)

    async def take(self, places: int) -> None:
        """Wait until ``places`` are free, behind those who asked before. Cancelled, it takes none."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._waiting and self.free >= places:
            self.free -= places
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        entry = (places, trio.Event())
        self._waiting.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()  # those behind it may fit now
            else:
                self.give(places)  # granted as it was cancelled
            raise

    def give(self, places: int) -> None:
        if places:
            self.free += places
            self._grant()

    def _grant(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            places, event = self._waiting.popleft()
            self.free -= places
            event.set()


@attrs.define(eq=False)
class _Groups:
    """A job's lines gathered into groups of the runner's size, each group started in ``nursery``
    as soon as it is whole (:meth:`BatchRunner._group`); a refused line's row sent at once. The
    places of a group in the pipeline are taken at once, so that a reader never holds part of
    the room while it waits for the rest; :meth:`close` gives back those not used."""

    runner: BatchRunner
    job: _Job
    prepare: Prepare
    view: View
    nursery: trio.Nursery
    send: trio.MemorySendChannel[_Item]
    on_start: Callable[[int], object] = lambda line: None
    """Told each line number as it is started or refused."""
    _group: list[Runnable] = attrs.Factory(list)
    _places: int = 0

    async def add(self, found: Runnable | Refused) -> None:
        if isinstance(found, Refused):
            self.on_start(found.number)
            await self.send.send((found.number, False, found.row))
            return
        if not self._places:
            await self.runner._room.take(self.runner.group_lines)
            self._places = self.runner.group_lines
        self.on_start(found.number)
        self._group.append(found)
        self._places -= 1
        if not self._places:
            self.flush()

    def flush(self) -> None:
        """Start the lines gathered, a whole group or not."""
        if self._group:
            self.nursery.start_soon(
                self.runner._group, self.job, self.prepare, self.view, self._group, self.send.clone()
            )
            self._group = []

    def close(self) -> None:
        self.runner._room.give(self._places + len(self._group))
        self._places = 0
        self._group = []


@attrs.define(eq=False)
class _Job:
    record: BatchRecord
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    cancelled: bool = False
    stopped: bool = False
    """The server could not run a line (draining, engine dead): the job is left for the restart."""
    completed: int = 0
    failed: int = 0


def _ended(job: _Job) -> str:
    """How a job whose lines stopped ends: cancelled, past its window, or every line answered."""
    if job.cancelled:
        return "cancelled"
    return "expired" if job.scope.cancelled_caught else "completed"


def _store_failed(exc: BaseException) -> bool:
    """Whether the store's database failed ``exc`` (itself, or within the group of a nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(StoreUnavailable) is not None
    return isinstance(exc, StoreUnavailable)


class BatchRunner:
    """See the module's contract."""

    def __init__(
        self, state: AppState, store: Store, *, in_flight: int | None = None, group_lines: int | None = None
    ) -> None:
        self.state = state
        self.store = store
        group_lines = group_lines or store.options.batch_group_lines
        in_flight = in_flight or default_in_flight(state, group_lines)
        self.group_lines = max(1, min(group_lines, in_flight))
        self._room = _Room(in_flight)
        self._nursery: trio.Nursery | None = None
        self._jobs: dict[str, _Job] = {}
        self.now: Callable[[], float] = time.time
        self.shared = store.options.shared
        """``--store-shared``: jobs are shared with other replicas (:mod:`braid.batch.shared`)."""
        self.holder = "braid-" + secrets.token_hex(8)
        """This runner's name on the chunks it claims (one per process: a restarted replica's
        claims are another's, taken over when their leases end)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume every active job, then run the jobs submitted, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for record in await self.store.active_batches():
                self.submit(record)
            task_status.started()
            if not self.shared:
                await trio.sleep_forever()
            while True:
                # Jobs made on other replicas, and jobs whose end a dead replica had claimed.
                await trio.sleep(DISCOVER_EVERY)
                try:
                    records = await self.store.active_batches()
                except StoreUnavailable:
                    continue  # the job tasks log it; the next look tries again
                for record in records:
                    self.submit(record)

    async def start(self, record: BatchRecord) -> None:
        """Store a new job and run it. With ``--store-shared`` the rows of its lines refused at
        creation (in this replica's work file) go to the database first, where the replica that
        ends the job finds them."""
        if self.shared:
            rows = await trio.to_thread.run_sync(read_rows, self.store.work_path(record.id, "error"), False)
            if rows:
                await self.store.add_rows(record.id, rows, count=False)
        await self.store.add_batch(record)
        self.submit(record)

    def submit(self, record: BatchRecord) -> None:
        """Start running a job (a job already running is left alone)."""
        if self._nursery is None or record.id in self._jobs:
            return
        job = self._jobs[record.id] = _Job(record)
        self._nursery.start_soon(self._run_job, job, name=f"batch {record.id}")

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object, name: str) -> bool:
        """Run other background work of the server's (a ``background`` response) in the runner's
        nursery, so that it ends with the runner; False when the runner is not running."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(fn, *args, name=name)
        return True

    async def cancel(self, record: BatchRecord) -> BatchRecord:
        """Cancel an active job: ``cancelling`` while its running lines are aborted, then
        ``cancelled`` (at once when none of it runs here). The job as stored now."""
        now = int(self.now())
        cancelling = attrs.evolve(record, status="cancelling", times=attrs.evolve(record.times, cancelling_at=now))
        if not await self.store.move_batch(cancelling, unless=("completed", "failed", "expired", "cancelled")):
            return await self.store.load_batch(record.id) or record
        job = self._jobs.get(record.id)
        if job is not None:
            job.cancelled = True
            job.scope.cancel()
            return cancelling
        if self.shared:
            # Other replicas may run it: a job task here ends it once they have stopped.
            self.submit(cancelling)
            return cancelling
        # Not running here (no runner yet, or it stopped): end it now with the rows written.
        job = _Job(cancelling, cancelled=True)
        store = self.store
        await self._take_back(record)
        out_path, err_path = store.work_path(record.id, "output"), store.work_path(record.id, "error")
        _, job.completed = await trio.to_thread.run_sync(read_done, out_path)
        _, job.failed = await trio.to_thread.run_sync(read_done, err_path)
        return await self._finish(job, "cancelled", out_path, err_path)

    async def fail(self, record: BatchRecord) -> BatchRecord:
        """Store a job that cannot run and end it ``failed``, its error rows its error file."""
        failed = attrs.evolve(record, status="failed", times=attrs.evolve(record.times, failed_at=record.created_at))
        await self.store.add_batch(failed)
        job = _Job(failed, failed=record.counts.failed)
        store = self.store
        return await self._finish(
            job, "failed", store.work_path(record.id, "output"), store.work_path(record.id, "error")
        )

    @property
    def active(self) -> int:
        """The jobs whose lines this runner is running now."""
        return len(self._jobs)

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def _run_job(self, job: _Job) -> None:
        store, record = self.store, job.record
        out_path, err_path = store.work_path(record.id, "output"), store.work_path(record.id, "error")
        try:
            if self.shared:
                await self._run_shared(job)
                return
            await self._take_back(record)
            out_done, job.completed = await trio.to_thread.run_sync(read_done, out_path)
            err_done, job.failed = await trio.to_thread.run_sync(read_done, err_path)
            if record.status == "cancelling":
                job.cancelled = True
            elif record.status == "in_progress":
                job.scope.deadline = trio.current_time() + (record.expires_at - self.now())
                with job.scope:
                    await self._feed(job, out_path, err_path, out_done | err_done)
            if job.stopped:
                log.info("batch %s: the server cannot run lines now; it resumes after a restart", record.id)
                await store.set_counts(record.id, job.completed, job.failed)
                return
            status = _ended(job)
            if status == "expired":
                await self._expire_rest(job, err_path, out_done | err_done)
            await self._finish(job, status, out_path, err_path)
        except FileNotFoundError:
            # The input file was deleted while the job ran (or before a restart).
            await self._fail(job, "input_file_deleted", "The batch's input file was deleted before the batch ended.")
        except Exception as exc:
            if _store_failed(exc):
                # The database is away (PostgreSQL restarting, a disk full). The rows written are
                # in the job's work files, so the job is not failed: it runs again from them.
                log.warning("batch %s: the store failed; the job runs again in %g s", record.id, STORE_RETRY)
                self.spawn(self._run_later, record, name=f"batch {record.id} (again)")
                return
            # A bug must not end the server with it: the job fails, and the log has why.
            log.exception("batch %s: the runner failed", record.id)
            try:
                await self._fail(job, "internal_error", "The batch failed inside braid (see the server's log).")
            except StoreUnavailable:
                log.exception("batch %s: the failure could not be stored", record.id)
        finally:
            del self._jobs[record.id]

    async def _run_later(self, record: BatchRecord) -> None:
        """Run a job again after the store failed it, as it is stored then (a cancel may have
        ended it meanwhile); later again while the store still fails."""
        await trio.sleep(STORE_RETRY)
        try:
            current = await self.store.load_batch(record.id)
        except StoreUnavailable:
            self.spawn(self._run_later, record, name=f"batch {record.id} (again)")
            return
        if current is not None and current.status in ACTIVE_STATUSES:
            self.submit(current)

    async def _feed(self, job: _Job, out_path: Path, err_path: Path, done: set[int]) -> None:
        record = job.record
        store = self.store
        # The lines' envelopes only: every body was checked when the job was created, and the
        # lines refused then have their rows already (in ``done``); a body the route refuses
        # now (the server restarted with other limits) gets the route's error when it runs.
        checker = LineChecker(record.endpoint, _any_body)
        prepare, view = _steps(record.endpoint)
        # Bounded: a line's task and the reader wait for the writer rather than hold rows.
        send, receive = trio.open_memory_channel[_Item](READ_LINES)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, job, receive, out_path, err_path)
            async with send:
                groups = _Groups(self, job, prepare, view, nursery, send)
                try:
                    source = await trio.to_thread.run_sync(
                        open_binary, await store.local_path(record.input_file_id), "rb"
                    )
                    with source:
                        lines = numbered_lines(source)
                        while True:
                            chunk = await trio.to_thread.run_sync(lambda: list(itertools.islice(lines, READ_LINES)))
                            if not chunk:
                                break
                            for number, raw in chunk:
                                found = checker(number, raw)  # every line: the checker learns the custom_ids
                                if number in done:
                                    continue  # its row is written (at validation, or before a restart)
                                await groups.add(found)
                    groups.flush()
                finally:
                    groups.close()

    # --- jobs shared by replicas (--store-shared; see braid.batch.shared) ---------------------

    async def _adopt(self, record: BatchRecord) -> None:
        """Rows this braid wrote for the job in its work files (it ran the job before it shared
        it, or has just refused some of its lines at creation) go to the database, each line
        once, with the job's counts made exact; the files go. So a job moved to replicas
        (restarted with ``--store-shared``) runs none of its lines again."""
        paths = (self.store.work_path(record.id, "output"), self.store.work_path(record.id, "error"))

        def read() -> list[tuple[int, bool, bytes]]:
            rows: list[tuple[int, bool, bytes]] = []
            for path, ok in zip(paths, (True, False), strict=True):
                read_done(path)  # cuts a row torn by a crash off the file
                rows += read_rows(path, ok)
            return rows

        rows = await trio.to_thread.run_sync(read)
        if rows:
            await self.store.adopt_rows(record.id, rows)

            def unlink() -> None:
                for path in paths:
                    path.unlink(missing_ok=True)

            await trio.to_thread.run_sync(unlink)

    async def _take_back(self, record: BatchRecord) -> None:
        """A job that replicas shared (this braid restarted without ``--store-shared``): its rows,
        this braid's work files' among them, become its work files, and the database forgets
        its chunks and rows. The job then resumes here as any other, each line once."""
        if not await self.store.was_shared(record.id):
            return
        await self._adopt(record)
        out_path, err_path = self.store.work_path(record.id, "output"), self.store.work_path(record.id, "error")
        completed, failed = await self.store.write_rows(record.id, out_path, err_path)
        await self.store.set_counts(record.id, completed, failed)
        await self.store.drop_shared(record.id)
        log.info(
            "batch %s: shared by replicas before, it now runs here alone (%d rows kept)", record.id, completed + failed
        )

    async def _run_shared(self, job: _Job) -> None:
        store, record, options = self.store, job.record, self.store.options
        size, lease = options.batch_chunk_lines, options.batch_lease
        await self._adopt(record)
        if record.status == "cancelling":
            job.cancelled = True
        elif record.status == "in_progress":
            source = await store.local_path(record.input_file_id)
            lines = await trio.to_thread.run_sync(count_lines, source)
            if not await store.add_chunks(record.id, chunks_of(lines, size)):
                return  # ended by another replica since this one found it
            job.scope.deadline = trio.current_time() + (record.expires_at - self.now())
            try:
                with job.scope:
                    while True:
                        chunks = Chunks(size)
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._keep_leases, job)
                            await self._feed_chunks(job, source, chunks)
                            nursery.cancel_scope.cancel()
                        if job.stopped:
                            break
                        left, others = await store.chunks_left(record.id, self.holder)
                        if left == 0:
                            break
                        # Chunks held by live replicas: wait, to take over those whose holder
                        # dies; chunks given back (a replica drained) are claimed at once.
                        await trio.sleep(0.2 if others < left else lease / 3)
                        await self._watch(job)
            finally:
                with trio.CancelScope(shield=True):
                    await store.release_chunks(record.id, self.holder)
        if job.stopped:
            log.info("batch %s: this replica cannot run lines now; its chunks are given back", record.id)
            return
        await self._end_shared(job, _ended(job))

    async def _end_shared(self, job: _Job, status: str) -> None:
        """End the job if this replica claims its end (else another replica ends it): once no
        other replica runs its lines, its rows become this replica's work files, then its files."""
        store, record, lease = self.store, job.record, self.store.options.batch_lease
        if await store.claim_chunk(record.id, self.holder, lease, end=True) is None:
            return
        current = await store.load_batch(record.id)
        if current is None or current.status not in ACTIVE_STATUSES:
            # Ended by a replica that died before it dropped the job's chunks.
            await store.drop_shared(record.id)
            return
        out_path, err_path = store.work_path(record.id, "output"), store.work_path(record.id, "error")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_leases, job)
            if status != "completed":
                # Replicas still running lines stop at their next renewal (a cancel) or at the
                # window's end (an expiry): at most a lease.
                while True:
                    _, others = await store.chunks_left(record.id, self.holder)
                    if not others:
                        break
                    await trio.sleep(1.0)
            job.completed, job.failed = await store.write_rows(record.id, out_path, err_path)
            if status == "expired":
                await self._expire_rest(job, err_path, set())
            await self._finish(job, status, out_path, err_path)
            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await store.drop_shared(record.id)

    async def _keep_leases(self, job: _Job) -> None:
        """Renew this replica's leases on the job's chunks every third of a lease, and look for a
        cancel made on another replica."""
        lease = self.store.options.batch_lease
        while True:
            await trio.sleep(lease / 3)
            await self.store.renew_chunks(job.record.id, self.holder, lease)
            await self._watch(job)

    async def _watch(self, job: _Job) -> None:
        current = await self.store.load_batch(job.record.id)
        if current is not None and current.status in ("cancelling", "cancelled") and not job.cancelled:
            job.cancelled = True
            job.scope.cancel()

    async def _feed_chunks(self, job: _Job, source: Path, chunks: Chunks) -> None:
        """Claim the job's chunks one after another, as the pipeline has room for their lines,
        and run each line of them that has no row yet, until no chunk is free."""
        store, record, options = self.store, job.record, self.store.options
        prepare, view = _steps(record.endpoint)
        send, receive = trio.open_memory_channel[_Item](READ_LINES)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_shared, job, receive, chunks)
            async with send:
                groups = _Groups(self, job, prepare, view, nursery, send, on_start=chunks.started)
                known = (1, 0)
                try:
                    while (chunk := await store.claim_chunk(record.id, self.holder, options.batch_lease)) is not None:
                        first, end = chunk_lines(chunk, chunks.size)
                        written = await store.row_lines(record.id, first, end)
                        lines, known = await trio.to_thread.run_sync(_read_chunk, source, first, end, known)
                        checker = LineChecker(record.endpoint, _any_body)
                        for number, raw in lines:
                            found = checker(number, raw)
                            if number not in written:
                                await groups.add(found)
                        groups.flush()
                        if chunks.read(chunk):
                            await store.chunk_done(record.id, chunk, self.holder)
                finally:
                    groups.close()

    async def _write_shared(self, job: _Job, receive: trio.MemoryReceiveChannel[_Item], chunks: Chunks) -> None:
        """Rows into the database as they come, several per call; a chunk done once its last
        row is in."""
        store, batch_id = self.store, job.record.id
        async with receive:
            while (rows := await _next_rows(receive)) is not None:
                # shielded: rows in hand are kept whole even as the job is cancelled
                with trio.CancelScope(shield=True):
                    await store.add_rows(batch_id, rows)
                    for chunk in chunks.written([line for line, _, _ in rows]):
                        await store.chunk_done(batch_id, chunk, self.holder)
                self._counted(rows)

    async def _group(
        self,
        job: _Job,
        prepare: Prepare,
        view: View,
        lines: list[Runnable],
        send: trio.MemorySendChannel[_Item],
    ) -> None:
        """Run lines as a group (:mod:`braid.batch.group`); those it gives back, each alone. Every
        line's slot in the pipeline is handed back as it is answered, or as this ends."""
        held = set(lines)

        async def answer(line: Runnable, result: JsonResponse) -> None:
            rid = next((v for k, v in result.headers if k == "X-Request-Id"), None)
            row = answer_row(line.number, line.custom_id, result.status, result.body, rid)
            await send.send((line.number, result.status == 200, row))
            held.discard(line)
            self._room.give(1)

        async def alone(line: Runnable) -> None:
            result = await self._alone(view, line)
            if result is None:
                self._stop(job)
                return
            await answer(line, result)

        async with send:
            try:
                pending: Sequence[Runnable] = lines
                while pending:
                    left = await run_group(self.state, prepare, pending, answer)
                    if isinstance(left.error, TooManyRequests):
                        # The background queue is full of other clients' work: wait as told.
                        await trio.sleep(left.error.retry_after or 1)
                    elif isinstance(left.error, EngineUnavailable):
                        self._stop(job)
                        return
                    elif left.error is None and len(left.lines) < len(pending):
                        pass  # lines of another n or priority: a group of their own
                    else:
                        # The run failed (or, were it a bug, answered no line): each line alone,
                        # all at once, so that an error is its own line's answer.
                        async with trio.open_nursery() as nursery:
                            for line in left.lines:
                                nursery.start_soon(alone, line)
                        return
                    pending = left.lines
            finally:
                self._room.give(len(held))

    @staticmethod
    def _stop(job: _Job) -> None:
        """The server cannot run lines now (draining, engine dead): leave the job for the restart."""
        job.stopped = True
        job.scope.cancel()

    async def _alone(self, view: View, line: Runnable) -> JsonResponse | None:
        """A line as a request of its own, the answer its route gives (a 429 waited out and
        retried); None when the server cannot run it now (a 503)."""
        while True:
            result = await self._call(view, line.body)
            if result.status == 429:
                await trio.sleep(next((int(v) for k, v in result.headers if k == "Retry-After"), 1))
                continue
            return None if result.status == 503 else result

    async def _call(self, view: View, body: bytes) -> JsonResponse:
        async def read_body() -> bytes:
            return body

        result = await view(self.state, read_body, content_type="application/json", request_id=None, background=True)
        assert isinstance(result, JsonResponse), "a batch line never streams (its validation refuses stream)"
        return result

    async def _write(
        self, job: _Job, receive: trio.MemoryReceiveChannel[_Item], out_path: Path, err_path: Path
    ) -> None:
        """Append rows as they come, several per worker-thread call; the counts to the store now and then."""
        store = self.store
        last = trio.current_time()
        out = await trio.to_thread.run_sync(open_binary, out_path, "ab")
        err = await trio.to_thread.run_sync(open_binary, err_path, "ab")
        with out, err:
            async with receive:
                while (rows := await _next_rows(receive)) is not None:

                    def append(rows: list[_Item] = rows) -> None:
                        for _, ok, row in rows:
                            (out if ok else err).write(row)
                        out.flush()
                        err.flush()

                    # shielded: rows in hand are written whole even as the job is cancelled
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(append)
                    completed = self._counted(rows)
                    job.completed += completed
                    job.failed += len(rows) - completed
                    if trio.current_time() - last >= COUNTS_EVERY:
                        last = trio.current_time()
                        with trio.CancelScope(shield=True):
                            await store.set_counts(job.record.id, job.completed, job.failed)

    def _counted(self, rows: list[_Item]) -> int:
        """Count written rows in the metrics; how many of them were answered 200."""
        completed = sum(ok for _, ok, _ in rows)
        self.state.metrics.batch_line(True, completed)
        self.state.metrics.batch_line(False, len(rows) - completed)
        return completed

    async def _expire_rest(self, job: _Job, err_path: Path, done: set[int]) -> None:
        """A row ``batch_expired`` for every line that has none, as OpenAI's expired batches have."""
        record = await self.store.local_path(job.record.input_file_id)

        def expire() -> int:
            done_now, _ = read_done(err_path)
            out_done, _ = read_done(self.store.work_path(job.record.id, "output"))
            seen = done | done_now | out_done
            rows = 0
            with open(record, "rb") as source, open(err_path, "ab") as err:
                for number, raw in numbered_lines(source):
                    if number in seen:
                        continue
                    try:
                        cid: str | None = _CUSTOM_ID.decode(raw).custom_id
                    except msgspec.MsgspecError:
                        cid = None
                    err.write(error_row(number, cid, "batch_expired", "The batch expired before this request ran."))
                    rows += 1
            return rows

        with trio.CancelScope(shield=True):
            expired = await trio.to_thread.run_sync(expire)
        job.failed += expired
        self.state.metrics.batch_line(False, expired)

    async def _fail(self, job: _Job, code: str, message: str) -> None:
        now = int(self.now())
        with trio.CancelScope(shield=True):
            current = await self.store.load_batch(job.record.id) or job.record
            await self.store.put_batch(
                attrs.evolve(
                    current,
                    status="failed",
                    errors=(BatchError(code, message),),
                    times=attrs.evolve(current.times, failed_at=now),
                )
            )
        self.state.metrics.batch_ended("failed")

    async def _finish(self, job: _Job, status: str, out_path: Path, err_path: Path) -> BatchRecord:
        """Finalize: the rows become the job's files, then the job its final status."""
        store, record = self.store, job.record
        now = int(self.now())
        with trio.CancelScope(shield=True):
            current = await store.load_batch(record.id) or record
            times = current.times
            if status == "completed":
                times = attrs.evolve(times, finalizing_at=times.finalizing_at or now)
                await store.move_batch(
                    attrs.evolve(current, status="finalizing", times=times), unless=("cancelling", "cancelled")
                )
            usage = await trio.to_thread.run_sync(usage_of, out_path)
            files: dict[str, str | None] = {}
            for kind, path in (("output", out_path), ("error", err_path)):
                file_id = _derived_id(record.id, kind)
                if await store.file_exists(file_id):
                    files[kind] = file_id
                    continue
                size = path.stat().st_size if path.exists() else 0
                if size == 0:
                    path.unlink(missing_ok=True)
                    files[kind] = None
                    continue
                await store.add_file(
                    FileRecord(
                        id=file_id,
                        owner=record.owner,
                        filename=f"{record.id}_{kind}.jsonl",
                        purpose="batch_output",
                        bytes=size,
                        created_at=now,
                        expires_at=now + _kept_for(record, store.options.file_retention),
                    ),
                    written=path,
                )
                files[kind] = file_id
            stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}.get(status)
            if stamp is not None:
                times = attrs.evolve(times, **{stamp: now})
            if status == "cancelled" and times.cancelling_at is None:
                times = attrs.evolve(times, cancelling_at=now)
            final = attrs.evolve(
                current,
                status=status,  # type: ignore[arg-type]
                times=times,
                counts=RequestCounts(current.counts.total, job.completed, job.failed),
                output_file_id=files["output"],
                error_file_id=files["error"],
                usage=None if status == "failed" else usage,
            )
            await store.put_batch(final)
        self.state.metrics.batch_ended(status)
        log.info("batch %s %s: %d completed, %d failed", record.id, status, job.completed, job.failed)
        return final


__all__ = ["BatchRunner", "default_in_flight", "read_done", "usage_of"]
