"""The shard cut: the bytes a sample takes in a tar shard, and where shards close.

One rule for every WebDataset shard shardfeed writes, applied by both of its users: the planner
(:func:`~shardfeed.convert.write.plan.plan_shards`, from the file sizes before anything is written) and
the writer (:class:`~shardfeed.convert.writers.shard.ShardWriter`, sample by sample while
writing):

    a shard closes *before* it would hold more than ``max_count`` samples or its file would pass
    ``max_bytes`` bytes on disk (tar headers, padding and the two end-of-archive blocks included).

A sample's bytes in a shard are those of POSIX ustar (each member a 512-byte header plus its
data padded to whole 512-byte blocks, :func:`shardfeed.readers.format.manifest.tar_member_bytes`); a
shard's file ends with two zero blocks (:data:`~shardfeed.convert.write.tarwriter.END_OF_ARCHIVE_BYTES`).
A sample that alone needs more than ``max_bytes`` can never be written: an error naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from shardfeed.readers.format.manifest import TAR_BLOCK

from .tarwriter import END_OF_ARCHIVE_BYTES

__all__ = ["MIN_SHARD_BYTES", "ShardLimits", "cut_shards", "sample_bytes", "wds_sample_bytes"]

#: The smallest ``max_bytes`` accepted, bytes (a shard must hold a small sample and its end blocks).
MIN_SHARD_BYTES = 4096


def wds_sample_bytes(data_len: int, cls_len: int, meta_len: int) -> int:
    """Bytes a sample of three members (image, ``.cls``, ``.json``) takes in a tar shard.

    Three 512-byte headers plus each member's data padded to whole 512-byte blocks: the sum of
    :func:`shardfeed.readers.format.manifest.tar_member_bytes` over the members (:func:`sample_bytes`).
    """
    return (3 * TAR_BLOCK + data_len + cls_len + meta_len
            + (-data_len % TAR_BLOCK) + (-cls_len % TAR_BLOCK) + (-meta_len % TAR_BLOCK))


def sample_bytes(member_lengths: Iterable[int]) -> int:
    """Bytes a sample of any members takes in a tar shard: each member's 512-byte header plus its
    data (``member_lengths``, bytes) padded to whole 512-byte blocks."""
    return sum(TAR_BLOCK + n + (-n % TAR_BLOCK) for n in member_lengths)


@dataclasses.dataclass(frozen=True)
class ShardLimits:
    """Per-shard limits and the rollover rule; where ``max_count`` and ``max_bytes`` are validated.

    Attributes:
        max_count: samples per shard at most (>= 1).
        max_bytes: bytes per shard file at most, headers, padding and end blocks included
            (>= :data:`MIN_SHARD_BYTES`).

    Raises:
        ValueError: a limit out of range (the message names the ``--max-count``/``--max-bytes``
            option and the keyword).
    """

    max_count: int
    max_bytes: int

    def __post_init__(self):
        if self.max_count < 1:
            raise ValueError(f"--max-count (max_count) must be at least 1, got {self.max_count}")
        if self.max_bytes < MIN_SHARD_BYTES:
            raise ValueError(f"--max-bytes (max_bytes) must be at least {MIN_SHARD_BYTES} bytes (KB/MB/GB are "
                             f"powers of 1000, KiB/MiB/GiB of 1024), got {self.max_bytes}")

    def starts_new_shard(self, count: int, size_bytes: int, need_bytes: int) -> bool:
        """The rollover rule: whether a sample of ``need_bytes`` must go to a new shard.

        Args:
            count: samples already in the current shard (>= 1; an empty shard takes any sample).
            size_bytes: the current shard's file size if closed now (end blocks included), bytes.
            need_bytes: the sample's bytes in the shard (:func:`wds_sample_bytes`).
        """
        return count >= self.max_count or size_bytes + need_bytes > self.max_bytes

    def fits(self, need_bytes: int) -> bool:
        """Whether a sample of ``need_bytes`` fits an empty shard (with its end blocks)."""
        return need_bytes + END_OF_ARCHIVE_BYTES <= self.max_bytes

    def check_sample(self, need_bytes: int, describe: str, hint: str = "") -> None:
        """Raise when one sample alone cannot fit a shard.

        Raises:
            ValueError: ``need_bytes`` plus the end blocks pass ``max_bytes``; the message starts
                with ``describe`` (the file or key) and ends with the fix (plus ``hint``).
        """
        if not self.fits(need_bytes):
            raise ValueError(f"{describe} needs {need_bytes + END_OF_ARCHIVE_BYTES} bytes in a shard, more than "
                             f"--max-bytes {self.max_bytes}; raise --max-bytes{hint}")


def cut_shards(sizes: Iterable[int], limits: ShardLimits, *, empty_bytes: int = END_OF_ARCHIVE_BYTES,
               describe: Callable[[int], str] | None = None) -> list[tuple[int, int]]:
    """Cut a sequence of samples into shards by :meth:`ShardLimits.starts_new_shard`.

    Args:
        sizes: each sample's bytes in a shard (:func:`wds_sample_bytes`), in order.
        limits: the limits.
        empty_bytes: the bytes of an empty shard (its two end-of-archive blocks; 0 to cut batches
            of plain byte counts by the same rule).
        describe: ``describe(i)`` names sample ``i`` in the error for a sample that alone passes
            ``max_bytes``; None: no sample is checked.

    Returns:
        ``[(start, end), ...]``: half-open sample ranges covering every sample, in order.

    Raises:
        ValueError: a sample alone needs more than ``max_bytes`` (only with ``describe``).
    """
    ranges = []
    start = 0
    i = -1
    size = empty_bytes
    starts_new = limits.starts_new_shard
    largest = limits.max_bytes - END_OF_ARCHIVE_BYTES
    for i, b in enumerate(sizes):
        if describe is not None and b > largest:
            limits.check_sample(b, describe(i))
        if i > start and starts_new(i - start, size, b):
            ranges.append((start, i))
            start, size = i, empty_bytes
        size += b
    if start <= i:
        ranges.append((start, i + 1))
    return ranges
