"""scripts/storage_emulator.py: a real FUSE mount (no mock) that adds latency and counts operations.

Expectations are computed from the source folder itself (bytes, sizes, file counts); latency is
checked only as a lower bound (N opens take at least N x the configured latency), never against
an upper wall-clock bound.

Needs /dev/fuse (skipped with a reason naming FUSE where it is absent; under CI=true a missing
FUSE fails instead, as CI must exercise it) and fails where /dev/fuse exists but the mount does not
come up (missing mfusepy or libfuse: ``make system-deps`` and the dev extra install them).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fuse, pytest.mark.multiprocess]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "storage_emulator.py"


def _load_emulator():
    spec = importlib.util.spec_from_file_location("storage_emulator", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


emu_mod = _load_emulator()


def _require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        msg = "FUSE unavailable: /dev/fuse is absent, the storage emulator cannot mount"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: FUSE is required here)")
        pytest.skip(msg)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A small folder: a few sizes around the kernel's 128 KiB request size, nested folders."""
    root = tmp_path_factory.mktemp("emu") / "src"
    sizes = {"a/empty.bin": 0, "a/one.bin": 1, "a/small.bin": 5000, "b/exact.bin": 128 * 1024,
             "b/big.bin": 3 * 128 * 1024 + 777, "b/c/deep.bin": 40_000}
    for i, (rel, n) in enumerate(sorted(sizes.items())):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes((j * 7 + i) % 251 for j in range(n)))
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def emulator_factory():
    _require_fuse()
    started = []

    def start(src, **kw):
        emu = emu_mod.StorageEmulator(src, **kw).start()
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()


def test_bytes_through_the_mount_equal_the_source(source, emulator_factory):
    expected = _files(source)
    emu = emulator_factory(source)
    got = _files(emu.mountpoint)
    assert got == expected
    assert sorted(os.listdir(emu.mountpoint / "b")) == sorted(os.listdir(source / "b"))
    stats = emu.stats()
    # every file opened once and read whole: the served bytes are the files' sizes, nothing more
    assert stats["opens"] == len(expected)
    assert stats["read_bytes"] == sum(len(b) for b in expected.values())
    assert stats["max_request_bytes"] <= 1024 * 1024


def test_opens_pay_the_configured_latency_and_are_counted(source, emulator_factory):
    open_ms, n = 30.0, 8
    emu = emulator_factory(source, open_ms=open_ms)
    path = emu.mountpoint / "a" / "small.bin"
    os.stat(path)  # lookup outside the timed loop
    emu.reset_stats()
    t0 = time.perf_counter()
    for _ in range(n):
        fd = os.open(path, os.O_RDONLY)
        os.close(fd)
    elapsed_s = time.perf_counter() - t0
    stats = emu.stats()
    assert stats["opens"] == n
    assert stats["reads"] == 0
    assert elapsed_s >= n * open_ms / 1000  # a lower bound only
    assert stats["slept_s"] >= n * open_ms / 1000 - 1e-6


def test_every_read_request_pays_read_latency(source, emulator_factory):
    read_ms = 20.0
    emu = emulator_factory(source, read_ms=read_ms)
    data_expected = (source / "b" / "big.bin").read_bytes()
    emu.reset_stats()
    t0 = time.perf_counter()
    with open(emu.mountpoint / "b" / "big.bin", "rb", buffering=0) as f:
        data = f.read()
    elapsed_s = time.perf_counter() - t0
    stats = emu.stats()
    assert data == data_expected
    assert stats["read_bytes"] == len(data_expected)
    # the kernel asks in requests of at most max_request_bytes: at least this many requests
    assert stats["reads"] >= math.ceil(len(data_expected) / stats["max_request_bytes"])
    assert stats["latency_reads"] == stats["reads"]  # "request" policy: each one paid
    assert sum(stats["read_sizes"].values()) == stats["reads"]
    # requests may overlap (kernel readahead): the lower bound is one latency per request over
    # the requests in flight at most
    assert elapsed_s >= stats["reads"] * read_ms / 1000 / max(1, stats["max_in_flight"])
    assert stats["slept_s"] >= stats["reads"] * read_ms / 1000 - 1e-6


def test_stream_policy_charges_the_first_byte_only(source, emulator_factory):
    emu = emulator_factory(source, read_ms=5.0, read_policy="stream")
    emu.reset_stats()
    with open(emu.mountpoint / "b" / "big.bin", "rb", buffering=0) as f:
        # no kernel read-ahead: each read below is one request, in order (read-ahead requests
        # may arrive together and out of order, and those rightly pay again)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        while f.read(64 << 10):
            pass
    stats = emu.stats()
    assert stats["opens"] == 1
    assert stats["reads"] >= 2
    # sequential requests continue the stream: only the first pays
    assert stats["latency_reads"] == 1


def test_bandwidth_cap_is_a_lower_bound_on_time(source, emulator_factory):
    mb_s = 2.0
    emu = emulator_factory(source, bandwidth_mb_s=mb_s)
    size = (source / "b" / "big.bin").stat().st_size
    t0 = time.perf_counter()
    with open(emu.mountpoint / "b" / "big.bin", "rb") as f:
        assert len(f.read()) == size
    assert time.perf_counter() - t0 >= size / (mb_s * 1e6) * 0.999


def test_concurrent_requests_are_served_at_once(source, emulator_factory):
    """Two readers (as two loader workers) have opens in flight together: the mount is multi-threaded."""
    emu = emulator_factory(source, open_ms=300.0)
    for rel in ("a/small.bin", "b/exact.bin"):
        os.stat(emu.mountpoint / rel)
    emu.reset_stats()
    barrier = threading.Barrier(2)

    def reader(rel):
        barrier.wait()
        with open(emu.mountpoint / rel, "rb") as f:
            f.read()

    threads = [threading.Thread(target=reader, args=(rel,)) for rel in ("a/small.bin", "b/exact.bin")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = emu.stats()
    assert stats["opens"] == 2
    assert stats["max_in_flight"] == 2


def test_more_requests_in_flight_than_libfuse_default_threads(tmp_path, emulator_factory):
    """16 opens at once are all in flight together: the mount serves more than libfuse 3's
    default of 10 request threads (a network mount keeps many requests in flight)."""
    src = tmp_path / "many"
    for i in range(16):
        (src / f"c{i:02d}").mkdir(parents=True)
        (src / f"c{i:02d}" / "f.bin").write_bytes(bytes([i]) * 100)
    emu = emulator_factory(src, open_ms=400.0, max_threads=64)
    rels = [f"c{i:02d}/f.bin" for i in range(16)]
    for rel in rels:
        os.stat(emu.mountpoint / rel)
    emu.reset_stats()
    barrier = threading.Barrier(len(rels))
    got = {}

    def reader(rel):
        barrier.wait()
        with open(emu.mountpoint / rel, "rb") as f:
            got[rel] = f.read()

    threads = [threading.Thread(target=reader, args=(rel,)) for rel in rels]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {rel: bytes([i]) * 100 for i, rel in enumerate(rels)}
    stats = emu.stats()
    assert stats["opens"] == 16
    assert stats["max_in_flight"] > 10


def test_buffered_reads_in_flight_exceed_the_kernels_background_limit(tmp_path, emulator_factory):
    """24 buffered reads of separate parts of one file at once are all in flight together: the
    mount raises the kernel's limit on a FUSE connection's background (readahead) requests, 12 by
    default, as a network mount keeps many reads in flight."""
    src = tmp_path / "one"
    src.mkdir()
    part = 256 * 1024
    data = os.urandom(24 * part)
    (src / "f.bin").write_bytes(data)
    emu = emulator_factory(src, read_ms=300.0)
    assert emu.config.max_background == 64
    fd = os.open(emu.mountpoint / "f.bin", os.O_RDONLY)
    try:
        emu.reset_stats()
        barrier = threading.Barrier(24)
        got = {}

        def reader(k):
            barrier.wait()
            got[k] = os.pread(fd, 96 * 1024, k * part)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    assert got == {k: data[k * part:k * part + 96 * 1024] for k in range(24)}
    assert emu.stats()["max_in_flight"] > 12


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a mount's read_ahead_kb in /sys needs root")
def test_read_ahead_window_is_set_and_bounds_request_sizes(source, emulator_factory):
    emu = emulator_factory(source, read_ms=1.0, read_ahead_kb=512)
    assert emu.read_ahead_kb == 512
    expected = (source / "b" / "big.bin").read_bytes()
    emu.reset_stats()
    with open(emu.mountpoint / "b" / "big.bin", "rb") as f:
        assert f.read() == expected
    stats = emu.stats()
    assert stats["read_bytes"] == len(expected)
    assert stats["max_request_bytes"] <= 1024 * 1024


def test_mount_is_read_only(source, emulator_factory):
    emu = emulator_factory(source)
    with pytest.raises(OSError):
        with open(emu.mountpoint / "a" / "small.bin", "r+b") as f:
            f.write(b"x")
    with pytest.raises(OSError):
        (emu.mountpoint / "new.txt").write_bytes(b"x")
    assert (source / "a" / "small.bin").read_bytes() == _files(source)["a/small.bin"]
    assert not (source / "new.txt").exists()


def test_context_manager_unmounts_and_cleans_up(source):
    _require_fuse()
    with emu_mod.StorageEmulator(source, open_ms=1.0) as emu:
        mnt = emu.mountpoint
        assert emu_mod._is_mounted(str(mnt))
        assert "emulat" in emu.describe()
    assert not emu_mod._is_mounted(str(mnt))
    assert not mnt.exists()
    with pytest.raises(emu_mod.StorageEmulatorError):
        emu.stats()


def test_an_emulator_never_started_leaves_nothing_behind(source):
    emu = emu_mod.StorageEmulator(source, open_ms=1.0)
    assert emu.mountpoint is None
    emu.stop()  # nothing to undo
    with pytest.raises(emu_mod.StorageEmulatorError, match="not running"):
        emu.stats()


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        emu_mod.StorageEmulator(tmp_path / "missing")
    with pytest.raises(ValueError, match="latencies"):
        emu_mod.EmulatorConfig(open_ms=-1)
    with pytest.raises(ValueError, match="read_policy"):
        emu_mod.EmulatorConfig(read_policy="sometimes")
    with pytest.raises(ValueError, match="bandwidth"):
        emu_mod.EmulatorConfig(bandwidth_mb_s=0)
