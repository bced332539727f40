"""The next epoch's first samples read ahead while the current epoch's last ones decode.

``SpansAhead`` (readers/storage/shard_readahead.py) holds byte spans read in a background thread; the
WebDataset reader (readers/sources/webdataset_source.py) reads the next epoch's first shuffle buffer's
worth of samples with it on slow storage. The spans' bytes are compared with the file's own
bytes; the samples read through the storage emulator (FUSE, a fixed latency per request) with the
planted images' bytes and labels, and their order with the same loader's on the local folder
(where nothing is read ahead: reads there are fast).
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
from shardfeed.readers.storage.shard_readahead import AHEAD_READ_BYTES, HeldBytes, SpansAhead

from .watch_helpers import load_emulator, require_fuse


@pytest.fixture(autouse=True)
def _fresh_process_state():
    shard_readahead._learned = None  # what an earlier (slow) range taught this process
    yield
    shard_readahead._learned = None


@pytest.fixture
def blob(tmp_path) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, 1_500_000, dtype=np.uint8).tobytes()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    return path, data


def test_held_bytes_cut_any_range_across_blocks():
    data = bytes(range(256)) * 40
    base = 100
    cuts = [base, base + 7, base + 300, base + 301, base + 2000, len(data)]
    blocks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    held = HeldBytes(150, 9000, base, blocks)
    assert held.nbytes == len(data) - base
    for a, n in [(150, 1), (150, 200), (399, 3), (400, 1700), (2100, 6900), (8990, 100), (9000, 5)]:
        assert held.read_at(a, n) == data[a:min(a + n, 9000)], (a, n)
    with pytest.raises(ValueError):
        held.read_at(149, 10)


def test_local_spans_hold_the_files_bytes(blob):
    path, data = blob
    spans = [("a", str(path), 1000, 300_000), ("b", path, 300_000, 300_001), ("c", str(path), 900_000, len(data))]
    ahead = SpansAhead(lambda: spans)
    assert ahead.spans() == {"a": (1000, 300_000), "b": (300_000, 300_001), "c": (900_000, len(data))}
    for key, _, a, b in spans:
        held = ahead.take(key)
        assert held is not None and held.read_at(a, b - a) == data[a:b]
        # aligned requests: at most one request's alignment before the span, the rest of the last one after
        assert held.nbytes <= (b - a) + 2 * AHEAD_READ_BYTES
    assert ahead.take("a") is None  # taken: no longer held
    assert ahead.held_bytes() == 0


def test_spans_beyond_the_bound_are_not_read(blob):
    path, data = blob
    opened = []

    def plan():
        opened.append(True)
        return [(k, str(path), k * 400_000, (k + 1) * 400_000) for k in range(3)]

    ahead = SpansAhead(plan, max_bytes=900_000)
    assert sorted(ahead.spans()) == [0, 1]  # the third would cross 900,000 bytes
    assert ahead.take(2) is None
    assert ahead.take(1).read_at(400_000, 400_000) == data[400_000:800_000]
    assert ahead.held_bytes() <= 900_000 + 2 * AHEAD_READ_BYTES
    ahead.close()
    assert ahead.spans() == {} and ahead.held_bytes() == 0 and opened == [True]


class Stream:
    def __init__(self, data: bytes, offset: int, stop_after: int | None = None):
        self.buf = io.BytesIO(data)
        self.buf.seek(offset)
        self.left = stop_after
        self.closed = False

    def read(self, n: int) -> bytes:
        if self.left is not None:
            n = min(n, self.left)
            self.left -= n
        return self.buf.read(n)

    def close(self) -> None:
        self.closed = True


def test_remote_spans_read_through_one_stream_each(blob):
    _, data = blob
    streams = []

    def opener(a):
        def open_stream():
            streams.append(Stream(data, a))
            return streams[-1], a
        return open_stream

    spans = [("x", opener(10), 10, 1_200_000), ("y", opener(1_300_000), 1_300_000, 1_300_100)]
    ahead = SpansAhead(lambda: spans)
    assert ahead.take("x").read_at(10, 1_199_990) == data[10:1_200_000]
    assert ahead.take("y").read_at(1_300_050, 1000) == data[1_300_050:1_300_100]
    assert len(streams) == 2 and all(s.closed for s in streams)


def test_a_span_that_cannot_be_read_is_left_to_the_caller(tmp_path, blob):
    path, data = blob

    def failing():
        raise OSError("connection refused")

    spans = [("missing", str(tmp_path / "gone.tar"), 0, 1000),
             ("past the end", str(path), len(data) - 100, len(data) + 5000),
             ("open fails", failing, 0, 10),
             ("wrong offset", lambda: (Stream(data, 0), 0), 5, 50),  # a server that ignored the range
             ("short", lambda: (Stream(data, 0, stop_after=20), 0), 0, 50),
             ("fine", str(path), 0, 4096)]
    ahead = SpansAhead(lambda: spans)
    for key in ["missing", "past the end", "open fails", "wrong offset", "short"]:
        assert ahead.take(key) is None, key
    assert ahead.take("fine").read_at(0, 4096) == data[:4096]


def test_a_plan_that_raises_holds_nothing():
    def plan():
        raise OSError("the index is unreadable")

    assert SpansAhead(plan).spans() == {}


def test_another_process_sees_nothing_held(blob):
    path, data = blob
    ahead = SpansAhead(lambda: [("a", str(path), 0, 10)])
    ahead.spans()
    ahead.pid = -1  # what a forked child sees: not its own
    assert ahead.spans() == {} and ahead.take("a") is None and ahead.held_bytes() == 0


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """A packed dataset of 90 JPEGs in 3 classes, 20 per shard: ``(folder, {key: (bytes, label)})``."""
    from shardfeed.convert.write.pack import PackOptions, pack

    tmp = tmp_path_factory.mktemp("ahead")
    folder = tmp / "folder"
    rng = np.random.default_rng(5)
    files = {}
    for i in range(90):
        cls = f"c{i % 3}"
        (folder / cls).mkdir(parents=True, exist_ok=True)
        side = int(rng.integers(60, 160))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        (folder / cls / f"{i:03d}.jpg").write_bytes(buf.getvalue())
        files[(cls, f"{i:03d}")] = (buf.getvalue(), i % 3)  # classes sorted: c0, c1, c2 -> 0, 1, 2
    pack(folder, tmp / "wds", PackOptions(format="wds", max_count=20, overwrite=True))
    return tmp / "wds", files


def _planted_label(files: dict, data: bytes) -> int:
    """The label of the planted file whose bytes the sample holds (every planted image differs)."""
    hits = [label for raw, label in files.values() if raw == data]
    assert len(hits) == 1
    return hits[0]


def _epochs(source, files, epochs: int, **kw) -> list[list[str]]:
    """Each epoch's sample keys in delivery order, checking every sample's bytes and label."""
    from shardfeed.readers import make_loader

    loader = make_loader(source, 6, decode=False, seed=4, shuffle=True, **kw)
    out = []
    for _ in range(epochs):
        keys = []
        for batch in loader:
            for s in batch:
                assert int(s.label) == _planted_label(files, bytes(s.data))
                keys.append(s.key)
        out.append(keys)
    assert all(sorted(k) == sorted(out[0]) for k in out) and len(out[0]) == len(files)
    return out


class Spy:
    """Counts the spans the reader took from memory, and their bytes (as planned)."""

    def __init__(self, monkeypatch):
        self.taken, self.planned = [], []
        self.lock = threading.Lock()
        take, run = SpansAhead.take, SpansAhead._run
        spy = self

        def counted_take(ahead, key):
            held = take(ahead, key)
            with spy.lock:
                spy.taken.append((key, None if held is None else held.nbytes))
            return held

        def counted_run(ahead, plan):
            def recorded():
                spans = list(plan())
                with spy.lock:
                    spy.planned.append([(key, b - a) for key, _, a, b in spans])
                return spans
            return run(ahead, recorded)

        monkeypatch.setattr(SpansAhead, "take", counted_take)
        monkeypatch.setattr(SpansAhead, "_run", counted_run)

    def wait_planned(self, count: int, timeout_s: float = 30.0) -> list:
        """The plans, once ``count`` were made (the last epoch's read ahead is planned on its own
        thread, which may not have run when the epoch's last batch arrives) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while len(self.planned) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.planned


def _epochs_at_2ms(wds, files, epochs: int, **kw) -> list:
    """:func:`_epochs` through the storage emulator at 2 ms per open and per read request."""
    emu = load_emulator().StorageEmulator(wds, open_ms=2.0, read_ms=2.0).start()
    try:
        return _epochs(emu.mountpoint, files, epochs, **kw)
    finally:
        emu.stop()


@pytest.mark.fuse
def test_next_epochs_on_slow_storage_are_the_planted_samples_in_order(planted, monkeypatch):
    require_fuse()
    wds, files = planted
    spy = Spy(monkeypatch)
    local = _epochs(wds, files, 3, num_workers=0, shuffle_buffer=50)
    assert spy.taken == [] and spy.planned == []  # fast local reads: nothing read ahead
    slow = _epochs_at_2ms(wds, files, 3, num_workers=0, shuffle_buffer=50)
    assert slow == local
    assert local[0] != local[1]  # the epochs differ: the next epoch's order was not the last one's
    # epochs 1 and 2 began on bytes read ahead: the first 50 samples (the buffer) in whole-sample spans
    used = [key for key, nbytes in spy.taken if nbytes]
    assert len(used) >= 2 * 3
    assert all(sum(k[2] - k[1] for k, _ in spans) == 50 for spans in spy.planned)


@pytest.mark.fuse
def test_a_dataset_iterated_outside_a_loader_reads_nothing_ahead(planted, monkeypatch):
    require_fuse()
    from shardfeed.readers import open_dataset

    wds, files = planted
    spy = Spy(monkeypatch)
    emu = load_emulator().StorageEmulator(wds, open_ms=2.0, read_ms=2.0).start()
    try:
        ds = open_dataset(emu.mountpoint, decode=False, shuffle=True, seed=4)
        for _ in range(2):  # no loader: a next epoch is not known to follow (a tool reads once)
            assert sorted(_planted_label(files, bytes(s.data)) for s in ds) == sorted(y for _, y in files.values())
    finally:
        emu.stop()
    assert spy.planned == [] and spy.taken == []


@pytest.mark.network
def test_remote_next_epochs_are_read_ahead_in_order(packed_wds, tiny_folder_expected, nginx_server, monkeypatch):
    local = _epochs(packed_wds, tiny_folder_expected, 3, num_workers=0, shuffle_buffer=8)
    spy = Spy(monkeypatch)
    remote = _epochs(f"{nginx_server}/wds/", tiny_folder_expected, 3, num_workers=0, shuffle_buffer=8)
    assert remote == local
    assert len(spy.wait_planned(3)) == 3 and all(sum(k[2] - k[1] for k, _ in spans) == 8 for spans in spy.planned)
    assert len([n for _, n in spy.taken if n]) >= 2  # epochs 1 and 2 began on ranges received ahead


@pytest.mark.fuse
def test_the_bytes_read_ahead_are_bounded(planted, monkeypatch):
    require_fuse()
    from shardfeed.readers.sources import webdataset_source

    wds, files = planted
    local = _epochs(wds, files, 3, num_workers=0, shuffle_buffer=50)
    sizes = sorted(os.path.getsize(p) for p in wds.glob("*.tar"))
    bound = sizes[0] // 3  # about 6 samples: the first span is cut, the rest read as usual
    monkeypatch.setattr(webdataset_source, "EPOCH_AHEAD_BYTES", bound)
    spy = Spy(monkeypatch)
    slow = _epochs_at_2ms(wds, files, 3, num_workers=0, shuffle_buffer=50)
    assert slow == local
    assert spy.planned and all(0 < sum(n for _, n in spans) <= bound for spans in spy.planned)
    assert all(len(spans) == 1 and spans[0][0][2] - spans[0][0][1] < 20 for spans in spy.planned)
    assert [n for _, n in spy.taken if n] and all(n <= bound + 2 * AHEAD_READ_BYTES for _, n in spy.taken if n)


@pytest.mark.fuse
@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_persistent_workers_on_slow_storage_keep_the_order(planted):
    require_fuse()
    wds, files = planted
    local = _epochs(wds, files, 3, num_workers=2, shuffle_buffer=40)
    slow = _epochs_at_2ms(wds, files, 3, num_workers=2, shuffle_buffer=40)
    assert slow == local


@pytest.mark.fuse
def test_a_resumed_epoch_after_one_read_ahead_continues_exactly(planted, monkeypatch):
    require_fuse()
    from shardfeed.readers import make_loader

    wds, _ = planted
    spy = Spy(monkeypatch)
    emu = load_emulator().StorageEmulator(wds, open_ms=2.0, read_ms=2.0).start()
    try:
        kw = dict(decode=False, seed=4, shuffle=True, num_workers=0, shuffle_buffer=50)
        loader = make_loader(emu.mountpoint, 6, **kw)
        whole = [[s.key for s in batch] for _ in range(3) for batch in loader]  # epochs 0, 1, 2
        nb = len(whole) // 3
        assert [k for k, n in spy.taken if n]  # epochs 1 and 2 began on bytes read ahead
        loader = make_loader(emu.mountpoint, 6, **kw)
        for _ in loader:  # epoch 0
            pass
        state = None
        first = []
        for n, batch in enumerate(loader):  # epoch 1, on the bytes read ahead: stop after 4 batches
            first.append([s.key for s in batch])
            if n == 3:
                state = loader.state_dict()
                break
        resumed = make_loader(emu.mountpoint, 6, **kw)
        resumed.load_state_dict(state)
        rest = [[s.key for s in batch] for _ in range(2) for batch in resumed]  # the rest of epoch 1, epoch 2
    finally:
        emu.stop()
    assert first == whole[nb:nb + 4]
    assert rest == whole[nb + 4:]


class _Clock:
    """A stand-in for the ``time`` module of the reader: ``perf_counter`` is what the test sets."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("last_elapsed, fill_s, started_after", [
    (1.0, None, 80),     # the last read took 1 s: start with 2 s (20 samples at 10/s) still to come
    (None, 0.5, 90),     # none read ahead yet: this epoch's reads (0.5 s) are the estimate
    ("running", None, 9),  # the last read's duration unknown: start as soon as the rate is measured
    (0.001, None, 100),  # a read far shorter than any sample: at the end
])
def test_the_next_epoch_is_read_just_in_time(monkeypatch, last_elapsed, fill_s, started_after):
    from types import SimpleNamespace

    from shardfeed.readers.sources import webdataset_source

    clock = _Clock()
    monkeypatch.setattr(webdataset_source, "time", clock)
    started = []
    src = SimpleNamespace(batch_size=8, _start_ahead=lambda epoch, a, b: started.append((epoch, a, b, emitted[0])))
    if last_elapsed is None:
        src._last_ahead = None
    else:
        src._last_ahead = SimpleNamespace(elapsed=None if last_elapsed == "running" else last_elapsed)
    src._next_read_s = lambda reads: webdataset_source.WebDatasetSource._next_read_s(src, reads)
    reads = SimpleNamespace(count=100, started_at=-(fill_s or 0.0), ended_at=0.0)  # all 100 read
    emitted = [0]

    def items():
        for i in range(100):  # 10 samples a second
            clock.now += 0.1
            yield i

    out = []
    for item in webdataset_source.WebDatasetSource._then_read_ahead(src, items(), reads, 3, 10, 110):
        out.append(item)
        emitted[0] += 1
    assert out == list(range(100))
    assert len(started) == 1 and started[0][:3] == (4, 10, 110)
    assert abs(started[0][3] - started_after) <= 1
