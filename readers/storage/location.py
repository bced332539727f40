"""One interface for every place a dataset is stored, and the table that picks its class by URL scheme.

A *location* is a folder of dataset files (a packed dataset, or an image folder) seen through one
interface, :class:`Location`, whatever stores it:

==================  ===============================================  ==================================
scheme              class                                            capabilities
==================  ===============================================  ==================================
local path, file    :class:`LocalLocation`                           listable, writable
``http``/``https``  :class:`~shardfeed.readers.storage.http_io.HttpLocation`  remote (read only, cannot list)
``s3``              :class:`~shardfeed.readers.storage.objstore.StoreLocation`  remote, listable, writable
==================  ===============================================  ==================================

:func:`~shardfeed.readers.storage.opener.open_location` looks the scheme up in one table; a new storage
is added with :func:`~shardfeed.readers.storage.opener.register_location` (and removed with
:func:`~shardfeed.readers.storage.opener.unregister_location`), after
which ``open_dataset``, ``make_loader``, ``pack``, ``convert``, ``check``, ``stage`` and ``inspect``
accept its URLs (docs/architecture.md, "How to add a storage backend").

Tools never ask which scheme a location has: they ask its capabilities (``remote``,
``listable``, ``writable``) and call its methods. Whether a location without a manifest holds an
image folder is decided once, by :func:`folder_kind`.
"""

from __future__ import annotations

import errno
import functools
import numbers
import os
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from ..errors import UnsupportedURLError
from ..format.manifest import LMDB_DATA_NAME, MANIFEST_NAME, PACK_STATE_DIR, Manifest
from .local_manifest import find_manifest_path, load_manifest
from ..format.offset_index import read_index
from .shard_readahead import open_ahead, read_shard_ahead, take_opened
from ..format.tario_indexed import iter_indexed_samples

__all__ = ["Location", "LocationBase", "LocalLocation", "folder_kind", "check_byte_range", "check_shard_size",
           "missing_file_error", "MAX_LOCAL_LIST_ENTRIES"]

#: Entries one listing of a local folder returns at most (the bound of an object store's listing).
MAX_LOCAL_LIST_ENTRIES = 20_000_000


def check_byte_range(where: str, start: int, end: int | None) -> None:
    """Refuse a byte range no storage can serve alike, before any request: every location's
    ``open(name, start, end)`` calls it, so a bad range is the same error on a local disk, over
    HTTP and in a bucket (rather than an empty stream on one, HTTP 416 or the whole file on others).

    Args:
        where: the file, for the message (no credentials).
        start: the first byte (an integer ≥ 0; NumPy integers too).
        end: one past the last byte (None: to the end of the file; else an integer ≥ ``start``).

    Raises:
        ValueError: a negative ``start``, or an ``end`` before ``start``.
        TypeError: a bound that is not an integer (a ``bool`` is refused).
    """
    for label, value in (("start", start), ("end", end)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"{where}: byte range {label} must be an integer, got {value!r}")
    if start < 0:
        raise ValueError(f"{where}: byte range start must be at least 0, got {start}")
    if end is not None and end < start:
        raise ValueError(f"{where}: byte range end {end} is before its start {start}")


@runtime_checkable
class Location(Protocol):
    """What every storage offers a reader or a tool: a folder of files named relative to it.

    Capability attributes (class or instance attributes):

    * ``remote``: not a local file system (files are fetched, not mapped; LMDB is refused);
    * ``listable``: :meth:`list_objects` / :meth:`list_sizes` work (HTTP: no);
    * ``writable``: :meth:`put_bytes`, :meth:`put_file`, :meth:`delete` and :meth:`head` work
      (``pack`` and ``convert`` can write there).

    ``manifest_name`` is the manifest's file name (``manifest.json``, or the one a URL named).
    ``str(location)`` is its base (a path, or a URL ending in ``/``) without credentials.
    """

    remote: bool
    listable: bool
    writable: bool
    manifest_name: str

    def where(self, name: str) -> str:
        """The path or URL of ``name`` for messages (never credentials)."""

    def url(self, name: str) -> str:
        """The path or URL of ``name`` (a local location: its path)."""

    def read_bytes(self, name: str, *, max_bytes: int = ..., what: str = "the file") -> bytes:
        """The whole content of ``name`` (at most ``max_bytes`` bytes; more is an error).

        Raises:
            FileNotFoundError: no such file. DataSourceError: it cannot be read, or is too large.
        """

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        """A read-only stream of bytes ``[start, end)`` of ``name`` and the file offset of its first
        byte (lower than ``start`` when a server ignored the range: skip the difference)."""

    def head_size(self, name: str) -> int:
        """The size of ``name`` in bytes. Raises FileNotFoundError: no such file."""

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        """``[(name relative to the location, size in bytes, mtime in ns)]`` of every file under it
        (and ``sub``), in name order. Raises UnsupportedURLError where ``listable`` is False."""

    def list_sizes(self, sub: str = "") -> dict[str, int]:
        """``{name: size in bytes}`` of every file under the location (see :meth:`list_objects`)."""

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """The validated manifest; with ``check_files``, the listed files' sizes are compared."""

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name``, whole (a reader never sees part of it)."""

    def put_file(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        """Copy the local file ``path`` whole to ``name``, recording its ``sha256`` (hex) for :meth:`head`."""

    def delete(self, name: str) -> None:
        """Remove ``name`` (no error when it does not exist)."""

    def head(self, name: str) -> dict[str, str]:
        """The metadata recorded with ``name`` (``{"sha256": ...}`` after :meth:`put_file`).
        Raises FileNotFoundError: no such file."""


class LocationBase:
    """Defaults shared by the location classes: :meth:`list_sizes` from :meth:`list_objects`,
    and a clear refusal of what a location cannot do (``listable`` / ``writable`` False)."""

    remote = True
    listable = False
    writable = False
    manifest_name = MANIFEST_NAME

    def _cannot(self, what: str) -> UnsupportedURLError:
        return UnsupportedURLError(f"{self}: this location cannot {what} ({type(self).__name__} is "
                                   f"{'listable' if self.listable else 'not listable'}, "
                                   f"{'writable' if self.writable else 'read-only'})")

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        raise self._cannot("list its files (give a manifest, or a storage that lists)")

    def list_sizes(self, sub: str = "") -> dict[str, int]:
        """``{name relative to the location: size in bytes}`` (one :meth:`list_objects`)."""
        return {name: size for name, size, _ in self.list_objects(sub)}

    def put_bytes(self, name: str, data: bytes) -> None:
        raise self._cannot("be written to")

    def put_file(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        raise self._cannot("be written to")

    def delete(self, name: str) -> None:
        raise self._cannot("be written to")

    def head(self, name: str) -> dict[str, str]:
        raise self._cannot("record file metadata")


def check_shard_size(root: str | os.PathLike, name: str, size: int, num_bytes: int) -> None:
    """Refuse a local shard opened for reading whose size (``size``, from ``fstat`` of the open
    file) is not the manifest's ``num_bytes``.

    Raises:
        CorruptDataError: the sizes differ; the message names the file and the fix.
    """
    if size != num_bytes:
        from ..errors import CorruptDataError

        raise CorruptDataError(f"{Path(root) / name}: {size} bytes on disk but {num_bytes} in {MANIFEST_NAME}; the "
                               f"file was changed or truncated: run `shardfeed check {root}` and repack")


def missing_file_error(root: str | os.PathLike, entry, exc: FileNotFoundError):
    """The :class:`~shardfeed.readers.errors.DataSourceError` naming a local shard (manifest entry
    ``entry``) or its offset index that ``exc`` found missing as it was opened for reading; None
    when ``exc`` names neither."""
    from ..errors import DataSourceError

    root, gone = Path(root), None if exc.filename is None else os.fspath(exc.filename)
    if gone == os.fspath(root / entry.name):
        return DataSourceError(f"{root / entry.name}: listed in {MANIFEST_NAME} but missing; restore it, or run "
                               f"`shardfeed check {root}` and repack (to read the other shards meanwhile, open it "
                               "with on_error=\"skip\")")
    if entry.index and gone == os.fspath(root / entry.index):
        return DataSourceError(f"{root / entry.index}: offset index missing; rebuild it with `shardfeed index {root}`")
    return None


#: Seconds a dataset file's modification time may lie after the dataset was opened before it
#: counts as rewritten (file systems whose clock runs ahead of this machine's).
VERSION_CLOCK_SLACK_S = 2.0


class LocalLocation(LocationBase):
    """A dataset directory (or an image folder) on a local or mounted file system.

    Args:
        root: the folder, or its manifest file (then ``manifest_name`` is that file's name).
        readahead: let the WebDataset reader read shards ahead once reads prove slow
            (:mod:`~shardfeed.readers.storage.shard_readahead`).
    """

    remote = False
    listable = True
    writable = True

    def __init__(self, root: str | os.PathLike, readahead: bool = True):
        p = Path(root)
        mpath = find_manifest_path(p)
        if p.is_file() or (not p.exists() and p.suffix == ".json"):
            self.root, self.manifest_name = mpath.parent, mpath.name
        else:
            self.root, self.manifest_name = p, MANIFEST_NAME
        self.readahead = bool(readahead)
        self._lock = threading.Lock()
        #: ``{name: (size, mtime_ns)}`` of the files at their first open (None: no version recorded;
        #: :meth:`record_versions`), the manifest's ``(size, mtime_ns, inode)`` and the time of opening
        self._versions: dict[str, tuple[int, int]] | None = None
        self._manifest_version: tuple[int, int, int] | None = None
        self._opened_ns = 0

    def __str__(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"LocalLocation({str(self.root)!r})"

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def manifest_path(self) -> Path:
        """The manifest file's path."""
        return self.root / self.manifest_name

    def where(self, name: str) -> str:
        """The path of ``name`` (for messages)."""
        return str(self.root / name)

    url = where

    def file_path(self, name: str) -> str:
        """The local file that holds ``name`` (read ahead by path)."""
        return str(self.root / name)

    def read_bytes(self, name: str, *, max_bytes: int | None = None, what: str = "the file") -> bytes:
        """The whole content of ``name``; ``max_bytes``: refuse a larger file (None: no bound).

        Raises:
            FileNotFoundError: no such file.
            DataSourceError: larger than ``max_bytes``, or (with ``max_bytes``) not a regular file.
        """
        path = self.root / name
        if max_bytes is None:
            return path.read_bytes()
        from ..errors import DataSourceError
        from ..file_io import read_small_file

        return read_small_file(path, max_bytes=max_bytes, what=what, error=DataSourceError)

    def record_versions(self, names=()) -> None:
        """Record the dataset's version as it is opened: the manifest's size, modification time
        and inode, and the time of opening. No shard is looked at (opening costs one ``stat``
        whatever the number of shards). Every later open of a dataset file (in this process or a
        worker it is pickled to) is checked by :meth:`check_version`. ``names`` is accepted for
        callers that list the files; they are recorded as they are first opened."""
        try:
            st = os.stat(self.manifest_path)
            manifest = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            manifest = None
        self._versions = {}
        self._manifest_version = manifest
        self._opened_ns = time.time_ns()

    def check_version(self, name: str, st: os.stat_result) -> None:
        """A reader reads one version of a dataset: refuse file ``name``, opened with status
        ``st``, when the manifest changed since the dataset was opened (a rebuild replaces it),
        when the file was modified more than :data:`VERSION_CLOCK_SLACK_S` after the dataset was
        opened, or when its size or modification time differs from its first open in this process.

        Raises:
            DatasetChangedError: the dataset was replaced or rewritten since it was opened (names
                the file, and what changed).
        """
        versions = getattr(self, "_versions", None)
        if versions is None:
            return
        what = self._manifest_change()
        if what is None:
            was = versions.get(name)
            now = (st.st_size, st.st_mtime_ns)
            if was is None:
                versions[name] = now
                if st.st_mtime_ns > self._opened_ns + VERSION_CLOCK_SLACK_S * 1e9:
                    what = f"modified {(st.st_mtime_ns - self._opened_ns) / 1e9:.3f} s after the dataset was opened"
            elif was != now:
                what = (f"{was[0]:,} bytes then, {now[0]:,} now" if was[0] != now[0] else
                        f"same size, modified {(now[1] - was[1]) / 1e9:+.3f} s from then")
        if what is None:
            return
        from ..errors import DatasetChangedError

        raise DatasetChangedError(f"{self.root / name}: changed since the dataset was opened ({what}): the dataset "
                                  "was replaced while being read (a `shardfeed pack --overwrite` of this folder?); "
                                  "stopped so that no epoch mixes two versions: open it again once it is complete")

    def _manifest_change(self) -> str | None:
        """How the manifest differs from the one the dataset was opened with (None: the same)."""
        was = getattr(self, "_manifest_version", None)
        if was is None:
            return None
        try:
            st = os.stat(self.manifest_path)
        except OSError:
            return f"{self.manifest_name} removed"
        if (st.st_size, st.st_mtime_ns, st.st_ino) != was:
            return f"{self.manifest_name} replaced"
        return None

    def read_index(self, name: str) -> list[int]:
        """The offsets of the ``.sfidx`` file ``name`` (:func:`~shardfeed.readers.format.offset_index.read_index`),
        checked by :meth:`check_version` before and after the read."""
        if getattr(self, "_versions", None) is not None:
            self.check_version(name, os.stat(self.root / name))
        offsets = read_index(self.root / name)
        if getattr(self, "_versions", None) is not None:
            self.check_version(name, os.stat(self.root / name))
        return offsets

    def read_indexed(self, name: str, offsets, start: int, end: int, where: str, *, num_bytes: int | None = None):
        """Samples ``[start, end)`` of an indexed local shard by
        :func:`~shardfeed.readers.format.tario_indexed.iter_indexed_samples` (``__url__`` tagged); returns
        how many it yielded (it stops before anything unusual).

        Raises:
            FileNotFoundError: no such file.
            CorruptDataError: ``num_bytes`` given and the open file (one ``fstat``) has another size
                (:func:`check_shard_size`).
        """
        fd = take_opened(self.root / name) if self.readahead else None
        if fd is None:
            fd = os.open(self.root / name, os.O_RDONLY)
        pread = os.pread
        try:
            st = os.fstat(fd)
            self.check_version(name, st)
            if num_bytes is not None:
                check_shard_size(self.root, name, st.st_size, num_bytes)
            return (yield from iter_indexed_samples(lambda offset, n: pread(fd, n, offset), offsets, start, end,
                                                    st.st_size, source=where, tag_source=True,
                                                    chunk_reader=functools.partial(read_shard_ahead, fd=fd)
                                                    if self.readahead else None))
        finally:
            os.close(fd)

    def open_ahead(self, name: str, first_bytes: int, prepare=None) -> None:
        """Open shard ``name`` ahead (and read its first ``first_bytes``) once reads proved slow
        (:func:`~shardfeed.readers.storage.shard_readahead.open_ahead`); :meth:`read_indexed` takes it."""
        if self.readahead:
            open_ahead(self.root / name, prepare=prepare, first_bytes=first_bytes)

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        """The file ``name`` opened for reading at byte ``start`` (``end`` is not enforced: a local
        reader stops where it wants). Returns ``(file, start)``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: a bad range (:func:`check_byte_range`; TypeError for a non-integer bound).
            DatasetChangedError: the file changed since :meth:`record_versions` (:meth:`check_version`).
        """
        check_byte_range(self.where(name), start, end)
        f = os.fdopen(self._open_fd(name), "rb", buffering=0)
        try:
            f.seek(start)
        except BaseException:
            f.close()
            raise
        return f, start

    def _open_fd(self, name: str) -> int:
        """A read-only descriptor of ``name``, checked by :meth:`check_version` (close it)."""
        path = self.root / name
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):  # named as open() names it
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            self.check_version(name, st)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def head_size(self, name: str) -> int:
        """The size of ``name`` in bytes. Raises FileNotFoundError: no such file."""
        return (self.root / name).stat().st_size

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        """Every plain file under the folder (and ``sub``), links not followed, in name order:
        ``[(relative POSIX path, size in bytes, mtime in ns)]``; at most
        :data:`MAX_LOCAL_LIST_ENTRIES` entries.

        Raises:
            ValueError: more entries than the bound.
        """
        base = self.root / sub if sub else self.root
        out: list[tuple[str, int, int]] = []
        if not base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in filenames:
                full = os.path.join(dirpath, fn)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if not os.path.isfile(full) or os.path.islink(full):
                    continue
                out.append((os.path.relpath(full, self.root).replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
                if len(out) > MAX_LOCAL_LIST_ENTRIES:
                    raise ValueError(f"{base}: more than {MAX_LOCAL_LIST_ENTRIES:,} files; list a narrower folder")
        out.sort()
        return out

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """The validated manifest (:func:`~shardfeed.readers.storage.local_manifest.load_manifest`).

        Raises:
            FileNotFoundError, ManifestError, IncompleteDatasetError: as ``load_manifest``.
        """
        return load_manifest(self.manifest_path, check_files=check_files)

    # ---- writing (whole files: written beside under a temporary name, then renamed)
    def _target(self, name: str) -> Path:
        from ..format.manifest import stored_path_problem

        problem = stored_path_problem(name)
        if problem is not None:
            raise ValueError(f"{self.root}: {name!r}: {problem}; refusing to write it")
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` (a temporary file renamed into place)."""
        path = self._target(name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def put_file(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        """Copy the local file ``path`` to ``name``; ``sha256`` is kept in a ``.NAME.sha256`` file
        beside it (:meth:`head`)."""
        import shutil

        target = self._target(name)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
        meta = target.with_name(f".{target.name}.sha256")
        if sha256:
            meta.write_text(sha256)
        else:
            meta.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        """Remove ``name`` and its recorded metadata (no error when missing)."""
        path = self.root / name
        path.unlink(missing_ok=True)
        path.with_name(f".{path.name}.sha256").unlink(missing_ok=True)

    def head(self, name: str) -> dict[str, str]:
        """``{"sha256": ...}`` recorded by :meth:`put_file` (``{}`` when none).

        Raises:
            FileNotFoundError: no such file.
        """
        path = self.root / name
        path.stat()
        meta = path.with_name(f".{path.name}.sha256")
        if not meta.is_file():
            return {}
        from ..errors import DataSourceError
        from ..file_io import read_small_file

        digest = read_small_file(meta, max_bytes=1024, what="the recorded sha256", error=DataSourceError)
        return {"sha256": digest.decode("utf-8", "replace").strip()}


# ---------------------------------------------------------------------------------------------
# what a location without a manifest holds

def folder_kind(location) -> str:
    """What a location holds, decided from one listing: ``"packed"`` (a manifest, shards, an
    offset index, LMDB or a pack's work files at the top: a dataset, possibly unfinished),
    ``"folder"`` (``CLASS/IMAGE`` files: an image folder) or ``"empty"``; ``"unknown"`` for a
    location that cannot list (HTTP).

    The listing is kept on the location (``listing_cache``) for the image-folder scan that follows.

    Raises:
        DataSourceError: the listing failed.
    """
    if not getattr(location, "listable", False):
        return "unknown"
    listing = location.list_objects()
    location.listing_cache = listing
    top = [rel for rel, _, _ in listing if "/" not in rel]
    if any(rel == location.manifest_name or rel == LMDB_DATA_NAME or rel.endswith((".tar", ".idx", ".mdb"))
           for rel in top) or any(rel.startswith(PACK_STATE_DIR + "/") for rel, _, _ in listing):
        return "packed"
    return "folder" if any("/" in rel for rel, _, _ in listing) else "empty"
