"""Page-cache eviction and warming (readers/measure/cache.py) on a real FUSE mount and local disk.

The storage emulator (scripts/storage_emulator.py, a real FUSE mount with latency per open) counts
opens: evicting or warming N files opens each file exactly once. Expected sizes come from the
source folder; residency on local disk is checked against util-linux's ``fincore``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _fincore_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, by util-linux's ``fincore`` (independent of our mincore)."""
    exe = shutil.which("fincore")
    assert exe, "fincore (util-linux, essential on Debian) is missing"
    res = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)],
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr
    return int(res.stdout.split()[0])


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Twelve files of varied sizes in two folders (one empty file)."""
    root = tmp_path_factory.mktemp("evict") / "src"
    for i in range(12):
        p = root / f"c{i % 2}" / f"f{i:02d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(0 if i == 0 else 3000 * i + 7))
    return root


@pytest.fixture
def emulator(source):
    if not os.path.exists("/dev/fuse"):
        msg = "FUSE unavailable: /dev/fuse is absent, the storage emulator cannot mount"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: FUSE is required here)")
        pytest.skip(msg)
    sys.path.insert(0, str(SCRIPTS))
    try:
        from storage_emulator import StorageEmulator
    finally:
        sys.path.remove(str(SCRIPTS))
    with StorageEmulator(source, open_ms=5) as emu:
        yield emu


def _emulated_files(source: Path, emu) -> tuple[list[Path], int]:
    rel = sorted(p.relative_to(source) for p in source.rglob("*.bin"))
    return [Path(emu.mountpoint) / r for r in rel], sum((source / r).stat().st_size for r in rel)


@pytest.mark.fuse
@pytest.mark.multiprocess
def test_evict_opens_each_file_once_on_fuse(source, emulator):
    from shardfeed.readers.measure import evict_page_cache

    files, total = _emulated_files(source, emulator)
    emulator.reset_stats()
    rep = evict_page_cache(files)
    assert emulator.stats()["opens"] == len(files) == 12
    assert rep["files"] == 12 and rep["bytes"] == total and rep["failed_files"] == 0
    # residency means nothing on FUSE: not measured, and said so
    assert rep["ignored"] is None and rep["cached_bytes_before"] is None and rep["cached_bytes_after"] is None
    assert rep["unmeasurable_files"] == 12 and rep["unmeasurable_bytes"] == total
    assert [t.split(".")[0] for t in rep["unmeasurable_fs"]] == ["fuse"]
    assert "not measurable on this file system" in rep["message"]

    from shardfeed.readers.measure.tables import _cache_text

    text = _cache_text(rep)
    assert "evicted, not measurable on this file system (fuse" in text


@pytest.mark.fuse
@pytest.mark.multiprocess
def test_evict_through_a_symlink_to_the_mount(source, emulator, tmp_path):
    """A local path that is a symlink to a folder on the mount is still recognised as FUSE."""
    from shardfeed.readers.measure import evict_page_cache

    link = tmp_path / "data"
    link.symlink_to(Path(emulator.mountpoint) / "c1")
    files = sorted(link.iterdir())
    emulator.reset_stats()
    rep = evict_page_cache(files)
    assert emulator.stats()["opens"] == len(files) == 6
    assert rep["unmeasurable_files"] == 6 and rep["ignored"] is None
    assert rep["bytes"] == sum(f.stat().st_size for f in (source / "c1").iterdir())


@pytest.mark.fuse
@pytest.mark.multiprocess
def test_warm_reads_each_file_once_on_fuse(source, emulator):
    from shardfeed.readers.measure import warm_page_cache
    from shardfeed.readers.measure.tables import _warm_text

    files, total = _emulated_files(source, emulator)
    emulator.reset_stats()
    rep = warm_page_cache(files)
    assert emulator.stats()["opens"] == 12
    assert rep["read_bytes"] == rep["bytes"] == total
    assert rep["cached_bytes_after"] is None and "not measurable" in rep["residency"]
    text = _warm_text(rep)
    assert "not measurable on this file system" in text and "of it cached" not in text


def test_evict_many_files_on_disk_reports_before_and_after(source):
    """Local disk: the 'before' figure matches fincore's, taken just before; the eviction is checked."""
    from shardfeed.readers.measure import evict_page_cache

    files = sorted(source.rglob("*.bin"))
    for f in files[::2]:  # half of the files read into the cache, half evicted first
        f.read_bytes()
    evict_page_cache(files[1::2])
    expected_before = sum(_fincore_bytes(f) for f in files)
    rep = evict_page_cache(files)
    assert rep["files"] == 12 and rep["bytes"] == sum(f.stat().st_size for f in files)
    assert rep["unmeasurable_files"] == 0 and rep["check"] == "mincore"
    assert rep["ignored"] in (True, False)
    # pages may come and go between the two measurements (other helpers share the machine): within 4 pages
    assert abs(rep["cached_bytes_before"] - expected_before) <= 4 * 4096
    if rep["ignored"] is False:
        assert sum(_fincore_bytes(f) for f in files) <= 0.05 * rep["bytes"] + 4096


def test_fs_type_of_uses_the_longest_mount_point():
    from shardfeed.readers.measure.cache import _fs_type_of, _read_mounts, _residency_measurable

    mounts = [("/", "ext4"), ("/mnt/data", "nfs4"), ("/mnt/data/fast", "fuse.sshfs"), ("/mnt/dat a", "tmpfs")]
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    assert _fs_type_of(Path("/mnt/data/x.jpg"), mounts) == "nfs4"
    assert _fs_type_of(Path("/mnt/data/fast/x.jpg"), mounts) == "fuse.sshfs"
    assert _fs_type_of(Path("/mnt/datab/x.jpg"), mounts) == "ext4"
    assert _fs_type_of(Path("/mnt/dat a/x"), mounts) == "tmpfs"
    assert [_residency_measurable(t) for t in ("ext4", "tmpfs", "nfs4", "fuse.sshfs", "fuse", None)] == \
        [True, True, False, False, False, True]
    if Path("/proc/self/mountinfo").exists():  # the real table: /proc is procfs
        assert _fs_type_of(Path("/proc/self/status"), _read_mounts()) == "proc"
