"""``shardfeed convert``: WebDataset <-> LMDB and re-sharding, keeping keys, labels, metadata,
bytes and the class map; an image folder as the source is the same as ``pack``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from shardfeed.readers.storage.redact import shown_source
from shardfeed.readers.format.registry import FORMATS, canonical_format, describe, writer_class

from .. import writers  # noqa: F401  (registers every format's writer)
from ..write.pack_state import PLAN_NAME, STATE_DIR, remove_state_folder
from .common import (
    DatasetLocation,
    Progress,
    is_url,
    iter_raw_samples,
    looks_like_image_folder,
    noop_progress,
)

log = logging.getLogger(__name__)

__all__ = ["ConvertReport", "convert_dataset"]


@dataclasses.dataclass
class ConvertReport:
    """What :func:`convert_dataset` did.

    Attributes:
        source, output: the datasets.
        source_format, format: their formats (``"imagefolder"`` for a folder source, which is packed).
        num_samples, num_shards, num_bytes: the output's samples, files and bytes.
        seconds: wall time.
        pack: the :class:`~shardfeed.convert.write.pack.PackReport` as JSON for a folder source.
    """

    source: str
    output: str
    source_format: str
    format: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    pack: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        mb = self.num_bytes / 1e6
        return (f"converted {self.source} ({self.source_format}) to {self.output} ({self.format}): "
                f"{self.num_samples:,} samples in {self.num_shards} "
                f"{'file' if not describe(self.format).sharded else ('shard' if self.num_shards == 1 else 'shards')}, "
                f"{mb:,.1f} MB in {self.seconds:.1f} s")




def _write_state(out: Path, fmt: str, prefix: str) -> None:
    """The record of a convert in progress (``OUT/.shardfeed-pack/plan.json``: command, format and
    shard prefix), removed once the manifest is written; what ``--overwrite`` of an interrupted
    convert may delete (:mod:`shardfeed.convert.write.ownership`)."""
    import json

    from shardfeed.readers.file_io import write_bytes_atomic

    state = out / STATE_DIR
    state.mkdir(exist_ok=True)
    write_bytes_atomic(state / PLAN_NAME, json.dumps({"command": "convert",
                                                      "options": {"format": fmt, "prefix": prefix}}).encode())


def convert_dataset(src: str | os.PathLike, out: str | os.PathLike, *, format: str, max_count: int = 10000,
                    max_bytes: int = 256_000_000, prefix: str = "shard", workers: int | None = None,
                    overwrite: bool = False, map_size: int | None = None,
                    progress: Progress | None = None, storage_options: dict | None = None) -> ConvertReport:
    """Convert a dataset to ``format`` (WebDataset ↔ LMDB, or re-shard), without re-encoding.

    Samples are copied in storage order with their keys, labels, metadata and bytes unchanged;
    the manifest's class map, skipped list and input accounting are carried over. A plain image
    folder as ``src`` is packed exactly as ``shardfeed pack`` would (default seed and shuffle).

    Args:
        src: a packed dataset (directory, manifest, or HTTP URL of a WebDataset) or an image folder.
        out: the output folder (missing or empty, unless ``overwrite``), or an ``s3://`` prefix
            (WebDataset only: built in a local staging folder and uploaded shard by shard, the
            manifest last, as ``pack`` to a bucket; :func:`~shardfeed.convert.write.store_pack.convert_to_store`).
        format: ``"wds"``/``"webdataset"`` or ``"lmdb"``.
        max_count, max_bytes, prefix: WebDataset shard limits (samples, bytes on disk) and prefix.
        workers: processes for a folder source (pack); conversion itself is sequential.
        overwrite: replace a dataset in OUT (only files shardfeed writes).
        map_size: LMDB initial map size, bytes (grows as needed).
        progress: ``callback(num_samples, num_bytes)``.
        storage_options: object-store client options for ``s3://`` SRC and OUT.

    Returns:
        A :class:`ConvertReport`.

    Raises:
        ValueError: unknown format, OUT not empty or inside SRC, a sample larger than ``max_bytes``.
        UnsupportedURLError: OUT is a URL of another scheme, or LMDB to a bucket.
        ManifestError, CorruptDataError, DataSourceError: the source cannot be read (or an upload
            failed).
    """
    from shardfeed.readers.storage.opener import check_supported, is_remote, local_path

    check_supported(out, what="`shardfeed convert`", hint="OUT may be a local folder or s3://BUCKET/PREFIX")
    if is_remote(out):  # any writable remote location (convert_to_store refuses a read-only one)
        from ..write.store_pack import convert_to_store

        fmt = canonical_format(format)
        build = lambda stage: convert_dataset(src, stage, format=fmt, max_count=max_count,  # noqa: E731
                                              max_bytes=max_bytes, prefix=prefix, workers=workers,
                                              map_size=map_size, progress=progress,
                                              storage_options=storage_options)
        report, report.output = convert_to_store(str(out), build, fmt=fmt, prefix=prefix, overwrite=overwrite,
                                                 storage_options=storage_options)
        return report
    out = local_path(out)
    from ..write.outlock import output_lock
    from ..write.pack import PackOptions, pack, prepare_output

    t0 = time.perf_counter()
    fmt = canonical_format(format)
    if not is_url(str(src)) and looks_like_image_folder(src):
        options = PackOptions(format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                              workers=workers, overwrite=overwrite, map_size=map_size)
        pr = pack(src, out, options, progress=progress)
        return ConvertReport(source=shown_source(src), output=str(out), source_format="imagefolder", format=fmt,
                             num_samples=pr.num_samples, num_shards=pr.num_shards, num_bytes=pr.num_bytes,
                             seconds=time.perf_counter() - t0, pack=pr.to_json())
    loc = DatasetLocation(src, storage_options=storage_options)
    manifest = loc.load_manifest(check_files=not loc.remote)
    # a URL source cannot contain OUT: compare OUT with a path that cannot be its parent
    src_root = Path("/nonexistent-url-source") if loc.remote else Path(loc.root)
    with output_lock(out, "convert"):  # one writer per OUT: a second command fails at once, naming this one
        prepare_output(src_root, out, resume=False, overwrite=overwrite)
        _write_state(out, fmt, prefix)  # names what this convert writes: a later --overwrite may delete it
        progress = progress or noop_progress
        own = {o for s in FORMATS.values() for o in s.options}  # a format's own options do not carry over
        options = {**{k: v for k, v in manifest.options.items() if k not in own},
                   "converted_from": shown_source(src), "source_format": manifest.format,
                   "source_created_by": manifest.created_by}
        writer = writer_class(fmt).create(out, classes=manifest.classes, class_to_idx=manifest.class_to_idx,
                                          max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                                          skipped=manifest.skipped, options=options, files=manifest.files,
                                          map_size=map_size, expected_bytes=sum(s.num_bytes for s in manifest.shards),
                                          labels=manifest.labels, fields=tuple(manifest.fields))
        n = 0
        with writer:
            for _, sample, fields in iter_raw_samples(loc, manifest, with_fields=True):
                writer.write(sample, fields)
                n += 1
                progress(1, len(sample.data))
            new = writer.close()
        remove_state_folder(out)  # the manifest is written: finished
        if n != manifest.num_samples:
            log.warning("%s: read %d samples, its manifest says %d", loc.root, n, manifest.num_samples)
        return ConvertReport(source=shown_source(src), output=str(out), source_format=manifest.format, format=fmt,
                             num_samples=new.num_samples, num_shards=len(new.shards),
                             num_bytes=sum(s.num_bytes for s in new.shards), seconds=time.perf_counter() - t0)


