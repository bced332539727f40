"""A pack's resume state on disk: ``OUT/.shardfeed-pack/`` (the plan and one record per finished shard).

The folder exists while a pack runs or after it stopped; the manifest, written last, marks the
dataset finished and the folder is removed then. ``plan.json`` holds the plan's fingerprint
(checked by ``--resume``); ``NNNNNN.json`` records one finished WebDataset shard:
``{"shard", "entry" (the ShardEntry, or None when every sample of it was skipped), "skipped"}``,
plus ``"start"``/``"end"`` (its sample range) for shards cut from re-encoded sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardfeed.readers.format import write_bytes_atomic

__all__ = ["STATE_DIR", "PLAN_NAME", "write_shard_record", "finished_shard_record"]

#: The state folder's name inside OUT.
STATE_DIR = ".shardfeed-pack"
#: The plan record's name inside :data:`STATE_DIR`.
PLAN_NAME = "plan.json"


def write_shard_record(out_dir: str | Path, shard_idx: int, record: dict) -> None:
    """Write shard ``shard_idx``'s completion record atomically (after the shard is in place)."""
    write_bytes_atomic(Path(out_dir) / STATE_DIR / f"{shard_idx:06d}.json", json.dumps(record).encode())


def finished_shard_record(out_dir: Path, shard_idx: int) -> dict | None:
    """Shard ``shard_idx``'s record if that shard was finished and its files are intact, else None.

    A record whose entry is None (every sample skipped) counts as finished; otherwise the ``.tar``
    and ``.idx`` must exist and the tar must have the recorded size.
    """
    rec_path = Path(out_dir) / STATE_DIR / f"{shard_idx:06d}.json"
    try:
        record = json.loads(rec_path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    entry = record.get("entry")
    if entry is None:
        return record
    tar = Path(out_dir) / entry["name"]
    idx = Path(out_dir) / entry["index"]
    if tar.exists() and idx.exists() and tar.stat().st_size == entry["num_bytes"]:
        return record
    return None
