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
  (:func:`shardfeed.readers.decode.decode_image`; with ``image_size`` also resized and cropped
  as ``make_loader(image_size=N)`` does), CPU seconds per image of this thread, and the library
  that decodes each format with its share of the files;
* the machine: cores, available RAM, free ``/dev/shm`` against the dataset's estimated size.

The loader ceiling it predicts, images/s at ``num_workers`` W (``W=0`` counts as one: the main
process), with ``t_dec`` the CPU seconds to decode one image and ``C`` the cores:

* folder: ``min(W / (t_open + t_first_read + max(0, size - 64 KiB) / throughput + t_dec),
  min(W, C) / (t_dec + t_file_cpu))`` (each worker opens and reads one file per image, then
  decodes it; ``t_file_cpu`` is the CPU time of one file's open, reads and close, the system calls
  a file system such as FUSE makes costly; decoding and those calls cannot use more than C cores);
* packed: ``min(W / (size / throughput + t_dec), min(W, C) / t_dec)`` (each worker streams a shard:
  one open per shard, sequential reads);
* staged to local storage or cached in memory: ``min(W, C) / t_dec``.

An image folder (local or in a bucket) is sampled in strata of format and size, spread over its folders, and the
sample grows until two standard errors of the prediction are under 10 %
(:mod:`~shardfeed.convert.tools.doctor_sample`). Each sampled file is read and decoded alone;
the folder's per-image times (``t_open + t_first_read + max(0, size - 64 KiB) / throughput``,
``t_dec``, ``t_file_cpu``) are the strata's means weighted by their shares of the files, and
``size`` in the packed figure is the mean file size. Elsewhere ``size`` is the median of the
sample. The model leaves out collate, the transforms after decoding and the step; it is a
ceiling, checked against ``shardfeed verify --model none`` on the storage emulator by
``scripts/doctor_vs_verify.py`` and against ``shardfeed bench --model none`` on a folder of
mixed small and large images by ``scripts/doctor_vs_bench.py``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from shardfeed.readers.format import IMAGE_EXTENSIONS, MANIFEST_NAME
from shardfeed.readers.measure.report import fmt_bytes, percentile
from shardfeed.readers.redact import shown_source
from shardfeed.readers.registry import describe, resolve

from .. import writers  # noqa: F401  (registers each format's record reader)
from .doctor_advice import ADVICE_MIN_GAIN, PACK_ADVICE_MIN_GAIN, advice_lines
from .doctor_folder import (CHUNK_BYTES, FIRST_READ_BYTES, MAX_DECODE_BYTES, READ_REQUEST_BYTES, decode_cost,
                            error_text, evict, list_images, probe_folder, read_throughput, timed_read)

__all__ = ["DoctorReport", "doctor", "predict_images_per_s", "fs_class", "FIRST_READ_BYTES", "READ_REQUEST_BYTES",
           "PACK_ADVICE_MIN_GAIN", "ADVICE_MIN_GAIN"]

#: Files or shards sampled at most by default (an image folder's stratified sample: FOLDER_MAX_FILES).
DEFAULT_MAX_FILES = 64
#: The most files a local image folder's stratified sample grows to by default.
FOLDER_MAX_FILES = 512
_CHUNK = CHUNK_BYTES
_MAX_DECODE_BYTES = MAX_DECODE_BYTES
_SEQ_READ_BYTES = 64 * 1024 * 1024

_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs",
               "virtiofs", "davfs"}
_LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "vfat", "exfat", "ntfs", "ntfs3"}


def fs_class(fs_type: str | None) -> str:
    """``local``, ``nfs``, ``fuse``, ``overlay``, ``tmpfs``, ``network`` or ``unknown`` for a
    ``/proc/self/mountinfo`` file-system type (``fuse.sshfs`` → ``fuse``)."""
    if not fs_type:
        return "unknown"
    base = fs_type.split(".", 1)[0]
    if base in ("fuse", "fuseblk"):
        return "fuse"
    if base in ("nfs", "nfs4"):
        return "nfs"
    if base in _NETWORK_FS:
        return "network"
    if base in ("overlay", "aufs"):
        return "overlay"
    if base in ("tmpfs", "ramfs"):
        return "tmpfs"
    if base in _LOCAL_FS:
        return "local"
    return "unknown"


def _fs_type_of(path: Path) -> tuple[str | None, str | None]:
    """``(fs_type, mount_point)`` of the mount holding ``path`` (the longest mount point above it)."""
    import psutil

    real = os.path.realpath(path)
    best = None
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if real == mp or real.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) > len(best.mountpoint):
                best = part
    return (best.fstype, best.mountpoint) if best else (None, None)


def predict_images_per_s(*, num_workers: int, cpus: float, t_decode_s: float | None, t_open_s: float,
                         t_first_read_s: float, median_bytes: float, read_bytes_per_s: float | None,
                         t_file_cpu_s: float = 0.0, folder_io_s: float | None = None) -> dict:
    """The model of the module docstring: ``{"folder_images_per_s", "packed_images_per_s",
    "local_images_per_s"}`` (None where a figure is missing). ``t_file_cpu_s``: the CPU seconds
    of one file's open, reads and close (system calls; the folder pays them per image).
    ``median_bytes``: the bytes of one image (the packed stream reads them in sequence).
    ``folder_io_s``: the mean seconds of one file's open and reads, measured per file (an image
    folder's stratified sample), used for the folder in place of ``t_open_s + t_first_read_s +
    max(0, median_bytes - 64 KiB) / read_bytes_per_s``."""
    w = max(1, num_workers)
    if not t_decode_s or t_decode_s <= 0 or not read_bytes_per_s:
        return {"folder_images_per_s": None, "packed_images_per_s": None, "local_images_per_s": None}
    cpu_cap = min(w, cpus) / t_decode_s
    if folder_io_s is None:
        folder_io_s = t_open_s + t_first_read_s + max(0.0, median_bytes - FIRST_READ_BYTES) / read_bytes_per_s
    folder = min(w / (folder_io_s + t_decode_s), min(w, cpus) / (t_decode_s + t_file_cpu_s))
    packed = min(w / (median_bytes / read_bytes_per_s + t_decode_s), cpu_cap)
    return {"folder_images_per_s": folder, "packed_images_per_s": packed, "local_images_per_s": cpu_cap}


@dataclasses.dataclass
class DoctorReport:
    """What :func:`doctor` found (the JSON of ``shardfeed doctor --json``).

    Attributes:
        path: the dataset probed (a URL without its ``user:password@``); ``kind``: ``folder``,
            ``webdataset``, ``lmdb`` or ``url`` (a packed dataset behind a URL; an image folder in
            a bucket is ``folder``).
        storage: ``fs_type`` (the URL scheme for a URL), ``fs_class``, ``mount_point`` (None for
            a URL), ``open_latency_ms`` and
            ``first_read_latency_ms`` (``{"p50", "p95"}``), ``read_mb_per_s`` (MB = 10^6 bytes),
            ``read_mb_per_s_measured`` (False: estimated from the first-read latency), ``cold``
            (whether eviction was advised before the reads), ``file_cpu_ms`` (CPU of one file's
            open, reads and close in this thread).
        files: ``count`` (``count_complete``: False when the listing stopped at ``max_list``),
            ``sampled``, ``median_bytes``, ``p95_bytes``, ``mean_bytes``, ``estimated_total_bytes``;
            an image folder also ``strata`` (``[{"format", "size", "files", "sampled"}]``) and
            ``sample_stopped_by`` (``target``: the error was small enough, ``max_files``,
            ``all_files``, ``budget``).
        decode: ``images_per_cpu_s`` (decoded images per CPU second of one thread),
            ``median_pixels`` (decoded), ``sampled``, ``decoder`` (the setting resolved),
            ``image_size``; an image folder also ``by_format`` (``[{"format", "share",
            "decoder", "images_per_cpu_s", "sampled"}]``, the largest share first: the library
            that decodes each format).
        cpus: logical cores; ``ram_available_bytes``; ``shm_free_bytes`` (None without /dev/shm).
        num_workers: the worker count the prediction is for.
        predicted: ``folder_images_per_s``, ``packed_images_per_s``, ``local_images_per_s``
            (staged or cached), ``more_workers`` (``{"num_workers", "folder_images_per_s",
            "packed_images_per_s"}``), ``busy_machine`` (the same with only the cores other
            processes left free during the probe: ``{"cores_free", "folder_images_per_s",
            "packed_images_per_s"}``); an image folder also ``error_share`` (two standard
            errors of the folder prediction over the prediction, from the sample's spread; None
            when unknown) and ``error_term`` (``storage`` or ``cpu``: the per-image time it is of).
        advice: actions, most helpful first, each with its predicted effect, one line per action
            (:mod:`~shardfeed.convert.tools.doctor_advice`).
        probe_s: seconds the probe took; ``others_cpu_share``: the share of the machine's CPU
            other processes used meanwhile; ``warnings``: what limits the figures.
    """

    path: str
    kind: str
    storage: dict
    files: dict
    decode: dict
    cpus: int
    ram_available_bytes: int
    shm_free_bytes: int | None
    num_workers: int
    predicted: dict
    advice: list
    probe_s: float
    others_cpu_share: float | None = None
    warnings: list = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        """Every figure as a JSON-able dict."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """The report as a few human-readable lines."""
        s, f, d, p = self.storage, self.files, self.decode, self.predicted
        ol, fr = s.get("open_latency_ms") or {}, s.get("first_read_latency_ms") or {}
        thr = s.get("read_mb_per_s")
        file_cpu = f", CPU per file {s['file_cpu_ms']:.2f} ms" if s.get("file_cpu_ms") else ""
        mount = f" at {s['mount_point']}" if s.get("mount_point") else ""
        lines = [f"{self.path} ({self.kind})",
                 f"  storage: {s.get('fs_type')} ({s.get('fs_class')}){mount}; open "
                 f"{_ms(ol.get('p50'))} (p95 {_ms(ol.get('p95'))}), first read {_ms(fr.get('p50'))} "
                 f"(p95 {_ms(fr.get('p95'))}), sequential "
                 f"{'n/a' if thr is None else f'{thr:.0f} MB/s'}"
                 f"{'' if s.get('read_mb_per_s_measured') else ' (estimated)'}"
                 f"{file_cpu}"
                 f"{'' if s.get('cold') else ' [warm: eviction not possible]'}",
                 f"  files: {f.get('count')}{'' if f.get('count_complete', True) else '+'}, median "
                 f"{fmt_bytes(f.get('median_bytes'))}, about {fmt_bytes(f.get('estimated_total_bytes'))} in all",
                 f"  decode: {_num(d.get('images_per_cpu_s'))} images per CPU second "
                 f"({_decoders_text(d)}; median {_num(d.get('median_pixels'))} pixels)",
                 f"  machine: {self.cpus} cores, {fmt_bytes(self.ram_available_bytes)} RAM available, /dev/shm "
                 f"{fmt_bytes(self.shm_free_bytes)} free",
                 f"  predicted at num_workers={self.num_workers}: "
                 f"folder {_num(p.get('folder_images_per_s'))} images/s{_error_note(p, f)}, "
                 f"packed {_num(p.get('packed_images_per_s'))}, staged or cached {_num(p.get('local_images_per_s'))}"]
        lines += [f"  advice: {a}" for a in self.advice]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _decoders_text(dec: dict) -> str:
    """``"PNG 98%: Pillow; JPEG 2%: simplejpeg"``, or the decoder's name where formats were not counted."""
    rows = dec.get("by_format")
    if not rows:
        return str(dec.get("decoder"))
    return "; ".join(f"{r['format']} {r['share']:.0%}: {r['decoder']}" for r in rows)


def _error_note(pred: dict, files: dict) -> str:
    """`` (±6 %, 95 % interval, from 96 files in 4 strata)`` where a stratified sample gave one."""
    if "error_share" not in pred:
        return ""
    strata = files.get("strata") or []
    return f" ({error_text(pred['error_share'])}, 95 % interval, from {files.get('sampled')} files in " \
           f"{len(strata)} strata of format and size)"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} ms"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def _tar_images(data: bytes, limit: int) -> list[tuple[str, bytes]]:
    import io
    import tarfile

    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                if len(out) >= limit:
                    break
                ext = m.name.rsplit(".", 1)[-1].lower()
                if m.isfile() and ext in IMAGE_EXTENSIONS:
                    f = tf.extractfile(m)
                    if f is not None:
                        out.append((m.name, f.read()))
    except (tarfile.TarError, EOFError):
        pass  # a truncated read of a large shard: the members read so far
    return out


def _record_images(records, root: Path, limit: int) -> list[tuple[str, bytes]]:
    """The first ``limit`` samples' image bytes of a record-store dataset (LMDB), read through its
    format's record reader (the registry's ``records``); a damaged record is passed over, an
    unreadable store gives none."""
    out: list[tuple[str, bytes]] = []
    try:
        for key, rec in resolve(records)(root, verify=False):
            if len(out) >= limit:
                break
            if isinstance(rec, Exception):
                continue
            out.append((f"{key}.{rec.get('ext', '')}", rec["data"]))
    except Exception:  # noqa: BLE001  (a probe: an unreadable store means no decode measurement)
        return out
    return out


def _machine(path: Path | None) -> tuple[int, int, int | None]:
    import psutil

    shm = None
    if os.path.isdir("/dev/shm"):
        try:
            shm = int(psutil.disk_usage("/dev/shm").free)
        except OSError:
            shm = None
    return psutil.cpu_count() or 1, int(psutil.virtual_memory().available), shm


def _others_cpu_share(machine0, ours0, wall_s: float, cpus: int) -> float | None:
    import psutil

    m1, o1 = psutil.cpu_times(), psutil.Process().cpu_times()
    busy = sum(getattr(m1, k) - getattr(machine0, k) for k in m1._fields if k not in ("idle", "iowait", "guest",
                                                                                     "guest_nice"))
    ours = (o1.user + o1.system) - (ours0.user + ours0.system)
    if wall_s <= 0:
        return None
    return min(1.0, max(0.0, (busy - ours) / (wall_s * cpus)))


def _lat(values: list[float]) -> dict:
    return {"p50": percentile(values, 50) * 1e3, "p95": percentile(values, 95) * 1e3} if values else \
        {"p50": None, "p95": None}


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
            ``region_name``, ``profile``, ``anon`` ...; see :mod:`shardfeed.readers.objstore`);
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
        return _doctor_url(text, storage_options=storage_options, num_workers=num_workers, max_files=max_files,
                           max_list=max_list, budget_s=budget_s, decoder=decoder, seed=seed, image_size=image_size,
                           say=say, t_start=t_start, machine0=machine0, ours0=ours0)
    root = _local_root(text)
    cpus, ram, shm = _machine(root)
    nw = _probe_workers(num_workers, cpus)
    warnings: list[str] = []
    fs_type, mount_point = _fs_type_of(root)
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
    pred = _predict_with_more_workers(nw, cpus, costs)
    pred.update(extra)
    storage = _storage_facts(fs_type, mount_point, opens, firsts, costs["read_bytes_per_s"],
                             files.pop("throughput_measured"), files.pop("cold"), costs.get("t_file_cpu_s", 0.0))
    advice = advice_lines(kind, str(root), storage, files, dec, pred, nw, cpus, ram, shm)
    others = _others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
    if others is not None:
        _add_busy_machine(pred, others, nw, cpus, costs, warnings)
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
    return _folder_facts(str(root), listed, complete, got, cold, warnings)


def _folder_facts(shown: str, listed: list[tuple[str, int]], complete: bool, got: dict, cold: bool,
                  warnings: list[str]) -> tuple[dict, list, dict, dict, dict]:
    """An image folder's ``(files, reads, decode, costs, predicted_extra)`` from its listing and
    :func:`probe_folder`'s result, warnings added (eviction, budget, strata left unsampled).

    Raises:
        ValueError: none of the sampled files could be read.
    """
    if not got["records"]:
        raise ValueError(f"{shown}: none of the sampled files could be read")
    if got["evicted"] < got["evict_tried"]:
        warnings.append(f"{got['evict_tried'] - got['evicted']} of {got['evict_tried']} sampled files could not be "
                        "evicted: their reads may come from RAM")
    if got["stopped_by"] == "budget":
        warnings.append(f"time budget: {len(got['records'])} files sampled; the expected error is "
                        f"{error_text(got['error_share'])} (more with --budget-s)")
    if got["unmeasured_share"] > 0:
        warnings.append(f"{got['unmeasured_share']:.0%} of the files are in strata the budget left unsampled: "
                        "the prediction leaves them out")
    sizes = [size for _, size in listed]
    files = {"count": len(listed), "count_complete": complete, "sampled": len(got["records"]),
             "median_bytes": float(statistics.median(sizes)), "p95_bytes": percentile(sizes, 95),
             "mean_bytes": float(statistics.fmean(sizes)), "estimated_total_bytes": float(sum(sizes)),
             "strata": got["strata"], "sample_stopped_by": got["stopped_by"],
             "throughput_measured": got["throughput_measured"], "cold": cold and got["evicted"] > 0}
    extra = {"error_share": got["error_share"], "error_term": got["error_term"]}
    return files, got["records"], got["decode"], got["costs"], extra


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
    dec = decode_cost(images, decoder, t_start + budget_s * 1.2, image_size)
    t_dec = 1.0 / dec["images_per_cpu_s"] if dec["images_per_cpu_s"] else None
    costs = dict(t_decode_s=t_dec, t_open_s=statistics.median(r["open_s"] for r in reads),
                 t_first_read_s=statistics.median(r["first_s"] for r in reads), median_bytes=median_bytes,
                 read_bytes_per_s=thr, t_file_cpu_s=0.0)
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
        images = _tar_images(reads[0]["data"] or b"", max_files)
    elif spec.records is not None:
        images = _record_images(spec.records, root, max_files)
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
    from shardfeed.readers.local_manifest import load_manifest

    manifest = load_manifest(root / MANIFEST_NAME, check_files=False)
    return manifest, manifest.format


def _storage_facts(fs_type: str | None, mount_point: str | None, opens: list[float], firsts: list[float], thr: float,
                   measured: bool, cold: bool, t_file_cpu: float) -> dict:
    """The report's ``storage`` section (latencies in ms, throughput in MB/s)."""
    return {"fs_type": fs_type, "fs_class": fs_class(fs_type), "mount_point": mount_point,
            "open_latency_ms": _lat(opens), "first_read_latency_ms": _lat(firsts),
            "read_mb_per_s": thr / 1e6, "read_mb_per_s_measured": measured, "cold": cold,
            "file_cpu_ms": t_file_cpu * 1e3}


def _probe_workers(num_workers: int | None, cpus: int) -> int:
    """The workers of the prediction: ``num_workers``, or the CPU count.

    Raises:
        ValueError: a negative count.
    """
    nw = cpus if num_workers is None else num_workers
    if nw < 0:
        raise ValueError(f"num_workers must be 0 or more, got {nw}")
    return nw


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
        r = timed_read(p, keep=not reads, max_rest=_SEQ_READ_BYTES if len(reads) < 4 else 0, keep_max=8 * _CHUNK)
        if r is None:
            continue
        r["path"] = p
        reads.append(r)
    return reads


def _predict_with_more_workers(nw: int, cpus: float, costs: dict) -> dict:
    """:func:`predict_images_per_s` with ``nw`` workers, plus ``more_workers``: the same with
    ``max(2 * nw, nw + 2)`` (``costs``: the other keyword arguments)."""
    pred = predict_images_per_s(num_workers=nw, cpus=cpus, **costs)
    more = max(2 * max(nw, 1), nw + 2)
    pred_more = predict_images_per_s(num_workers=more, cpus=cpus, **costs)
    pred["more_workers"] = {"num_workers": more, "folder_images_per_s": pred_more["folder_images_per_s"],
                            "packed_images_per_s": pred_more["packed_images_per_s"]}
    return pred


def _add_busy_machine(pred: dict, others: float, nw: int, cpus: float, costs: dict, warnings: list[str]) -> None:
    """``pred["busy_machine"]``: the prediction with only the cores other processes left free
    (``others``: their share of the CPU during the probe), and a warning when it was above 30 %."""
    free = max(0.1, cpus * (1 - others))
    now = predict_images_per_s(num_workers=nw, cpus=free, **costs)
    pred["busy_machine"] = {"cores_free": free, "folder_images_per_s": now["folder_images_per_s"],
                            "packed_images_per_s": now["packed_images_per_s"]}
    if others > 0.3:
        warnings.append(f"other processes used {others:.0%} of the CPU during the probe: the decode-bound figures "
                        f"are for this machine when it is quiet (with the {free:.1f} "
                        "cores left free: predicted.busy_machine)")


def _doctor_url(url: str, *, storage_options, num_workers, max_files, max_list, budget_s, decoder, seed, image_size,
                say, t_start, machine0, ours0) -> DoctorReport:
    """A dataset behind ``http(s)://`` or ``s3://``: a packed dataset (time to the response, first
    64 KiB, sequential reads of up to 4 shards, 64 MB each at most, decode of the first shard's
    samples) or, where the location lists and holds class folders but no manifest, an image
    folder (:func:`_doctor_remote_folder`). Reports and progress name the URL without its
    ``user:password@``."""
    from shardfeed.readers.errors import ManifestError
    from shardfeed.readers.location import folder_kind
    from shardfeed.readers.opener import open_location, url_scheme

    shown = shown_source(url)
    loc = open_location(url, storage_options=storage_options)
    say(f"reading the manifest of {shown} ...")
    try:
        manifest = loc.load_manifest(check_files=False)
    except ManifestError:
        if not getattr(loc, "listable", False) or url.endswith(".json"):
            raise
        say(f"no manifest: listing {shown} ...")
        if folder_kind(loc) != "folder":
            raise
        return _doctor_remote_folder(loc, shown, url_scheme(url), num_workers=num_workers, max_files=max_files,
                                     max_list=max_list, budget_s=budget_s, decoder=decoder, seed=seed,
                                     image_size=image_size, say=say, t_start=t_start, machine0=machine0,
                                     ours0=ours0)
    cpus, ram, shm = _machine(None)
    nw = _probe_workers(num_workers, cpus)
    if not (describe(manifest.format).tar_shards and describe(manifest.format).remote_readable):
        raise ValueError(f"{shown}: doctor probes WebDataset shards over a URL (this is {manifest.format}); "
                         "run it on a local or mounted copy")
    rng = random.Random(seed)
    names = [sh.name for sh in manifest.shards]
    sample = rng.sample(names, min(max_files or DEFAULT_MAX_FILES, len(names)))
    warnings: list[str] = []
    say(f"reading {len(sample)} shards ...")
    reads = []
    for i, name in enumerate(sample):
        if reads and time.monotonic() > t_start + budget_s * 0.7:
            warnings.append(f"time budget: {len(reads)} of {len(sample)} sampled shards read")
            break
        reads.append(_timed_remote_read(loc, name, _SEQ_READ_BYTES if i < 4 else FIRST_READ_BYTES,
                                        keep_max=8 * _CHUNK if i == 0 else 0))
    opens, firsts = [r["open_s"] for r in reads], [r["first_s"] for r in reads]
    seq = [r for r in reads if r["rest"]]
    seq_bytes, seq_s = sum(r["rest"] for r in seq), sum(r["rest_s"] for r in seq)
    measured = seq_bytes >= _CHUNK
    thr = seq_bytes / max(seq_s, 1e-9) if measured else READ_REQUEST_BYTES / max(statistics.median(firsts), 1e-6)
    images = _tar_images(reads[0]["data"], max_files or DEFAULT_MAX_FILES)
    total = float(sum(sh.num_bytes for sh in manifest.shards))
    count = manifest.num_samples
    sizes = [len(b) for _, b in images]
    median_bytes = float(statistics.median(sizes)) if sizes else total / max(count, 1)
    say(f"decoding {len(images)} images ...")
    dec = decode_cost(images, decoder, time.monotonic() + budget_s * 0.2, image_size)
    t_dec = 1.0 / dec["images_per_cpu_s"] if dec["images_per_cpu_s"] else None
    costs = dict(t_decode_s=t_dec, t_open_s=statistics.median(opens), t_first_read_s=statistics.median(firsts),
                 median_bytes=median_bytes, read_bytes_per_s=thr)
    pred = _predict_with_more_workers(nw, cpus, costs)
    storage = {"fs_type": url_scheme(url), "fs_class": "network", "mount_point": None,
               "open_latency_ms": _lat(opens), "first_read_latency_ms": _lat(firsts), "read_mb_per_s": thr / 1e6,
               "read_mb_per_s_measured": measured, "cold": False}
    files = {"count": count, "count_complete": True, "sampled": len(opens), "median_bytes": median_bytes,
             "p95_bytes": percentile(sizes, 95) if sizes else median_bytes, "mean_bytes": total / max(count, 1),
             "estimated_total_bytes": total}
    advice = advice_lines(manifest.format, shown, storage, files, dec, pred, nw, cpus, ram, shm)
    others = _others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
    return DoctorReport(path=shown, kind="url", storage=storage, files=files, decode=dec, cpus=cpus,
                        ram_available_bytes=ram, shm_free_bytes=shm, num_workers=nw, predicted=pred, advice=advice,
                        probe_s=time.monotonic() - t_start, others_cpu_share=others, warnings=warnings)


def _timed_remote_read(loc: Any, name: str, limit: int, keep_max: int) -> dict:
    """Open ``name`` of a remote location for its first ``limit`` bytes and read them: the time to
    the response (``open_s``), of the first 64 KiB (``first_s``) and of the rest (``rest_s``),
    the bytes past the first read (``rest``), the whole size read (``size``), this thread's CPU
    seconds (``cpu_s``) and the bytes read, the rest kept up to ``keep_max`` (``data``).

    Raises:
        ShardfeedError: the object cannot be read (the readers' errors).
    """
    c0 = time.thread_time()
    t0 = time.perf_counter()
    stream, _ = loc.open(name, 0, limit)
    try:
        t1 = time.perf_counter()
        first = stream.read(FIRST_READ_BYTES)
        t2 = time.perf_counter()
        parts, rest = [first], 0
        while rest + len(first) < limit:
            chunk = stream.read(min(_CHUNK, limit - rest - len(first)))
            if not chunk:
                break
            rest += len(chunk)
            if rest <= keep_max:
                parts.append(chunk)
        t3 = time.perf_counter()
    finally:
        stream.close()
    return {"open_s": t1 - t0, "first_s": t2 - t1, "rest_s": t3 - t2, "size": len(first) + rest, "rest": rest,
            "cpu_s": time.thread_time() - c0, "data": b"".join(parts)}


def _remote_images(listing: list, max_list: int) -> tuple[list[tuple[str, int]], bool]:
    """``([(name, size)], complete)``: the image files of a remote image folder's listing (in a
    class folder, no hidden part), at most ``max_list``."""
    out: list[tuple[str, int]] = []
    for rel, size, _ in listing:
        parts = rel.split("/")
        if len(parts) < 2 or any(p.startswith(".") for p in parts):
            continue
        if os.path.splitext(parts[-1])[1].lower().lstrip(".") in IMAGE_EXTENSIONS:
            if len(out) >= max_list:
                return out, False
            out.append((rel, int(size)))
    return out, True


def _doctor_remote_folder(loc: Any, shown: str, scheme: str | None, *, num_workers, max_files, max_list, budget_s,
                          decoder, seed, image_size, say, t_start, machine0, ours0) -> DoctorReport:
    """An image folder in a bucket (class folders, no manifest): a stratified sample as for a local
    folder (:func:`probe_folder`), each sampled image requested and read whole, as the folder reader
    does; sizes come from the listing.

    Raises:
        ValueError: no image file in a class folder of the listing.
        ShardfeedError: an object cannot be read.
    """
    listing = getattr(loc, "listing_cache", None) or loc.list_objects()
    listed, complete = _remote_images(listing, max_list)
    if not listed:
        raise ValueError(f"{shown}: no image file found in a class folder (extensions: "
                         f"{', '.join(sorted(IMAGE_EXTENSIONS)[:8])}, ...): give an image folder or a packed dataset")
    cpus, ram, shm = _machine(None)
    nw = _probe_workers(num_workers, cpus)
    warnings: list[str] = []
    sizes = dict(listed)

    def read(name: str) -> dict:
        r = _timed_remote_read(loc, name, max(sizes[name], 1), keep_max=_MAX_DECODE_BYTES)
        r["path"] = name
        return r

    got = probe_folder(listed, rng=random.Random(seed), max_files=max_files or FOLDER_MAX_FILES,
                       deadline=t_start + budget_s * 0.8, cold=False, decoder=decoder, image_size=image_size,
                       num_workers=nw, cpus=cpus, say=say, read=read)
    files, reads, dec, costs, extra = _folder_facts(shown, listed, complete, got, False, warnings)
    opens, firsts = [r["open_s"] for r in reads], [r["first_s"] for r in reads]
    pred = _predict_with_more_workers(nw, cpus, costs)
    pred.update(extra)
    thr = costs["read_bytes_per_s"]
    storage = {"fs_type": scheme, "fs_class": "network", "mount_point": None,
               "open_latency_ms": _lat(opens), "first_read_latency_ms": _lat(firsts), "read_mb_per_s": thr / 1e6,
               "read_mb_per_s_measured": files.pop("throughput_measured"), "cold": files.pop("cold"),
               "file_cpu_ms": costs["t_file_cpu_s"] * 1e3}
    advice = advice_lines("folder", shown, storage, files, dec, pred, nw, cpus, ram, shm)
    others = _others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
    if others is not None:
        _add_busy_machine(pred, others, nw, cpus, costs, warnings)
    return DoctorReport(path=shown, kind="folder", storage=storage, files=files, decode=dec, cpus=cpus,
                        ram_available_bytes=ram, shm_free_bytes=shm, num_workers=nw, predicted=pred, advice=advice,
                        probe_s=time.monotonic() - t_start, others_cpu_share=others, warnings=warnings)
