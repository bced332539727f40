"""Read-ahead of shard chunks (readers/storage/shard_readahead.py): same bytes, in order, bounded in flight.

The slow storage is a real file read with ``os.pread`` after a sleep (what a network mount's
round trip adds); the loader test reads a WebDataset through the FUSE storage emulator.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.readers.storage import shard_readahead
from shardfeed.readers.storage.shard_readahead import open_ahead, read_ahead, storage_is_slow, take_opened

from .watch_helpers import load_emulator


@pytest.fixture(autouse=True)
def _fresh_process_state():
    shard_readahead._learned = None  # what an earlier (slow) range taught this process
    yield
    shard_readahead._learned = None
    if shard_readahead._opened is not None:
        for future in shard_readahead._opened[1].values():
            shard_readahead._close_when_done(future)
        shard_readahead._opened = None


def _plan(total: int, step: int) -> list[tuple[int, int, int, int]]:
    return [(k, k + 1, a, min(total, a + step)) for k, a in enumerate(range(0, total, step))]


class SlowFile:
    """``read_at`` over a real file, sleeping ``delay_s`` per read; counts reads in flight."""

    def __init__(self, path: Path, delay_s: float):
        self.fd = os.open(path, os.O_RDONLY)
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = self.reads = 0

    def __call__(self, offset: int, n: int) -> bytes:
        with self.lock:
            self.in_flight += 1
            self.reads += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay_s)
            return os.pread(self.fd, n, offset)
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def blob(tmp_path) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    return path, data


def test_fast_reads_stay_in_the_callers_thread(blob):
    path, data = blob
    f = SlowFile(path, 0.0)
    chunks = list(read_ahead(f, _plan(len(data), 96 * 1024), slow_read_s=10.0))
    assert b"".join(chunks) == data and f.max_in_flight == 1


def test_slow_reads_go_ahead_in_order_and_bounded(blob):
    path, data = blob
    f = SlowFile(path, 0.003)
    plan = _plan(len(data), 96 * 1024)
    out = []
    for chunk in read_ahead(f, plan, max_depth=6, max_bytes=6 * 96 * 1024):
        out.append(chunk)
        time.sleep(0.0005)  # the caller decodes
    assert b"".join(out) == data  # every byte, in order
    assert f.reads == len(plan)
    assert 2 <= f.max_in_flight <= 6


def test_a_slow_range_makes_the_next_one_read_ahead_from_its_start(blob):
    path, data = blob
    plan = _plan(len(data), 96 * 1024)
    assert b"".join(read_ahead(SlowFile(path, 0.003), plan[:10])) == data[: plan[9][3]]
    f = SlowFile(path, 0.003)
    gen = read_ahead(f, plan[10:])
    assert next(gen) == data[plan[10][2] : plan[10][3]]
    assert f.reads >= 2  # the first chunk was not read alone
    assert b"".join(gen) == data[plan[11][2] :]


def test_a_range_read_as_the_tar_parser_reads_it_teaches_the_next_one(blob):
    """The parser zips its plan with the chunks and so never resumes the generator after its
    last chunk: what the range learned must be kept by then."""
    path, data = blob
    plan = _plan(len(data), 96 * 1024)
    got = [chunk for _, chunk in zip(plan[:10], read_ahead(SlowFile(path, 0.003), plan[:10]))]
    assert b"".join(got) == data[: plan[9][3]]
    assert storage_is_slow()
    f = SlowFile(path, 0.003)
    gen = read_ahead(f, plan[10:])
    assert next(gen) == data[plan[10][2] : plan[10][3]]
    assert f.reads >= 2  # read ahead from its first chunk on
    assert b"".join(gen) == data[plan[11][2] :]


def test_a_fast_caller_on_slow_storage_gets_many_reads_in_flight(blob):
    """The depth grows to what the latency needs over the caller's time per chunk (here about
    2 * 20 / 1 + 2), not one request at a time."""
    path, data = blob
    f = SlowFile(path, 0.02)
    plan = _plan(len(data), 96 * 1024)
    out = []
    for chunk in read_ahead(f, plan, max_depth=16):
        out.append(chunk)
        time.sleep(0.001)
    assert b"".join(out) == data
    assert 8 <= f.max_in_flight <= 16


def test_open_ahead_hands_over_the_file_after_a_slow_range(blob, tmp_path):
    path, data = blob
    prepared = []
    assert not open_ahead(path, prepare=lambda: prepared.append(1))  # reads were never slow here
    assert take_opened(path) is None and not prepared
    list(zip(_plan(len(data), 96 * 1024)[:4], read_ahead(SlowFile(path, 0.003), _plan(len(data), 96 * 1024)[:4])))
    assert open_ahead(path, prepare=lambda: prepared.append(1), first_bytes=96 * 1024)
    assert not open_ahead(path)  # never twice
    fd = take_opened(path)
    try:
        assert prepared == [1]
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)
    assert take_opened(path) is None  # handed over once
    assert open_ahead(tmp_path / "gone.tar")
    with pytest.raises(FileNotFoundError):
        take_opened(tmp_path / "gone.tar")


def test_open_ahead_keeps_at_most_max_opened_files(blob, tmp_path):
    path, data = blob
    list(zip(_plan(len(data), 96 * 1024)[:4], read_ahead(SlowFile(path, 0.003), _plan(len(data), 96 * 1024)[:4])))
    paths = [tmp_path / f"s{k}.tar" for k in range(shard_readahead.MAX_OPENED + 3)]

    def opened_here() -> int:  # this process's descriptors on the planted files (others may come and go)
        names = {str(p) for p in paths}
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") in names
            except OSError:
                pass
        return n

    for k, p in enumerate(paths):
        p.write_bytes(bytes([k]) * 1000)
        assert open_ahead(p, first_bytes=1000)
    time.sleep(0.2)  # the pool finishes the opens (evicted ones close when their open is done)
    assert opened_here() == shard_readahead.MAX_OPENED
    for k, p in enumerate(paths):
        fd = take_opened(p)
        if k < 3:
            assert fd is None
        else:
            assert os.pread(fd, 1000, 0) == bytes([k]) * 1000
            os.close(fd)


def test_bytes_in_flight_are_bounded(blob):
    path, data = blob
    f = SlowFile(path, 0.003)
    chunks = list(read_ahead(f, _plan(len(data), 256 * 1024), max_depth=16, max_bytes=512 * 1024))
    assert b"".join(chunks) == data and f.max_in_flight <= 2


def test_a_failed_read_is_raised_at_its_chunk(blob):
    path, data = blob
    f = SlowFile(path, 0.002)
    plan = _plan(len(data), 100_000)

    def read_at(offset, n):
        if offset == plan[7][2]:
            raise OSError(5, "Input/output error")
        return f(offset, n)

    got = []
    with pytest.raises(OSError, match="Input/output"):
        for chunk in read_ahead(read_at, plan):
            got.append(chunk)
    assert b"".join(got) == data[: plan[7][2]]


def test_closing_early_stops_reading(blob):
    path, data = blob
    f = SlowFile(path, 0.002)
    plan = _plan(len(data), 32 * 1024)
    gen = read_ahead(f, plan, max_depth=4)
    first = [next(gen) for _ in range(5)]
    gen.close()
    time.sleep(0.05)
    assert b"".join(first) == data[: 5 * 32 * 1024]
    assert f.reads <= 5 + 4 + 1 and f.in_flight == 0


class LoggedFile(SlowFile):
    """A :class:`SlowFile` that also records each read's ``(offset, nbytes)``."""

    def __init__(self, path: Path, delay_s: float):
        super().__init__(path, delay_s)
        self.calls: list[tuple[int, int]] = []

    def __call__(self, offset: int, n: int) -> bytes:
        with self.lock:
            self.calls.append((offset, n))
        return super().__call__(offset, n)


def test_aligned_requests_give_the_same_chunks(blob):
    """With ``request_bytes``, the reads ahead are aligned 128 KiB requests, each byte asked once,
    and every chunk still holds the plan's bytes."""
    path, data = blob
    size = 128 * 1024
    plan = _plan(len(data), 96 * 1024)
    f = LoggedFile(path, 0.003)
    out = list(read_ahead(f, plan, request_bytes=size))
    assert [len(c) for c in out] == [b - a for _, _, a, b in plan]
    assert b"".join(out) == data
    caller = f.calls[0]  # the first read, in the caller's thread, proved the storage slow
    assert caller == (0, 96 * 1024)
    ahead = sorted(f.calls[1:])
    assert ahead == [(o, min(size, len(data) - o)) for o in range(0, len(data), size)]


def test_aligned_requests_after_a_slow_range_start_at_its_first_chunk(blob):
    path, data = blob
    size = 128 * 1024
    plan = _plan(len(data), 100_000)
    list(read_ahead(SlowFile(path, 0.003), plan[:5], request_bytes=size))
    assert storage_is_slow()
    f = LoggedFile(path, 0.003)
    out = list(read_ahead(f, plan[5:], request_bytes=size))
    assert b"".join(out) == data[plan[5][2]:]
    first = plan[5][2] // size * size  # 500_000 rounded down to a request boundary
    assert sorted(f.calls) == [(o, min(size, len(data) - o)) for o in range(first, len(data), size)]


def test_aligned_requests_are_bounded_in_flight(blob):
    path, data = blob
    f = SlowFile(path, 0.003)
    chunks = list(read_ahead(f, _plan(len(data), 96 * 1024), max_depth=16, max_bytes=4 * 128 * 1024,
                             request_bytes=128 * 1024))
    assert b"".join(chunks) == data and f.max_in_flight <= 4


def test_a_failed_request_is_raised_at_the_first_chunk_that_needs_it(blob):
    path, data = blob
    size = 128 * 1024
    f = SlowFile(path, 0.002)
    plan = _plan(len(data), 96 * 1024)
    bad = 8 * size  # bytes [1 MiB, 1 MiB + 128 KiB) fail

    def read_at(offset, n):
        if offset == bad:
            raise OSError(5, "Input/output error")
        return f(offset, n)

    got = []
    with pytest.raises(OSError, match="Input/output"):
        for chunk in read_ahead(read_at, plan, request_bytes=size):
            got.append(chunk)
    # every chunk that ends at or before 1 MiB came back whole; the one crossing it raised
    whole = [k for k, (_, _, a, b) in enumerate(plan) if b <= bad]
    assert len(got) == len(whole) and b"".join(got) == data[: plan[whole[-1]][3]]


def test_a_short_request_cuts_its_chunk_short(tmp_path):
    """The file ends before the plan does (truncated since it was indexed): the chunk that
    crosses its end holds the bytes up to it, the later ones nothing, as ``pread`` gives."""
    data = np.random.default_rng(2).integers(0, 256, 1_000_000, dtype=np.uint8).tobytes()
    path = tmp_path / "short.tar"
    path.write_bytes(data)
    plan = _plan(1_300_000, 96 * 1024)
    list(read_ahead(SlowFile(path, 0.003), plan[:2]))  # the storage proved slow
    out = list(read_ahead(SlowFile(path, 0.003), plan, request_bytes=128 * 1024))
    assert len(out) == len(plan)
    for (_, _, a, b), chunk in zip(plan, out):
        assert chunk == data[a:b]


@pytest.mark.fuse
@pytest.mark.multiprocess
def test_webdataset_on_slow_storage_reads_the_same_samples(tmp_path, monkeypatch):
    if not os.path.exists("/dev/fuse"):
        msg = "FUSE unavailable: /dev/fuse is absent, the storage emulator cannot mount"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: FUSE is required here)")
        pytest.skip(msg)
    from shardfeed.convert.write.pack import PackOptions, pack
    from shardfeed.readers import open_dataset

    folder = tmp_path / "folder"
    rng = np.random.default_rng(1)
    planted = {}
    for i in range(60):
        d = folder / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        side = int(rng.integers(100, 220))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
        planted[f"c{i % 2}/{i:03d}.jpg"] = buf.getvalue()
    pack(folder, tmp_path / "wds", PackOptions(format="wds", max_count=15, overwrite=True))
    from shardfeed.readers.storage import location as location_module

    handed = []

    def take(path):
        fd = shard_readahead.take_opened(path)
        handed.append(fd is not None)
        return fd

    monkeypatch.setattr(location_module, "take_opened", take)
    emu = load_emulator().StorageEmulator(tmp_path / "wds", open_ms=2.0, read_ms=2.0).start()
    try:
        for readahead in (True, False):
            ds = open_dataset(emu.mountpoint, decode=False, shuffle=False, readahead=readahead)
            got = sorted(bytes(s.data) for s in ds)
            assert got == sorted(planted.values()), readahead
        stats = emu.stats()
        assert stats["max_in_flight"] >= 2  # the reads went ahead
        assert len(handed) == 4 and sum(handed) >= 2  # shards after the first slow one were opened ahead
    finally:
        emu.stop()


def test_hinted_requests_give_the_same_chunks_one_read_each(blob):
    """With the file's descriptor, the requests go out as kernel hints: every chunk is one read
    of the plan's own range in the caller's thread, and the bytes are the file's."""
    path, data = blob
    plan = _plan(len(data), 96 * 1024)
    f = LoggedFile(path, 0.003)
    out = []
    for chunk in read_ahead(f, plan, request_bytes=128 * 1024, fd=f.fd):
        out.append(chunk)
    assert [len(c) for c in out] == [b - a for _, _, a, b in plan]
    assert b"".join(out) == data
    assert f.calls == [(a, b - a) for _, _, a, b in plan] and f.max_in_flight == 1


def test_hinted_requests_are_aligned_and_bounded(blob, monkeypatch):
    """The hints cover the plan's bytes in aligned requests, each asked once, never more than
    ``max_bytes`` ahead of the chunk being read."""
    path, data = blob
    size = 128 * 1024
    plan = _plan(len(data), 96 * 1024)
    hints = []
    reads = []
    real = os.posix_fadvise

    def fadvise(fd, offset, n, advice):
        hints.append((offset, n, len(reads)))
        return real(fd, offset, n, advice)

    monkeypatch.setattr(shard_readahead.os, "posix_fadvise", fadvise)
    f = SlowFile(path, 0.003)

    def read_at(offset, n):
        reads.append(offset + n)
        return f(offset, n)

    out = list(read_ahead(read_at, plan, request_bytes=size, max_bytes=4 * size, fd=f.fd))
    assert b"".join(out) == data
    assert sorted((o, n) for o, n, _ in hints) == [(o, min(size, len(data) - o)) for o in range(0, len(data), size)]
    for offset, _, done in hints:
        read_to = reads[done - 1] if done else 0  # the end of the last chunk read before this hint
        assert offset < max(read_to, plan[min(done, len(plan) - 1)][3]) + 4 * size


def test_a_failing_hint_hands_the_rest_to_the_read_pool(blob, monkeypatch):
    path, data = blob
    size = 128 * 1024

    def fadvise(fd, offset, n, advice):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(shard_readahead.os, "posix_fadvise", fadvise)
    f = LoggedFile(path, 0.003)
    out = list(read_ahead(f, _plan(len(data), 96 * 1024), request_bytes=size, fd=f.fd))
    assert b"".join(out) == data
    assert sorted(f.calls[1:]) == [(o, min(size, len(data) - o)) for o in range(0, len(data), size)]


@pytest.mark.fuse
def test_hinted_requests_on_the_emulator_go_out_ahead_once_each(tmp_path):
    """On the FUSE emulator at 5 ms, the hints are the kernel's requests: each aligned 128 KiB
    asked once (the byte count is the file's; under load the kernel may ask one or two ranges
    again, having dropped their pages before the read came), several in flight, the chunks the
    file's bytes."""
    from .watch_helpers import require_fuse

    require_fuse()
    data = np.random.default_rng(3).integers(0, 256, 4_000_000, dtype=np.uint8).tobytes()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "shard.tar").write_bytes(data)
    (tmp_path / "src" / "first.tar").write_bytes(data[:1_000_000])
    plan = _plan(len(data), 96 * 1024)
    emu = load_emulator().StorageEmulator(tmp_path / "src", open_ms=5.0, read_ms=5.0).start()
    try:
        fd = os.open(emu.mountpoint / "first.tar", os.O_RDONLY)
        try:
            list(read_ahead(lambda o, n: os.pread(fd, n, o), plan[:3]))  # the storage proved slow
        finally:
            os.close(fd)
        fd = os.open(emu.mountpoint / "shard.tar", os.O_RDONLY)
        try:
            emu.reset_stats()
            t0 = time.perf_counter()
            out = list(read_ahead(lambda o, n: os.pread(fd, n, o), plan, request_bytes=128 * 1024, fd=fd))
            took = time.perf_counter() - t0
        finally:
            os.close(fd)
        stats = emu.stats()
    finally:
        emu.stop()
    assert b"".join(out) == data
    assert len(data) <= stats["read_bytes"] <= len(data) + 2 * 128 * 1024, stats
    assert stats["max_request_bytes"] <= 128 * 1024
    assert stats["max_in_flight"] >= 2
    assert took < stats["reads"] * 0.005  # not one request after the other


def test_hints_that_wait_for_the_storage_hand_the_rest_to_the_read_pool(blob, monkeypatch):
    """A file system that reads a hinted range before returning (each hint takes the latency):
    after a few such hints the pool reads the rest, several requests at once."""
    path, data = blob
    size = 128 * 1024
    real = os.posix_fadvise
    hints = []

    def fadvise(fd, offset, n, advice):
        hints.append(offset)
        # far above half the reads' latency (3 ms, learned from the first read), also when a
        # busy machine stretches that read to tens of milliseconds
        time.sleep(0.1)
        return real(fd, offset, n, advice)

    monkeypatch.setattr(shard_readahead.os, "posix_fadvise", fadvise)
    monkeypatch.setattr(shard_readahead, "_learned", None)  # no latency left by an earlier test's reads
    f = LoggedFile(path, 0.003)
    out = list(read_ahead(f, _plan(len(data), 96 * 1024), request_bytes=size, fd=f.fd))
    assert b"".join(out) == data
    assert len(hints) == shard_readahead.SLOW_HINTS
    aligned = sorted(c for c in f.calls if c[0] % size == 0 and (c[1] == size or sum(c) == len(data)))
    assert f.max_in_flight >= 2 and aligned[-1] == (aligned[-1][0], len(data) - aligned[-1][0])
    assert [o for o, _ in aligned[-10:]] == [aligned[-1][0] - k * size for k in range(9, -1, -1)]
