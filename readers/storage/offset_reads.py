"""Reading samples of a local WebDataset by position, with few system calls (a mix's reads).

A mix (:mod:`~shardfeed.readers.sources.mixing_access`) reads a few samples of many shards in each
batch. Opening a shard per sample costs more than reading it: ``open``, ``fstat``, the version
checks (a ``stat`` of the manifest) and ``close``. :class:`ShardFiles` keeps each shard's
descriptor open (at most :data:`MAX_OPEN_SHARDS` a source and process, the least recently used
closed first). :func:`read_runs` reads a batch's runs of consecutive samples by their offset
index: runs of one shard less than :data:`COALESCE_GAP_BYTES` apart are read with one ``pread``
(at most :data:`MAX_SPAN_BYTES`), and parsed from memory.

The checks stay, once a batch: each descriptor's size and modification time against its first
open, and the manifest against the one the dataset was opened with
(:meth:`~shardfeed.readers.storage.location.LocalLocation.check_version`). Anything unusual (a file that
will not open, a short read, a damaged or exotic sample) is read again by the source's general
reader, which raises the precise error or, under ``on_error="skip"``, counts the loss.
"""

from __future__ import annotations

import collections
import itertools
import os
from typing import Any, Iterator

from .location import LocalLocation, check_shard_size
from ..format.tario_indexed import iter_indexed_samples

__all__ = ["ShardFiles", "read_runs", "sample_runs", "MAX_OPEN_SHARDS", "COALESCE_GAP_BYTES", "MAX_SPAN_BYTES"]

#: Most shard descriptors one source keeps open in one process.
MAX_OPEN_SHARDS = 32
#: Runs of one shard with fewer bytes than this between them are read with one ``pread``.
COALESCE_GAP_BYTES = 64 << 10
#: Most bytes one ``pread`` reads (a longer span is cut before the run that would cross it).
MAX_SPAN_BYTES = 8 << 20


class ShardFiles:
    """Open descriptors of a local dataset's shards, reused from read to read.

    Each belongs to the process that opened it: after ``fork`` a child closes its inherited
    copies and opens its own; a pickled copy holds none.

    Args:
        location: the dataset's :class:`~shardfeed.readers.storage.location.LocalLocation`.
        max_open: most descriptors kept open (the least recently used is closed first).
    """

    def __init__(self, location: LocalLocation, max_open: int = MAX_OPEN_SHARDS):
        self.location = location
        self.max_open = max(1, int(max_open))
        self._pid = os.getpid()
        self._open: collections.OrderedDict[str, tuple[int, int, int, str]] = collections.OrderedDict()

    def __getstate__(self) -> dict:
        return {"location": self.location, "max_open": self.max_open}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["location"], state["max_open"])

    def __len__(self) -> int:
        return len(self._open) if self._pid == os.getpid() else 0

    def get(self, name: str, num_bytes: int | None) -> tuple[int, int, str]:
        """``(descriptor, file size, where)`` of shard ``name``, opened and checked on first use.

        Raises:
            FileNotFoundError, IsADirectoryError: as ``open``.
            DatasetChangedError: the dataset changed since it was opened.
            CorruptDataError: ``num_bytes`` given and the file has another size.
        """
        if self._pid != os.getpid():
            self.close()
        got = self._open.get(name)
        if got is not None:
            self._open.move_to_end(name)
            return got[0], got[1], got[3]
        fd = self.location._open_fd(name)  # noqa: SLF001 -- the location's checked descriptor
        try:
            st = os.fstat(fd)
            if num_bytes is not None:
                check_shard_size(self.location.root, name, st.st_size, num_bytes)
        except BaseException:
            os.close(fd)
            raise
        self._open[name] = (fd, st.st_size, st.st_mtime_ns, self.location.where(name))
        while len(self._open) > self.max_open:
            os.close(self._open.popitem(last=False)[1][0])
        return fd, st.st_size, self.location.where(name)

    def check(self, names) -> None:
        """Check the open shards ``names`` and the manifest, as each open does (one ``fstat`` a shard).

        Raises:
            DatasetChangedError: a shard's size or modification time changed since it was opened,
                or the manifest was replaced.
        """
        if self._pid != os.getpid():
            return
        checked_manifest = False
        for name in names:
            got = self._open.get(name)
            if got is None:
                continue
            st = os.fstat(got[0])
            if (st.st_size, st.st_mtime_ns) != (got[1], got[2]) or not checked_manifest:
                self.location.check_version(name, st)  # raises on any change; also stats the manifest
                checked_manifest = True

    def close(self) -> None:
        """Close every descriptor this process opened (a child's inherited copies: its own)."""
        while self._open:
            try:
                os.close(self._open.popitem()[1][0])
            except OSError:
                pass
        self._pid = os.getpid()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def sample_runs(pairs, gap: int = 0) -> list[tuple[int, int, int]]:
    """``(shard, start, end)`` runs covering sorted, distinct ``(shard, sample)`` pairs; a run
    goes on through up to ``gap`` samples not asked for (read and dropped)."""
    out: list[list[int]] = []
    for sh, i in pairs:
        if out and out[-1][0] == sh and i - out[-1][2] <= gap:
            out[-1][2] = i + 1
        else:
            out.append([sh, i, i + 1])
    return [(a, b, c) for a, b, c in out]


def _span_end(offsets, i: int, file_size: int) -> int:
    """The byte after sample ``i - 1`` (the next sample's offset, or the file's end)."""
    return offsets[i] if i < len(offsets) else file_size


def read_runs(source: Any, runs: list[tuple[int, int, int]], files: ShardFiles) -> Iterator[tuple[int, Any, Any]]:
    """``(index, key, parts)`` of the samples of ``runs`` (``(shard, start, end)``, sorted), as
    the source's ``_iter_ranges`` gives them (``index``: packing order), read through ``files``.

    Raises:
        as the source's ``_iter_ranges``: what it raises for a run it reads again.
    """
    shards = source.manifest.shards
    names = []
    for shard, group in itertools.groupby(runs, key=lambda r: r[0]):
        group = list(group)
        entry = shards[shard]
        try:
            offsets = source._index(shard)  # noqa: SLF001
            fd, size, where = files.get(entry.name, entry.num_bytes if source.check_files else None)
        except Exception:  # the general reader opens it again and says what is wrong
            yield from source._iter_ranges(group)  # noqa: SLF001
            continue
        names.append(entry.name)
        base = source._starts[shard]  # noqa: SLF001
        for span in _spans(group, offsets, size):
            yield from _read_span(source, fd, size, where, offsets, base, span)
    files.check(names)


def _spans(group: list[tuple[int, int, int]], offsets, size: int) -> list[list[tuple[int, int, int]]]:
    """The runs of one shard, cut into spans read with one ``pread`` each."""
    spans: list[list[tuple[int, int, int]]] = []
    for run in group:
        if spans:
            last = spans[-1]
            first_byte = offsets[last[0][1]]
            gap = offsets[run[1]] - _span_end(offsets, last[-1][2], size)
            if gap <= COALESCE_GAP_BYTES and _span_end(offsets, run[2], size) - first_byte <= MAX_SPAN_BYTES:
                last.append(run)
                continue
        spans.append([run])
    return spans


def _read_span(source, fd: int, size: int, where: str, offsets, base: int, span):
    """The samples of the runs of one span: one ``pread``, parsed from memory; the rest of a run
    the fast parser leaves is read by the source's general reader."""
    shard = span[0][0]
    first = offsets[span[0][1]]
    stop = _span_end(offsets, span[-1][2], size)
    try:
        data = os.pread(fd, max(0, stop - first), first)
    except OSError:
        data = b""

    def read_at(offset: int, nbytes: int) -> bytes:
        return data[offset - first:offset - first + nbytes]

    for _, start, end in span:
        got = 0
        try:
            samples = iter_indexed_samples(read_at, offsets, start, end, size, source=where, tag_source=True,
                                           read_bytes=max(1, stop - first))
            while True:
                try:
                    key, parts, _ = next(samples)
                except StopIteration:
                    break
                yield base + start + got, key, parts
                got += 1
        except (OSError, ValueError):  # a damaged sample: read again below, for the precise error
            pass
        if got < end - start:
            yield from source._iter_ranges([(shard, start + got, end)])  # noqa: SLF001
