"""``shardfeed doctor PATH``: where the data lives, what it costs to read, and what would help.

Without training anything, :func:`doctor` probes a dataset (an image folder, a packed dataset or
a URL) within a bounded sample and time budget:

* the storage: the file system type of the mount holding it (``psutil.disk_partitions``,
  classed as local, nfs, fuse, overlay, tmpfs, network or other), the latency of an ``open`` and
  of a first small read (64 KiB) per file, median and p95, on a sample of files that is first
  evicted from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) so the reads are cold
  where the file system honours it; the sequential read throughput (the rest of files of 1 MiB or
  more, a shard of a packed dataset; for a folder of small files it is estimated as one 128 KiB
  read request per first-read latency, the kernel's default readahead window);
* the files: how many (the listing stops at ``max_list``) and their sizes (a local folder: every
  file listed; elsewhere the sample's);
* the decode cost on this CPU: the sampled images decoded with shardfeed's decoder
  (:func:`shardfeed.readers.decode.image.decode_image`; with ``image_size`` also resized and cropped
  as ``make_loader(image_size=N)`` does), CPU seconds per image of this thread, and the library
  that decodes each format with its share of the files;
* the batch costs on this CPU: the collate, the hand-off to the main process and the conversion
  to float, measured on a batch of the sample's decoded images
  (:func:`~shardfeed.readers.measure.doctor_model.batch_costs`);
* the machine: cores, available RAM, free ``/dev/shm`` against the dataset's estimated size.

The loader ceiling it predicts, images/s at ``num_workers`` W (``W=0``: the main process loads),
is :mod:`~shardfeed.readers.measure.doctor_model`'s: per image, a worker's wall time (the file's
open and reads for a folder, each worker opening one file per image; the bytes at the sequential
rate for a packed dataset, one open per shard; nothing once staged or cached) plus its CPU work
(decode, the folder's file system calls, collate), the workers' CPU capped by the cores, and the
main process's hand-off and conversion to float on the cores that are left.

An image folder (local or in a bucket) is sampled in strata of format and size, spread over its folders, and the
sample grows until two standard errors of the prediction are under 10 %
(:mod:`~shardfeed.readers.measure.doctor_sample`). Each sampled file is read and decoded alone;
the folder's per-image times (``t_open + t_first_read + max(0, size - 64 KiB) / throughput``,
``t_dec``, ``t_file_cpu``) are the strata's means weighted by their shares of the files, and
``size`` in the packed figure is the mean file size. Elsewhere ``size`` is the median of the
sample. The model leaves out the transforms after cropping and the step; it is a ceiling, checked
against ``shardfeed verify --model none`` on the storage emulator by ``scripts/doctor_vs_verify.py``
and against ``shardfeed bench --model none`` on a folder of mixed small and large images by
``scripts/doctor_vs_bench.py``. Whether decoding is the limit, the worker counts advised and the
resize target are ``watch``'s rules (:mod:`~shardfeed.readers.measure.doctor_advice`).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from ..format.manifest import IMAGE_EXTENSIONS, MANIFEST_NAME
from ..format.registry import describe, source_factory
from .doctor_advice import ADVICE_MIN_GAIN, PACK_ADVICE_MIN_GAIN, advice_lines
from .doctor_folder import (DEFAULT_MAX_FILES, FIRST_READ_BYTES, FOLDER_MAX_FILES, READ_REQUEST_BYTES, SEQ_READ_BYTES,
                            CHUNK_BYTES, decode_with_batch, evict, folder_facts, list_images, probe_folder,
                            read_throughput, tar_images, timed_read)
from .doctor_model import add_busy_machine, predict_images_per_s, predict_with_more_workers
from .doctor_remote import doctor_url
from .doctor_report import (DoctorReport, fs_class, fs_type_of, machine_facts, others_cpu_share, probe_workers,
                            storage_facts)
from .report import percentile

__all__ = ["DoctorReport", "doctor", "predict_images_per_s", "fs_class", "FIRST_READ_BYTES", "READ_REQUEST_BYTES",
           "PACK_ADVICE_MIN_GAIN", "ADVICE_MIN_GAIN", "DEFAULT_MAX_FILES", "FOLDER_MAX_FILES"]

_CHUNK = CHUNK_BYTES


def _source_images(kind: str, root: Path, manifest: Any, limit: int) -> list[tuple[str, bytes]]:
    """The first ``limit`` samples' image bytes of a record-store dataset (LMDB), read through its
    format's reader source (``read_raw``); a damaged record is passed over, an unreadable store
    gives none."""
    out: list[tuple[str, bytes]] = []
    try:
        src = source_factory(kind)(str(root), manifest)
        n = len(src)
    except Exception:  # noqa: BLE001  (a probe: an unreadable store means no decode measurement)
        return out
    try:
        for i in range(min(limit, n)):
            try:
                key, data, ext = src.read_raw(i)[:3]
            except Exception:  # noqa: BLE001  (a damaged record is no cost figure)
                continue
            out.append((f"{key}.{ext}", bytes(data)))
    finally:
        close = getattr(src, "close", None)
        if callable(close):
            close()
    return out


def doctor(path: str | os.PathLike, *, num_workers: int | None = None, max_files: int | None = None,
           max_list: int = 200_000, budget_s: float = 30.0, decoder: str = "auto", cold: bool = True, seed: int = 0,
           image_size: int | None = None, progress: Callable[[str], None] | None = None,
           storage_options: dict | None = None) -> DoctorReport:
    """Probe the dataset at ``path`` and predict its loader ceiling (see the module docstring).

    Args:
        path: an image folder, a packed dataset (folder or ``manifest.json``) on a local or
            mounted file system, or a WebDataset dataset's ``http(s)://`` or ``s3://`` URL (time to
            the response stands for the open latency; the page cache is not involved), or an
            image folder in a bucket (``s3://bucket/prefix`` holding ``CLASS/IMAGE`` objects and
            no manifest). Reports and progress lines name a URL without its ``user:password@``.
        num_workers: the ``DataLoader`` workers of the prediction (default: the CPU count).
        max_files: the most files (or shards) sampled for latency, sizes and decode (≥ 1). An image
            folder's stratified sample (local or in a bucket) starts at 64 and grows while the prediction's expected
            error is above 10 % (default 512); elsewhere all are sampled at once (default 64).
        max_list: files listed at most (the count is then a lower bound).
        budget_s: the probe's time budget, seconds (listing, reading and decoding stop when it
            is spent, keeping at least 3 files).
        decoder: shardfeed's decoder (``auto``, ``pil``, ``cv2``, ``simplejpeg``).
        cold: evict the sampled files from the page cache before reading them.
        seed: the sample's seed.
        image_size: also count what ``make_loader(image_size=N)`` does on the CPU per image:
            reduced-scale JPEG decoding, resizing the shorter side to N, the centre crop
            (None: decoding at full size only).
        progress: called with a line per phase.
        storage_options: object-store client options for an ``s3://`` URL (``endpoint_url``,
            ``region_name``, ``profile``, ``anon`` ...; see :mod:`shardfeed.readers.storage.objstore`);
            None: the defaults (the environment's).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: bad counts, no image file under ``path`` (or in a bucket folder's class
            folders), a URL to an LMDB dataset.
        ShardfeedError: a URL whose manifest cannot be fetched or read (the readers' errors).
    """
    _check_probe_args(image_size, 1 if max_files is None else max_files, max_list, budget_s)
    text = str(path)
    import psutil

    t_start = time.monotonic()
    machine0, ours0 = psutil.cpu_times(), psutil.Process().cpu_times()
    say = progress or (lambda line: None)
    if "://" in text and not text.startswith("file://"):
        return doctor_url(text, storage_options=storage_options, num_workers=num_workers, max_files=max_files,
                           max_list=max_list, budget_s=budget_s, decoder=decoder, seed=seed, image_size=image_size,
                           say=say, t_start=t_start, machine0=machine0, ours0=ours0)
    root = _local_root(text)
    cpus, ram, shm = machine_facts(root)
    nw = probe_workers(num_workers, cpus)
    warnings: list[str] = []
    fs_type, mount_point = fs_type_of(root)
    manifest, kind = _local_manifest(root)
    rng = random.Random(seed)
    if max_files is None:
        max_files = FOLDER_MAX_FILES if manifest is None else DEFAULT_MAX_FILES
    probe = dict(rng=rng, max_files=max_files, cold=cold, decoder=decoder, image_size=image_size, say=say,
                 warnings=warnings, t_start=t_start, budget_s=budget_s)
    if manifest is None:
        files, reads, dec, costs, extra = _probe_local_folder(root, max_list=max_list, nw=nw, cpus=cpus, **probe)
    else:
        files, reads, dec, costs, extra = _probe_packed(root, manifest, kind, **probe)
    opens, firsts = [r["open_s"] for r in reads], [r["first_s"] for r in reads]
    pred = predict_with_more_workers(nw, cpus, costs)
    pred.update(extra)
    storage = storage_facts(fs_type, mount_point, opens, firsts, costs["read_bytes_per_s"],
                             files.pop("throughput_measured"), files.pop("cold"), costs.get("t_file_cpu_s", 0.0))
    advice = advice_lines(kind, str(root), storage, files, dec, pred, nw, cpus, ram, shm)
    others = others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
    if others is not None:
        add_busy_machine(pred, others, nw, cpus, costs, warnings)
    return DoctorReport(path=str(root), kind=kind, storage=storage, files=files, decode=dec, cpus=cpus,
                        ram_available_bytes=ram, shm_free_bytes=shm, num_workers=nw, predicted=pred, advice=advice,
                        probe_s=time.monotonic() - t_start, others_cpu_share=others, warnings=warnings)


def _probe_local_folder(root: Path, *, max_list: int, nw: int, cpus: int, rng: random.Random, max_files: int,
                        cold: bool, decoder: str, image_size: int | None, say: Callable[[str], None],
                        warnings: list[str], t_start: float, budget_s: float) -> tuple[dict, list, dict, dict, dict]:
    """A local image folder through a stratified sample (:func:`probe_folder`): ``(files, reads,
    decode, costs, predicted_extra)``; ``files`` also holds ``throughput_measured`` and ``cold``
    for the storage section.

    Raises:
        ValueError: no image file under ``root``, or none of the sampled files could be read.
    """
    say(f"listing {root} ...")
    listed, complete = list_images(root, max_list, t_start + budget_s * 0.25)
    if not listed:
        raise ValueError(f"{root}: no image file found (extensions: {', '.join(sorted(IMAGE_EXTENSIONS)[:8])}, "
                         "...): give an image folder or a packed dataset")
    got = probe_folder(listed, rng=rng, max_files=max_files, deadline=t_start + budget_s * 0.8, cold=cold,
                       decoder=decoder, image_size=image_size, num_workers=nw, cpus=cpus, say=say)
    return folder_facts(str(root), listed, complete, got, cold, warnings)




def _probe_packed(root: Path, manifest: Any, kind: str, *, rng: random.Random, max_files: int, cold: bool,
                  decoder: str, image_size: int | None, say: Callable[[str], None], warnings: list[str],
                  t_start: float, budget_s: float) -> tuple[dict, list, dict, dict, dict]:
    """A packed dataset: timed reads of sampled shards, the decode of the first shard's samples:
    ``(files, reads, decode, costs, predicted_extra)`` as :func:`_probe_local_folder`.

    Raises:
        ValueError: no shard file present, or none could be read.
    """
    shard_paths = [str(root / s.name) for s in manifest.shards if (root / s.name).is_file()]
    if describe(kind).files and not shard_paths:
        shard_paths = [str(root / n) for n in describe(kind).files if (root / n).is_file()]
    if not shard_paths:
        raise ValueError(f"{root}: the manifest names no shard file present here")
    sample = rng.sample(shard_paths, min(max_files, len(shard_paths)))
    evicted = _evict_sample(sample, say, warnings) if cold else 0
    say(f"reading {len(sample)} files ...")
    reads = _read_shards(sample, t_start + budget_s * 0.7, warnings)
    if not reads:
        raise ValueError(f"{root}: none of the sampled files could be read")
    thr, measured = read_throughput(reads, [r["first_s"] for r in reads])
    count = manifest.num_samples
    images, median_bytes, p95_bytes, mean_bytes, total = _packed_sizes(manifest, kind, root, shard_paths, reads,
                                                                       count, max_files, warnings)
    say(f"decoding {len(images)} images ...")
    dec, terms = decode_with_batch(images, decoder, t_start + budget_s * 1.2, image_size)
    t_dec = 1.0 / dec["images_per_cpu_s"] if dec["images_per_cpu_s"] else None
    costs = dict(t_decode_s=t_dec, t_open_s=statistics.median(r["open_s"] for r in reads),
                 t_first_read_s=statistics.median(r["first_s"] for r in reads), median_bytes=median_bytes,
                 read_bytes_per_s=thr, t_file_cpu_s=0.0, **terms)
    files = {"count": count, "count_complete": True, "sampled": len(reads), "median_bytes": median_bytes,
             "p95_bytes": p95_bytes, "mean_bytes": mean_bytes, "estimated_total_bytes": total,
             "throughput_measured": measured, "cold": cold and evicted > 0}
    return files, reads, dec, costs, {}


def _packed_sizes(manifest: Any, kind: str, root: Path, shard_paths: list[str], reads: list[dict[str, Any]],
                  count: int, max_files: int, warnings: list[str]
                  ) -> tuple[list[tuple[str, bytes]], float, float, float, float]:
    """A packed dataset's sample images and sizes: ``(images, median_bytes, p95_bytes, mean_bytes,
    total_bytes)``; the mean is the manifest's bytes per sample, the median and 95th percentile the
    sampled images' where some could be taken out of the shards (a warning says when none could)."""
    total = float(sum(s.num_bytes for s in manifest.shards)) or float(sum(os.path.getsize(p) for p in shard_paths))
    mean_bytes = median_bytes = p95_bytes = total / max(count, 1)
    spec = describe(kind)
    if spec.tar_shards:
        images = tar_images(reads[0]["data"] or b"", max_files)
    elif spec.source is not None and callable(getattr(source_factory(kind), "read_raw", None)):
        images = _source_images(kind, root, manifest, max_files)
    else:
        images = []
    if not images:
        warnings.append(f"decode cost not measured for the {kind} format: run 'shardfeed doctor' on the image "
                        "folder it was packed from")
    sizes = [len(b) for _, b in images]
    if sizes:
        median_bytes = float(statistics.median(sizes))
        p95_bytes = percentile(sizes, 95)
    return images, median_bytes, p95_bytes, mean_bytes, total


def _local_manifest(root: Path):
    """``(manifest, kind)`` of a local dataset: its manifest (files not checked) and format, or
    ``(None, "folder")`` for an image folder."""
    if not (root / MANIFEST_NAME).is_file():
        return None, "folder"
    from ..storage.local_manifest import load_manifest

    manifest = load_manifest(root / MANIFEST_NAME, check_files=False)
    return manifest, manifest.format




def _check_probe_args(image_size: int | None, max_files: int, max_list: int, budget_s: float) -> None:
    """Raises:
        ValueError: a count below 1 or a budget not above 0 (:func:`doctor`'s arguments)."""
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be at least 1, got {image_size}")
    if max_files < 1 or max_list < 1:
        raise ValueError(f"max_files and max_list must be at least 1, got {max_files}, {max_list}")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")


def _local_root(text: str) -> Path:
    """The dataset folder a local path (or ``file://`` URL, or its ``manifest.json``) names.

    Raises:
        FileNotFoundError: it does not exist.
    """
    if text.startswith("file://"):
        text = text[len("file://"):]
    root = Path(text).expanduser()
    if root.name == MANIFEST_NAME:
        root = root.parent
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such file or directory")
    return root


def _evict_sample(sample: list[str], say: Callable[[str], None], warnings: list[str]) -> int:
    """Evict the sampled files from the page cache; returns how many were (a warning for the rest)."""
    say(f"evicting {len(sample)} files from the page cache ...")
    evicted = sum(evict(p) for p in sample)
    if evicted < len(sample):
        warnings.append(f"{len(sample) - evicted} of {len(sample)} sampled files could not be evicted: their "
                        "reads may come from RAM")
    return evicted


def _read_shards(sample: list[str], deadline: float, warnings: list[str]) -> list[dict]:
    """Timed reads of the sampled shards (the first 4 read sequentially for throughput, up to 64 MiB,
    the first one's bytes kept up to 8 MiB for the decode probe; the rest opened and read 64 KiB),
    stopping at ``deadline`` (``time.monotonic``) once 3 are read. Unreadable files are left out."""
    reads = []
    for p in sample:
        if len(reads) >= 3 and time.monotonic() > deadline:
            warnings.append(f"time budget: {len(reads)} of {len(sample)} sampled files read")
            break
        r = timed_read(p, keep=not reads, max_rest=SEQ_READ_BYTES if len(reads) < 4 else 0, keep_max=8 * _CHUNK)
        if r is None:
            continue
        r["path"] = p
        reads.append(r)
    return reads


