"""``doctor``'s report (:class:`DoctorReport`) and the facts it gathers about the machine and the storage:
the file-system class of a mount, cores, RAM, ``/dev/shm``, the CPU other processes used, latencies.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .doctor_folder import error_text
from .report import fmt_bytes, percentile

__all__ = ["DoctorReport", "fs_class", "fs_type_of", "machine_facts", "others_cpu_share", "latency_ms",
           "storage_facts", "probe_workers"]

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


def fs_type_of(path: Path) -> tuple[str | None, str | None]:
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
            ``image_size``, ``batch`` (the collate, hand-off and conversion to float per image:
            :func:`~shardfeed.readers.measure.doctor_model.batch_costs`); an image folder also
            ``by_format`` (``[{"format", "share", "decoder", "images_per_cpu_s", "sampled"}]``, the
            largest share first: the library that decodes each format).
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
            (:mod:`~shardfeed.readers.measure.doctor_advice`).
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
                 f"({_decoders_text(d)}; median {_num(d.get('median_pixels'))} pixels){_batch_text(d)}",
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


def _batch_text(dec: dict) -> str:
    """``"; per image also collate 0.02 ms, hand-off 0.03 ms, to float 0.40 ms"``, or nothing when not measured."""
    b = dec.get("batch") or {}
    if b.get("collate_ms_per_image") is None:
        return ""
    return (f"; per image also collate {b['collate_ms_per_image']:.2f} ms, hand-off {b['handoff_ms_per_image']:.2f} "
            f"ms, to float {b['to_float_ms_per_image']:.2f} ms")


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



def machine_facts(path: Path | None) -> tuple[int, int, int | None]:
    import psutil

    shm = None
    if os.path.isdir("/dev/shm"):
        try:
            shm = int(psutil.disk_usage("/dev/shm").free)
        except OSError:
            shm = None
    return psutil.cpu_count() or 1, int(psutil.virtual_memory().available), shm


def others_cpu_share(machine0, ours0, wall_s: float, cpus: int) -> float | None:
    import psutil

    m1, o1 = psutil.cpu_times(), psutil.Process().cpu_times()
    busy = sum(getattr(m1, k) - getattr(machine0, k) for k in m1._fields if k not in ("idle", "iowait", "guest",
                                                                                     "guest_nice"))
    ours = (o1.user + o1.system) - (ours0.user + ours0.system)
    if wall_s <= 0:
        return None
    return min(1.0, max(0.0, (busy - ours) / (wall_s * cpus)))


def latency_ms(values: list[float]) -> dict:
    return {"p50": percentile(values, 50) * 1e3, "p95": percentile(values, 95) * 1e3} if values else \
        {"p50": None, "p95": None}



def storage_facts(fs_type: str | None, mount_point: str | None, opens: list[float], firsts: list[float], thr: float,
                   measured: bool, cold: bool, t_file_cpu: float) -> dict:
    """The report's ``storage`` section (latencies in ms, throughput in MB/s)."""
    return {"fs_type": fs_type, "fs_class": fs_class(fs_type), "mount_point": mount_point,
            "open_latency_ms": latency_ms(opens), "first_read_latency_ms": latency_ms(firsts),
            "read_mb_per_s": thr / 1e6, "read_mb_per_s_measured": measured, "cold": cold,
            "file_cpu_ms": t_file_cpu * 1e3}


def probe_workers(num_workers: int | None, cpus: int) -> int:
    """The workers of the prediction: ``num_workers``, or the CPU count.

    Raises:
        ValueError: a negative count.
    """
    nw = cpus if num_workers is None else num_workers
    if nw < 0:
        raise ValueError(f"num_workers must be 0 or more, got {nw}")
    return nw

