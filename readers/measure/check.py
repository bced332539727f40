"""``verify``'s first step: do the two datasets hold the same samples and classes?"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
from typing import Any

from ..storage.redact import shown_source
from .bench import dataset_len
from .report import DatasetMismatchError

__all__ = ["check_same_samples"]

_REPACK = ". Repack it from this folder (shardfeed pack) before comparing"


def _open_info(source: str | os.PathLike, **options: Any):
    from ..sources.dataset import open_dataset

    return open_dataset(source, **options)


def _class_map(ds: Any) -> dict[str, int]:
    for obj in (ds, getattr(ds, "manifest", None)):
        value = getattr(obj, "class_to_idx", None)
        if value:
            return dict(value)
    for obj in (ds, getattr(ds, "manifest", None)):
        value = getattr(obj, "classes", None)
        if value:
            return {c: i for i, c in enumerate(value)}
    return {}


def _skipped_of(ds: Any) -> list:
    m = getattr(ds, "manifest", None)
    return list(getattr(m, "skipped", None) or [])


def _iter_raw(ds: Any):
    """Every raw sample of a dataset opened with ``decode=False``, in the main process."""
    fn = getattr(ds, "iter_samples", None)
    if callable(fn):
        yield from fn()
        return
    if hasattr(ds, "__iter__"):
        yield from iter(ds)
        return
    for i in range(len(ds)):
        yield ds[i]


def _class_map_problem(cb: dict[str, int], ca: dict[str, int]) -> str | None:
    if cb == ca:
        return None
    only_b = sorted(set(cb) - set(ca))
    only_a = sorted(set(ca) - set(cb))
    moved = sorted(c for c in set(cb) & set(ca) if cb[c] != ca[c])
    parts = []
    if only_b:
        parts.append(f"only in BEFORE: {', '.join(only_b[:5])}")
    if only_a:
        parts.append(f"only in AFTER: {', '.join(only_a[:5])}")
    if moved:
        parts.append(f"other index: {', '.join(f'{c} ({cb[c]} vs {ca[c]})' for c in moved[:5])}")
    return "the class maps differ (" + "; ".join(parts) + ")"


def _count_problem(nb: int | None, na: int | None, ds_a: Any) -> str | None:
    if nb == na:
        return None
    msg = f"BEFORE holds {nb} samples, AFTER {na}"
    skipped = _skipped_of(ds_a)
    if skipped:
        msg += (f" (AFTER's manifest lists {len(skipped)} skipped file(s), e.g. {skipped[0].get('path')}: "
                f"{skipped[0].get('reason')})")
    return msg


def _deep_differences(ds_b: Any, ds_a: Any) -> tuple[list[str], int]:
    """Every raw sample of both matched by original path: ``(differences, samples compared)``."""
    seen: dict[str, tuple[bytes, int]] = {}
    for s in _iter_raw(ds_b):
        path = s.meta.get("path", s.key)
        seen[path] = (hashlib.sha256(bytes(s.data)).digest(), int(s.label))
    diffs: list[str] = []
    found: set[str] = set()
    compared = 0
    for s in _iter_raw(ds_a):
        path = s.meta.get("path")
        if path is None or path not in seen:
            diffs.append(f"{path or s.key}: in AFTER only")
            continue
        if path in found:
            diffs.append(f"{path}: twice in AFTER")
        found.add(path)
        digest, label = seen[path]
        if hashlib.sha256(bytes(s.data)).digest() != digest:
            diffs.append(f"{path}: other bytes")
        elif int(s.label) != label:
            diffs.append(f"{path}: label {s.label} in AFTER, {label} in BEFORE")
        compared += 1
    diffs += [f"{p}: missing in AFTER" for p in sorted(set(seen) - found)]
    return diffs, compared


def check_same_samples(before: str | os.PathLike, after: str | os.PathLike, *, deep: bool = False,
                       **open_options: Any) -> dict:
    """Check that AFTER holds the same samples and classes as BEFORE.

    Always compares the sample counts and the class maps. ``deep`` also reads every raw sample
    of both (``open_dataset(..., decode=False)``), matches them by ``meta["path"]`` and compares
    their bytes (SHA-256) and labels. ``open_options``: ``extensions``, ``storage_options``
    (for remote sources) and ``follow_external_links`` (an image folder) are passed to
    ``open_dataset``; the others are ignored.

    Returns:
        ``{"num_samples", "num_classes", "deep", "num_compared"}``.

    Raises:
        DatasetMismatchError: counts, class maps, paths, bytes or labels differ (the message names
            the first differences).
    """
    opts = {k: v for k, v in open_options.items() if k in ("extensions", "storage_options", "follow_external_links")}
    # the whole dataset in this process: one rank, no shuffle
    opts.update(rank=0, world_size=1, shuffle=False)
    ds_b = _open_info(before, decode=False, **opts)
    ds_a = _open_info(after, decode=False, **opts)
    differ = f"{shown_source(after)} does not hold the same samples as {shown_source(before)}"
    try:
        nb, na = dataset_len(ds_b), dataset_len(ds_a)
        cb = _class_map(ds_b)
        problems = [p for p in (_class_map_problem(cb, _class_map(ds_a)), _count_problem(nb, na, ds_a)) if p]
        if problems:
            raise DatasetMismatchError(f"{differ}: " + "; ".join(problems)
                                       + _REPACK)
        compared = 0
        if deep:
            diffs, compared = _deep_differences(ds_b, ds_a)
            if diffs:
                raise DatasetMismatchError(f"{differ} ({len(diffs)} "
                                           f"difference(s)): " + "; ".join(diffs[:5])
                                           + ("; ..." if len(diffs) > 5 else "") + _REPACK)
        return {"num_samples": nb, "num_classes": len(cb), "deep": deep, "num_compared": compared}
    finally:
        for ds in (ds_b, ds_a):
            close = getattr(ds, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()
        del ds_b, ds_a
        gc.collect()
