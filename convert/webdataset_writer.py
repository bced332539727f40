"""A streaming WebDataset writer: samples in, rolling ``.tar`` shards + ``.sfidx`` + manifest out.

``pack`` plans its shard boundaries up front (it knows every file size before reading a byte);
``convert`` and other producers see samples one at a time, so this writer follows the
``Writer`` protocol of DESIGN.md (``write(sample)``, ``close() -> Manifest``, context manager)
and rolls a shard over *before* it would pass ``max_count`` samples or ``max_bytes`` bytes on
disk (headers, padding and the end-of-archive blocks included), like MosaicML streaming's
writers. Each shard goes through :class:`~shardfeed.convert.tarwriter.TarShardFile` (temporary
name, sha256 while writing, atomic rename, offset index), so the on-disk result is exactly what
``pack`` writes for the same samples in the same order and shard cuts.

The manifest is written last, atomically, by :meth:`WebDatasetWriter.close`; leaving the
``with`` block on an exception drops the shard in progress and writes no manifest.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from shardfeed.readers.format import (
    DEFAULT_PREFIX,
    Manifest,
    Sample,
    ShardEntry,
    class_bytes,
    index_name,
    meta_bytes,
    shard_name,
    tar_member_bytes,
)

from .tarwriter import END_OF_ARCHIVE_BYTES, TarShardFile

__all__ = ["WebDatasetWriter"]

log = logging.getLogger(__name__)


class WebDatasetWriter:
    """Write samples into ``out/{prefix}-{index:06d}.tar`` shards with offset indexes and a manifest.

    Each sample becomes the contiguous members ``{key}.{ext}`` (its bytes, unchanged),
    ``{key}.cls`` (ASCII class index) and ``{key}.json`` (its metadata).

    Args:
        out: output folder; created if missing, must hold no ``manifest.json`` and no shard of
            the same prefix (a finished or half-written dataset is never overwritten silently).
        classes: class names in class-index order (the manifest's ``classes``).
        class_to_idx: name → index (default: from ``classes``' order).
        max_count: samples per shard at most (≥ 1).
        max_bytes: bytes per shard file at most, headers/padding/end blocks included (≥ 4096).
        prefix: shard file prefix (no ``/`` or ``.``).
        skipped: ``[{"path", "reason"}]`` entries to carry into the manifest.
        options: extra provenance recorded in the manifest's ``options`` (``max_count``,
            ``max_bytes``, ``prefix`` and ``format`` are added).
        files: the manifest's input accounting (default: ``{"packed": N}``).

    Raises:
        ValueError: bad limits or prefix; ``out`` already holds a dataset.
        NotADirectoryError: ``out`` is a file.

    Example::

        with WebDatasetWriter("out/wds", classes=["cat", "dog"], max_count=1000) as w:
            for sample in samples:          # shardfeed.readers.format.Sample
                w.write(sample)
        manifest = w.manifest               # also returned by close()
    """

    format = "webdataset"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], class_to_idx: dict[str, int] | None = None,
                 max_count: int = 10000, max_bytes: int = 256_000_000, prefix: str = DEFAULT_PREFIX,
                 skipped: list[dict] | None = None, options: dict | None = None, files: dict | None = None):
        if max_count < 1:
            raise ValueError(f"max_count must be at least 1, got {max_count}")
        if max_bytes < 4096:
            raise ValueError(f"max_bytes must be at least 4096 bytes, got {max_bytes}")
        if not prefix or "/" in prefix or "." in prefix:
            raise ValueError(f"prefix {prefix!r} must be a plain name without '/' or '.'")
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise NotADirectoryError(f"{self.out}: exists and is a file; choose a folder for the output")
        self.out.mkdir(parents=True, exist_ok=True)
        if (self.out / "manifest.json").exists() or any(self.out.glob(f"{prefix}-*.tar")):
            raise ValueError(f"{self.out}: already holds a dataset (manifest.json or {prefix}-*.tar); "
                             "choose an empty folder")
        self.classes = list(classes)
        self.class_to_idx = dict(class_to_idx) if class_to_idx is not None else {c: i for i, c in enumerate(classes)}
        self.max_count = int(max_count)
        self.max_bytes = int(max_bytes)
        self.prefix = prefix
        self.skipped = list(skipped or [])
        self.options = dict(options or {})
        self.files = files
        self.shards: list[ShardEntry] = []
        self.manifest: Manifest | None = None
        self._shard: TarShardFile | None = None
        self._shard_bytes = 0
        self._keys: set[str] = set()
        self._closed = False

    @property
    def num_samples(self) -> int:
        """Samples written so far."""
        return sum(s.num_samples for s in self.shards) + (len(self._shard.offsets) if self._shard else 0)

    def _sample_bytes(self, data: bytes, cls: bytes, meta: bytes) -> int:
        return tar_member_bytes(len(data)) + tar_member_bytes(len(cls)) + tar_member_bytes(len(meta))

    def write(self, sample: Sample) -> None:
        """Append one sample, first closing the current shard if it would pass a limit.

        Args:
            sample: a :class:`~shardfeed.readers.format.Sample`; its bytes are stored unchanged.

        Raises:
            ValueError: the key is empty, holds a ``.``, repeats an earlier key, or the sample alone
                is larger than ``max_bytes``; the writer is closed.
        """
        if self._closed:
            raise ValueError(f"{self.out}: writer is closed")
        key = sample.key
        if not key or "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"sample key {key!r}: keys must be non-empty and hold no '.' (WebDataset splits the "
                             "key from the extension at the first dot)")
        if key in self._keys:
            raise ValueError(f"sample key {key!r} written twice; keys must be unique")
        cls, meta = class_bytes(sample.label), meta_bytes(sample.meta)
        need = self._sample_bytes(sample.data, cls, meta)
        if need + END_OF_ARCHIVE_BYTES > self.max_bytes:
            path = (sample.meta or {}).get("path", "?")
            raise ValueError(f"sample {key!r} ({path}) needs {need + END_OF_ARCHIVE_BYTES} bytes in a shard, more "
                             f"than max_bytes {self.max_bytes}; raise --max-bytes")
        if self._shard is not None and (len(self._shard.offsets) >= self.max_count
                                        or self._shard_bytes + need > self.max_bytes):
            self._finish_shard()
        if self._shard is None:
            i = len(self.shards)
            self._shard = TarShardFile(self.out, shard_name(i, self.prefix), index_name(i, self.prefix))
            self._shard_bytes = END_OF_ARCHIVE_BYTES
        self._shard.add_sample(key, [(sample.ext, sample.data), ("cls", cls), ("json", meta)])
        self._shard_bytes += need
        self._keys.add(key)

    def _finish_shard(self) -> None:
        entry = self._shard.close()
        self._shard = None
        log.debug("wrote %s (%d samples, %d bytes)", entry.name, entry.num_samples, entry.num_bytes)
        self.shards.append(entry)

    def close(self) -> Manifest:
        """Close the last shard and write ``manifest.json`` (atomically, last).

        Returns:
            The dataset's :class:`~shardfeed.readers.format.Manifest`.

        Raises:
            ValueError: no sample was written (an empty dataset has no manifest).
        """
        if self._closed:
            if self.manifest is None:
                raise ValueError(f"{self.out}: writer was aborted; no manifest")
            return self.manifest
        if self._shard is not None:
            self._finish_shard()
        self._closed = True
        n = sum(s.num_samples for s in self.shards)
        if n == 0:
            raise ValueError(f"{self.out}: no sample was written; nothing to describe")
        options = {**self.options, "format": self.format, "max_count": self.max_count,
                   "max_bytes": self.max_bytes, "prefix": self.prefix}
        self.manifest = Manifest(format=self.format, num_samples=n, classes=self.classes,
                                 class_to_idx=self.class_to_idx, shards=list(self.shards),
                                 skipped=self.skipped, options=options,
                                 files=self.files if self.files is not None else {"packed": n})
        self.manifest.write(self.out)
        from .consumers import write_consumer_files

        write_consumer_files(self.out, self.manifest)  # wids' shardindex.json, the Hugging Face dataset card
        return self.manifest

    def abort(self) -> None:
        """Drop the shard in progress (complete shards stay; no manifest is written)."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None
        self._closed = True

    def __enter__(self) -> "WebDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()
