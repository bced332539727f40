"""A pack's resume state on disk: ``OUT/.shardfeed-pack/`` (the plan and one record per finished shard).

The folder exists while a pack runs or after it stopped; the manifest, written last, marks the
dataset finished and the folder is removed then (:func:`remove_state_folder`: only the files a
pack writes there; anything else someone put in it stays, and so does the folder).
``plan.json`` holds the plan's fingerprint (checked by ``--resume``) and the options;
``files.jsonl.z`` the scanned files (``[path, size, mtime_ns]`` per line, zlib-compressed: ~10
bytes a file), so that a refused ``--resume`` can name the files that changed; ``NNNNNN.json``
records one finished WebDataset shard: ``{"shard", "entry" (the ShardEntry, or None when every
sample of it was skipped), "skipped"}``, plus ``"start"``/``"end"`` (its sample range) for shards
cut from re-encoded sizes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from pathlib import Path

from shardfeed.readers.format.manifest import PACK_PLAN_NAME, PACK_STATE_DIR, WRITE_DATASET_MARK
from shardfeed.readers.file_io import read_small_file, write_bytes_atomic

__all__ = ["STATE_DIR", "PLAN_NAME", "FILES_NAME", "write_shard_record", "finished_shard_record", "finished_prefix",
           "field_counts",
           "write_plan_files", "describe_plan_change", "remove_state_folder", "is_state_file",
           "remove_shard_temp_files"]

log = logging.getLogger(__name__)

#: The state folder's name inside OUT.
STATE_DIR = PACK_STATE_DIR
#: The plan record's name inside :data:`STATE_DIR`.
PLAN_NAME = PACK_PLAN_NAME
#: The scanned files' list inside :data:`STATE_DIR` (for the message of a refused ``--resume``).
FILES_NAME = "files.jsonl.z"
#: The marker of a ``write_dataset`` in progress inside :data:`STATE_DIR`.
WRITING_NAME = WRITE_DATASET_MARK
#: The names a pack writes inside :data:`STATE_DIR`: the plan, the file list, the ``write_dataset``
#: marker and the shard records (``NNNNNN.json``).
_STATE_FILE = re.compile("|".join([re.escape(PLAN_NAME), re.escape(FILES_NAME), re.escape(WRITING_NAME),
                                   r"[0-9]{6,}\.json"]))
#: The random part of an atomic write's temporary name (``tempfile.mkstemp``: 8 characters).
_TMP_RANDOM = re.compile(r"[A-Za-z0-9_]{1,16}")
#: Names of files kept in the state folder given in the warning that it was kept.
_KEPT_NAMED = 5
#: Largest compressed file list (``files.jsonl.z``) read back; 4x that is the bound inflated.
MAX_FILES_LIST_BYTES = 1 << 30
#: Files named per kind (added, removed, changed) in that message.
NAMED_FILES = 5


def is_state_file(name: str) -> bool:
    """Whether ``name`` (one entry of :data:`STATE_DIR`) is a file a pack writes there (or the
    temporary file of an atomic write of one); anything else in the folder is not the pack's."""
    if _STATE_FILE.fullmatch(name):
        return True
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    body = name[1:-len(".tmp")]  # .NAME.tmp or .NAME.XXXXXXXX.tmp
    base, _, random_part = body.rpartition(".")
    return bool(_STATE_FILE.fullmatch(body) or (_TMP_RANDOM.fullmatch(random_part) and _STATE_FILE.fullmatch(base)))


def remove_state_folder(out_dir: str | Path, *, warn: bool = True) -> list[str]:
    """Delete a local pack's state folder ``OUT/.shardfeed-pack/``: the plain files a pack writes
    there (:func:`is_state_file`), then the folder once empty. Anything else in it (a file
    someone put there, a folder, a link) is not the pack's: it stays, with the folder, and a
    warning names it (unless ``warn`` is False). A link named ``.shardfeed-pack`` is not followed
    nor removed.

    Returns:
        The names kept in the folder (empty when it is gone or was never there).
    Raises:
        OSError: a file of the pack's could not be removed.
    """
    state = Path(out_dir) / STATE_DIR
    try:  # opened without following a link, so a folder swapped for one after a check is never listed
        folder = os.open(state, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        if state.is_symlink():  # O_NOFOLLOW on a link: ELOOP; not the pack's
            return []
        raise
    kept = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False) and is_state_file(entry.name):
                    os.unlink(entry.name, dir_fd=folder)
                else:
                    kept.append(entry.name)
    finally:
        os.close(folder)
    if not kept:
        try:
            state.rmdir()
        except FileNotFoundError:
            pass
        return []
    kept.sort()
    if not warn:
        return kept
    more = f" and {len(kept) - _KEPT_NAMED} more" if len(kept) > _KEPT_NAMED else ""
    shown = [n if n.isprintable() else ascii(n) for n in kept[:_KEPT_NAMED]]  # a newline in a name forges no log line
    log.warning("%s: kept, as it holds files no pack writes (%s%s); remove them and the folder if they are "
                "not needed", state, ", ".join(shown), more)
    return kept


def remove_shard_temp_files(out: str | Path, prefix: str) -> list[str]:
    """Remove the temporary files a stopped pack left for its own shards in ``out``, and nothing
    else: ``.{prefix}-NNNNNN.tar.tmp`` (a shard being written) and ``.{prefix}-NNNNNN.sfidx.tmp`` /
    ``.{prefix}-NNNNNN.sfidx.XXXXXXXX.tmp`` (its offset index being written atomically), plain files
    only (a link or folder of that name is left). Returns the names removed."""
    shard = re.escape(prefix) + r"-[0-9]{6,}"
    own = re.compile(rf"\.{shard}\.tar\.tmp|\.{shard}\.sfidx(\.[A-Za-z0-9_]{{1,16}})?\.tmp")
    removed = []
    try:
        entries = list(os.scandir(out))
    except OSError:
        return removed
    for entry in entries:
        if own.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append(entry.name)
    return sorted(removed)


def write_shard_record(out_dir: str | Path, shard_idx: int, record: dict) -> None:
    """Write shard ``shard_idx``'s completion record atomically (after the shard is in place)."""
    write_bytes_atomic(Path(out_dir) / STATE_DIR / f"{shard_idx:06d}.json", json.dumps(record).encode())


def finished_shard_record(out_dir: Path, shard_idx: int) -> dict | None:
    """Shard ``shard_idx``'s record if that shard was finished and its files are intact, else None.

    A record whose entry is None (every sample skipped) counts as finished; otherwise the ``.tar``
    and ``.sfidx`` must exist and the tar must have the recorded size. The record comes from OUT,
    so it is checked as untrusted (:func:`_record_problem`): one that is not exactly what a pack
    writes for this shard (its own ``-NNNNNN`` file names inside OUT, counts, digests, skip
    entries) counts as unfinished, and the shard is packed again.
    """
    rec_path = Path(out_dir) / STATE_DIR / f"{shard_idx:06d}.json"
    try:
        record = json.loads(read_small_file(rec_path, what="a shard record"))
    except (FileNotFoundError, ValueError, RecursionError):
        return None
    problem = _record_problem(record, shard_idx)
    if problem is not None:
        log.warning("%s: %s; packing shard %d again", rec_path, problem, shard_idx)
        return None
    entry = record.get("entry")
    if entry is None:
        return record
    tar = Path(out_dir) / entry["name"]
    idx = Path(out_dir) / entry["index"]
    if tar.exists() and idx.exists() and tar.stat().st_size == entry["num_bytes"]:
        return record
    return None


def finished_prefix(out_dir: Path, num_samples: int, *, with_fields: bool = False) -> list[dict]:
    """The records of the shards a pack cut as it went (re-encoding) finished, in order: shard 0,
    1, ... while each record's ``start`` is the previous ``end`` (a prefix of the shards).

    ``with_fields``: a record must also count its samples per field (a layout pack's).
    """
    done: list[dict] = []
    end = 0
    while end < num_samples:
        rec = finished_shard_record(out_dir, len(done))
        if (rec is None or rec.get("start") != end or not isinstance(rec.get("end"), int) or rec["end"] <= end
                or (with_fields and not field_counts(rec.get("fields")))):
            break
        done.append(rec)
        end = rec["end"]
    return done


def field_counts(fields) -> bool:
    """Whether ``fields`` (from a record in OUT) is ``{field name: sample count}``."""
    return isinstance(fields, dict) and all(isinstance(k, str) and _is_count(v) for k, v in fields.items())


_ENTRY_KEYS = frozenset({"name", "num_samples", "num_bytes", "sha256", "index", "index_sha256", "extensions"})
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def _is_count(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _record_problem(record, shard_idx: int) -> str | None:
    """Why a shard record read from OUT is not one a pack wrote for shard ``shard_idx``, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    skipped = record.get("skipped", [])
    flat = (str, int, float, type(None))
    if not isinstance(skipped, list) or not all(
            isinstance(s, dict) and all(isinstance(v, flat) for v in s.values()) for s in skipped):
        return "its 'skipped' is not a list of flat objects"
    for key in ("start", "end"):
        if key in record and not _is_count(record[key]):
            return f"its {key!r} is not a sample count"
    entry = record.get("entry")
    if entry is None:
        return None
    if not isinstance(entry, dict) or not {"name", "num_samples", "num_bytes"} <= set(entry) <= _ENTRY_KEYS:
        return "its 'entry' is not a shard entry"
    stem = f"-{shard_idx:06d}"
    name, index = entry["name"], entry.get("index")
    if (not isinstance(name, str) or not name.endswith(stem + ".tar") or "/" in name or "\\" in name
            or "\0" in name or name.startswith(".")):
        return f"its shard name {name!r} is not this shard's file in OUT"
    if index is not None and index != name[: -len(".tar")] + ".sfidx":
        return f"its index name {index!r} is not this shard's index"
    if not (_is_count(entry["num_samples"]) and _is_count(entry["num_bytes"])):
        return "its sample or byte count is not a count"
    for key in ("sha256", "index_sha256"):
        if entry.get(key) is not None and not (isinstance(entry[key], str) and _HEX_DIGEST.fullmatch(entry[key])):
            return f"its {key} is not a SHA-256 hex digest"
    exts = entry.get("extensions")
    if exts is not None and not (isinstance(exts, dict) and all(isinstance(k, str) and _is_count(v)
                                                                 for k, v in exts.items())):
        return "its extensions are not counts by extension"
    return None


def write_plan_files(state_dir: Path, files) -> None:
    """Record the scanned files (``rels``, ``sizes``, ``mtimes_ns`` columns) for :func:`describe_plan_change`."""
    comp = zlib.compressobj(1)
    parts = []
    rels, sizes, mtimes = files.rels, files.sizes, files.mtimes_ns
    for a in range(0, len(rels), 4096):
        b = min(a + 4096, len(rels))
        chunk = "".join(json.dumps([rel, sizes[i], mtimes[i]], ensure_ascii=False) + "\n"
                        for i, rel in zip(range(a, b), rels[a:b]))  # a slice: one gather of a compact column
        parts.append(comp.compress(chunk.encode("utf-8")))
    parts.append(comp.flush())
    write_bytes_atomic(Path(state_dir) / FILES_NAME, b"".join(parts))


def describe_plan_change(state_dir: Path, old_plan: dict, options: dict, files) -> str:
    """Say why a ``--resume`` plan differs: the options that changed (old → new) and the files
    added, removed or changed (size or modification time) since the interrupted pack, a few of each.

    Args:
        state_dir: the pack's state folder.
        old_plan: the interrupted pack's ``plan.json`` (``{}`` when unreadable).
        options: this run's ``PackOptions.fingerprint_fields()``.
        files: this run's scanned files (:class:`~shardfeed.readers.format.imagefolder.ScannedFiles`).

    Returns:
        A short description for the error message.
    """
    if not old_plan:
        return f"its plan ({STATE_DIR}/{PLAN_NAME}) is missing or unreadable"
    said = []
    old_opts = old_plan.get("options")
    if not isinstance(old_opts, dict):
        old_opts = {}
    changed = [f"--{k.replace('_', '-')} {old_opts.get(k)!r} then, {v!r} now" for k, v in options.items()
               if old_opts.get(k) != v]
    if changed:
        said.append("options changed: " + "; ".join(changed))
    try:
        packed = read_small_file(Path(state_dir) / FILES_NAME, max_bytes=MAX_FILES_LIST_BYTES, what="the file list")
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, 4 * MAX_FILES_LIST_BYTES)
        if inflate.unconsumed_tail:
            raise ValueError("the file list inflates past its bound")
        raw = raw.decode("utf-8")
        old = {r: (s, m) for r, s, m in (json.loads(line) for line in raw.splitlines() if line)}
    except (OSError, ValueError, TypeError, RecursionError, zlib.error):  # a file list from OUT, unlike ours
        old = None
    if old is None:
        said.append("the list of the interrupted pack's files is missing")
    else:
        added, modified = [], []
        n_added = n_modified = 0
        for rel, size, mtime in zip(files.rels, files.sizes, files.mtimes_ns):
            was = old.pop(rel, None)
            if was is None:
                n_added += 1
                if len(added) < NAMED_FILES:
                    added.append(rel)
            elif tuple(was) != (size, mtime):
                n_modified += 1
                if len(modified) < NAMED_FILES:
                    modified.append(rel)
        for n, names, what in ((n_added, added, "added"), (len(old), sorted(old)[:NAMED_FILES], "removed"),
                               (n_modified, modified, "changed (size or modification time)")):
            if n:
                said.append(f"{n} file(s) {what}: {', '.join(names)}" + (" ..." if n > len(names) else ""))
    if not said:
        said.append("the class map or the shardfeed version differs (same options and files)")
    return "; ".join(said)
