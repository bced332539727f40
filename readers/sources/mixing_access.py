"""Reading a mix's sources by index (:mod:`~shardfeed.readers.sources.mixing`).

Map-style sources (LMDB, image folders, ``cache="memory"``) are read as they are. A WebDataset is
read by index through its offset index: the samples a batch asks for are sorted by shard and read
by their byte offsets (consecutive ones in one read). A local dataset's shards stay open from
batch to batch, and nearby samples of one shard are read with one ``pread``
(:mod:`~shardfeed.readers.storage.offset_reads`). Over HTTP or from a bucket each such read is one ranged
request; with ``cache_dir`` each shard is fetched once and read from the local disk after that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..storage.location import LocalLocation
from ..storage.offset_reads import ShardFiles, read_runs, sample_runs

__all__ = ["by_index", "IndexedWebDataset"]


def by_index(source: Any) -> Any:
    """``source`` read by index: itself when it is map-style, an :class:`IndexedWebDataset` for a WebDataset.

    Raises:
        ValueError: a WebDataset shard without an offset index (the message says how to build them);
            a source that is neither map-style nor a WebDataset.
    """
    from .source_base import SourceBase
    from .webdataset_source import WebDatasetSource

    if isinstance(source, WebDatasetSource):
        return IndexedWebDataset(source)
    if isinstance(source, SourceBase) and source.map_style:
        return source
    raise ValueError(f"{source!r} cannot be read by index: a mix reads LMDB, image folders, cache='memory' "
                     "or WebDataset sources opened by shardfeed")


class IndexedWebDataset:
    """A :class:`~shardfeed.readers.sources.webdataset_source.WebDatasetSource` read by sample index.

    Every attribute is the source's own (reading and setting); :meth:`__getitems__` reads samples
    by their packing-order index.

    Raises:
        ValueError: a shard of the dataset has no offset index.
    """

    map_style = True

    def __init__(self, source: Any) -> None:
        missing = [s.name for s in source.manifest.shards if not s.index]
        if missing:
            raise ValueError(f"{source.location}: shard {missing[0]} (and {len(missing) - 1} more) has no offset "
                             "index, so its samples cannot be read by position; build the indexes with "
                             f"`shardfeed index {source.location}` (or read it with cache='memory')")
        object.__setattr__(self, "_src", source)
        counts = np.asarray([s.num_samples for s in source.manifest.shards], dtype=np.int64)
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_ends", np.cumsum(counts))
        local = type(source.location) is LocalLocation  # a shard cache's copies are opened as it says
        object.__setattr__(self, "_files", ShardFiles(source.location) if local else None)
        source.holes = True  # a damaged sample stands as None: the items stay in step with the indices

    def __getattr__(self, name: str) -> Any:
        if name in ("_src", "_counts", "_ends", "_files"):  # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self._src, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._src, name, value)

    def __repr__(self) -> str:
        return repr(self._src)

    def __len__(self) -> int:
        return self._src.num_samples

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices) -> list:
        """The items of samples ``indices`` (packing order), in that order; None for a skipped one.

        Raises:
            IndexError: an index outside ``[0, N)``.
            CorruptDataError, DataSourceError: under ``on_error="raise"``, a damaged shard or a failed read.
        """
        src = self._src
        idx = np.asarray(list(indices), dtype=np.int64)
        n = src.num_samples
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"sample index {int(idx.min()) if int(idx.min()) < 0 else int(idx.max())} is outside "
                             f"[0, {n})")
        shard = np.searchsorted(self._ends, idx, side="right")
        local = idx - (self._ends[shard] - self._counts[shard])
        # (shard, start, end) of consecutive samples: nothing is read and dropped
        runs = sample_runs(sorted(set(zip(shard.tolist(), local.tolist()))))
        reads = read_runs(src, runs, self._files) if self._files is not None else src._iter_ranges(runs)
        got = {item[0]: item for item in reads}
        raw = (got.get(i, (i, None, None)) for i in idx.tolist())  # (i, None, None): lost to damage, skipped
        return list(src._emit_general(raw))
