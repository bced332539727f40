"""The one WebDataset shard writer and its one rollover rule.

Every WebDataset shard shardfeed writes goes through :class:`ShardWriter`: ``pack`` (one planned
shard per task), ``pack`` with re-encoding (shards cut from the encoded sizes as they come), the
streaming :class:`~shardfeed.convert.writers.webdataset.WebDatasetWriter` of ``shardfeed convert``
and the Ray executor's tasks (which run pack's tasks). The rule, :meth:`ShardLimits.starts_new_shard`,
is also what :func:`~shardfeed.convert.plan.plan_shards` applies to the file sizes up front:

    a shard closes *before* it would hold more than ``max_count`` samples or its file would pass
    ``max_bytes`` bytes on disk (tar headers, padding and the two end-of-archive blocks included).

A sample that alone needs more than ``max_bytes`` is an error (it could never be written).
Each shard is a :class:`~shardfeed.convert.tarwriter.TarShardFile` (temporary name, sha256 while
writing, ``.sfidx`` offset index, atomic rename), named ``{prefix}-{index:06d}.tar``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Callable

from shardfeed.readers.format import TAR_BLOCK, ShardEntry, index_name, shard_name

from ..tarwriter import END_OF_ARCHIVE_BYTES, TarShardFile

__all__ = ["ShardLimits", "ShardWriter", "PlanMismatchError", "wds_sample_bytes"]

log = logging.getLogger(__name__)


class PlanMismatchError(RuntimeError):
    """A planned shard would need a cut the plan did not make (a bug: plan and writer disagree)."""


def wds_sample_bytes(data_len: int, cls_len: int, meta_len: int) -> int:
    """Bytes a sample of three members (image, ``.cls``, ``.json``) takes in a tar shard.

    Three 512-byte headers plus each member's data padded to whole 512-byte blocks, as
    :func:`shardfeed.readers.format.tar_member_bytes` for each member.
    """
    return (3 * TAR_BLOCK + data_len + cls_len + meta_len
            + (-data_len % TAR_BLOCK) + (-cls_len % TAR_BLOCK) + (-meta_len % TAR_BLOCK))


@dataclasses.dataclass(frozen=True)
class ShardLimits:
    """Per-shard limits and the rollover rule.

    Attributes:
        max_count: samples per shard at most (>= 1).
        max_bytes: bytes per shard file at most, headers, padding and end blocks included (>= 4096).

    Raises:
        ValueError: a limit out of range.
    """

    max_count: int
    max_bytes: int

    def __post_init__(self):
        if self.max_count < 1:
            raise ValueError(f"max_count must be at least 1, got {self.max_count}")
        if self.max_bytes < 4096:
            raise ValueError(f"max_bytes must be at least 4096 bytes, got {self.max_bytes}")

    def starts_new_shard(self, count: int, size_bytes: int, need_bytes: int) -> bool:
        """The rollover rule: whether a sample of ``need_bytes`` must go to a new shard.

        Args:
            count: samples already in the current shard (>= 1; an empty shard takes any sample).
            size_bytes: the current shard's file size if closed now (end blocks included), bytes.
            need_bytes: the sample's bytes in the shard (:func:`wds_sample_bytes`).
        """
        return count >= self.max_count or size_bytes + need_bytes > self.max_bytes

    def check_sample(self, need_bytes: int, describe: str, hint: str = "") -> None:
        """Raise when one sample alone cannot fit a shard.

        Raises:
            ValueError: ``need_bytes`` plus the end blocks pass ``max_bytes``; the message starts
                with ``describe`` (the file or key) and ends with the fix (plus ``hint``).
        """
        if need_bytes + END_OF_ARCHIVE_BYTES > self.max_bytes:
            raise ValueError(f"{describe} needs {need_bytes + END_OF_ARCHIVE_BYTES} bytes in a shard, more than "
                             f"--max-bytes {self.max_bytes}; raise --max-bytes{hint}")


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
        n, m, k = len(data), len(cls), len(meta)
        need = (1536 + n + m + k + (-n % TAR_BLOCK) + (-m % TAR_BLOCK) + (-k % TAR_BLOCK))
        shard = self._shard
        limits = self.limits
        if need + END_OF_ARCHIVE_BYTES > limits.max_bytes:
            limits.check_sample(need, describe or f"sample {key!r}", hint)
        if shard is not None and limits.starts_new_shard(len(shard.offsets), shard.num_bytes + END_OF_ARCHIVE_BYTES,
                                                         need):
            self.finish_shard()
            shard = None
        if shard is None:
            shard = self._open()
        return shard.add_wds_sample(key, ext, data, cls, meta)

    def add_members(self, key: str, members: list[tuple[str, bytes]], *, describe: str | None = None,
                    hint: str = "") -> int:
        """Append one sample of any members (image first, then ``cls``/``json``/extra fields),
        under the same rollover rule as :meth:`add` (whose three-member sample it generalises).

        Returns:
            The sample's bytes on disk.

        Raises:
            ValueError, PlanMismatchError, OSError: as :meth:`add`.
        """
        need = sum(TAR_BLOCK + len(d) + (-len(d) % TAR_BLOCK) for _, d in members)
        limits = self.limits
        if need + END_OF_ARCHIVE_BYTES > limits.max_bytes:
            limits.check_sample(need, describe or f"sample {key!r}", hint)
        shard = self._shard
        if shard is not None and limits.starts_new_shard(len(shard.offsets), shard.num_bytes + END_OF_ARCHIVE_BYTES,
                                                         need):
            self.finish_shard()
            shard = None
        if shard is None:
            shard = self._open()
        return shard.add_sample(key, members)

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
