"""``doctor`` on a dataset behind a URL: a packed WebDataset dataset over ``http(s)://`` or ``s3://``,
or an image folder in a bucket (class folders, no manifest).

The time to the response stands for the open latency; the page cache is not involved. Reports and
progress lines name the URL without its ``user:password@``.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any

from ..format.manifest import IMAGE_EXTENSIONS
from ..storage.redact import shown_source
from ..format.registry import describe
from .doctor_advice import advice_lines
from .doctor_folder import (CHUNK_BYTES, DEFAULT_MAX_FILES, FIRST_READ_BYTES, FOLDER_MAX_FILES, MAX_DECODE_BYTES,
                            READ_REQUEST_BYTES, SEQ_READ_BYTES, decode_with_batch, folder_facts, probe_folder,
                            tar_images)
from .doctor_model import add_busy_machine, predict_with_more_workers
from .doctor_report import DoctorReport, latency_ms, machine_facts, others_cpu_share, probe_workers
from .report import percentile

__all__ = ["doctor_url"]

_CHUNK = CHUNK_BYTES


def doctor_url(url: str, *, storage_options, num_workers, max_files, max_list, budget_s, decoder, seed, image_size,
                say, t_start, machine0, ours0) -> DoctorReport:
    """A dataset behind ``http(s)://`` or ``s3://``: a packed dataset (time to the response, first
    64 KiB, sequential reads of up to 4 shards, 64 MB each at most, decode of the first shard's
    samples) or, where the location lists and holds class folders but no manifest, an image
    folder (:func:`_doctor_remote_folder`). Reports and progress name the URL without its
    ``user:password@``."""
    from ..errors import ManifestError
    from ..storage.location import folder_kind
    from ..storage.opener import open_location, url_scheme

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
    cpus, ram, shm = machine_facts(None)
    nw = probe_workers(num_workers, cpus)
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
        reads.append(_timed_remote_read(loc, name, SEQ_READ_BYTES if i < 4 else FIRST_READ_BYTES,
                                        keep_max=8 * _CHUNK if i == 0 else 0))
    opens, firsts = [r["open_s"] for r in reads], [r["first_s"] for r in reads]
    seq = [r for r in reads if r["rest"]]
    seq_bytes, seq_s = sum(r["rest"] for r in seq), sum(r["rest_s"] for r in seq)
    measured = seq_bytes >= _CHUNK
    thr = seq_bytes / max(seq_s, 1e-9) if measured else READ_REQUEST_BYTES / max(statistics.median(firsts), 1e-6)
    images = tar_images(reads[0]["data"], max_files or DEFAULT_MAX_FILES)
    total = float(sum(sh.num_bytes for sh in manifest.shards))
    count = manifest.num_samples
    sizes = [len(b) for _, b in images]
    median_bytes = float(statistics.median(sizes)) if sizes else total / max(count, 1)
    say(f"decoding {len(images)} images ...")
    dec, terms = decode_with_batch(images, decoder, time.monotonic() + budget_s * 0.2, image_size)
    t_dec = 1.0 / dec["images_per_cpu_s"] if dec["images_per_cpu_s"] else None
    costs = dict(t_decode_s=t_dec, t_open_s=statistics.median(opens), t_first_read_s=statistics.median(firsts),
                 median_bytes=median_bytes, read_bytes_per_s=thr, **terms)
    pred = predict_with_more_workers(nw, cpus, costs)
    storage = {"fs_type": url_scheme(url), "fs_class": "network", "mount_point": None,
               "open_latency_ms": latency_ms(opens), "first_read_latency_ms": latency_ms(firsts),
               "read_mb_per_s": thr / 1e6,
               "read_mb_per_s_measured": measured, "cold": False}
    files = {"count": count, "count_complete": True, "sampled": len(opens), "median_bytes": median_bytes,
             "p95_bytes": percentile(sizes, 95) if sizes else median_bytes, "mean_bytes": total / max(count, 1),
             "estimated_total_bytes": total}
    advice = advice_lines(manifest.format, shown, storage, files, dec, pred, nw, cpus, ram, shm)
    others = others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
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
    cpus, ram, shm = machine_facts(None)
    nw = probe_workers(num_workers, cpus)
    warnings: list[str] = []
    sizes = dict(listed)

    def read(name: str) -> dict:
        r = _timed_remote_read(loc, name, max(sizes[name], 1), keep_max=MAX_DECODE_BYTES)
        r["path"] = name
        return r

    got = probe_folder(listed, rng=random.Random(seed), max_files=max_files or FOLDER_MAX_FILES,
                       deadline=t_start + budget_s * 0.8, cold=False, decoder=decoder, image_size=image_size,
                       num_workers=nw, cpus=cpus, say=say, read=read)
    files, reads, dec, costs, extra = folder_facts(shown, listed, complete, got, False, warnings)
    opens, firsts = [r["open_s"] for r in reads], [r["first_s"] for r in reads]
    pred = predict_with_more_workers(nw, cpus, costs)
    pred.update(extra)
    thr = costs["read_bytes_per_s"]
    storage = {"fs_type": scheme, "fs_class": "network", "mount_point": None,
               "open_latency_ms": latency_ms(opens), "first_read_latency_ms": latency_ms(firsts),
               "read_mb_per_s": thr / 1e6,
               "read_mb_per_s_measured": files.pop("throughput_measured"), "cold": files.pop("cold"),
               "file_cpu_ms": costs["t_file_cpu_s"] * 1e3}
    advice = advice_lines("folder", shown, storage, files, dec, pred, nw, cpus, ram, shm)
    others = others_cpu_share(machine0, ours0, time.monotonic() - t_start, cpus)
    if others is not None:
        add_busy_machine(pred, others, nw, cpus, costs, warnings)
    return DoctorReport(path=shown, kind="folder", storage=storage, files=files, decode=dec, cpus=cpus,
                        ram_available_bytes=ram, shm_free_bytes=shm, num_workers=nw, predicted=pred, advice=advice,
                        probe_s=time.monotonic() - t_start, others_cpu_share=others, warnings=warnings)
