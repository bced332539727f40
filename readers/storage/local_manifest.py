"""A local dataset folder: its manifest loaded and checked against the files beside it, and the
description of a pack that did not finish there.

For any storage (URLs included) use :func:`shardfeed.readers.load_manifest`
(:func:`~shardfeed.readers.storage.opener.load_manifest`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import IncompleteDatasetError, ManifestError, UnsupportedURLError
from ..file_io import read_small_file
from ..format.manifest import (
              LMDB_DATA_NAME,
              MANIFEST_NAME,
              MAX_MANIFEST_BYTES,
              PACK_PLAN_NAME,
              PACK_STATE_DIR,
              PATH_INDEX_NAME,
              WRITE_DATASET_MARK,
              Manifest,
          )
from ..format.registry import describe
from .manifest_cache import parse_manifest

__all__ = ["describe_unfinished", "unfinished_pack_error", "find_manifest_path", "load_manifest",
           "check_files_present"]


def describe_unfinished(root: str | os.PathLike[str]) -> tuple[str, str]:
    """What an unfinished pack left in local folder ``root`` and what finishes it, as
    ``(found, fix)`` phrases: a stopped ``convert``, a stopped pack (its plan), a stopped
    ``write_dataset`` (its mark) or a state folder without a plan. The one description of every
    command that meets such a folder (readers and ``index`` alike)."""
    root = Path(root)
    state = root / PACK_STATE_DIR
    try:
        plan = json.loads(read_small_file(state / PACK_PLAN_NAME, max_bytes=1 << 20, what="the pack plan"))
    except (OSError, ValueError, RecursionError):
        plan = None
    plan = plan if isinstance(plan, dict) else {}
    if plan.get("command") == "convert":
        return (f"an unfinished `shardfeed convert` ({state}/{PACK_PLAN_NAME})",
                f"run the same `shardfeed convert SRC {root} --overwrite` again (a convert is not resumed)")
    if plan:
        done = sum(1 for n in _names_in(state) if re.fullmatch(r"[0-9]{6,}\.json", n))
        return (f"an unfinished pack ({state}/{PACK_PLAN_NAME}, {done} finished shard record(s))",
                f"finish it with `shardfeed pack SRC {root} --resume` (the same source and options), or rebuild it "
                "with --overwrite")
    if (state / WRITE_DATASET_MARK).is_file():
        return (f"a write_dataset that stopped ({state}/{WRITE_DATASET_MARK})",
                "call write_dataset again into an empty folder (its shards are not all there)")
    return (f"a pack's state folder {state}/ without a plan (stopped as it started)",
            f"run the pack again (`shardfeed pack SRC {root} --resume` starts it afresh)")


def _names_in(folder: Path, limit: int = 1_000_000) -> list[str]:
    """The names in ``folder`` (at most ``limit``; none when it cannot be listed)."""
    try:
        with os.scandir(folder) as it:
            return [e.name for _, e in zip(range(limit), it)]
    except OSError:
        return []


def unfinished_pack_error(root: str) -> IncompleteDatasetError:
    """The error for a dataset location whose pack did not finish (its state, no manifest): for a
    local folder, what was found there and what finishes it (:func:`describe_unfinished`); for a
    bucket prefix, the pack's fix (``--resume``)."""
    if "://" not in str(root) and os.path.isdir(Path(root) / PACK_STATE_DIR):
        found, fix = describe_unfinished(root)
        return IncompleteDatasetError(f"{root}: no {MANIFEST_NAME}; the command that wrote it did not finish: it "
                                      f"holds {found}: {fix}")
    return IncompleteDatasetError(f"{root}: no {MANIFEST_NAME}; the pack that wrote it did not finish. Finish it "
                                  f"with `shardfeed pack SRC {root} --resume`, or rebuild it")


def find_manifest_path(path: str | os.PathLike[str]) -> Path:
    """Resolve a dataset directory or a manifest file path to the manifest file path."""
    p = Path(path)
    return p / MANIFEST_NAME if p.is_dir() else p

def load_manifest(path: str | os.PathLike[str], *, check_files: bool = True) -> Manifest:
    """Load and validate a local manifest (a dataset directory or its ``manifest.json``).

    Args:
        path: the dataset directory or the manifest file: a local path or a ``file://`` URL
            (any storage, URLs included: :func:`shardfeed.readers.load_manifest`, which is
            :func:`~shardfeed.readers.storage.opener.load_manifest`).
        check_files: also check that every listed file exists with the listed size (cheap; hashes
            are for ``shardfeed check``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IncompleteDatasetError: the directory holds shards but no manifest (interrupted pack).
        ManifestError: bad manifest, a local manifest that is not a regular file or is larger than
            :data:`MAX_MANIFEST_BYTES`, or files missing / of the wrong size.
        UnsupportedURLError: a URL other than ``file://``.
    """
    if isinstance(path, str) and "://" in path:
        if not path.lower().startswith("file://"):
            raise UnsupportedURLError(f"{path}: this function reads a local manifest; for a URL use "
                                      "shardfeed.readers.load_manifest (or open_location(url).load_manifest())")
        path = path[len("file://"):]
    p = Path(path)
    if not p.exists() and p.name == MANIFEST_NAME and p.parent.is_dir():
        p = p.parent  # "DIR/manifest.json" that is not there: say what DIR is
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    mpath = find_manifest_path(p)
    if not mpath.exists():
        root = mpath.parent
        state_left = any(p.name != PATH_INDEX_NAME for p in root.glob(".shardfeed-*"))  # a pack's, not its path index
        if any(root.glob("*.tar")) and not (root / LMDB_DATA_NAME).exists() and not state_left:
            # no pack state: not an interrupted shardfeed pack (--resume would refuse it)
            raise ManifestError(
                f"{root}: .tar shards but no {MANIFEST_NAME} (and no unfinished shardfeed pack): shards written by "
                f"another tool, or a dataset whose manifest was lost. Make them readable with "
                f"`shardfeed index {root}` (writes the manifest and offset indexes beside them)")
        if (root / LMDB_DATA_NAME).exists() or state_left:
            raise unfinished_pack_error(str(root))
        if any(d.is_dir() and not d.name.startswith(".") for d in root.iterdir()):
            raise ManifestError(f"{root}: an image folder (or other folder), not a packed dataset: pack it first "
                                f"with `shardfeed pack {root} OUT`")
        raise ManifestError(f"{root}: no {MANIFEST_NAME}: not a packed dataset (pack it with `shardfeed pack`, "
                            "or write a manifest for existing shards with `shardfeed index`)")
    manifest = parse_manifest(read_small_file(mpath, max_bytes=MAX_MANIFEST_BYTES, what="the manifest"), str(mpath))
    if check_files:
        check_files_present(manifest, mpath.parent)
    return manifest


def check_files_present(manifest: Manifest, root: str | os.PathLike[str]) -> None:
    """Check that each shard (and offset index) exists; shards must have the listed size.

    Raises:
        ManifestError: a file is missing or has another size; the message says how to fix it.
    """
    root = Path(root)
    for s in manifest.shards:
        f = root / s.name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{f}: listed in {MANIFEST_NAME} but missing; restore it, or run "
                                f"`shardfeed check {root}` and repack (to read the other shards meanwhile, open "
                                f"it with check_files=False and on_error=\"skip\")") from None
        if size != s.num_bytes and describe(manifest.format).exact_sizes:
            raise ManifestError(f"{f}: {size} bytes on disk but {s.num_bytes} in {MANIFEST_NAME}; the file was "
                                f"changed or truncated: run `shardfeed check {root}` and repack")
        if s.index and not (root / s.index).exists():
            raise ManifestError(f"{root / s.index}: offset index missing; rebuild it with "
                                f"`shardfeed index {root}`")
