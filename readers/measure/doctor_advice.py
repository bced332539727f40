"""``doctor``'s advice: one line per action, most helpful first, each with its predicted effect.

An action is named by the start of its line (``pack:``, ``stage:``, ``cache:``, ``more workers:``,
``re-encode smaller:``, ``nothing to gain``); each appears at most once. Whether decoding is the limit
or the workers wait on storage is ``watch``'s rule (:func:`~shardfeed.readers.measure.watch_rules.loader_verdict`)
on the predicted share of the workers' time spent on the CPU (the predicted rate over the decode-only
ceiling); ``more workers`` says one of the two, never both, with ``watch``'s worker counts
(:func:`~shardfeed.readers.measure.watch_rules.storage_workers`, or one per core) and its resize
target (:func:`~shardfeed.readers.measure.watch_rules.resize_target`).
"""

from __future__ import annotations

from .report import fmt_bytes
from .watch_rules import loader_verdict, resize_target

__all__ = ["PACK_ADVICE_MIN_GAIN", "ADVICE_MIN_GAIN", "advice_lines", "advice_action", "decode_bound"]

#: Packing is advised when the packed prediction is at least this many times the folder's (a pack
#: costs a copy of the dataset and a change of reader: worth it for a clear gain).
PACK_ADVICE_MIN_GAIN = 1.5
#: Staging, caching and more workers are advised from this gain on.
ADVICE_MIN_GAIN = 1.25


def decode_bound(base: float, local: float, nw: int, remote: bool = False) -> bool:
    """Whether decoding is the limit of a loader predicted at ``base`` images/s whose decode-only
    ceiling is ``local``: ``watch``'s ``cpu-bound`` on the workers' CPU busy share ``base / local``
    (the first kind of a borderline verdict)."""
    verdict = loader_verdict(num_workers=max(1, nw), workers_cpu_busy_share=min(1.0, base / local) if local else None,
                             remote=remote)
    kind = verdict["between"][0] if verdict["between"] else verdict["kind"]
    return kind == "cpu-bound"


def advice_action(line: str) -> str:
    """The action an advice line names: the text before its first ``:`` (``"more workers"``)."""
    return line.split(":", 1)[0]


def _more_workers(kind: str, pred: dict, base: float, local: float, nw: int, cpus: int, decoding: bool) -> str | None:
    """The one ``more workers`` line: decoding is the limit and cores are free, or the workers wait
    on storage and more of them are predicted to help; None when neither."""
    if decoding:
        if nw >= cpus:
            return None
        at_cores = local * cpus / max(1, nw)
        return (f"more workers: num_workers={nw} → {cpus}: decoding is the limit and this machine has {cpus} cores "
                f"(up to about {at_cores:,.0f} images/s)")
    more = pred["more_workers"]
    more_rate = more["folder_images_per_s"] if kind == "folder" else more["packed_images_per_s"]
    if more_rate and more_rate >= ADVICE_MIN_GAIN * base:
        return (f"more workers: num_workers={nw} → {more['num_workers']} → about {more_rate:,.0f} images/s "
                f"({more_rate / base:.1f}x): the workers wait on storage, more of them keep more reads in flight "
                f"(this machine has {cpus} cores)")
    return None


def advice_lines(kind: str, root: str, storage: dict, files: dict, dec: dict, pred: dict, nw: int, cpus: int,
                 ram: int, shm: int | None) -> list[str]:
    """The advice of a :class:`~shardfeed.readers.measure.doctor.DoctorReport` (module docstring).

    Args:
        kind: ``folder`` or a packed format; ``root``: the dataset as shown in commands.
        storage, files, dec, pred: the report's sections; ``nw``: the workers predicted for;
        ``cpus``, ``ram`` (bytes available), ``shm`` (bytes free in /dev/shm, None without it).
    """
    out: list[str] = []
    folder, packed, local = pred["folder_images_per_s"], pred["packed_images_per_s"], pred["local_images_per_s"]
    total = files["estimated_total_bytes"]
    if folder is None or packed is None:
        return ["no prediction: the sampled images could not be decoded (see the warnings)"]
    base = folder if kind == "folder" else packed
    if kind == "folder" and packed >= PACK_ADVICE_MIN_GAIN * folder:
        out.append(f"pack: shardfeed pack {root} OUT --format wds → about {packed:,.0f} images/s instead of "
                   f"{folder:,.0f} at num_workers={nw} ({packed / folder:.1f}x): one open per shard, sequential "
                   "reads")
    remote = storage["fs_class"] in ("fuse", "nfs", "network")
    if remote and local >= ADVICE_MIN_GAIN * base:
        where = "/dev/shm" if shm is not None and total < 0.5 * shm else "a local NVMe disk"
        out.append(f"stage: shardfeed stage OUT {where}/… (about {fmt_bytes(total)}) → about {local:,.0f} images/s "
                   f"({local / base:.1f}x): read from local storage")
    if local >= ADVICE_MIN_GAIN * base and total < 0.5 * ram:
        out.append(f'cache: make_loader(OUT, cache="memory") (about {fmt_bytes(total)} of '
                   f"{fmt_bytes(ram)} RAM available) → about {local:,.0f} images/s after the first epoch")
    decoding = decode_bound(base, local, nw, remote)
    workers = _more_workers(kind, pred, base, local, nw, cpus, decoding)
    if workers:
        out.append(workers)
    px = dec.get("median_pixels")
    side = resize_target(dec.get("image_size"))
    if decoding and px and px > 1.5 * side * side:
        gain = px / (side * side * 1.33)
        out.append(f"re-encode smaller: shardfeed pack {root} OUT --resize {side} → decode about {gain:.1f}x cheaper "
                   f"(median {px:,.0f} pixels per image now); or decode at a reduced scale with "
                   "make_loader(image_size=...)")
    if not out:
        out.append(f"nothing to gain on the data path at num_workers={nw}: about {base:,.0f} images/s, limited by "
                   "decoding on this CPU; if the training loop still waits for data, run it under 'shardfeed watch'")
    return out
