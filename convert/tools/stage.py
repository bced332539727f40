"""``shardfeed stage``: copy a dataset (local or HTTP) to fast local storage with free-space
checks, sha256 verification, atomic renames and resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from pathlib import Path

from shardfeed.readers.errors import DataSourceError
from shardfeed.readers.format.manifest import LMDB_DATA_NAME, MANIFEST_NAME, Manifest
from shardfeed.readers.file_io import read_small_file, write_bytes_atomic
from shardfeed.readers.format.registry import describe, resolve
from shardfeed.readers.storage.shard_cache import TooLongError, copy_stream

from ..write.outlock import output_lock
from .common import (
    COPY_CHUNK_BYTES,
    DatasetLocation,
    Progress,
    noop_progress,
    make_problem,
    safe_relative_path,
)

log = logging.getLogger(__name__)

__all__ = ["StageReport", "stage", "default_min_free_bytes", "open_private_file"]

_MEMORY_FS = ("tmpfs", "ramfs")
_GB = 1_000_000_000


def _fs_type(path: Path) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/mounts; ``""`` if unknown)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    best, best_len = "", -1
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best_len:
            best, best_len = parts[2], len(mnt)
    return best


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_min_free_bytes(dest: str | os.PathLike) -> int:
    """Bytes ``stage`` leaves free on DEST's file system by default.

    Disk: 1 GB + 2 % of the file system. Memory file systems (``tmpfs``/``ramfs``, e.g.
    ``/dev/shm``), whose pages are RAM the training job needs: 1 GB + 10 % of their size.
    """
    dest = Path(dest)
    probe = dest if dest.exists() else next((p for p in dest.parents if p.exists()), Path("/"))
    st = os.statvfs(probe)
    total = st.f_blocks * st.f_frsize
    share = 0.10 if _fs_type(probe) in _MEMORY_FS else 0.02
    return _GB + int(share * total)


@dataclasses.dataclass
class StageReport:
    """What :func:`stage` did.

    Attributes:
        source: the dataset staged (path or URL).
        path: the staged dataset's directory (absolute): hand it to the reader.
        ok: every file verified and the manifest written.
        copied: files copied in full; resumed: files whose partial copy was continued;
        skipped: files already staged and intact.
        bytes_copied: bytes transferred this run.
        free_bytes_before, min_free_bytes: free space on DEST before, and what is kept free.
        problems: ``[{"shard", "key", "problem"}]`` (mismatches, missing sources).
        seconds: wall time.
    """

    source: str
    path: str
    ok: bool = False
    copied: list = dataclasses.field(default_factory=list)
    resumed: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    bytes_copied: int = 0
    free_bytes_before: int = 0
    min_free_bytes: int = 0
    problems: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_copied / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["mb_per_s"] = round(self.mb_per_s, 1)
        return d

    def summary(self) -> str:
        s = (f"staged {self.source} -> {self.path}: {len(self.copied)} copied, {len(self.resumed)} resumed, "
             f"{len(self.skipped)} already intact; {self.bytes_copied / 1e6:,.1f} MB in {self.seconds:.1f} s "
             f"({self.mb_per_s:,.0f} MB/s)")
        if not self.ok:
            s += f"; {len(self.problems)} problem(s): NOT staged"
        return s


@dataclasses.dataclass
class _StageFile:
    name: str
    num_bytes: int | None
    sha256: str | None


def _stage_files(manifest: Manifest) -> list[_StageFile]:
    files = []
    for s in manifest.shards:
        files.append(_StageFile(s.name, s.num_bytes, s.sha256))
        if s.index:
            files.append(_StageFile(s.index, 8 * s.num_samples, s.index_sha256))
    return files


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(COPY_CHUNK_BYTES)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def stage(src: str | os.PathLike, dest: str | os.PathLike, *, min_free_bytes: int | None = None,
          progress: Progress | None = None, retries: int | None = None, overwrite: bool = False,
          storage_options: dict | None = None) -> StageReport:
    """Copy a packed dataset to fast local storage, verified, resumable.

    Steps: read the source manifest; plan the files (shards, offset indexes, or ``data.mdb``);
    keep those already in DEST with the right size and sha256 (a file without a hash in the
    manifest, i.e. LMDB's ``data.mdb``, is kept only when DEST already holds this very manifest
    and every record passes its CRC-32); check free space for the rest, leaving
    ``min_free_bytes`` free (and, on a memory file system, also that much RAM available); copy
    each file to ``.NAME.stage.tmp``, hashing as it goes, continuing a partial temporary file
    from where it stopped (an HTTP ``Range`` request; from the start when the server ignores
    it), verify sha256 and size, rename into place; write ``manifest.json`` last (removed first
    while files are missing, so DEST is never a half-staged dataset that looks finished).

    Args:
        src: the dataset (directory, manifest path, or HTTP URL).
        dest: the local directory to stage into (created).
        min_free_bytes: bytes to keep free on DEST's file system; None:
            :func:`default_min_free_bytes`.
        progress: ``callback(num_files_done, num_bytes)``.
        retries: HTTP retries per request after the first attempt (a transfer that breaks resumes at
            the byte where it stopped); None: the readers' default.
        overwrite: replace a finished dataset in DEST that is not SRC's (other shards, hashes, sample
            count or classes): the files its own manifest names that SRC's does not are deleted
            (``pack --overwrite``'s rule); without it such a DEST is refused. Re-staging the same dataset (a
            refresh, or resuming a partial stage) needs no flag.
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`); None: the storage's defaults.

    Returns:
        A :class:`StageReport`; ``ok`` False on any mismatch (the manifest is then not written).

    Raises:
        ValueError: not enough free space (nothing is copied), DEST is the source, DEST holds a
            different finished dataset and ``overwrite`` is False (nothing is touched), DEST holds a
            different finished dataset and files shardfeed did not write with ``overwrite`` (nothing
            is touched), or a
            manifest file name that would escape DEST.
        ManifestError, FileNotFoundError, DataSourceError: the source manifest cannot be read.
        OSError: writing to DEST failed (disk full, permissions).
    """
    t0 = time.perf_counter()
    progress = progress or noop_progress
    loc = DatasetLocation(src, retries=retries, storage_options=storage_options)
    manifest_bytes = loc.read_manifest_bytes()
    manifest = Manifest.from_json(manifest_bytes, loc.manifest_source)
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"{dest}: exists and is a file; choose a folder to stage into")
    if not loc.remote and dest.exists() and dest.resolve() == Path(loc.root).resolve():
        raise ValueError(f"{dest}: is the source dataset itself; choose another folder")
    files = _stage_files(manifest)
    for f in files:
        safe_relative_path(f.name, what=f"{loc.manifest_source}: file {f.name!r}")
    with output_lock(dest, "stage"):  # one writer per DEST: a second command fails at once, naming this one
        recorded = _recorded_entries(dest)  # before anything changes there: what DEST's records name
        if not overwrite:
            _refuse_other_dataset(dest, manifest)
        else:
            _clear_other_dataset(dest, manifest, files)
        return _stage_locked(loc, manifest, manifest_bytes, dest, files, min_free_bytes, progress, t0, recorded)


def _recorded_entries(dest: Path) -> set[str]:
    """The entries of DEST that a shardfeed dataset's own records there name (its manifest's files,
    the consumer files it wrote: :func:`~shardfeed.convert.write.ownership.survey`); empty for a new DEST."""
    from ..write.ownership import local_entries, survey

    if not dest.is_dir():
        return set()
    entries, read = local_entries(dest)
    return set(survey(str(dest), entries, read).ours)


def _refuse_replacing_foreign(dest: Path, todo: "list[_StageFile]", recorded: set[str]) -> None:
    """Raise ValueError when a file to copy would replace an entry of DEST that no record there names
    (a user's file, a link, a folder): staging never deletes what it did not write. A file an earlier,
    interrupted stage of this dataset finished is intact and not in ``todo``."""
    foreign = sorted(f.name for f in todo if os.path.lexists(dest / f.name) and f.name not in recorded)
    if foreign:
        shown = ", ".join(ascii(n) for n in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"{dest}: holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} where the dataset's "
                         f"files go that no shardfeed dataset there names ({shown}); nothing was replaced: move "
                         "them away, or choose another DEST")


def _identity(manifest: Manifest) -> tuple:
    """What makes a dataset itself: format, sample count, classes, and each file's name, size and hashes."""
    return (manifest.format, manifest.num_samples, list(manifest.classes),
            [(s.name, s.num_samples, s.num_bytes, s.sha256, s.index, s.index_sha256) for s in manifest.shards])


def _refuse_other_dataset(dest: Path, manifest: Manifest) -> None:
    """Raise ValueError when DEST holds a finished dataset (its manifest) that is not ``manifest``'s."""
    dest_manifest = dest / MANIFEST_NAME
    if not dest_manifest.is_file():
        return  # empty, or a partial stage (its manifest comes last): staging resumes it
    try:
        theirs = _identity(Manifest.from_json(read_small_file(dest_manifest, what="the manifest"),
                                              str(dest_manifest)))
    except Exception:  # noqa: BLE001 - an unreadable manifest is not known to be this dataset
        theirs = None
    if theirs != _identity(manifest):
        raise ValueError(f"{dest}: already holds a different dataset (its manifest.json differs from the "
                         "source's); choose another DEST, or pass --overwrite to replace it")


def _clear_other_dataset(dest: Path, manifest: Manifest, files: list[_StageFile]) -> None:
    """Before staging ``manifest`` over a different finished dataset in DEST, delete that dataset's files
    the new one does not name.

    What is the previous dataset's is what its own records name (the rule ``pack --overwrite``
    follows, :mod:`shardfeed.convert.write.ownership`): its manifest (deleted first, so DEST never looks
    finished with files missing), its shards and offset indexes, its ``data.mdb``/``lock.mdb``, the
    consumer files it wrote. Files the new dataset names stay (they are verified and reused when
    intact). Nothing else is deleted.

    Raises:
        ValueError: DEST also holds entries shardfeed did not write (named; nothing is deleted).
    """
    from ..write.consumers import CARD_NAME, WIDS_INDEX_NAME
    from ..write.outdir import remove_recorded
    from ..write.ownership import local_entries, survey

    if not dest.is_dir():
        return
    entries, read = local_entries(dest)
    contents = survey(str(dest), entries, read)
    if contents.manifest is None or _identity(contents.manifest) == _identity(manifest):
        return
    if contents.foreign:
        n = len(contents.foreign)
        raise ValueError(f"{dest}: holds {n} entr{'y' if n == 1 else 'ies'} shardfeed did not write "
                         f"({contents.named_foreign()}); refusing to replace the dataset there with --overwrite, "
                         "which deletes only the files the previous dataset's records name: move them away or "
                         "choose another DEST")
    keep = {f.name for f in files} | {WIDS_INDEX_NAME, CARD_NAME}  # the consumer files are written again
    for name in remove_recorded(dest, contents, keep):
        log.info("%s: removed (a file of the dataset DEST held before)", dest / name)


def _stage_locked(loc, manifest: Manifest, manifest_bytes: bytes, dest: Path, files, min_free_bytes, progress,
                  t0: float, recorded: set[str]) -> "StageReport":
    """:func:`stage` once DEST's lock is held (``recorded``: :func:`_recorded_entries` of DEST)."""
    dest.mkdir(parents=True, exist_ok=True)
    report = StageReport(source=str(loc.root), path=str(dest.resolve()))
    dest_manifest = dest / MANIFEST_NAME
    try:
        same_manifest = read_small_file(dest_manifest, what="the manifest") == manifest_bytes
    except (FileNotFoundError, ValueError):  # none, or not one shardfeed wrote: replaced below
        same_manifest = False

    todo: list[_StageFile] = []
    for f in files:
        final = dest / f.name
        if final.exists() and _intact(final, f, manifest, dest, same_manifest):
            report.skipped.append(f.name)
            progress(1 if f.name.endswith(".tar") or f.name == LMDB_DATA_NAME else 0, 0)
        else:
            todo.append(f)
    _refuse_replacing_foreign(dest, todo, recorded)
    if todo and dest_manifest.exists():
        dest_manifest.unlink()  # DEST is incomplete until the manifest comes back, last

    _check_free_space(dest, todo, min_free_bytes, report)

    for f in todo:
        try:
            status = _stage_one(loc, dest, f, progress)
        except (DataSourceError, FileNotFoundError) as exc:
            report.problems.append(make_problem(f.name, None, str(exc)))
            continue
        status, nbytes = status
        report.bytes_copied += nbytes
        if status == "mismatch":
            report.problems.append(make_problem(f.name, None, f"{loc.where(f.name)}: the copied bytes do not match the "
                                                          "manifest (sha256 or size); the source is damaged: run "
                                                          "`shardfeed check` on it"))
            continue
        (report.resumed if status == "resumed" else report.copied).append(f.name)
    if not report.problems:
        write_bytes_atomic(dest_manifest, manifest_bytes)
        from ..write.consumers import write_consumer_files

        write_consumer_files(dest, manifest)  # wids' shardindex.json, the Hugging Face card: made from the copy
        report.ok = True
    report.seconds = time.perf_counter() - t0
    return report


def _check_free_space(dest: Path, todo: list[_StageFile], min_free_bytes: int | None, report: StageReport) -> None:
    """Refuse (ValueError) when copying ``todo`` would leave less than ``min_free_bytes`` free on DEST.

    Partial temporary files count as copied; on a memory file system the RAM available counts too.
    Records the free bytes and the bytes kept free in ``report``.
    """
    st = os.statvfs(dest)
    free = st.f_bavail * st.f_frsize
    fs_type = _fs_type(dest)
    if fs_type in _MEMORY_FS:
        mem = _mem_available_bytes()
        if mem is not None:
            free = min(free, mem)
    keep = default_min_free_bytes(dest) if min_free_bytes is None else int(min_free_bytes)
    report.free_bytes_before, report.min_free_bytes = free, keep
    need = 0
    for f in todo:
        tmp = dest / f".{f.name}.stage.tmp"
        partial = tmp.stat().st_size if tmp.exists() else 0
        need += max((f.num_bytes or 0) - partial, 0)
    if todo and free - need < keep:
        where = f"{dest} ({fs_type or 'unknown fs'})"
        raise ValueError(f"{where}: staging needs {need / 1e9:,.2f} GB more, {free / 1e9:,.2f} GB are free"
                         f"{' (RAM available included: this is a memory file system)' if fs_type in _MEMORY_FS else ''}"
                         f" and {keep / 1e9:,.2f} GB must stay free; free some space, choose another DEST, or "
                         "lower --min-free")


def _intact(final: Path, f: _StageFile, manifest: Manifest, dest: Path, same_manifest: bool) -> bool:
    if final.is_symlink():
        return False  # a link is not a staged copy: it is replaced (the rename replaces the link, not its target)
    if f.num_bytes is not None and final.stat().st_size != f.num_bytes:
        return False
    if f.sha256:
        return _sha256_file(final) == f.sha256
    if not same_manifest:
        return False
    records = describe(manifest.format).records
    if records is not None:
        # no file hash for a record store (LMDB): trust it only if every record passes its check (CRC-32)
        loc = DatasetLocation(dest)
        return all(not isinstance(rec, Exception) for _, rec in resolve(records)(loc.root, verify=True))
    return True


def _stage_one(loc: DatasetLocation, dest: Path, f: _StageFile, progress: Progress) -> tuple[str, int]:
    """Copy one file; returns ("copied" | "resumed" | "mismatch", bytes transferred)."""
    final = dest / f.name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.stage.tmp")
    resumed = False
    transferred = 0
    for attempt in range(2):  # a resumed copy that fails verification is redone from scratch once
        os.close(open_private_file(tmp))  # never a link: the partial copy is read and written below
        start = tmp.lstat().st_size
        if f.num_bytes is not None and start > f.num_bytes:
            start = 0
        h = hashlib.sha256()
        if start:
            with open(tmp, "rb") as r:
                remaining = start
                while remaining:
                    chunk = r.read(min(COPY_CHUNK_BYTES, remaining))
                    if not chunk:
                        break
                    h.update(chunk)
                    remaining -= len(chunk)
            resumed = True
        try:
            transferred += _copy_stream(loc, f, tmp, start, h, progress)
        except TooLongError:
            tmp.unlink(missing_ok=True)
            raise
        size = tmp.stat().st_size
        digest = h.hexdigest()
        ok = (f.num_bytes is None or size == f.num_bytes) and \
            (f.sha256 is None or digest == f.sha256)
        if ok and f.sha256 is None:
            ok = _sha256_file(tmp) == digest  # no reference hash: at least check what landed on disk
        if ok:
            os.replace(tmp, final)
            progress(1 if f.name.endswith(".tar") or f.name == LMDB_DATA_NAME else 0, 0)
            return ("resumed" if resumed and attempt == 0 else "copied"), transferred
        tmp.unlink(missing_ok=True)
        if not resumed:
            break
        resumed = False
        log.info("%s: resumed copy failed verification; copying it again from the start", f.name)
    return "mismatch", transferred


def _copy_stream(loc: DatasetLocation, f: _StageFile, tmp: Path, start: int, h, progress: Progress) -> int:
    """Write the source file from byte ``start`` into ``tmp`` (kept up to ``start``), hashing
    (:func:`~shardfeed.readers.storage.shard_cache.copy_stream`: the location's stream retries and resumes
    mid-file; at most the manifest's size is written).

    Returns:
        Bytes written.

    Raises:
        TooLongError: the source sends more than the manifest lists.
    """
    with os.fdopen(open_private_file(tmp), "r+b") as out:
        out.seek(start)
        out.truncate()
        written = copy_stream(loc.location, f.name, out, start=start, hasher=h, num_bytes=f.num_bytes,
                              progress=progress)
        out.flush()
        os.fsync(out.fileno())
    return written


def open_private_file(path: Path) -> int:
    """Open ``path`` read-write for a copy in progress, created if missing, never through a link.

    Returns:
        A file descriptor.

    Raises:
        OSError: ``path`` is a symbolic link, not a plain file, or has other hard links (named,
            with the fix).
    """
    from ..write.tarwriter import open_own_file

    fd = open_own_file(path, create=True, mode=0o666, where="the folder it stages into", fix="choose another DEST")
    assert fd is not None  # created when missing
    return fd


