"""The one WebDataset shard writer, applying the one rollover rule (:mod:`shardfeed.convert.write.shard_cut`).

Every WebDataset shard shardfeed writes goes through :class:`ShardWriter`: ``pack`` (one planned
shard per task), ``pack`` with re-encoding (shards cut from the encoded sizes as they come), the
streaming :class:`~shardfeed.convert.writers.webdataset.WebDatasetWriter` of ``shardfeed convert``
and the Ray executor's tasks (which run pack's tasks). The rule,
:meth:`~shardfeed.convert.write.shard_cut.ShardLimits.starts_new_shard`, is also what
:func:`~shardfeed.convert.write.shard_cut.cut_shards` applies to the file sizes up front:

    a shard closes *before* it would hold more than ``max_count`` samples or its file would pass
    ``max_bytes`` bytes on disk (tar headers, padding and the two end-of-archive blocks included).

A sample that alone needs more than ``max_bytes`` is an error (it could never be written).
Each shard is a :class:`~shardfeed.convert.write.tarwriter.TarShardFile` (temporary name, sha256 while
writing, ``.sfidx`` offset index, atomic rename), named ``{prefix}-{index:06d}.tar``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from shardfeed.readers.format.manifest import ShardEntry, index_name, shard_name

from ..write.shard_cut import ShardLimits, sample_bytes, wds_sample_bytes
from ..write.tarwriter import END_OF_ARCHIVE_BYTES, TarShardFile

__all__ = ["ShardLimits", "ShardWriter", "PlanMismatchError", "wds_sample_bytes"]

log = logging.getLogger(__name__)


class PlanMismatchError(RuntimeError):
    """A planned shard would need a cut the plan did not make (a bug: plan and writer disagree)."""


class ShardWriter:
    """Writes samples into ``{prefix}-{index:06d}.tar`` shards (+ ``.sfidx``), rolling over by the rule.

    Args:
        out: the output folder (exists).
        prefix: shard file prefix.
        limits: the :class:`ShardLimits`.
        first_index: index of the first shard this writer writes.
        max_shards: shards this writer may open at most (None: any). A planned shard uses 1: a roll
            there would mean the plan and the rule disagree (:class:`PlanMismatchError`).
        on_shard_end: called with each closed shard's :class:`ShardEntry` and its index, after
            the rename (a packer writes its resume record there).

    Attributes:
        shards: the closed shards' entries, in order.
        next_index: the index the next opened shard gets.
    """

    def __init__(self, out: str | os.PathLike, *, prefix: str, limits: ShardLimits, first_index: int = 0,
                 max_shards: int | None = None,
                 on_shard_end: Callable[[ShardEntry, int], None] | None = None):
        self.out = Path(out)
        self.prefix = prefix
        self.limits = limits
        self.next_index = int(first_index)
        self.max_shards = max_shards
        self.on_shard_end = on_shard_end
        self.shards: list[ShardEntry] = []
        self._opened = 0
        self._shard: TarShardFile | None = None

    @property
    def is_open(self) -> bool:
        """Whether a shard is in progress."""
        return self._shard is not None

    @property
    def count_in_shard(self) -> int:
        """Samples in the shard in progress (0 when none)."""
        return len(self._shard.offsets) if self._shard is not None else 0

    def add(self, key: str, ext: str, data: bytes, cls: bytes, meta: bytes, *, describe: str | None = None,
            hint: str = "") -> int:
        """Append one sample (``{key}.{ext}``, ``{key}.cls``, ``{key}.json``), first closing the
        shard in progress if the sample would pass a limit.

        Args:
            key: the sample key.
            ext: the image extension.
            data, cls, meta: the three members' bytes.
            describe: how an error names the sample (default: its key).
            hint: more advice for a sample too large for any shard.

        Returns:
            The sample's bytes on disk.

        Raises:
            ValueError: the sample alone is larger than ``max_bytes``; a bad member name.
            PlanMismatchError: ``max_shards`` would be passed.
            OSError: writing failed (the message names the shard).
        """
        need = wds_sample_bytes(len(data), len(cls), len(meta))
        return self._shard_for(key, need, describe, hint).add_wds_sample(key, ext, data, cls, meta)

    def add_members(self, key: str, members: list[tuple[str, bytes]], *, describe: str | None = None,
                    hint: str = "") -> int:
        """Append one sample of any members (image first, then ``cls``/``json``/extra fields),
        under the same rollover rule as :meth:`add` (whose three-member sample it generalises).

        Returns:
            The sample's bytes on disk.

        Raises:
            ValueError, PlanMismatchError, OSError: as :meth:`add`.
        """
        need = sample_bytes(len(d) for _, d in members)
        return self._shard_for(key, need, describe, hint).add_sample(key, members)

    def _shard_for(self, key: str, need: int, describe: str | None, hint: str) -> TarShardFile:
        """The shard a sample of ``need`` bytes goes to: the one in progress, or a new one when the
        rollover rule closes it (or none is open); a sample that fits no shard raises."""
        shard = self._shard
        limits = self.limits
        if not limits.fits(need):
            limits.check_sample(need, describe or f"sample {key!r}", hint)
        if shard is not None and limits.starts_new_shard(len(shard.offsets), shard.num_bytes + END_OF_ARCHIVE_BYTES,
                                                         need):
            self.finish_shard()
            shard = None
        return shard if shard is not None else self._open()

    def _open(self) -> TarShardFile:
        if self.max_shards is not None and self._opened >= self.max_shards:
            raise PlanMismatchError(f"{self.out}: shard {self.next_index - 1} was planned to hold its samples, but "
                                    "the rollover rule cuts it; plan and writer disagree (a shardfeed bug)")
        i = self.next_index
        self._shard = TarShardFile(self.out, shard_name(i, self.prefix), index_name(i, self.prefix))
        self._opened += 1
        return self._shard

    def finish_shard(self) -> ShardEntry | None:
        """Close the shard in progress (index written, renamed into place); None when none is open."""
        shard, self._shard = self._shard, None
        if shard is None:
            return None
        if not shard.offsets:
            shard.abort()
            return None
        entry = shard.close()
        index = self.next_index
        self.next_index += 1
        self.shards.append(entry)
        log.debug("wrote %s (%d samples, %d bytes)", entry.name, entry.num_samples, entry.num_bytes)
        if self.on_shard_end is not None:
            self.on_shard_end(entry, index)
        return entry

    def close(self) -> list[ShardEntry]:
        """Close the last shard; returns every shard's entry."""
        self.finish_shard()
        return self.shards

    def abort(self) -> None:
        """Drop the shard in progress (its temporary file); closed shards stay."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
