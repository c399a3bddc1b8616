"""Jobs shared by replicas (``--store-shared``): a job's lines in chunks, claimed with leases.

Replicas on one PostgreSQL database each run every active job they find
(:class:`braid.batch.runner.BatchRunner` looks every :data:`DISCOVER_EVERY` seconds), but a line
is run by the replica that holds its chunk:

* **Chunks.** Chunk ``k`` is the lines numbered ``k * size + 1 .. (k + 1) * size`` of the input
  file (numbers from 1, blank lines counted, as :func:`braid.batch.validate.numbered_lines`
  gives them). Every replica that starts a job adds its chunks, the ones that exist staying as
  they are. A replica claims the first chunk not done and free (never claimed, released, or its
  lease run out) with ``FOR UPDATE SKIP LOCKED``, so replicas claiming at once each get another;
  it claims the next when the pipeline has room for it, and renews its leases every third of
  ``--batch-lease``. Leases are read by the database's clock.
* **Rows.** A line's row goes to ``batch_rows`` keyed by (job, line), kept once: a chunk taken
  over from a replica that died runs only its lines without a row, and a row the dead replica
  wrote meanwhile keeps the first. The job's counts grow in the same transaction as its rows,
  so they are exact whichever replica wrote them. A chunk is done once every line of it has
  its row.
* **The end.** When no chunk is left, the replica that claims the job's end (chunk -1, with a
  lease as any chunk) writes the rows, in line order, to its work files and ends the job from
  them as an unshared job ends. If it dies, its lease runs out and another replica ends it: the
  files' ids are the job's own, so a second end finds what the first made.
* **Cancel and expiry.** A cancel, on any replica, makes the job ``cancelling``; a replica
  running it sees that at its next renewal, stops its lines (aborted as a client's) and gives
  its chunks back. The replica that claims the end waits until no other replica holds a live
  lease (at most one lease), then ends the job with the rows written. A job past its window
  ends the same way, ``expired``, its lines without a row given ``batch_expired`` rows.
* **Draining.** A replica that stops (drain, engine dead) gives its chunks back at once, for the
  others to take.
* **Moving a job.** A braid that ran a job alone and is restarted with ``--store-shared`` puts
  the rows of its work files into ``batch_rows`` before it runs the job (the counts then
  recounted from the rows), so no replica runs those lines again. A braid restarted without
  the flag takes a shared job back: every row, its own work files' among them, into its work
  files, the counts from them, and the job's chunks and rows dropped; it then resumes the job
  as its own. (A job that has ended takes no rows.)
"""

from __future__ import annotations

from pathlib import Path

import attrs
import msgspec

DISCOVER_EVERY = 2.0
"""Seconds between two looks for active jobs, by each replica of ``--store-shared``."""


class _Line(msgspec.Struct):
    line: int


_LINE = msgspec.json.Decoder(_Line)


def count_lines(path: Path) -> int:
    """Lines of a file, blank ones too (a last line without its newline counts); for a worker thread."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def chunks_of(lines: int, size: int) -> int:
    return -(-lines // size)


def chunk_of(line: int, size: int) -> int:
    """The chunk of a line number (from 1)."""
    return (line - 1) // size


def chunk_lines(chunk: int, size: int) -> tuple[int, int]:
    """The line numbers of a chunk: ``first .. end - 1``."""
    return chunk * size + 1, (chunk + 1) * size + 1


def read_rows(path: Path, ok: bool) -> list[tuple[int, bool, bytes]]:
    """Every row of a work file (line number, ``ok``, the row); for a worker thread."""
    if not path.exists():
        return []
    with open(path, "rb") as f:
        return [(_LINE.decode(raw).line, ok, raw) for raw in f if raw.strip()]


@attrs.define(eq=False)
class Chunks:
    """The chunks a replica is running of one job: for each, its lines started and not yet
    written; a chunk is done when its reader has ended and none is left."""

    size: int
    _left: dict[int, int] = attrs.Factory(dict)
    _read: set[int] = attrs.Factory(set)

    def started(self, line: int) -> None:
        chunk = chunk_of(line, self.size)
        self._left[chunk] = self._left.get(chunk, 0) + 1

    def read(self, chunk: int) -> bool:
        """Its reader has started every line of the chunk; whether it is done already."""
        self._read.add(chunk)
        return self._done(chunk)

    def written(self, lines: list[int]) -> list[int]:
        """Rows of these lines are in the database now: the chunks done by them."""
        touched = set()
        for line in lines:
            chunk = chunk_of(line, self.size)
            if chunk in self._left:
                self._left[chunk] -= 1
                touched.add(chunk)
        return sorted(c for c in touched if self._done(c))

    def _done(self, chunk: int) -> bool:
        if chunk in self._read and self._left.get(chunk, 0) == 0:
            self._read.discard(chunk)
            self._left.pop(chunk, None)
            return True
        return False


__all__ = ["DISCOVER_EVERY", "Chunks", "chunk_lines", "chunk_of", "chunks_of", "count_lines", "read_rows"]
