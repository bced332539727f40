"""``doctor``'s reads and decodes: the listing, page-cache eviction, a file's timed reads, the decode
cost of images, and the probe of a local image folder through a stratified sample
(:mod:`shardfeed.readers.measure.doctor_sample`).

The folder probe measures each sampled file alone: evicted from the page cache (``cold``), opened,
read whole (the open, the first 64 KiB and the rest timed apart, and the CPU time of those system
calls), then decoded as the loader does (CPU seconds of this thread; with ``image_size`` also resized
and cropped). The first file of each format is decoded once untimed first (the decoder's set-up).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from ..format.manifest import IMAGE_EXTENSIONS
from .doctor_model import FIRST_READ_BYTES, batch_cost_terms, batch_costs
from .report import percentile

from .doctor_sample import (TARGET_RELATIVE_ERROR, StratifiedSample, bucket_text, decoders_by_format, image_format,
                            stratified_mean)

__all__ = ["FIRST_READ_BYTES", "READ_REQUEST_BYTES", "CHUNK_BYTES", "MAX_DECODE_BYTES", "SEQ_READ_BYTES",
           "DEFAULT_MAX_FILES", "FOLDER_MAX_FILES", "KEEP_DECODED", "list_images", "evict", "timed_read",
           "decode_one", "decode_cost", "decode_with_batch", "read_throughput", "probe_folder", "error_text",
           "tar_images", "folder_facts"]

#: Files or shards sampled at most by default (an image folder's stratified sample: FOLDER_MAX_FILES).
DEFAULT_MAX_FILES = 64
#: The most files a local image folder's stratified sample grows to by default.
FOLDER_MAX_FILES = 512
#: The most bytes of a shard read sequentially for the throughput figure.
SEQ_READ_BYTES = 64 * 1024 * 1024
#: Decoded images kept for the batch costs (:func:`~shardfeed.readers.measure.doctor_model.batch_costs`).
KEEP_DECODED = 32
#: A decoded image larger than this, bytes, is not kept (without ``image_size`` images keep their size).
KEEP_DECODED_MAX_BYTES = 2 * 1024 * 1024

#: One read request of the kernel's default readahead window, bytes (the throughput estimate).
READ_REQUEST_BYTES = 128 * 1024
#: The read size past the first read, bytes; reads of at least this much past it measure throughput.
CHUNK_BYTES = 1024 * 1024
#: Files larger than this are read but not decoded, bytes.
MAX_DECODE_BYTES = 64 * 1024 * 1024
_CHUNK = CHUNK_BYTES


def list_images(root: Path, max_list: int, deadline: float) -> tuple[list[tuple[str, int]], bool]:
    """Image files below ``root`` (hidden ones skipped, links not followed out), with their sizes in
    bytes: ``([(path, size)], complete)``; the listing stops at ``max_list`` files or ``deadline``
    (``time.monotonic``)."""
    out: list[tuple[str, int]] = []
    stack = [str(root)]
    while stack:
        if len(out) >= max_list or time.monotonic() > deadline:
            return out, False
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False) and os.path.splitext(e.name)[1].lower().lstrip(".") in \
                        IMAGE_EXTENSIONS:
                    out.append((e.path, e.stat(follow_symlinks=False).st_size))
            except OSError:
                continue
            if len(out) >= max_list:
                return out, False
    return out, True


def evict(path: str) -> bool:
    """Advise the kernel to drop ``path`` from the page cache; False where it cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)


def timed_read(path: str, keep: bool, max_rest: int | None = None, keep_max: int | None = None) -> dict | None:
    """Open, first read, then the rest of the file (at most ``max_rest`` bytes more: a shard's
    sequential-throughput sample): the three times, the bytes read, this thread's CPU time, and the
    bytes themselves when ``keep`` (of the rest, at most ``keep_max``); None when unreadable."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        t1 = time.perf_counter()
        first = os.read(fd, FIRST_READ_BYTES)
        t2 = time.perf_counter()
        parts = [first] if keep else []
        rest = 0
        while max_rest is None or rest < max_rest:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            rest += len(chunk)
            if keep and (keep_max is None or rest <= keep_max):
                parts.append(chunk)
        t3 = time.perf_counter()
    except OSError:
        return None
    finally:
        os.close(fd)
    return {"open_s": t1 - t0, "first_s": t2 - t1, "rest_s": t3 - t2, "size": len(first) + rest, "rest": rest,
            "cpu_s": time.thread_time() - c0, "data": b"".join(parts) if keep else None}


def decode_one(name: str, data: bytes, decoder: str, image_size: int | None,
               keep: list | None = None) -> tuple[float, int] | None:
    """Decode one image as the loader does: ``(cpu_s, pixels)``, this thread's CPU seconds and the
    decoded ``height * width``, or None when it cannot be decoded (an undecodable sample is not a
    cost figure). With ``image_size``: reduced-scale JPEG decoding, the shorter side resized to
    ``image_size``, the centre crop (what ``make_loader(image_size=N)`` does on the CPU). ``keep``: a
    list the decoded (resized and cropped) ``uint8`` ``[H, W, 3]`` array is appended to while it
    holds fewer than :data:`KEEP_DECODED`."""
    from ..decode.image import decode_image
    from ..decode.transforms import center_crop, resize_shorter

    t0 = time.thread_time()
    try:
        arr = decode_image(data, os.path.splitext(name)[1].lstrip("."), decoder=decoder, source=name,
                           target_size=image_size)
        pixels = int(arr.shape[0]) * int(arr.shape[1])
        if image_size:
            arr = center_crop(resize_shorter(arr, image_size), image_size)
    except Exception:  # noqa: BLE001  (a probe: any decode failure means no figure for this file)
        return None
    spent = time.thread_time() - t0
    if keep is not None and len(keep) < KEEP_DECODED and arr.nbytes <= KEEP_DECODED_MAX_BYTES:
        keep.append(arr)
    return spent, pixels


def _resolved(decoder: str) -> str:
    from ..decode.image import resolve_decoder

    try:
        return resolve_decoder(decoder)
    except Exception:  # noqa: BLE001  (reported as given; the decodes report the error)
        return decoder


def decode_cost(samples: list[tuple[str, bytes]], decoder: str, deadline: float,
                image_size: int | None = None, keep: list | None = None) -> dict:
    """The decode cost of ``(name, bytes)`` images (the first decoded once untimed first), until
    ``deadline`` (``time.monotonic``, at least 3): ``{"images_per_cpu_s", "median_pixels",
    "sampled", "decoder", "image_size"}`` (None figures when none decodes); the decoded arrays
    appended to ``keep`` as :func:`decode_one` does."""
    for name, data in samples[:1]:  # warm-up, not timed: the decoder's and cv2's first-call set-up
        decode_one(name, data, decoder, image_size)
    cpu, n, pixels = 0.0, 0, []
    for name, data in samples:
        if time.monotonic() > deadline and n >= 3:
            break
        got = decode_one(name, data, decoder, image_size, keep)
        if got is None:
            continue
        cpu += got[0]
        n += 1
        pixels.append(got[1])
    return {"images_per_cpu_s": n / cpu if n and cpu > 0 else None, "median_pixels": statistics.median(pixels)
            if pixels else None, "sampled": n, "decoder": _resolved(decoder), "image_size": image_size}


def decode_with_batch(samples: list[tuple[str, bytes]], decoder: str, deadline: float,
                      image_size: int | None = None) -> tuple[dict, dict]:
    """:func:`decode_cost` of ``(name, bytes)`` images with the batch costs of the decoded ones:
    ``(decode, terms)``, ``decode["batch"]`` from
    :func:`~shardfeed.readers.measure.doctor_model.batch_costs` and ``terms`` its keyword arguments
    of :func:`~shardfeed.readers.measure.doctor_model.predict_images_per_s`."""
    kept: list = []
    dec = decode_cost(samples, decoder, deadline, image_size, kept)
    dec["batch"] = batch_costs(kept)
    return dec, batch_cost_terms(dec["batch"])


def read_throughput(reads: list[dict], firsts: list[float]) -> tuple[float, bool]:
    """``(bytes per second, measured)``: from the reads of at least ``CHUNK_BYTES`` bytes past their
    first request, else (not measured) one request's bytes over the median first-read latency."""
    big = [r for r in reads if r["rest"] >= _CHUNK]
    if big:
        return sum(r["rest"] for r in big) / max(sum(r["rest_s"] for r in big), 1e-9), True
    return READ_REQUEST_BYTES / max(statistics.median(firsts), 1e-6), False


def _local_read(cold: bool, counters: dict) -> Callable[[str], dict | None]:
    """A local file's timed read for :func:`probe_folder`, evicted from the page cache first (``cold``)."""

    def read(path: str) -> dict | None:
        if cold:
            counters["evicted"] += evict(path)
            counters["evict_tried"] += 1
        return timed_read(path, keep=True, keep_max=MAX_DECODE_BYTES)

    return read


def _file_measure(read: Callable[[str], dict | None], decoder: str, image_size: int | None,
                  keep: list) -> Callable[[str], dict | None]:
    """The per-file measurement of :func:`probe_folder`: the timed ``read``, then the decode (the
    decoded arrays appended to ``keep``)."""
    warmed: set[str] = set()

    def measure(path: str) -> dict | None:
        r = read(path)
        if r is None:
            return None
        data = r.pop("data")
        got = None
        if data is not None and len(data) == r["size"]:  # larger than MAX_DECODE_BYTES: read, not decoded
            fmt = image_format(path)
            if fmt not in warmed:  # the decoder's first-call set-up, not timed
                warmed.add(fmt)
                decode_one(path, data, decoder, image_size)
            got = decode_one(path, data, decoder, image_size, keep)
        r["decode_s"], r["pixels"] = got if got else (None, None)
        r["path"] = path
        return r

    return measure


class _Terms:
    """The per-image times of the folder prediction from a sample's records: the wall time of one
    worker's open, reads and decode (``wall``), and the CPU time of the decode and the file's
    system calls (``cpu``); the one that sets the predicted rate and its expected error."""

    def __init__(self, num_workers: int, cpus: float):
        self.w = max(1, num_workers)
        self.cores = min(self.w, cpus)
        self.thr = 1.0

    def refresh(self, sample: StratifiedSample) -> None:
        recs = [r for v in sample.records.values() for r in v]
        if recs:
            self.thr = read_throughput(recs, [r["first_s"] for r in recs])[0]

    def io(self, r: dict) -> float:
        return r["open_s"] + r["first_s"] + max(0, r["size"] - FIRST_READ_BYTES) / self.thr

    def wall(self, r: dict) -> float | None:
        return None if r["decode_s"] is None else self.io(r) + r["decode_s"]

    def cpu(self, r: dict) -> float | None:
        return None if r["decode_s"] is None else r["decode_s"] + r["cpu_s"]

    def binding(self, sample: StratifiedSample) -> tuple[str, Callable[[dict], float | None], float | None]:
        """``(name, key, relative_error)`` of the term that sets the rate (``"storage"``: the
        workers' wall time, ``"cpu"``: the cores); the error is two standard errors over the mean."""
        self.refresh(sample)
        (mw, sw), (mc, sc) = sample.mean(self.wall), sample.mean(self.cpu)
        if mw is None or mc is None or mw <= 0 or mc <= 0:
            return "cpu", self.cpu, None
        if self.w / mw < self.cores / mc:
            return "storage", self.wall, 2 * sw / mw
        return "cpu", self.cpu, 2 * sc / mc


    def judge(self, sample: StratifiedSample) -> tuple[float | None, Callable[[dict], float | None]]:
        """``(relative_error, key)`` for :meth:`StratifiedSample.run`."""
        _, key, error = self.binding(sample)
        return error, key


def probe_folder(files: list[tuple[str, int]], *, rng: random.Random, max_files: int, deadline: float, cold: bool,
                 decoder: str, image_size: int | None, num_workers: int, cpus: float,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 read: Callable[[str], dict | None] | None = None) -> dict[str, Any]:
    """Measure a stratified sample of an image folder's ``(path, size)`` files until the expected
    error of the predicted rate is at most ``TARGET_RELATIVE_ERROR`` (or ``max_files`` files, or
    ``deadline``), and return the costs per image for
    :func:`~shardfeed.readers.measure.doctor_model.predict_images_per_s`. ``read(path)`` reads one file
    whole and times it (:func:`timed_read`'s dict, the bytes in ``data``; None when unreadable);
    default: a local file, evicted first where ``cold``.

    Returns:
        ``{"costs", "records", "read_bytes_per_s", "throughput_measured", "decode", "error_share",
        "error_term", "strata", "stopped_by", "evicted", "evict_tried", "unmeasured_share"}``:
        ``costs`` holds ``t_decode_s``, ``t_file_cpu_s``, ``folder_io_s`` (s per image, the strata's
        means weighted by their files), ``t_open_s``, ``t_first_read_s`` (weighted means),
        ``median_bytes`` (the mean bytes per image: what a packed stream reads),
        ``read_bytes_per_s`` and the batch costs (``t_collate_s``, ``t_handoff_s``, ``t_to_float_s``,
        measured on the first :data:`KEEP_DECODED` decoded images); ``decode`` the report's decode
        section, ``by_format`` and ``batch`` (:func:`~shardfeed.readers.measure.doctor_model.batch_costs`) included.
    """
    counters = {"evicted": 0, "evict_tried": 0}
    decoded: list = []
    sample = StratifiedSample(files, rng, _file_measure(read or _local_read(cold, counters), decoder, image_size,
                                                        decoded), clock)
    terms = _Terms(num_workers, cpus)
    say(f"reading and decoding a sample of {len(files)} files in {len(sample.counts)} strata (format, size) ...")
    sample.run(max_files, deadline, terms.judge)
    recs = [r for v in sample.records.values() for r in v]
    if not recs:
        return {"records": []}
    term, _, error = terms.binding(sample)
    thr, measured = read_throughput(recs, [r["first_s"] for r in recs])
    t_dec = sample.mean(lambda r: r["decode_s"])[0]
    costs = {"t_decode_s": t_dec, "t_file_cpu_s": sample.mean(lambda r: r["cpu_s"])[0] or 0.0,
             "folder_io_s": sample.mean(terms.io)[0], "t_open_s": sample.mean(lambda r: r["open_s"])[0],
             "t_first_read_s": sample.mean(lambda r: r["first_s"])[0],
             "median_bytes": statistics.fmean(s for _, s in files), "read_bytes_per_s": thr}
    dec = _decode_section(sample, decoder, image_size, t_dec)
    dec["batch"] = batch_costs(decoded)
    costs.update(batch_cost_terms(dec["batch"]))
    return {"costs": costs, "records": recs, "read_bytes_per_s": thr, "throughput_measured": measured,
            "decode": dec, "error_share": error, "error_term": term, "strata": _strata_rows(sample),
            "stopped_by": sample.stopped_by, "unmeasured_share": sample.unmeasured_share(), **counters}


def _decode_section(sample: StratifiedSample, decoder: str, image_size: int | None, t_dec: float | None) -> dict:
    """The report's ``decode``: images per CPU second (stratified), the weighted median pixels, the
    decoder used and, per format, its share of the files, its library and its images per CPU second."""
    used = _resolved(decoder)
    by_format = decoders_by_format(sample.counts, used)
    for row in by_format:
        sub = {k: v for k, v in sample.records.items() if k[0] == row["format"]}
        vals = {k: [r["decode_s"] for r in v if r["decode_s"] is not None] for k, v in sub.items()}
        m = stratified_mean(vals, {k: sample.counts[k] for k in sub})[0]
        row["images_per_cpu_s"] = 1 / m if m else None
        row["sampled"] = sum(len(v) for v in vals.values())
    return {"images_per_cpu_s": 1 / t_dec if t_dec else None,
            "median_pixels": sample.weighted_median(lambda r: r["pixels"]),
            "sampled": sum(1 for v in sample.records.values() for r in v if r["decode_s"] is not None),
            "decoder": used, "image_size": image_size, "by_format": by_format}


def _strata_rows(sample: StratifiedSample) -> list[dict]:
    """``[{"format", "size", "files", "sampled"}]`` per stratum."""
    return [{"format": fmt, "size": bucket_text(b), "files": sample.counts[(fmt, b)],
             "sampled": len(sample.records[(fmt, b)])} for fmt, b in sample.counts]


def error_text(error_share: float | None) -> str:
    """``"±6 %"`` (two standard errors), or ``"error unknown"``."""
    if error_share is None:
        return "error unknown"
    return f"±{error_share:.0%}" + ("" if error_share <= TARGET_RELATIVE_ERROR else " (above the 10 % target)")


def tar_images(data: bytes, limit: int) -> list[tuple[str, bytes]]:
    """The first ``limit`` image members ``(name, bytes)`` of tar bytes (those of a truncated read
    up to where it stops)."""
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



def folder_facts(shown: str, listed: list[tuple[str, int]], complete: bool, got: dict, cold: bool,
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
