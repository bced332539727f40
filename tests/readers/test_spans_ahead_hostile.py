"""``SpansAhead`` with files that change after their bytes were read, spans larger than the
bound, and streams that stall: held bytes are served only as the file they were read from, the
bound holds, and a closed reader's thread ends."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shardfeed.readers.storage import shard_readahead
from shardfeed.readers.storage.shard_readahead import SpansAhead


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


def test_a_shard_changed_between_epochs_is_read_as_it_is_now(tmp_path, monkeypatch):
    """Local shards read ahead for the next epoch (the storage taken for slow); one image's bytes
    in each shard rewritten in place after the first epoch: the next epoch delivers neither the
    bytes read ahead before nor a mix of versions: it stops, naming the changed shard (a reader
    reads one version of a dataset)."""
    import io

    import numpy as np
    from PIL import Image

    from shardfeed.convert.write.pack import PackOptions, pack
    from shardfeed.readers import make_loader
    from shardfeed.readers.sources import webdataset_source

    folder = tmp_path / "folder"
    rng = np.random.default_rng(9)
    planted = {}
    for i in range(24):
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        (folder / f"c{i % 2}" / f"{i:03d}.jpg").write_bytes(buf.getvalue())
        planted[buf.getvalue()] = i % 2
    pack(folder, tmp_path / "wds", PackOptions(format="wds", max_count=8, overwrite=True))
    monkeypatch.setattr(webdataset_source, "storage_is_slow", lambda: True)
    taken = []
    real_take = SpansAhead.take

    def take(ahead, key):
        held = real_take(ahead, key)
        taken.append(held is not None)
        return held

    monkeypatch.setattr(SpansAhead, "take", take)
    loader = make_loader(tmp_path / "wds", 4, decode=False, seed=1, shuffle=True, shuffle_buffer=30,
                         num_workers=0)
    first = [(bytes(s.data), int(s.label)) for batch in loader for s in batch]
    assert sorted(first) == sorted(planted.items())
    for thread in threading.enumerate():  # the next epoch's spans read ahead: all read by now
        if thread.name == "shardfeed-epoch-ahead":
            thread.join(30)
    # every shard rewritten in place: the first image's 64 bytes past its JPEG header inverted
    changed = {}
    for shard in sorted((tmp_path / "wds").glob("*.tar")):
        raw = bytearray(shard.read_bytes())
        for image in planted:
            at = raw.find(image)
            if at >= 0:
                raw[at + 600:at + 664] = bytes(255 - x for x in raw[at + 600:at + 664])
                changed[image] = bytes(raw[at:at + len(image)])
                break
        with open(shard, "r+b") as f:
            f.write(raw)
        st = os.stat(shard)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a coarse clock's later write
    assert changed
    from shardfeed.readers.errors import DatasetChangedError

    second = []
    with pytest.raises(DatasetChangedError, match=r"shard-00000[0-2]\.tar: changed since the dataset was opened"):
        for batch in loader:
            second.extend(bytes(s.data) for s in batch)
    assert second == []  # nothing of either version
    assert taken and not any(taken)  # each span read ahead was refused: its file changed
