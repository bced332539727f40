"""A remote dataset read through the local shard cache (``open_dataset(url, cache_dir=...)``):
:class:`CachedLocation`, the location the WebDataset reader reads a remote dataset's shards and
offset indexes through once :mod:`~shardfeed.readers.storage.shard_cache` holds verified copies of them.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any, BinaryIO

from ..errors import DataSourceError
from ..format.offset_index import decode_index
from .location import LocalLocation, LocationBase
from .shard_cache import ShardCache, copy_stream, dataset_identity
from .shard_readahead import open_ahead, read_shard_ahead, take_opened

__all__ = ["CachedLocation"]

log = logging.getLogger(__name__)


class CachedLocation(LocalLocation):
    """A remote dataset's location whose shards and offset indexes are read from a
    :class:`ShardCache` (downloaded there on first use).

    It is a :class:`~shardfeed.readers.storage.location.LocalLocation` to the readers (the copies are local
    files, read with the local fast path); messages name the remote URLs. Read-only: it cannot list
    or be written to. It reads ahead as a local dataset does once reads prove slow; the next shard
    of a reader's epoch is downloaded while it reads one (:meth:`open_ahead`).

    Args:
        remote: the dataset's remote :class:`~shardfeed.readers.storage.location.Location`.
        manifest: its validated manifest (the files, sizes and hashes the copies are checked against).
        cache: the :class:`ShardCache`.

    Raises:
        ValueError: a file of the manifest is larger than the cache's limit.
    """

    listable = False
    writable = False

    def __init__(self, remote: Any, manifest: Any, cache: ShardCache) -> None:
        self.remote_location = remote
        self.cache = cache
        self.root = cache.directory
        self.manifest_name = remote.manifest_name
        self._lock = threading.Lock()
        self._ahead: threading.Thread | None = None
        self._where: dict[str, str] = {}  # where(name), made once (redacting costs regular expressions)
        self._paths: dict[str, Any] = {}
        #: read ahead once reads prove slow, as a local dataset does (set by the WebDataset source)
        self.readahead = True
        self.dataset_id = dataset_identity(remote, manifest)
        files: dict[str, tuple[int, str | None]] = {}
        for s in manifest.shards:
            files[s.name] = (s.num_bytes, s.sha256)
            if s.index:
                files[s.index] = (8 * s.num_samples, s.index_sha256)  # 8 bytes per offset (format.encode_index)
        self._files = files
        if cache.limit is not None and files:
            name, (size, _) = max(files.items(), key=lambda item: item[1][0])
            if size > cache.limit:
                raise ValueError(f"{remote.where(name)}: {size:,} bytes, more than cache_limit ({cache.limit:,} "
                                 "bytes); raise cache_limit above the largest shard (times the shards read at once)")

    def file_path(self, name: str) -> str:
        """The cache file of ``name`` (read ahead by path while it is there: the next epoch's first
        samples, :class:`~shardfeed.readers.storage.shard_readahead.SpansAhead`, which serves its bytes only
        while the path still names the file it read)."""
        return str(self._path(name))

    def _path(self, name: str):
        """The cache file of ``name`` (:meth:`ShardCache.path`), made once."""
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = self.cache.path(self.dataset_id, name)
        return path

    def __str__(self) -> str:
        return str(self.remote_location)

    def __repr__(self) -> str:
        return f"CachedLocation({str(self.remote_location)!r}, cache={self.cache!r})"

    def where(self, name: str) -> str:
        """The remote URL of ``name`` (for messages; no credentials)."""
        shown = self._where.get(name)
        if shown is None:
            shown = self._where[name] = self.remote_location.where(name)
        return shown

    url = where

    def _open_fd(self, name: str) -> int:
        """A descriptor of the verified copy of ``name`` (holding its shared lock; close it): the
        one :meth:`open_ahead` opened when there is one and it is still good."""
        if name not in self._files:
            raise FileNotFoundError(f"{self.where(name)}: not a shard or index of the dataset's manifest; the "
                                    "cache holds only those")
        size, sha256 = self._files[name]
        if self.readahead:
            path = self._path(name)
            try:
                fd = take_opened(path)
            except OSError:
                fd = None
            if fd is not None and self.cache.adopt(fd, path, size, sha256, self.where(name), quiet=True):
                return fd
        return self.cache.open(self.dataset_id, name, num_bytes=size, sha256=sha256, where=self.where(name),
                               fetch=functools.partial(_fetch_into, self.remote_location, name, size))

    def read_bytes(self, name: str, *, max_bytes: int | None = None, what: str = "the file") -> bytes:
        """The whole content of ``name``: from the cache for a shard or index, else from the remote.

        Raises:
            DataSourceError: larger than ``max_bytes``, or the download failed.
        """
        if name not in self._files:
            return self.remote_location.read_bytes(name, **({} if max_bytes is None else {"max_bytes": max_bytes}),
                                                   what=what)
        size = self._files[name][0]
        if max_bytes is not None and size > max_bytes:
            raise DataSourceError(f"{self.where(name)}: {what} is {size:,} bytes, more than the {max_bytes:,} read "
                                  "whole at most")
        fd = self._open_fd(name)
        try:
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)

    def read_index(self, name: str) -> list[int]:
        """The offsets of the ``.sfidx`` file ``name`` (:func:`~shardfeed.readers.format.offset_index.decode_index`)."""
        return decode_index(self.read_bytes(name, what="the offset index"), self.where(name))

    def read_indexed(self, name: str, offsets, start: int, end: int, where: str, *, num_bytes: int | None = None):
        """Samples ``[start, end)`` of the cached copy of shard ``name`` (see
        :meth:`LocalLocation.read_indexed`); the copy is not evicted while they are read.
        ``num_bytes`` is not compared again: a copy was checked against the manifest when it was fetched."""
        from ..format.tario_indexed import iter_indexed_samples

        fd = self._open_fd(name)
        pread = os.pread
        try:
            return (yield from iter_indexed_samples(lambda offset, n: pread(fd, n, offset), offsets, start, end,
                                                    os.fstat(fd).st_size, source=where, tag_source=True,
                                                    chunk_reader=functools.partial(read_shard_ahead, fd=fd)
                                                    if self.readahead else None))
        finally:
            os.close(fd)

    def open_ahead(self, name: str, first_bytes: int, prepare=None) -> None:
        """Download shard ``name`` into the cache in the background (after ``prepare()``, which
        reads its index) while the reader is busy with the shard before it: one such download per
        process at a time (while one runs: nothing). A failure is left to the read that follows,
        which raises it. A shard the cache holds is opened ahead as a local one is
        (:func:`~shardfeed.readers.storage.shard_readahead.open_ahead`: once reads proved slow)."""
        if name not in self._files:
            return
        path = self._path(name)
        if path.exists():  # held already: opened ahead as a local shard is, on slow storage
            if self.readahead:
                open_ahead(path, prepare=prepare, first_bytes=first_bytes)
            return
        with self._lock:
            if self._ahead is not None and self._ahead.is_alive():
                return
            self._ahead = threading.Thread(target=self._fetch_ahead, args=(name, prepare), daemon=True,
                                           name="shardfeed-cache-ahead")
            self._ahead.start()

    def _fetch_ahead(self, name: str, prepare) -> None:
        try:
            if prepare is not None:
                prepare()
            os.close(self._open_fd(name))
        except Exception as exc:  # noqa: BLE001 - the read that needs it raises it
            log.debug("%s: not downloaded ahead (%s)", self.where(name), exc)

    def __getstate__(self):
        state = super().__getstate__()
        state["_ahead"] = None
        return state

    def head_size(self, name: str) -> int:
        """The size of ``name`` in bytes (the manifest's for a shard or index, else the remote's)."""
        return self._files[name][0] if name in self._files else self.remote_location.head_size(name)

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        raise self._cannot("list its files")

    def load_manifest(self, *, check_files: bool = True):
        """The remote manifest (:meth:`Location.load_manifest`)."""
        return self.remote_location.load_manifest(check_files=check_files)

    # read-only, as every remote location: the base class's refusals, not the local folder's writes
    put_bytes = LocationBase.put_bytes
    put_file = LocationBase.put_file
    delete = LocationBase.delete
    head = LocationBase.head


def _fetch_into(location: Any, name: str, num_bytes: int, out: BinaryIO, hasher: Any) -> int:
    return copy_stream(location, name, out, hasher=hasher, num_bytes=num_bytes)
