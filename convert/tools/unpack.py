"""``shardfeed unpack``: write the ImageFolder back from each sample's ``meta["path"]``, byte for byte.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.format.manifest import (
    normalize_ext,
)

from ..write.outlock import listing, output_lock
from ..write.tarwriter import create_new_file
from .common import (
    DatasetLocation,
    Progress,
    iter_raw_samples,
    noop_progress,
    safe_relative_path,
)

log = logging.getLogger(__name__)

__all__ = ["UnpackReport", "unpack"]

@dataclasses.dataclass
class UnpackReport:
    """What :func:`unpack` wrote.

    Attributes:
        source, output: the dataset and the image folder written.
        num_files: images written.
        num_bytes: their total size, bytes.
        num_sidecar_files: other files written beside the images (the samples' extra fields, e.g.
            ``x.txt``, ``x.json``); num_sidecar_bytes: their total size, bytes.
        num_classes: class folders created (empty classes included, so ImageFolder gives the same
            class indices).
        generated_paths: samples without ``meta["path"]`` written as ``CLASS/KEY.EXT``.
        renamed: samples whose stored format differs from their path's extension (re-encoded by
            ``pack --resize``/``--image-format``), written with the stored extension instead.
        label_mismatches: samples whose path's class folder is not their label's class
            (``[{"key", "path", "class"}]``; re-packing would label them by folder).
        skipped: the manifest's skipped files (not in the dataset, so not written).
        seconds: wall time.
    """

    source: str
    output: str
    num_files: int = 0
    num_bytes: int = 0
    num_classes: int = 0
    generated_paths: int = 0
    renamed: int = 0
    label_mismatches: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    num_sidecar_files: int = 0
    num_sidecar_bytes: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        side = (f" and {self.num_sidecar_files:,} sidecar files ({self.num_sidecar_bytes / 1e6:,.1f} MB)"
                if self.num_sidecar_files else "")
        s = (f"unpacked {self.num_files:,} images ({self.num_bytes / 1e6:,.1f} MB){side} in {self.num_classes} "
             f"classes into {self.output} in {self.seconds:.1f} s")
        if self.generated_paths:
            s += f"; {self.generated_paths} without a stored path named CLASS/KEY.EXT"
        if self.label_mismatches:
            s += f"; {len(self.label_mismatches)} in a folder other than their label's class"
        if self.skipped:
            s += f"; {len(self.skipped)} files were skipped at pack time and are not in the dataset"
        return s


def unpack(path_or_url: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False,
           progress: Progress | None = None, storage_options: dict | None = None) -> UnpackReport:
    """Write a packed dataset back as an ImageFolder, every image byte-identical to its original.

    Each sample goes to ``OUT/meta["path"]`` (its path relative to the packed folder); a sample
    without one goes to ``OUT/CLASS/KEY.EXT``. Every class of the manifest gets its folder, empty
    ones included, so ``ImageFolder(OUT)`` finds the same class indices.

    Args:
        path_or_url: the packed dataset (WebDataset also over HTTP).
        out: the folder to write; must be empty or missing unless ``overwrite``.
        overwrite: allow writing into a non-empty folder, replacing files of the same names.
        progress: ``callback(num_samples, num_bytes)``.
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`); None: the storage's defaults.

    Returns:
        An :class:`UnpackReport`.

    Raises:
        ValueError: OUT not empty; a stored path that is absolute or holds ``..`` (it would escape
            OUT); two samples with the same path; a class name that is not a plain folder name.
        CorruptDataError: a damaged shard or record.
        OSError: writing failed.
    """
    t0 = time.perf_counter()
    loc = DatasetLocation(path_or_url, storage_options=storage_options)
    manifest = loc.load_manifest(check_files=not loc.remote)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder to unpack into")
    if not loc.remote and out.resolve() == Path(loc.root).resolve():
        raise ValueError(f"{out}: is the packed dataset's own folder; choose another output folder")
    if out.exists() and listing(out) and not overwrite:
        raise ValueError(f"{out}: output folder is not empty; choose an empty folder or pass --overwrite")
    with output_lock(out, "unpack"):  # one writer per OUT: a second command fails at once, naming this one
        return _unpack_locked(loc, manifest, out, overwrite, progress, t0)


def _unpack_locked(loc, manifest, out: Path, overwrite: bool, progress, t0: float) -> "UnpackReport":
    """:func:`unpack` once OUT's lock is held."""
    out.mkdir(parents=True, exist_ok=True)
    out_resolved = out.resolve()
    report = UnpackReport(source=str(loc.root), output=str(out), skipped=list(manifest.skipped))
    class_folders = manifest.options.get("layout", "class-folders") == "class-folders"
    for c in manifest.classes if class_folders else ():
        safe_relative_path(c, what=f"class name {c!r}")
        if "/" in c:
            raise ValueError(f"class name {c!r} holds a '/'; cannot make it a folder")
        (out / c).mkdir(exist_ok=True)
    report.num_classes = len(manifest.classes)
    progress = progress or noop_progress
    try:
        _write_samples(loc, manifest, out, out_resolved, overwrite, report, progress)
    except CorruptDataError as exc:
        raise CorruptDataError(f"{exc}; {out} holds only part of the dataset: delete it") from None
    report.seconds = time.perf_counter() - t0
    return report


def _write_samples(loc, manifest, out: Path, out_resolved: Path, overwrite: bool, report: UnpackReport,
                   progress: Progress) -> None:
    written: dict[str, str] = {}
    for shard_name, s, fields in iter_raw_samples(loc, manifest, with_fields=True):
        where = f"{loc.where(shard_name)} key {s.key}"
        cls_name = manifest.classes[s.label] if 0 <= s.label < len(manifest.classes) else str(s.label)
        if not manifest.labelled:
            cls_name = ""
        rel = s.meta.get("path") if isinstance(s.meta, dict) else None
        if not isinstance(rel, str) or not rel:
            rel = (f"{cls_name}/" if cls_name else "") + f"{s.key.replace('/', '_')}.{s.ext}"
            report.generated_paths += 1
        safe_relative_path(rel, what=where)
        stem, dot_ext = os.path.splitext(rel)
        if s.ext and normalize_ext(dot_ext) != s.ext:  # re-encoded (e.g. --resize made a PNG a JPEG)
            rel = f"{stem}.{s.ext}"
            report.renamed += 1
        if rel in written:
            raise ValueError(f"{where}: path {rel!r} was already written for key {written[rel]}; two samples "
                             "cannot be unpacked to the same file")
        written[rel] = s.key
        if manifest.labelled and manifest.options.get("layout", "class-folders") == "class-folders" \
                and rel.split("/", 1)[0] != cls_name:
            report.label_mismatches.append({"key": s.key, "path": rel, "class": cls_name})
        dest = out / rel
        parent = dest.parent.resolve()
        if parent != out_resolved and out_resolved not in parent.parents:
            raise ValueError(f"{where}: path {rel!r} leads outside {out} (through a symlink); refusing to write it")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and not overwrite:
            raise ValueError(f"{dest}: exists already; pass --overwrite to replace it")
        _write_file(dest, s.data)
        for name, data in sorted(fields.items()):  # sidecar files back beside their image: x.txt, x.mask.png
            side = dest.with_name(f"{Path(stem).name}.{name}")
            if (side.exists() and not overwrite) or f"{stem}.{name}" in written:
                raise ValueError(f"{side}: exists already; pass --overwrite to replace it")
            written[f"{stem}.{name}"] = s.key
            _write_file(side, data)
            report.num_sidecar_files += 1
            report.num_sidecar_bytes += len(data)
        report.num_files += 1
        report.num_bytes += len(s.data)
        progress(1, len(s.data))


def _write_file(dest: Path, data: bytes) -> None:
    """Write ``dest`` through a temporary name (a half-written file never has the final name),
    created without following a link planted at that name."""
    tmp = dest.with_name(f".{dest.name}.unpack.tmp")
    with os.fdopen(create_new_file(tmp), "wb") as f:
        f.write(data)
    os.replace(tmp, dest)


