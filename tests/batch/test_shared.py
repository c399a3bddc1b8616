"""braid.batch.shared's pieces, and the runner's chunk reader: which lines a chunk is, and when
a chunk is done."""

from __future__ import annotations

import random
from pathlib import Path

from braid.batch.runner import _read_chunk
from braid.batch.shared import Chunks, chunk_lines, chunk_of, chunks_of, count_lines
from braid.batch.validate import numbered_lines


def test_a_chunk_read_from_where_the_last_ended_is_the_chunk_read_from_the_top(tmp_path: Path) -> None:
    rng = random.Random(7)
    text = b"".join(rng.choice([b"\n", b"  \n", f'{{"n": {i}}}\n'.encode()]) for i in range(500)) + b'{"last": 1}'
    path = tmp_path / "in.jsonl"
    path.write_bytes(text)
    with open(path, "rb") as f:
        every = list(numbered_lines(f))
    size = 37
    assert count_lines(path) == 501 and chunks_of(501, size) == 14
    known = (1, 0)
    read: list[tuple[int, bytes]] = []
    for i, chunk in enumerate([*range(14), 3, 13]):  # in order, then one again (given back), then the last
        first, end = chunk_lines(chunk, size)
        lines, known = _read_chunk(path, first, end, known)
        assert lines == [(n, raw) for n, raw in every if first <= n < end]
        assert all(chunk_of(n, size) == chunk for n, _ in lines)
        if i < 14:
            read += lines
    assert read == every


def test_count_lines_counts_a_last_line_without_its_newline(tmp_path: Path) -> None:
    for data, lines in ((b"", 0), (b"a", 1), (b"a\n", 1), (b"a\n\nb", 3), (b"\n\n", 2)):
        (tmp_path / "f").write_bytes(data)
        assert count_lines(tmp_path / "f") == lines, data


def test_a_chunk_is_done_when_read_and_every_line_started_is_written() -> None:
    chunks = Chunks(10)
    for line in (1, 2, 3):
        chunks.started(line)
    assert chunks.written([1]) == []  # its reader has not ended
    assert not chunks.read(0)
    assert chunks.written([2]) == []
    chunks.started(11)
    assert chunks.written([3, 11]) == [0]  # chunk 1 is still being read
    assert chunks.read(1)  # nothing of it left: done at once
    assert Chunks(10).read(5)  # a chunk whose every line had its row already
