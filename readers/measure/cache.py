"""The page cache: which files a dataset has, how much of them is cached, evicting them.

``cold=True`` runs evict the dataset's files from the page cache first with
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` and check with ``mincore(2)`` (or the
``fincore`` tool) whether the file system honoured it: tmpfs (``/dev/shm``) keeps the pages, and
the report says so. Pages mapped by a running process are not evicted either. ZFS's ARC ignores
the advice without ``mincore`` noticing. Each file is opened once (residency before and after on
the same descriptor) on up to 32 threads, so a mount with latency per open (NFS, FUSE) pays
about files x latency / 32. On FUSE and network file systems (by ``/proc/self/mountinfo``) the
local page cache says nothing about a cold read's cost (FUSE drops pages on open; the server
has its own cache): the advice is given and the report says residency is not measurable there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import mmap
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from ..format.manifest import LMDB_DATA_NAME, MANIFEST_NAME
from ..storage.local_manifest import load_manifest
from .report import fmt_bytes
from .probes import meminfo

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


def dataset_files(source: str | os.PathLike, *, follow_external_links: bool = False) -> list[Path]:
    """Every regular file of a local dataset (a folder, a packed dataset or its manifest); [] for URLs.

    Hidden files and folders are skipped for image folders (they are not samples). Symbolic links
    of a folder are followed by the readers' link rule (:mod:`~shardfeed.readers.format.folder_walk`):
    inside it, and outside it only with ``follow_external_links``.
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
            from ..format.imagefolder import scan_image_folder

            scanned = scan_image_folder(p, follow_external_links=follow_external_links).files
            return [Path(os.path.realpath(scanned.path_of(i))) for i in range(len(scanned))]
        except ValueError:
            pass  # not an ImageFolder: every file below it
    from ..format.folder_walk import LinkRule

    rule = LinkRule(p, follow_external_links)
    files: list[Path] = []
    seen: set[str] = set()
    for root, dirs, names in os.walk(p, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (
            os.path.islink(os.path.join(root, d)) and rule.outside(os.path.join(root, d))))
        for name in sorted(names):
            if name.startswith("."):
                continue
            f = Path(root) / name
            if f.is_symlink() and rule.outside(str(f)):
                continue
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

#: Threads that open, check and advise files at once: opens and syscalls release the GIL, so on a
#: mount with latency per open (NFS, FUSE) the round trips overlap instead of adding up.
_MAX_THREADS = 32

#: File systems where the local page cache does not say what a cold read costs, by
#: ``/proc/self/mountinfo`` type (``fuse.*`` included): FUSE drops a file's cached pages on every
#: open unless the daemon keeps them, and a network file system's server has its own cache that
#: no client call can see or evict.
_UNMEASURABLE_FS = frozenset({"fuse", "fuseblk", "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs",
                              "lustre", "gpfs", "beegfs", "afs", "coda", "virtiofs", "davfs", "sshfs", "ncpfs"})


def _unescape_mount(text: str) -> str:
    """A mount point as ``/proc/self/mountinfo`` writes it (octal escapes ``\\040`` for space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _read_mounts() -> list[tuple[str, str]]:
    """``[(mount_point, fs_type)]`` of this process, longest mount point first; [] off Linux."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after_sep = line.split(" - ", 1)[1].split()
        if after_sep:
            mounts.append((_unescape_mount(fields[4]), after_sep[0]))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return mounts


def _fs_type_of(path: Path, mounts: list[tuple[str, str]]) -> str | None:
    """The type of the file system holding ``path`` (the longest mount point above it); None if unknown.

    ``path`` is taken as written (symlinks are not followed: see :func:`_fs_types`).
    """
    text = os.path.abspath(path)
    for point, fstype in mounts:
        if text == point or text.startswith(point.rstrip("/") + "/") or point == "/":
            return fstype
    return None


def _fs_types(paths: Sequence[Path], mounts: list[tuple[str, str]]) -> list[str | None]:
    """:func:`_fs_type_of` for each path, with symlinks in its folder resolved (once per folder)."""
    by_dir: dict[str, str | None] = {}
    out = []
    for p in paths:
        parent = os.path.dirname(os.path.abspath(p))
        if parent not in by_dir:
            by_dir[parent] = _fs_type_of(Path(os.path.realpath(parent)) / "x", mounts)
        out.append(by_dir[parent])
    return out


def _residency_measurable(fstype: str | None) -> bool:
    if fstype is None:
        return True
    return fstype.split(".", 1)[0] not in _UNMEASURABLE_FS


def _cached_bytes_fd(libc, fd: int, size: int, path: Path) -> int:
    """Bytes of the open file ``fd`` (``size`` bytes) in the page cache, by ``mincore(2)``."""
    import numpy as np

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


def _map_files(fn, items: Sequence) -> list:
    """``[fn(x) for x in items]`` on up to :data:`_MAX_THREADS` threads (in order)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(_MAX_THREADS, len(items)), thread_name_prefix="shardfeed-cache") as ex:
        return list(ex.map(fn, items))


def _unmeasurable_text(fs_types: dict[str, int]) -> str:
    names = ", ".join(sorted(fs_types))
    return (f"page-cache residency is not measurable on this file system ({names}): FUSE drops cached pages on "
            "open and a network file system's server keeps its own cache that no client can see or evict")


def page_cache_residency(paths: Sequence[str | os.PathLike]) -> tuple[int | None, int, str | None]:
    """How many bytes of ``paths`` are in the page cache.

    Uses ``mincore(2)`` on a read-only shared mapping of each file (through ``ctypes``; one open per
    file, on up to :data:`_MAX_THREADS` threads), else the ``fincore`` tool (util-linux). On FUSE and
    network file systems (NFS, SMB, Ceph, ... by ``/proc/self/mountinfo``) residency says nothing
    about what a cold read costs, and is not measured.

    Returns:
        ``(cached_bytes, total_bytes, method)``; ``cached_bytes`` and ``method`` are None when
        neither way works on this system or when some of the files lie on a FUSE or network file
        system.
    """
    paths = [Path(p) for p in paths]
    measurable_of = dict(zip(paths, (_residency_measurable(t) for t in _fs_types(paths, _read_mounts()))))
    libc = _libc()

    def one(p: Path) -> tuple[int, int | None, bool]:
        measurable = measurable_of[p]
        if not measurable or libc is None:
            try:
                return p.stat().st_size, None, measurable
            except OSError:
                return 0, None, measurable
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            return 0, 0, True  # gone: nothing of it is cached
        try:
            size = os.fstat(fd).st_size
            try:
                return size, _cached_bytes_fd(libc, fd, size, p), True
            except OSError as exc:
                logger.debug("mincore residency check failed (%s)", exc)
                return size, None, True
        finally:
            os.close(fd)

    results = _map_files(one, paths)
    total = sum(r[0] for r in results)
    if not all(r[2] for r in results):
        return None, total, None
    if all(r[1] is not None for r in results):
        return sum(r[1] for r in results), total, "mincore"
    try:
        return _cached_bytes_fincore(paths), total, "fincore"
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        logger.debug("fincore residency check failed: %s", exc)
        return None, total, None


#: Files modified this recently (s) may still have dirty pages: they are written back before eviction.
_DIRTY_WINDOW_S = 120.0


def _evict_one(p: Path, libc, measure: bool, now: float) -> tuple[int, int | None, int | None, bool]:
    """Open ``p`` once: residency, ``posix_fadvise(DONTNEED)``, residency again, on the same fd.

    Returns ``(size_bytes, cached_before, cached_after, failed)``; the cached figures are None
    when not measured (``measure`` False, no libc, or mmap/mincore refused on this file).
    """
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return 0, None, None, True
    try:
        size = os.fstat(fd).st_size
        before = after = None
        check = measure and libc is not None
        if check:
            try:
                before = _cached_bytes_fd(libc, fd, size, p)
            except OSError as exc:
                logger.debug("mincore residency check failed (%s)", exc)
                check = False
        try:
            if now - os.fstat(fd).st_mtime < _DIRTY_WINDOW_S:
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)  # DONTNEED drops clean pages only
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            return size, before, None, True
        if check:
            with contextlib.suppress(OSError):
                after = _cached_bytes_fd(libc, fd, size, p)
        return size, before, after, False
    finally:
        os.close(fd)


def evict_page_cache(paths: Sequence[str | os.PathLike], *, retries: int = 1) -> dict:
    """Drop ``paths`` from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) and check it.

    Each file is opened once: ``mincore(2)`` on a mapping of that descriptor measures what was
    cached before and after the advice; files are handled on up to :data:`_MAX_THREADS` threads so
    that per-open latency (NFS, FUSE) overlaps. Files modified in the last two minutes are written
    back first (``fdatasync``), since the advice only drops clean pages. When too much stayed
    cached the advice is repeated ``retries`` times, after a short pause (read-ahead still in flight
    from a previous run), on the files that kept pages. On FUSE and network file systems (by
    ``/proc/self/mountinfo``) the advice is given but residency is not measured: it says nothing
    there (FUSE drops pages on open; the server's cache is out of reach).

    Returns:
        ``{"files", "bytes", "cached_bytes_before", "cached_bytes_after", "check", "ignored",
        "failed_files", "attempts", "seconds", "unmeasurable_files", "unmeasurable_bytes",
        "unmeasurable_fs", "message"}``: the cached figures (bytes) cover the files whose residency
        was measured (None when none was); ``ignored`` is True when more than
        :data:`EVICTION_IGNORED_SHARE` of those bytes stayed cached (tmpfs, pages mapped by a
        running process, another process reading the same files), None when it could not be
        checked; ``unmeasurable_fs`` counts files per file-system type that could not be
        checked; ``message`` says what that means for the measurement.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in paths]
    mounts = _read_mounts()
    fs_types = _fs_types(paths, mounts)
    measure = [_residency_measurable(t) for t in fs_types]
    if not hasattr(os, "posix_fadvise"):
        before, total, method = page_cache_residency(paths)
        return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": before,
                "check": method, "ignored": True, "failed_files": 0, "attempts": 0,
                "seconds": time.perf_counter() - t0, "unmeasurable_files": 0, "unmeasurable_bytes": 0,
                "unmeasurable_fs": {},
                "message": "this platform has no posix_fadvise: the page cache was not evicted (a warm run)"}
    libc = _libc()
    now = time.time()
    results = _map_files(lambda i: _evict_one(paths[i], libc, measure[i], now), range(len(paths)))
    sizes = [r[0] for r in results]
    befores = [r[1] for r in results]
    afters = [r[2] for r in results]
    failed_at = {i for i, r in enumerate(results) if r[3]}
    total = sum(sizes)
    unmeasurable = [i for i in range(len(paths)) if not measure[i]]
    unmeasurable_fs: dict[str, int] = {}
    for i in unmeasurable:
        unmeasurable_fs[fs_types[i] or "?"] = unmeasurable_fs.get(fs_types[i] or "?", 0) + 1
    checked = [i for i in range(len(paths)) if measure[i] and i not in failed_at]
    method = "mincore" if libc is not None else None
    if checked and any(afters[i] is None for i in checked):  # no libc or mincore refused: fincore
        try:
            sub = [paths[i] for i in checked]
            before, after = None, _cached_bytes_fincore(sub)
            method = "fincore"
        except (OSError, ValueError, subprocess.CalledProcessError) as exc:
            logger.debug("fincore residency check failed: %s", exc)
            before = after = None
            method = None
    elif checked:
        before, after = sum(befores[i] for i in checked), sum(afters[i] for i in checked)
    else:
        before = after = None
        method = None
    checked_bytes = sum(sizes[i] for i in checked)
    attempts = 1
    ignored = None if after is None or checked_bytes == 0 else after / checked_bytes > EVICTION_IGNORED_SHARE
    while ignored and attempts <= retries:
        attempts += 1
        time.sleep(0.25)
        if method == "mincore":  # again on the files that kept pages, on the same terms
            again = [i for i in checked if afters[i]]
            for i, r in zip(again, _map_files(lambda i: _evict_one(paths[i], libc, True, now), again)):
                if r[3] or r[2] is None:
                    failed_at.add(i)
                else:
                    afters[i] = r[2]
            after = sum(afters[i] for i in checked)
        else:
            _map_files(lambda i: _evict_one(paths[i], libc, False, now), checked)
            after = page_cache_residency([paths[i] for i in checked])[0]
        ignored = None if after is None or checked_bytes == 0 else after / checked_bytes > EVICTION_IGNORED_SHARE
    failed = len(failed_at)
    messages = []
    if ignored:
        messages.append(f"the page cache kept {after / checked_bytes:.0%} of the dataset's {fmt_bytes(checked_bytes)} "
                        "after POSIX_FADV_DONTNEED (tmpfs such as /dev/shm ignores it; pages a running process has "
                        "mapped, or another process reading the same files, keep them too): this run reads partly "
                        "from RAM, not disk")
    if unmeasurable:
        what = "" if len(unmeasurable) == len(paths) else f"{len(unmeasurable)} of {len(paths)} files: "
        messages.append(f"{what}{_unmeasurable_text(unmeasurable_fs)}; the eviction was advised but is not "
                        "verified, and a server-side cache may still serve this run")
    elif checked and after is None:
        messages.append("could not check page-cache residency (no mincore, no fincore): eviction not verified")
    if failed:
        messages.append(f"{failed} file(s) could not be opened or advised")
    return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": after,
            "check": method, "ignored": ignored, "failed_files": failed, "attempts": attempts,
            "seconds": time.perf_counter() - t0, "unmeasurable_files": len(unmeasurable),
            "unmeasurable_bytes": sum(sizes[i] for i in unmeasurable), "unmeasurable_fs": unmeasurable_fs,
            "message": "; ".join(messages) or None}


def close_lmdb_envs(files: Sequence[str | os.PathLike]) -> int:
    """Close this process's LMDB environments on ``files`` (before evicting them).

    The LMDB reader keeps one memory-mapped environment per database and process; pages mapped
    by a live process cannot be evicted from the page cache, so after a run that read in this
    process (``num_workers=0``) a cold run would find the file still cached. An LMDB dataset
    object still alive in this process on these files cannot be used afterwards (open it again);
    :func:`bench_source` builds its own and drops it after the run. Returns how many were closed.
    """
    mod = sys.modules.get("shardfeed.readers.storage.lmdb_io")
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
        ``{"files", "bytes", "read_bytes", "cached_bytes_after", "seconds", "skipped",
        "unmeasurable_fs", "residency"}``: ``skipped`` says why nothing was read (too large for RAM,
        no files), else None; ``cached_bytes_after`` is None and ``residency`` says why when some
        files lie on a FUSE or network file system (``unmeasurable_fs``: files per type), where
        page-cache residency is not measurable. Files are read (one open each) on up to
        :data:`_MAX_THREADS` threads.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in paths]
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    out = {"files": len(paths), "bytes": total, "read_bytes": 0, "cached_bytes_after": None, "skipped": None,
           "unmeasurable_fs": {}, "residency": None}
    avail = meminfo().get("MemAvailable")
    if not paths:
        out["skipped"] = "no local files (a URL?)"
    elif avail is not None and total > WARM_MAX_SHARE_OF_AVAILABLE * avail:
        out["skipped"] = (f"the datasets ({fmt_bytes(total)}) do not fit comfortably in the available memory "
                          f"({fmt_bytes(avail)}): warm runs read partly from the disk")
    else:
        fs_type_of = dict(zip(paths, _fs_types(paths, _read_mounts())))
        libc = _libc()

        def one(p: Path) -> tuple[int, int | None, str | None]:
            fstype = fs_type_of[p]
            measurable = _residency_measurable(fstype)
            buf = bytearray(_READ_CHUNK_BYTES)
            read = 0
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                return 0, 0, None
            try:
                with open(fd, "rb", buffering=0, closefd=False) as f:
                    while n := f.readinto(buf):
                        read += n
                if not measurable:
                    return read, None, fstype or "?"
                if libc is None:
                    return read, None, None
                try:  # on the same descriptor: no second open
                    return read, _cached_bytes_fd(libc, fd, os.fstat(fd).st_size, p), None
                except OSError:
                    return read, None, None
            except OSError:
                return read, 0, None
            finally:
                os.close(fd)

        results = _map_files(one, paths)
        out["read_bytes"] = sum(r[0] for r in results)
        for r in results:
            if r[2] is not None:
                out["unmeasurable_fs"][r[2]] = out["unmeasurable_fs"].get(r[2], 0) + 1
        if out["unmeasurable_fs"]:
            out["residency"] = _unmeasurable_text(out["unmeasurable_fs"])
        elif all(r[1] is not None for r in results):
            out["cached_bytes_after"] = sum(r[1] for r in results)
        else:
            out["cached_bytes_after"] = page_cache_residency(paths)[0]
    out["seconds"] = time.perf_counter() - t0
    return out
