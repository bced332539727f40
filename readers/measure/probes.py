"""Probes of the machine and the data: mounts, memory, stored images, torch's ``DataLoader`` internals.

Each probe reads a little, never blocks for long and answers None (or an empty result) where it
cannot tell: a probe only refines a measurement or its advice.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from ..storage.redact import shown_source

__all__ = ["read_text", "meminfo", "loader_knobs", "data_root", "data_facts", "slow_mount", "SLOW_FS_TYPES",
           "SIZE_PROBE_IMAGES", "SIZE_PROBE_MAX_BYTES", "batch_ready", "held_out_of_order", "loader_worker_pids"]


def read_text(path: str) -> str | None:
    """The text of a (``/proc``) file; None when it cannot be read."""
    try:
        with open(path, "r") as f:
            return f.read()
    except OSError:
        return None


def meminfo() -> dict:
    """``/proc/meminfo`` as ``{key: bytes}`` (kB values converted); {} off Linux."""
    text = read_text("/proc/meminfo") or ""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def loader_knobs(loader: Any) -> dict:
    """The loader's knobs as found: ``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``,
    ``batch_size`` (None where the iterable has none; a value that is no plain scalar as its text)."""
    out = {}
    for key in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"):
        value = getattr(loader, key, None)
        out[key] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
    return out


def data_root(loader: Any) -> str | None:
    """Where the loader's dataset lives, as shown in reports (credentials hidden); None when unknown."""
    ds = getattr(loader, "dataset", None)
    root = getattr(ds, "root", None)
    if not isinstance(root, (str, os.PathLike)):  # a packed dataset of ours: its location
        from ..sources.source_base import SourceBase

        location = getattr(ds, "location", None) if isinstance(ds, SourceBase) else None
        root = str(location) if location is not None else None
    return shown_source(root) if isinstance(root, (str, os.PathLike)) else None


#: Images whose header :func:`data_facts` reads to learn the stored sizes (a few, cheaply).
SIZE_PROBE_IMAGES = 4
#: The most bytes read for one probed image (larger ones are left out).
SIZE_PROBE_MAX_BYTES = 32 * 1024 * 1024
#: File system types taken as slow (network or user-space) storage for the ``stage`` advice.
SLOW_FS_TYPES = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "sshfs", "9p", "ceph", "lustre", "gpfs", "glusterfs",
                 "davfs", "s3fs", "fuse")


def _image_side(data: bytes) -> int | None:
    """The shorter side, px, from an encoded image's header (None when it does not parse)."""
    import io

    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
    except Exception:  # noqa: BLE001 - a sample that does not parse tells no size
        return None
    return min(int(w), int(h)) if w > 0 and h > 0 else None


def _file_side(path: str | os.PathLike) -> int | None:
    try:
        if os.path.getsize(path) > SIZE_PROBE_MAX_BYTES:
            return None
        with open(path, "rb") as f:
            return _image_side(f.read(SIZE_PROBE_MAX_BYTES))
    except (OSError, TypeError, ValueError):
        return None


def _probe_sides(ds: Any, fmt: str | None, remote: bool | None) -> list[int]:
    """Shorter sides of up to :data:`SIZE_PROBE_IMAGES` stored images of ``ds`` (local files only)."""
    n = SIZE_PROBE_IMAGES
    sides: list[int] = []
    if remote:
        return sides
    from ..format.registry import describe

    spec = describe(fmt) if fmt is not None and fmt != "folder" else None
    if spec is not None and spec.tar_shards:
        import tarfile

        from ..format.manifest import IMAGE_EXTENSIONS

        shards = getattr(getattr(ds, "manifest", None), "shards", None) or []
        location = getattr(ds, "location", None)
        if not shards or location is None:
            return sides
        try:
            with tarfile.open(location.where(shards[0].name), "r:") as tar:
                for _ in range(16 * n):
                    member = tar.next()
                    if member is None or len(sides) >= n:
                        break
                    ext = member.name.rsplit(".", 1)[-1].lower()
                    if member.isfile() and ext in IMAGE_EXTENSIONS and member.size <= SIZE_PROBE_MAX_BYTES:
                        f = tar.extractfile(member)
                        side = _image_side(f.read()) if f is not None else None
                        if side:
                            sides.append(side)
        except (OSError, tarfile.TarError, ValueError):
            pass
        return sides
    read_raw = getattr(ds, "read_raw", None)
    length = len(ds) if hasattr(ds, "__len__") else 0
    if spec is not None and not spec.sharded:  # LMDB: opening its environment here would share it with later workers
        return sides
    if callable(read_raw) and length:
        for i in range(min(n, length)):
            try:
                data = read_raw(i)[1]
            except Exception:  # noqa: BLE001 - an unreadable sample tells no size
                continue
            side = _image_side(data) if isinstance(data, (bytes, bytearray, memoryview)) else None
            if side:
                sides.append(side)
        return sides
    for attr in ("samples", "imgs", "paths", "files"):  # torchvision-style and plain file lists
        items = getattr(ds, attr, None)
        if not isinstance(items, (list, tuple)) or not items:
            continue
        for item in items[:n]:
            path = item[0] if isinstance(item, (list, tuple)) and item else item
            if isinstance(path, (str, os.PathLike)):
                side = _file_side(path)
                if side:
                    sides.append(side)
        break
    return sides


def slow_mount(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies on a network or user-space file system (``/proc/mounts``; False when unknown)."""
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    for line in lines[:100_000]:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
            best, fstype = mnt, parts[2]
    return any(fstype == t or fstype.startswith(t + ".") for t in SLOW_FS_TYPES)


def data_facts(loader: Any) -> dict:
    """What a loader reads, as far as it can be learnt cheaply; the advice of :func:`diagnose` depends on it.

    Args:
        loader: the watched iterable (a ``DataLoader``; its ``dataset`` is looked at).

    Returns:
        ``{"reader", "format", "remote", "slow_storage", "decoder", "image_size", "image_side"}``:
        ``reader`` ``"shardfeed"`` (one of our sources) or ``"other"`` (None without a dataset);
        ``format`` ``"webdataset"``, ``"lmdb"``, ``"folder"``, ``"memory"`` (``cache="memory"``, then
        also ``"in_memory": True``) or None (unknown); ``remote``: the
        location's ``remote`` capability (None when unknown); ``slow_storage``: a local dataset (ours, or a
        user's with a ``root`` or a list of files) on a
        network or user-space file system; ``decoder``: the JPEG decoder in use (``"simplejpeg"``,
        ``"pil"``, ``"cv2"``; None when unknown); ``image_size``: the loader's output size, px;
        ``image_side``: the median shorter side of a few stored images, px (from their headers,
        local files only; None when unknown).
    """
    ds = getattr(loader, "dataset", None)
    facts = {"reader": None, "format": None, "remote": None, "slow_storage": False, "decoder": None,
             "image_size": None, "image_side": None}
    if ds is None:
        return facts
    from ..format.registry import FORMATS
    from ..sources.source_base import SourceBase

    ours = isinstance(ds, SourceBase)
    facts["reader"] = "shardfeed" if ours else "other"
    fmt = None
    for obj in (ds, getattr(ds, "manifest", None)):
        for attr in ("source_format", "format"):
            value = getattr(obj, attr, None)
            if fmt is None and isinstance(value, str) and (value == "folder" or value in FORMATS):
                fmt = value
    from ..sources.memory_cache import MemoryCachedSource

    if isinstance(ds, MemoryCachedSource):  # cache="memory": the samples are in RAM already
        fmt, facts["in_memory"] = "memory", True
    facts["format"] = fmt if ours else None
    location = getattr(ds, "location", None) or getattr(ds, "store", None)
    remote = getattr(location, "remote", None)
    if ours and remote is None and fmt == "folder":
        remote = False  # a folder on the local file system
    facts["remote"] = remote if isinstance(remote, bool) else None
    if ours:
        root = getattr(location, "root", None) if location is not None else getattr(ds, "root", None)
        if remote is False and isinstance(root, (str, os.PathLike)):
            facts["slow_storage"] = slow_mount(root)
        size = getattr(ds, "image_size", None)
        facts["image_size"] = int(size) if isinstance(size, int) and not isinstance(size, bool) else None
        decoder = getattr(getattr(ds, "sample_decoder", None), "decoder", None)
        if decoder == "auto":
            from ..decode.jpeg import simplejpeg_available

            decoder = "simplejpeg" if simplejpeg_available() else "pil"
        facts["decoder"] = decoder if isinstance(decoder, str) else None
    if not ours:  # a user's dataset: the mount of its root or of its first file
        first = next((x for x in (getattr(ds, a, None) for a in ("samples", "imgs", "paths", "files"))
                      if isinstance(x, (list, tuple)) and x), [None])[0]
        first = first[0] if isinstance(first, (list, tuple)) and first else first
        where = getattr(ds, "root", None) or first
        facts["slow_storage"] = isinstance(where, (str, os.PathLike)) and slow_mount(where)
    sides = _probe_sides(ds, facts["format"], facts["remote"])
    if sides:
        facts["image_side"] = int(statistics.median(sides))
    return facts




def batch_ready(it: Any) -> bool | None:
    """Whether a batch has already come back from a worker when the loop asks a ``DataLoader``
    iterator for the next one: the batch due is held out of order, or the result queue (the
    pinning thread's queues too) is not empty. (The watch then also checks that the call did not
    hold a later batch aside while it waited for the due one; if it did, the request was not ready.)

    A loop that stalls although its batches were ready waits on the hand-off itself (the main
    process receiving and unpickling each batch, mapping its shared memory), not on the workers.
    Looks only at torch's multi-process iterator (``_task_info``, ``_rcvd_idx``, ``_data_queue``;
    torch 2.x) and never blocks: a non-blocking poll of each queue, a few microseconds.

    Returns:
        True or False; None for any other iterable, or when torch's internals are not as expected.
    """
    it = _torch_iterator(it)
    try:
        info, idx, data_queue = it.__dict__.get("_task_info"), it.__dict__.get("_rcvd_idx"), \
            it.__dict__.get("_data_queue")
        if not isinstance(info, dict) or not isinstance(idx, int) or data_queue is None:
            return None
        entry = info.get(idx)
        if isinstance(entry, tuple) and len(entry) == 2:
            return True
        queues = [data_queue]
        if it.__dict__.get("_pin_memory"):
            queues.append(it.__dict__.get("_worker_result_queue"))
        return any(q is not None and not q.empty() for q in queues)
    except Exception:  # noqa: BLE001 - a torch whose internals differ: unknown, never an error in the loop
        return None


def _torch_iterator(it: Any, max_depth: int = 4) -> Any:
    """The ``DataLoader`` iterator inside ``it``: a wrapper that hands the loop batches of its own
    (shardfeed's loader, this module's epoch) holds the one it wraps as ``_it``."""
    for _ in range(max_depth):
        d = getattr(it, "__dict__", None)
        if not isinstance(d, dict) or "_task_info" in d or d.get("_it") is None:
            return it
        it = d["_it"]
    return it


def held_out_of_order(it: Any) -> int | None:
    """Batches a ``DataLoader`` iterator holds that came back before their turn (None: not known)."""
    it = _torch_iterator(it)
    try:
        info = it.__dict__.get("_task_info")
        return sum(1 for v in list(info.values()) if isinstance(v, tuple) and len(v) == 2) \
            if isinstance(info, dict) else None
    except Exception:  # noqa: BLE001 - torch internals not as expected: unknown
        return None


def loader_worker_pids(it: Any, loader: Any) -> list[int] | None:
    """PIDs of the worker processes of ``it``, an iterator over ``loader`` (torch's multi-process
    iterator keeps them in ``_workers``): [] when it has none (a single-process iterator), None when
    not known (an iterable that is no ``DataLoader`` but says it has workers)."""
    workers = getattr(_torch_iterator(it), "_workers", None) if it is not None else None
    if workers is None:
        workers = getattr(it, "_workers", None)
    if workers is None:
        return [] if not getattr(loader, "num_workers", None) else None
    return [p.pid for p in workers if getattr(p, "pid", None)]
