"""``SpansAhead`` with files that change after their bytes were read, spans larger than the
bound, and streams that stall: held bytes are served only as the file they were read from, the
bound holds, and a closed reader's thread ends."""

from __future__ import annotations

import os
import threading
import time

from shardfeed.readers import shard_readahead
from shardfeed.readers.shard_readahead import SpansAhead


def _planted(path, n, seed):
    data = bytes((i * seed + 11) % 251 for i in range(n))
    path.write_bytes(data)
    return data


def _wait_read(ahead, key):
    ahead.spans()
    entry = ahead._spans[key]
    entry[2].result(timeout=30)


def test_an_unchanged_file_serves_its_planted_bytes(tmp_path):
    path = tmp_path / "s.tar"
    data = _planted(path, 3 << 20, 7)
    ahead = SpansAhead(lambda: [("k", str(path), 1000, 2_500_000)])
    held = ahead.take("k")
    assert held is not None and held.read_at(1000, 2_499_000) == data[1000:2_500_000]


def test_a_file_replaced_after_the_read_is_not_served(tmp_path):
    path = tmp_path / "s.tar"
    _planted(path, 2 << 20, 7)
    ahead = SpansAhead(lambda: [("k", str(path), 0, 1 << 20)])
    _wait_read(ahead, "k")
    other = tmp_path / "other.tar"
    _planted(other, 2 << 20, 13)  # same size, other bytes
    os.replace(other, path)
    assert ahead.take("k") is None


def test_a_file_truncated_or_extended_after_the_read_is_not_served(tmp_path):
    for change in ("truncate", "extend"):
        path = tmp_path / f"{change}.tar"
        _planted(path, 2 << 20, 7)
        ahead = SpansAhead(lambda p=path: [("k", str(p), 0, 1 << 20)])
        _wait_read(ahead, "k")
        with open(path, "r+b") as f:
            f.truncate((1 << 20) + 5 if change == "truncate" else 3 << 20)
        assert ahead.take("k") is None, change


def test_a_span_past_the_end_of_the_file_is_not_read(tmp_path):
    path = tmp_path / "short.tar"
    _planted(path, 100_000, 7)
    ahead = SpansAhead(lambda: [("k", str(path), 50_000, 300_000)])
    assert ahead.take("k") is None


def test_spans_larger_than_the_bound_are_not_read(tmp_path):
    path = tmp_path / "s.tar"
    data = _planted(path, 1 << 20, 7)
    opened = []

    def source():
        opened.append(1)
        raise AssertionError("a span over the bound was opened")

    ahead = SpansAhead(lambda: [("a", str(path), 0, 4096), ("huge", source, 0, 1 << 62), ("b", str(path), 0, 10)],
                       max_bytes=1 << 20)
    assert ahead.spans() == {"a": (0, 4096)}  # cut at the first span over the bound, none after it
    assert ahead.take("a").read_at(0, 4096) == data[:4096]
    ahead._thread.join(10)
    assert opened == [] and ahead.held_bytes() == 0


class _StallingStream:
    """A stream whose every ``read`` waits for ``release`` (a server that stalls)."""

    def __init__(self, release):
        self.release, self.reads, self.closed = release, 0, False

    def read(self, n):
        self.release.wait(10)
        self.reads += 1
        return b"x" * n

    def close(self):
        self.closed = True


def test_a_closed_reader_stops_a_stalled_stream_and_its_thread_ends(monkeypatch):
    monkeypatch.setattr(shard_readahead, "STREAM_PIECE_BYTES", 1 << 10)
    release = threading.Event()
    stream = _StallingStream(release)
    ahead = SpansAhead(lambda: [("k", lambda: (stream, 0), 0, 1 << 20), ("k2", lambda: (stream, 0), 0, 10)])
    ahead.spans()
    time.sleep(0.2)  # the thread waits in the first read
    ahead.close()
    release.set()
    ahead._thread.join(10)
    assert not ahead._thread.is_alive()
    assert stream.reads <= 2 and stream.closed  # not the 1,024 pieces of the span
    assert ahead.held_bytes() == 0 and ahead.take("k") is None
