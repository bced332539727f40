"""A local shard cache for remote datasets: ``open_dataset(url, cache_dir=PATH, cache_limit=BYTES)``.

A remote WebDataset (``http(s)://``, ``s3://``) is read through
:class:`~shardfeed.readers.storage.cached_location.CachedLocation`: each shard
and each offset index is downloaded whole, once, into ``cache_dir``, and then read from the local
disk as a local dataset is (the same ``pread`` fast path). Every process of the machine that opens
the dataset with the same ``cache_dir`` (DataLoader workers, ranks, other jobs) shares the copies.

How a file gets into the cache (:meth:`ShardCache.open`):

* its cache name is a hash of the dataset's identity (:func:`dataset_identity`: the manifest's
  URL without credentials and the sha256 of the manifest) and the file's name: two datasets never
  share an entry, and no name from the manifest or the URL reaches the file system;
* the download runs under an exclusive ``flock`` on the file's lock file (``STEM.lock``): a second
  process that wants the same file waits on that lock (at most ``lock_timeout_s``), then finds the
  file there and downloads nothing;
* the bytes go to a temporary file (``STEM.PID.RANDOM.tmp``, its full size reserved first), are
  checked against the manifest (size, and sha256 where the manifest records one), and are renamed
  into place (``STEM.data``): a reader never sees a partial file;
* a verified file's modification time is set to :data:`VERIFIED_MTIME_NS`. Any write to the file
  changes it, so a file whose size differs from the manifest, or which was written since it was
  verified and no longer matches the manifest's sha256, is downloaded again.

Reading holds a shared ``flock`` on the data file for as long as it is open. Eviction, to keep
``cache_limit``, removes the least recently used files first (access times, set on use at most
every 10 s); it takes each file's exclusive lock without waiting and passes over a file that is
being read or downloaded. The space of a download is reserved under a cache-wide lock (``.shardfeed-cache.lock``)
before it starts, so concurrent downloads cannot overshoot the limit together. When the files being
read at once hold more than the limit, the cache grows past it (logged once) rather than stall.

Waits are bounded: a lock not granted within ``lock_timeout_s`` raises :class:`CacheLockTimeout`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ..errors import CorruptDataError, DataSourceError
from ..sizes import parse_size

__all__ = ["ShardCache", "CacheLockTimeout", "lock_file", "TooLongError", "copy_stream", "dataset_identity",
           "check_cache_limit", "VERIFIED_MTIME_NS", "DEFAULT_LOCK_TIMEOUT_S", "COPY_CHUNK_BYTES"]

log = logging.getLogger(__name__)

#: Bytes read from the remote per call while copying a file.
COPY_CHUNK_BYTES = 4 << 20
#: Seconds a process waits for a lock held by another (a download of the same file, an eviction).
DEFAULT_LOCK_TIMEOUT_S = 600.0
#: The modification time (ns since the epoch) of a file the cache verified; a write changes it.
VERIFIED_MTIME_NS = 1_000_000_000
#: A copy's access time is set when it is used and is older than this (ns): the order of least
#: recent use is kept to this precision, without a metadata write at every read.
TOUCH_AFTER_NS = 10_000_000_000
#: Entries a scan of the cache folder reads at most.
MAX_CACHE_ENTRIES = 1_000_000
#: Times :meth:`ShardCache.open` fetches a file that vanishes again before it could be opened.
MAX_OPEN_ATTEMPTS = 8

DATA_SUFFIX, LOCK_SUFFIX, TMP_SUFFIX = ".data", ".lock", ".tmp"
#: The cache-wide lock: held while space is reserved for a download (eviction included).
SPACE_LOCK_NAME = ".shardfeed-cache.lock"
_STEM = re.compile(r"^[0-9a-f]{40}$")
_TMP = re.compile(r"^([0-9a-f]{40})\.[0-9]+\.[0-9a-f]+\.tmp$")


class CacheLockTimeout(DataSourceError):
    """A cache lock was not granted within ``lock_timeout_s`` (another process held it)."""


class TooLongError(DataSourceError):
    """A remote file longer than its manifest entry (the copy stopped at the listed size)."""


# ---------------------------------------------------------------------------------------------
# the verified copy (shared with ``shardfeed stage``)

def copy_stream(location: Any, name: str, out: BinaryIO, *, start: int = 0, hasher: Any = None,
                num_bytes: int | None = None, progress: Callable[[int, int], None] | None = None) -> int:
    """Copy the file ``name`` of ``location`` from byte ``start`` into ``out`` (written at its position).

    The location's stream retries and resumes mid-file itself (one retry policy: HTTP and object
    stores); a server that ignores ``Range`` sends the file from byte 0 and the bytes before
    ``start`` are skipped. At most ``num_bytes - start`` bytes are written.

    Args:
        location: a :class:`~shardfeed.readers.storage.location.Location` (``open``, ``where``).
        name: the file, relative to the location.
        out: a writable binary file.
        start: the first byte to copy.
        hasher: updated with every byte written (``hashlib.sha256()``), or None.
        num_bytes: the file's size in the manifest (None: not checked).
        progress: ``progress(0, bytes)`` after each chunk.

    Returns:
        Bytes written.

    Raises:
        TooLongError: the source sends more than ``num_bytes`` (one byte more is read to prove it).
        DataSourceError, FileNotFoundError: the remote read failed (names the URL).
    """
    from ..format.tario import skip_stream

    written = 0
    limit = None if num_bytes is None else max(num_bytes - start, 0)
    stream, offset = location.open(name, start)
    with stream:
        if offset < start:
            skip_stream(stream, start - offset, source=location.where(name))
        while True:
            want = COPY_CHUNK_BYTES if limit is None else min(COPY_CHUNK_BYTES, limit - written + 1)
            chunk = stream.read(want)
            if not chunk:
                break
            if limit is not None and written + len(chunk) > limit:
                raise TooLongError(f"{location.where(name)}: the source sends more than the {num_bytes:,} bytes the "
                                   "manifest lists for it; stopped at that size and not copied (the source is "
                                   "damaged or is not this dataset: run `shardfeed check` on it)")
            out.write(chunk)
            if hasher is not None:
                hasher.update(chunk)
            written += len(chunk)
            if progress is not None:
                progress(0, len(chunk))
    return written


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while True:
        chunk = os.pread(fd, COPY_CHUNK_BYTES, offset)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)
        offset += len(chunk)


def dataset_identity(location: Any, manifest: Any) -> str:
    """The identity of a remote dataset: a sha256 (hex) of the manifest's URL (without credentials)
    and of the manifest itself, so that a dataset rewritten at the same URL is another dataset."""
    h = hashlib.sha256()
    h.update(location.where(location.manifest_name).encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(hashlib.sha256(manifest.dumps()).digest())
    return h.hexdigest()


def check_cache_limit(value: Any) -> int | None:
    """``cache_limit`` as bytes: an integer >= 1, a size string (``"50GB"``, ``"1GiB"``) or None.

    Raises:
        TypeError: not an integer or a string (a bool or a float). ValueError: < 1 byte, or a bad size.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_size(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cache_limit must be a number of bytes (int) or a size such as '50GB', got {value!r}")
    if value < 1:
        raise ValueError(f"cache_limit must be at least 1 byte, got {value}")
    return int(value)


# ---------------------------------------------------------------------------------------------
# locks

def _flock(fd: int, kind: int, timeout_s: float, what: Callable[[], str]) -> None:
    """``flock(fd, kind)``, waiting at most ``timeout_s`` seconds.

    Raises:
        CacheLockTimeout: not granted in time (the message from ``what()``).
    """
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        time.sleep(delay)
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise CacheLockTimeout(what())
        delay = min(delay * 2, 0.05)


def _same_file(fd: int, path: Path, st: os.stat_result | None = None) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (``st``: its ``fstat``, when known),
    not removed or replaced since."""
    try:
        cur = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    st = os.fstat(fd) if st is None else st
    return (cur.st_ino, cur.st_dev) == (st.st_ino, st.st_dev)


def _lock_file(path: Path, kind: int, timeout_s: float | None, what: Callable[[], str]) -> int | None:
    """Open (create) the lock file ``path`` and lock it; returns the descriptor (close it to unlock),
    or None when ``timeout_s`` is None (do not wait) and the lock is held elsewhere.

    A lock file removed or replaced while this process waited for it is opened again (eviction
    removes a lock file while it holds it).

    Raises:
        CacheLockTimeout: not granted within ``timeout_s``.
        OSError: the file cannot be created (a link in its place, permissions).
    """
    for _ in range(MAX_OPEN_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            if timeout_s is None:
                try:
                    fcntl.flock(fd, kind | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
            else:
                _flock(fd, kind, timeout_s, what)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)
    raise CacheLockTimeout(f"{path}: removed or replaced {MAX_OPEN_ATTEMPTS} times while this process locked it "
                           "(other processes evict and fetch it again at that pace): raise cache_limit")


#: The one bounded lock of a cache file (the shard cache's and the parsed-manifest cache's).
lock_file = _lock_file


def _allocate(fd: int, num_bytes: int, path: Path) -> None:
    """Give the file ``fd`` its full size, its blocks allocated where the file system can
    (``posix_fallocate``): a full disk is found before the download, not in its middle.

    Raises:
        OSError: no space left (ENOSPC, naming ``path`` and the fix).
    """
    try:
        os.posix_fallocate(fd, 0, num_bytes)
        return
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"{path.parent}: no room for a {num_bytes:,}-byte file of the shard cache; "
                                        "free some space, or set cache_limit below the free space") from None
    except AttributeError:  # no posix_fallocate (macOS)
        pass
    os.ftruncate(fd, num_bytes)


# ---------------------------------------------------------------------------------------------
# the cache

class ShardCache:
    """A folder of verified copies of remote files, shared by every process that uses it.

    Picklable (it holds the folder, the limit and counters; no open file).

    Args:
        directory: the cache folder (created, mode 0700 where it is new); a local disk.
        limit: bytes the cached files may take in all (None: no limit); the least recently used
            files are removed to stay within it.
        lock_timeout_s: seconds to wait for a lock another process holds (its download of the
            same file, an eviction) before :class:`CacheLockTimeout`.

    Attributes:
        fetched_files, fetched_bytes: files and bytes this process downloaded.

    Raises:
        NotADirectoryError: ``directory`` exists and is not a folder.
        ValueError: ``limit`` or ``lock_timeout_s`` is not positive.
    """

    def __init__(self, directory: str | os.PathLike, limit: int | str | None = None, *,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.directory = Path(directory)
        self.limit = check_cache_limit(limit)
        if not lock_timeout_s > 0:
            raise ValueError(f"lock_timeout_s must be > 0 seconds, got {lock_timeout_s!r}")
        self.lock_timeout_s = float(lock_timeout_s)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory}: exists and is not a folder; choose another cache_dir")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fetched_files = 0
        self.fetched_bytes = 0
        self._warned = False

    def __repr__(self) -> str:
        return f"ShardCache({str(self.directory)!r}, limit={self.limit})"

    @staticmethod
    def stem(dataset_id: str, name: str) -> str:
        """The cache name (40 hex digits) of file ``name`` of dataset ``dataset_id``."""
        h = hashlib.sha256(dataset_id.encode("ascii") + b"\0" + name.encode("utf-8", "surrogatepass"))
        return h.hexdigest()[:40]

    def path(self, dataset_id: str, name: str) -> Path:
        """Where the verified copy of ``name`` lives (whether or not it is there now)."""
        return self.directory / (self.stem(dataset_id, name) + DATA_SUFFIX)

    def usage(self) -> int:
        """Bytes the cached files (and the downloads in progress, at their full size) take now."""
        return sum(size for _, size, _, _ in self._scan())

    def open(self, dataset_id: str, name: str, *, num_bytes: int, sha256: str | None,
             fetch: Callable[[BinaryIO, Any], int], where: str) -> int:
        """A read-only descriptor of the verified copy of ``name``, downloaded first when the cache
        does not hold it intact. The descriptor holds a shared lock (the file is not evicted while
        it is open): close it when done.

        Args:
            dataset_id: :func:`dataset_identity` of the dataset.
            name: the file's name in the manifest (only hashed).
            num_bytes: its size in the manifest, bytes.
            sha256: its hash in the manifest (hex), or None.
            fetch: ``fetch(out, hasher) -> bytes written``: writes the remote file into ``out``.
            where: the file's URL without credentials (messages only).

        Raises:
            CorruptDataError: the downloaded bytes do not match the manifest.
            CacheLockTimeout: another process held the file's lock for ``lock_timeout_s``.
            DataSourceError, FileNotFoundError: the download failed.
            OSError: the cache folder cannot be written (disk full, permissions).
        """
        stem = self.stem(dataset_id, name)
        path = self.directory / (stem + DATA_SUFFIX)
        for _ in range(MAX_OPEN_ATTEMPTS):
            fd = self._open_valid(path, num_bytes, sha256, where, quiet=True)
            if fd is None:
                fd = self._fetch(stem, path, num_bytes, sha256, fetch, where)
            if fd is not None:
                return fd
        raise DataSourceError(f"{where}: its copy in the cache {self.directory} was removed {MAX_OPEN_ATTEMPTS} times "
                              "before it could be read (other processes evict it to make room): raise cache_limit")

    # ---- reading a copy
    def _open_valid(self, path: Path, num_bytes: int, sha256: str | None, where: str,
                    quiet: bool = False) -> int | None:
        """The copy at ``path`` opened and share-locked, or None when it is missing, was just
        replaced, or does not match the manifest (then it is fetched again; logged unless ``quiet``:
        the first look is quiet and the look under the download lock logs, so a damaged copy seen by
        several threads or processes is reported once, by the one that fetches it again)."""
        fd, link = _open_copy(path)
        if link:
            (log.debug if quiet else log.warning)("%s: a link, not a cached copy; replacing it", path)
        if fd is None:
            return None
        return fd if self.adopt(fd, path, num_bytes, sha256, where, quiet=quiet) else None

    def adopt(self, fd: int, path: Path, num_bytes: int, sha256: str | None, where: str, *,
              quiet: bool = False) -> bool:
        """Share-lock ``fd``, opened on the copy at ``path`` (:meth:`path`), and check it: still the
        file at ``path``, of the manifest's size, verified (else hashed again when the manifest has
        a sha256). True: ``fd`` holds its lock and the copy's use is recorded (LRU). False: ``fd``
        is closed (a copy replaced, removed or damaged; logged unless ``quiet``).

        Raises:
            CacheLockTimeout: an eviction held the file for ``lock_timeout_s``.
        """
        report = log.debug if quiet else log.warning
        try:
            _flock(fd, fcntl.LOCK_SH, self.lock_timeout_s,
                   lambda: f"{path}: locked by another process for over {self.lock_timeout_s:g} s while reading "
                           f"the cached copy of {where}; is the cache_dir on a file system without working locks?")
            st = os.fstat(fd)
            ok = _same_file(fd, path, st)
            if ok and (not stat.S_ISREG(st.st_mode) or st.st_size != num_bytes):
                report("%s: the cached copy of %s holds %d bytes, the manifest lists %d; fetching it again",
                       path, where, st.st_size, num_bytes)
                ok = False
            if ok and st.st_mtime_ns != VERIFIED_MTIME_NS and sha256 is not None and _sha256_fd(fd) != sha256:
                report("%s: the cached copy of %s does not match the manifest's sha256; fetching it again",
                       path, where)
                ok = False
            if not ok:
                os.close(fd)
                return False
            now = time.time_ns()
            if st.st_mtime_ns != VERIFIED_MTIME_NS or now - st.st_atime_ns > TOUCH_AFTER_NS:
                try:
                    os.utime(fd, ns=(now, VERIFIED_MTIME_NS))  # used now (LRU); verified
                except OSError:
                    pass  # another user's file: read, not touched
            return True
        except BaseException:
            os.close(fd)
            raise

    # ---- downloading a copy
    def _fetch(self, stem: str, path: Path, num_bytes: int, sha256: str | None,
               fetch: Callable[[BinaryIO, Any], int], where: str) -> int | None:
        """Download ``where`` into ``path`` under the file's exclusive lock (unless another process
        did meanwhile); returns the copy opened as :meth:`_open_valid` does."""
        lock = _lock_file(self.directory / (stem + LOCK_SUFFIX), fcntl.LOCK_EX, self.lock_timeout_s,
                          lambda: f"{self.directory}: waited {self.lock_timeout_s:g} s for another process's "
                                  f"download of {where} into the cache; it is still running (a slow remote) or "
                                  "stuck: retry, or use another cache_dir")
        try:
            fd = self._open_valid(path, num_bytes, sha256, where)
            if fd is not None:
                return fd  # fetched by another process while this one waited
            tmp, tmp_fd = self._reserve(stem, num_bytes)
            try:
                h = hashlib.sha256()
                with os.fdopen(tmp_fd, "r+b") as out:
                    written = fetch(out, h)
                    out.flush()
                    os.fsync(out.fileno())
                digest = h.hexdigest()
                if written != num_bytes or (sha256 is not None and digest != sha256):
                    raise CorruptDataError(
                        f"{where}: downloaded {written:,} bytes with sha256 {digest[:12]}..., but the manifest lists "
                        f"{num_bytes:,} bytes" + (f" and sha256 {sha256[:12]}..." if sha256 else "") +
                        "; the remote file changed since the manifest was written, or is damaged: run "
                        "`shardfeed check` on the dataset")
                os.utime(tmp, ns=(time.time_ns(), VERIFIED_MTIME_NS))
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self.fetched_files += 1
            self.fetched_bytes += written
            log.debug("%s: cached as %s (%d bytes)", where, path.name, written)
            return self._open_valid(path, num_bytes, sha256, where)
        finally:
            os.close(lock)

    def _reserve(self, stem: str, num_bytes: int) -> tuple[Path, int]:
        """Make room for ``num_bytes`` (evicting) and create the download's temporary file at that
        size, under the cache-wide lock: concurrent downloads see each other's reservations.
        Returns the file and its descriptor (open for writing)."""
        tmp = self.directory / f"{stem}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        space = _lock_file(self.directory / SPACE_LOCK_NAME, fcntl.LOCK_EX, self.lock_timeout_s,
                           lambda: f"{self.directory}: waited {self.lock_timeout_s:g} s for the cache's space lock "
                                   f"({SPACE_LOCK_NAME}); is the cache_dir on a file system without working locks?")
        try:
            entries = self._scan()  # (also removes what interrupted downloads left)
            if self.limit is not None:
                self._make_room(entries, num_bytes, keep=stem)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                _allocate(fd, num_bytes, tmp)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
        finally:
            os.close(space)
        return tmp, fd

    # ---- eviction
    def _scan(self) -> list[tuple[int, int, str, Path]]:
        """``(last use ns, bytes, stem, path)`` of every copy and download in the folder; temporary
        files left by a download that is no longer running are removed."""
        out = []
        with os.scandir(self.directory) as it:
            for n, entry in enumerate(it):
                if n >= MAX_CACHE_ENTRIES:
                    raise ValueError(f"{self.directory}: more than {MAX_CACHE_ENTRIES:,} entries; a cache_dir "
                                     "holds the cache only: choose an empty folder")
                name = entry.name
                stem = name[:-len(DATA_SUFFIX)] if name.endswith(DATA_SUFFIX) else None
                tmp = _TMP.match(name)
                if (stem is None or not _STEM.match(stem)) and tmp is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if tmp is not None:
                    if self._remove_stale(tmp.group(1), Path(entry.path)):
                        continue
                    out.append((0, st.st_size, tmp.group(1), Path(entry.path)))
                else:
                    out.append((st.st_atime_ns, st.st_size, stem, Path(entry.path)))
        return out

    def _remove_stale(self, stem: str, tmp: Path) -> bool:
        """Remove ``tmp`` when no process downloads ``stem`` (its lock is free); True when removed."""
        lock = _lock_file(self.directory / (stem + LOCK_SUFFIX), fcntl.LOCK_EX, None, lambda: "")
        if lock is None:
            return False
        try:
            tmp.unlink(missing_ok=True)
            return True
        finally:
            os.close(lock)

    def _make_room(self, entries: list[tuple[int, int, str, Path]], incoming: int, keep: str) -> None:
        """Evict least recently used copies of ``entries`` (:meth:`_scan`) until they and
        ``incoming`` bytes fit the limit."""
        assert self.limit is not None
        total = incoming + sum(size for _, size, _, _ in entries)
        for _, size, stem, path in sorted(e for e in entries if e[3].name.endswith(DATA_SUFFIX)):
            if total <= self.limit:
                break
            if stem != keep and self._evict(stem, path):
                total -= size
        if total > self.limit and not self._warned:
            self._warned = True
            log.warning("%s: the cache holds %d bytes, over its cache_limit of %d: the files being read now take "
                        "more than the limit (they are never evicted while read); raise cache_limit",
                        self.directory, total, self.limit)

    def _evict(self, stem: str, path: Path) -> bool:
        """Remove the copy ``path`` unless it is being read or downloaded; True when removed."""
        lock_path = self.directory / (stem + LOCK_SUFFIX)
        lock = _lock_file(lock_path, fcntl.LOCK_EX, None, lambda: "")
        if lock is None:
            return False  # being downloaded (or evicted by another process)
        try:
            fd, link = _open_copy(path)
            if fd is None:
                if link:
                    path.unlink(missing_ok=True)
                return True
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # being read
                path.unlink(missing_ok=True)  # still this file: replacing it needs the lock held here
            finally:
                os.close(fd)
            lock_path.unlink(missing_ok=True)  # a process waiting on it opens the new one (_lock_file)
            log.debug("%s: evicted (least recently used)", path.name)
            return True
        finally:
            os.close(lock)


def _open_copy(path: Path) -> tuple[int | None, bool]:
    """Open a cached copy for reading without following a link: ``(fd, False)``; ``(None, False)``
    when there is no such file; ``(None, True)`` when a symbolic link stands there (never a copy
    of ours: the caller replaces it). Other errors are raised."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), False
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return None, True
