"""The page cache: which files a dataset has, how much of them is cached, evicting them.

``cold=True`` runs evict the dataset's files from the page cache first with
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` and check with ``mincore(2)`` (or the
``fincore`` tool) whether the file system honoured it: tmpfs (``/dev/shm``), and some network
and FUSE file systems, keep the pages, and the report says so. Pages mapped by a running process
are not evicted either. ZFS's ARC ignores the advice without ``mincore`` noticing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from ..format import LMDB_DATA_NAME, MANIFEST_NAME, load_manifest
from .report import fmt_bytes
from .sampling import meminfo

__all__ = ["EVICTION_IGNORED_SHARE", "detect_source_format", "dataset_files", "page_cache_residency",
           "evict_page_cache", "close_lmdb_envs", "settle_disk",
           "warm_page_cache", "WARM_MAX_SHARE_OF_AVAILABLE"]

logger = logging.getLogger(__name__)

#: After eviction, a cached share of the dataset's bytes above this means the eviction did not take
#: (the main process's own LMDB mapping keeps ~1% of a small data.mdb, which is fine).
EVICTION_IGNORED_SHARE = 0.05

_PAGE_SIZE = mmap.PAGESIZE


def detect_source_format(source: str | os.PathLike) -> str:
    """``"folder"``, ``"webdataset"`` or ``"lmdb"`` for a local path (its manifest says which).

    A URL is taken as a packed dataset; its format is read by the reader (see :func:`bench_source`).

    Raises:
        FileNotFoundError: the path does not exist.
    """
    text = str(source)
    if "://" in text:
        return "webdataset"
    p = Path(text)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    mpath = p if p.is_file() else p / MANIFEST_NAME
    if mpath.is_file() and mpath.name == MANIFEST_NAME:
        return load_manifest(mpath, check_files=False).format
    if p.is_dir():
        return "folder"
    raise ValueError(f"{p}: not an image folder or a packed dataset (no {MANIFEST_NAME})")


def dataset_files(source: str | os.PathLike) -> list[Path]:
    """Every regular file of a local dataset (a folder, a packed dataset or its manifest); [] for URLs.

    Hidden files and folders are skipped for image folders (they are not samples).
    """
    text = str(source)
    if "://" in text:
        return []
    p = Path(text)
    if p.is_file():
        p = p.parent if p.name == MANIFEST_NAME else p
        if p.is_file():
            return [p]
    if p.is_dir() and not (p / MANIFEST_NAME).exists():
        try:  # an image folder: exactly its samples, through symlinked class folders too
            from ..imagefolder import scan_image_folder

            scanned = scan_image_folder(p).files
            return [Path(os.path.realpath(scanned.path_of(i))) for i in range(len(scanned))]
        except ValueError:
            pass  # not an ImageFolder: every file below it
    files: list[Path] = []
    seen: set[str] = set()
    for root, dirs, names in os.walk(p, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            f = Path(root) / name
            if f.is_file():
                files.append(f.resolve() if f.is_symlink() else f)
    return files


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        return libc
    except (OSError, AttributeError):
        return None


_MAP_FAILED = ctypes.c_void_p(-1).value
_MINCORE_CHUNK = 1 << 30  # bytes of file examined per mincore call


def _cached_bytes_mincore(libc, path: Path) -> int:
    import numpy as np

    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap failed: {os.strerror(err)}", str(path))
        try:
            resident = 0
            for start in range(0, size, _MINCORE_CHUNK):
                length = min(_MINCORE_CHUNK, size - start)
                pages = (length + _PAGE_SIZE - 1) // _PAGE_SIZE
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(ctypes.c_void_p(addr + start), length, vec) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mincore failed: {os.strerror(err)}", str(path))
                resident += int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))
            return min(resident * _PAGE_SIZE, size)
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def _cached_bytes_fincore(paths: Sequence[Path]) -> int:
    exe = shutil.which("fincore")
    if exe is None:
        raise OSError("fincore not found")
    total = 0
    for i in range(0, len(paths), 256):
        chunk = [str(p) for p in paths[i:i + 256]]
        out = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES", *chunk],
                             capture_output=True, text=True, check=True).stdout
        total += sum(int(x) for x in out.split())
    return total


def page_cache_residency(paths: Sequence[str | os.PathLike]) -> tuple[int | None, int, str | None]:
    """How many bytes of ``paths`` are in the page cache.

    Uses ``mincore(2)`` on a read-only shared mapping (through ``ctypes``), else the ``fincore``
    tool (util-linux).

    Returns:
        ``(cached_bytes, total_bytes, method)``; ``cached_bytes`` and ``method`` are None when
        neither way works on this system.
    """
    paths = [Path(p) for p in paths]
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    libc = _libc()
    if libc is not None:
        try:
            cached = 0
            for p in paths:
                try:
                    cached += _cached_bytes_mincore(libc, p)
                except FileNotFoundError:
                    continue
            return cached, total, "mincore"
        except OSError as exc:
            logger.debug("mincore residency check failed (%s); trying fincore", exc)
    try:
        return _cached_bytes_fincore(paths), total, "fincore"
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        logger.debug("fincore residency check failed: %s", exc)
        return None, total, None


#: Files modified this recently (s) may still have dirty pages: they are written back before eviction.
_DIRTY_WINDOW_S = 120.0


def _advise_dontneed(paths: Sequence[Path]) -> int:
    """``posix_fadvise(DONTNEED)`` on every file; returns how many could not be opened or advised."""
    failed = 0
    now = time.time()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            if now - os.fstat(fd).st_mtime < _DIRTY_WINDOW_S:
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)  # DONTNEED drops clean pages only
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return failed


def evict_page_cache(paths: Sequence[str | os.PathLike], *, retries: int = 1) -> dict:
    """Drop ``paths`` from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) and check it.

    Files modified in the last two minutes are written back first (``fdatasync``), since the
    advice only drops clean pages. Afterwards :func:`page_cache_residency` tells whether the file
    system honoured the advice; when too much stayed cached the advice is repeated ``retries``
    times after a short pause (read-ahead still in flight from a previous run).

    Returns:
        ``{"files", "bytes", "cached_bytes_before", "cached_bytes_after", "check", "ignored",
        "failed_files", "attempts", "seconds", "message"}``: ``ignored`` is True when more than
        :data:`EVICTION_IGNORED_SHARE` of the bytes stayed cached (tmpfs, some network/FUSE file
        systems, pages mapped by a running process, another process reading the same files),
        None when it could not be checked; ``message`` says what that means for the measurement.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in paths]
    before, total, method = page_cache_residency(paths)
    if not hasattr(os, "posix_fadvise"):
        return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": before,
                "check": method, "ignored": True, "failed_files": 0, "attempts": 0,
                "seconds": time.perf_counter() - t0,
                "message": "this platform has no posix_fadvise: the page cache was not evicted (a warm run)"}
    attempts = 0
    while True:
        attempts += 1
        failed = _advise_dontneed(paths)
        after, _, _ = page_cache_residency(paths)
        ignored = None if after is None or total == 0 else after / total > EVICTION_IGNORED_SHARE
        if not ignored or attempts > retries:
            break
        time.sleep(0.25)
    message = None
    if ignored:
        message = (f"the page cache kept {after / total:.0%} of the dataset's {fmt_bytes(total)} after "
                   "POSIX_FADV_DONTNEED (tmpfs such as /dev/shm and some network or FUSE file systems ignore it; "
                   "pages a running process has mapped, or another process reading the same files, keep them "
                   "too): this run reads partly from RAM, not disk")
    elif after is None:
        message = "could not check page-cache residency (no mincore, no fincore): eviction not verified"
    if failed:
        message = (message + "; " if message else "") + f"{failed} file(s) could not be opened or advised"
    return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": after,
            "check": method, "ignored": ignored, "failed_files": failed, "attempts": attempts,
            "seconds": time.perf_counter() - t0, "message": message}


def close_lmdb_envs(files: Sequence[str | os.PathLike]) -> int:
    """Close this process's LMDB environments on ``files`` (before evicting them).

    The LMDB reader keeps one memory-mapped environment per database and process; pages mapped
    by a live process cannot be evicted from the page cache, so after a run that read in this
    process (``num_workers=0``) a cold run would find the file still cached. An LMDB dataset
    object still alive in this process on these files cannot be used afterwards (open it again);
    :func:`bench_source` builds its own and drops it after the run. Returns how many were closed.
    """
    mod = sys.modules.get("shardfeed.readers.lmdb_io")
    if mod is None:  # no LMDB reader in this process: nothing is open
        return 0
    return mod.close_environments({Path(f).parent for f in files if Path(f).name == LMDB_DATA_NAME})


def settle_disk() -> dict:
    """Flush dirty pages to the storage devices (``os.sync()``) before measuring.

    Files just written (a dataset packed a moment ago) leave dirty pages that the kernel writes
    back some 30 s later (``vm.dirty_expire_centisecs``), in the middle of a measurement, taking
    disk bandwidth and CPU from whichever run is going then. ``sync`` does that work now.

    Returns:
        ``{"method", "seconds", "dirty_bytes_before", "dirty_bytes_after"}``: ``method`` is
        ``"os.sync"`` (None where the platform has no ``sync``); dirty bytes from
        ``/proc/meminfo`` (``Dirty`` + ``Writeback``; None off Linux).
    """
    t0 = time.perf_counter()
    before = _dirty_bytes()
    method = None
    if hasattr(os, "sync"):
        os.sync()
        method = "os.sync"
    return {"method": method, "seconds": time.perf_counter() - t0, "dirty_bytes_before": before,
            "dirty_bytes_after": _dirty_bytes()}


def _dirty_bytes() -> int | None:
    info = meminfo()
    if "Dirty" not in info:
        return None
    return info["Dirty"] + info.get("Writeback", 0)


#: ``warm_page_cache`` reads the files only when they take at most this share of the available memory.
WARM_MAX_SHARE_OF_AVAILABLE = 0.5
_READ_CHUNK_BYTES = 1 << 20


def warm_page_cache(paths: Sequence[str | os.PathLike]) -> dict:
    """Read ``paths`` once so that a warm run finds them in the page cache.

    A warm comparison is only fair when both datasets start in RAM: a dataset packed a moment
    ago is cached (just written) while an older folder may not be (or the reverse), and the
    first warm run of the side that is not cached reads it from the disk. The files are read
    (1 MiB at a time) only when they fit comfortably: at most
    :data:`WARM_MAX_SHARE_OF_AVAILABLE` of ``MemAvailable``.

    Returns:
        ``{"files", "bytes", "read_bytes", "cached_bytes_after", "seconds", "skipped"}``:
        ``skipped`` says why nothing was read (too large for RAM, no files), else None.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in paths]
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    out = {"files": len(paths), "bytes": total, "read_bytes": 0, "cached_bytes_after": None, "skipped": None}
    avail = meminfo().get("MemAvailable")
    if not paths:
        out["skipped"] = "no local files (a URL?)"
    elif avail is not None and total > WARM_MAX_SHARE_OF_AVAILABLE * avail:
        out["skipped"] = (f"the datasets ({fmt_bytes(total)}) do not fit comfortably in the available memory "
                          f"({fmt_bytes(avail)}): warm runs read partly from the disk")
    else:
        buf = bytearray(_READ_CHUNK_BYTES)
        for p in paths:
            try:
                with open(p, "rb", buffering=0) as f:
                    while n := f.readinto(buf):
                        out["read_bytes"] += n
            except OSError:
                continue
        out["cached_bytes_after"] = page_cache_residency(paths)[0]
    out["seconds"] = time.perf_counter() - t0
    return out
