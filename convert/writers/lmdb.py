"""LMDB output: the packer of ``shardfeed pack --format lmdb`` and the :class:`LmdbWriter` for conversions.

One database, ``OUT/data.mdb`` (+ ``lock.mdb``), one record per sample: key = the sample key
(UTF-8 digits, so keys sort in packing order), value = :func:`shardfeed.readers.format.manifest.encode_record`
(a versioned msgpack map with a CRC-32 of the image bytes; no pickle anywhere). The manifest is
stored under :data:`~shardfeed.readers.format.manifest.LMDB_MANIFEST_KEY` in the final transaction, so a
database without that key is an unfinished one, for every reader and for ``--resume``.

How the classic ImageFolder→LMDB failures are avoided:

* **MDB_MAP_FULL**: the map starts at the payload estimate plus headroom (or
  ``PackOptions.map_size``) and every transaction that hits :class:`lmdb.MapFullError` is aborted,
  the map is grown (:meth:`lmdb.Environment.set_mapsize`) and the whole batch is put again. The
  batch stays in memory until it is committed, so nothing is lost and nobody sees the error.
* **Files far larger than the data**: the environment is opened with ``writemap=False``, so
  ``data.mdb`` grows with the pages written, not with the map size. Records are appended in key
  order (``MDB_APPEND``: leaf pages are filled, not split in half), so almost no page is ever
  freed; at the end the free pages are counted and the file is compacted (``mdb_env_copy2`` with
  ``MDB_CP_COMPACT`` into a temporary folder, then an atomic rename) only when they are worth it
  (:data:`COMPACT_MIN_FREE_FRACTION`). What remains is LMDB's page granularity: a value larger than
  about 2 KiB goes to its own run of 4 KiB overflow pages, which wastes half a page per record on
  average (ratio ~1.2 for 10 KB images, ~1.02 for 100 KB photos). The ratio
  ``data.mdb bytes / image bytes`` is reported as ``extra["lmdb_file_to_payload_ratio"]``.
* **A half-written database that looks complete**: commits are durable (``sync=True``,
  ``map_async`` off); the manifest key is written last, in the transaction with the last records.
  ``manifest.json`` beside the database is written after it.
* **Resume**: records are appended in packing order, so the last committed key (found with a
  cursor) says where to continue. Every chunk of samples read by a task (at most 256 samples or
  2 MB of input) is committed when it arrives, so a pack stopped by Ctrl-C, SIGTERM or ``kill -9``
  keeps every chunk it finished, however slow the reads or the re-encoding. Bookkeeping that must
  survive a ``kill -9`` together with the records (the ``--on-error skip`` list and the payload
  byte count) lives in the reserved key :data:`PACK_STATE_KEY`, written in the same transaction as
  each chunk and deleted in the final one. ``--resume`` therefore writes exactly the records an
  uninterrupted pack writes.

Files are read (and re-encoded, through :func:`shardfeed.convert.write.samples.load_sample_payload`) and
their records encoded in ``workers`` processes; results come back in packing order to the one
writer, with a bounded number of chunks in flight (memory stays bounded when the disk is slower
than the readers). Commit boundaries (each chunk, cut from the file sizes, and every
:data:`~shardfeed.convert.writers.lmdb_store.COMMIT_COUNT` records inside one) depend only on
the plan, so the database is byte-identical whatever the worker count.

Fault injection (tests): ``PackOptions(faults=FaultHooks(lmdb_commit_count=N, lmdb_commit_delay_s=S))``
gives many commits out of a small folder and slows each, so a test can ``kill -9`` a pack mid-way
(:mod:`shardfeed.convert.write.faults`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import msgpack

from shardfeed.readers.format.manifest import (
    LABELS_CLASS,
    LABELS_NONE,
    LMDB_DATA_NAME,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    Manifest,
    Sample,
    ShardEntry,
    encode_record,
    fields_problem,
    normalize_ext,
)

from ..write.context import PackContext, PackResult
from ..write.plan import PlannedSample, file_sizes
from ..write.samples import ChunkTask, load_chunk
from ..write.shard_cut import ShardLimits, cut_shards
from .webdataset import field_summary
from .lmdb_store import (
    COMMIT_BYTES,
    COMMIT_COUNT,
    MAP_HEADROOM_BYTES,
    PACK_STATE_KEY,
    LmdbStore,
    estimate_map_size,
)

__all__ = ["LmdbWriter", "pack_lmdb", "encode_sample_record", "committed_progress"]

log = logging.getLogger(__name__)


def encode_sample_record(s: PlannedSample, data: bytes, ext: str, meta: dict) -> tuple[bytes, int]:
    """Worker: the LMDB record of one loaded sample and its stored image bytes (``ChunkTask.encode``)."""
    return encode_record(s.key, data, ext, s.file.label, meta), len(data)


def _chunks(samples: Sequence[PlannedSample], max_count: int, max_bytes: int) -> list[Sequence[PlannedSample]]:
    """Consecutive slices of ``samples`` of at most ``max_count`` samples / ``max_bytes`` input bytes.

    Cut from the file sizes alone; slices of a :class:`~shardfeed.convert.write.plan.SamplePlan` are O(1)
    views that pickle as their own columns, so no :class:`PlannedSample` of the whole dataset is
    ever held (the pack's memory stays flat in the number of files).
    """
    bounds = cut_shards(file_sizes(samples), ShardLimits(max_count, max_bytes), empty_bytes=0)
    return [samples[a:b] for a, b in bounds]


def _state_value(next_index: int, payload_bytes: int, skipped: list) -> bytes:
    return msgpack.packb({"v": 1, "next_index": next_index, "payload_bytes": payload_bytes, "skipped": skipped},
                         use_bin_type=True)


def _resume_point(store: LmdbStore, out: Path, samples: Sequence[PlannedSample]) -> tuple[int, int, list, int, bool]:
    """What an interrupted run committed: ``(start, payload_bytes, skipped, records_resumed, done)``.

    Raises:
        ValueError: the database was written from another plan, or not by ``shardfeed pack``.
    """
    start, payload_bytes, skipped = 0, 0, []
    records_resumed, last, done, state = store.existing()
    if last is not None:
        idx = int(last) if last.isdigit() else -1
        if not 0 <= idx < len(samples) or samples[idx].key.encode() != last:
            raise ValueError(f"{out / LMDB_DATA_NAME}: its last record {last[:40]!r} is not a key of this "
                             "pack's plan (another source folder or options); use --overwrite")
        start = idx + 1
    if done:
        # Killed between the final commit and manifest.json: every record is there, and the
        # stored manifest holds the skipped list.
        start = len(samples)
        stored = Manifest.from_json(store.stored_manifest(), f"{out / LMDB_DATA_NAME} manifest key")
        skipped = list(stored.skipped)
        payload_bytes = store.payload_bytes()
    elif state is not None:
        start = max(start, int(state["next_index"]))
        payload_bytes = int(state["payload_bytes"])
        skipped = list(state["skipped"])
    elif records_resumed:
        raise ValueError(f"{out / LMDB_DATA_NAME}: holds records but no shardfeed pack state; it was not "
                         "written by an interrupted `shardfeed pack`: use --overwrite")
    return start, payload_bytes, skipped, records_resumed, done


def committed_progress(out: str | os.PathLike) -> tuple[int, int] | None:
    """What an interrupted ``pack --format lmdb`` committed to ``out/data.mdb`` (read-only, no lock).

    Returns:
        ``(records, samples_done)``: sample records committed, and samples of the plan done
        (records plus files skipped under ``--on-error skip``; ``--resume`` continues after them);
        None when there is no database or it cannot be read.
    """
    path = Path(out)
    if not (path / LMDB_DATA_NAME).is_file():
        return None
    import lmdb

    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=False, max_readers=1)
    except lmdb.Error:
        return None
    try:
        with env.begin() as txn:
            entries = txn.stat()["entries"]
            raw = txn.get(PACK_STATE_KEY)
            reserved = sum(1 for k in (LMDB_MANIFEST_KEY, PACK_STATE_KEY) if txn.get(k) is not None)
    except lmdb.Error:
        return None
    finally:
        env.close()
    records = max(0, entries - reserved)
    done = records
    if raw is not None:
        try:
            done = max(records, int(msgpack.unpackb(bytes(raw), raw=False)["next_index"]))
        except Exception:  # noqa: BLE001 - a damaged record: count the records alone
            pass
    return records, done


def committed_state(out: str | os.PathLike) -> dict | None:
    """The state an interrupted :class:`LmdbWriter` write (with a ``state``) committed last in
    ``out/data.mdb``, without the writer's counts (read-only, no lock); None when there is none.

    Raises:
        ValueError: the state cannot be decoded (not a shardfeed write).
    """
    import lmdb

    path = Path(out)
    if not (path / LMDB_DATA_NAME).is_file():
        return None
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=False, max_readers=1)
    try:
        with env.begin() as txn:
            raw = txn.get(PACK_STATE_KEY)
            raw = bytes(raw) if raw is not None else None
    finally:
        env.close()
    if raw is None:
        return None
    try:
        state = msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # noqa: BLE001 - any decoding failure: a state that is not ours
        raise ValueError(f"{path / LMDB_DATA_NAME}: its pack state cannot be read ({exc}); start again with "
                         "--overwrite") from None
    if not isinstance(state, dict) or not isinstance(state.get("writer"), dict):
        return None
    return {k: v for k, v in state.items() if k != "writer"}


def _resume(out: Path, samples: Sequence[PlannedSample], map_size: int, store_kw: dict, progress
            ) -> tuple[int, int, list, int, bool]:
    """:func:`_resume_point` of the database in ``out``, reported to ``progress``."""
    store = LmdbStore(out, map_size=map_size, **store_kw)
    try:
        point = _resume_point(store, out, samples)
    finally:
        store.close()
    start, records_resumed = point[0], point[3]
    log.info("%s: resuming after %d committed records (sample %d of %d)", out, records_resumed, start, len(samples))
    progress(start, sum(s.file.size for s in samples[:start]))
    return point


def pack_lmdb(scan, samples: Sequence[PlannedSample], out: Path, options, context: PackContext) -> PackResult:
    """Write the planned samples into ``out/data.mdb`` (the ``"lmdb"`` packer of the registry;
    :class:`~shardfeed.convert.write.context.Packer`).

    Files are read and encoded in tasks on the pack's executor (``options.workers`` processes,
    at most ``2 * workers + 2`` chunks in flight); the records are appended in packing order by
    this process, each task's chunk committed as it arrives together with the resume bookkeeping
    (so an interrupted pack keeps every chunk it finished). The result's ``finalize(manifest)``
    commits the manifest (:func:`shardfeed.convert.write.pack.pack` calls it just before writing
    ``manifest.json``), which then also fills the size figures of its ``extra``.

    Args:
        scan: the folder scan.
        samples: the packing order (:func:`shardfeed.convert.write.plan.plan_samples`).
        out: the dataset folder, prepared by :func:`shardfeed.convert.write.pack.prepare_output`.
        options: the pack options (``workers``, ``on_error``, ``resume``, ``map_size``).
        context: the :class:`~shardfeed.convert.write.context.PackContext`: the tasks run on its
            executor, ``progress(num_samples, num_input_bytes)`` hears of them, its ``faults``
            set the commit size and delay (tests); ``output_progress`` is not called (the stored
            sizes are in ``extra`` once the pack is finalized), nor ``on_shard_end`` (the one
            database is complete only once finalized; LMDB is packed to a local disk only).

    Returns:
        A :class:`~shardfeed.convert.write.context.PackResult`: one :class:`ShardEntry` for
        ``data.mdb``; the skipped files (``{"path", "key", "reason"}``); ``resumed`` 1 when an
        interrupted database was continued, else 0; ``finalize``, which commits the manifest and
        then adds the ``lmdb_*`` figures of :func:`_finish` to ``extra``.

    Raises:
        ValueError: ``resume`` on a database written from another plan.
        OSError, SourceChangedError, CorruptDataError: as :func:`shardfeed.convert.write.pack.pack`;
            committed batches stay and ``resume`` continues after them.
    """
    faults, progress = context.faults, context.progress
    store_kw = {"commit_count": (faults.lmdb_commit_count if faults and faults.lmdb_commit_count else COMMIT_COUNT),
                "commit_delay_s": faults.lmdb_commit_delay_s if faults else 0.0}
    db_exists = (out / LMDB_DATA_NAME).exists()
    if db_exists and not options.resume:
        raise ValueError(f"{out / LMDB_DATA_NAME}: exists already; use --resume to continue it or --overwrite")
    start, payload_bytes, skipped, records_resumed, done = 0, 0, [], 0, False
    map_size = options.map_size or estimate_map_size(file_sizes(samples))
    if db_exists:  # resume: see what the interrupted run committed (before any worker is forked)
        start, payload_bytes, skipped, records_resumed, done = _resume(out, samples, map_size, store_kw, progress)
        # room for what is there plus what is left
        map_size = max(map_size, (out / LMDB_DATA_NAME).stat().st_size + estimate_map_size(file_sizes(samples[start:])))
    # up to 256 samples and 2 MB a task: with 32 small files a task, the process pool's per-task
    # IPC cost more than the reads it spreads (20,000 small files: 1.57 s -> 1.21 s with 2 workers);
    # the 2 MB cap keeps the chunks in flight (and their pickled copies) small for large images
    tasks = [ChunkTask(c, options, encode_sample_record, keep_partial=True)
             for c in _chunks(samples[start:], 256, 2 * 1024 * 1024)]
    results = context.executor.map_ordered(load_chunk, tasks, max_in_flight=2 * options.workers + 2,
                                           required_paths=(scan.root,))
    store = None
    num_records, next_index = records_resumed, start
    try:
        for chunk, error in results:
            if store is None:  # opened once the workers run: forked workers must not inherit it
                store = _open_store(out, map_size, store_kw, db_exists)
            n_in = b_in = 0
            for index, payload, skip in chunk:
                next_index = index + 1
                n_in += 1
                b_in += samples[index].file.size
                if payload is None:
                    skipped.append(skip)
                    continue
                value, nbytes = payload
                store.add(samples[index].key.encode(), value)
                num_records += 1
                payload_bytes += nbytes
                if store.batch_full:
                    store.commit(extra_puts=[(PACK_STATE_KEY, _state_value(next_index, payload_bytes, skipped))])
            # Every chunk is committed with the bookkeeping, so a pack stopped by Ctrl-C, SIGTERM,
            # kill -9 or a bad file keeps every chunk it finished (a slow re-encoding pack too),
            # and --resume starts after it (after a failing file's predecessors, at that file).
            store.commit(extra_puts=[(PACK_STATE_KEY, _state_value(next_index, payload_bytes, skipped))])
            progress(n_in, b_in)
            if error is not None:
                raise error
        if store is None:
            store = _open_store(out, map_size, store_kw, db_exists)
    except BaseException:
        results.close()  # stop the workers now, not when the traceback is freed
        if store is not None:
            store.close()
        raise
    return _finish(store, num_records, records_resumed, payload_bytes, skipped, done)


def _open_store(out: Path, map_size: int, store_kw: dict, db_exists: bool) -> LmdbStore:
    store = LmdbStore(out, map_size=map_size, **store_kw)
    if db_exists:
        store.existing()  # the last key, for the ordering check of add()
    return store


def _finish(store: LmdbStore, num_records: int, records_resumed: int, payload_bytes: int, skipped: list,
            done: bool) -> PackResult:
    """The packer's result, with ``finalize`` that commits the manifest into ``store`` and then
    adds ``lmdb_payload_bytes``, ``lmdb_file_bytes``, ``lmdb_file_to_payload_ratio``, ``lmdb_map_size``,
    ``lmdb_map_resizes``, ``lmdb_commits``, ``lmdb_compacted`` and ``lmdb_records_resumed`` to ``extra``."""
    entry = ShardEntry(name=LMDB_DATA_NAME, num_samples=num_records, num_bytes=store.file_bytes)
    extra: dict = {}

    def finalize(manifest: Manifest) -> None:
        try:
            size = store.finalize(manifest, entry, deletes=[PACK_STATE_KEY])
            extra.update(
                lmdb_payload_bytes=payload_bytes, lmdb_file_bytes=size,
                lmdb_file_to_payload_ratio=round(size / payload_bytes, 4) if payload_bytes else None,
                lmdb_map_size=store.map_size, lmdb_map_resizes=store.num_resizes,
                lmdb_commits=store.num_commits, lmdb_compacted=store.compacted,
                lmdb_records_resumed=records_resumed)
        finally:
            store.close()

    return PackResult([entry], skipped, int(records_resumed > 0 or done), extra, finalize=finalize)


# ---------------------------------------------------------------------------------------------
# the Writer (format conversion)

class LmdbWriter:
    """Write samples into a new LMDB dataset (``OUT/data.mdb`` + ``manifest.json``).

    Implements the ``Writer`` protocol (docs/architecture.md): :meth:`write` each :class:`Sample` in
    increasing key order, then :meth:`close` (or leave the ``with`` block) to commit the last
    records with the manifest and write ``manifest.json``. Leaving the block on an exception closes
    the database without a manifest: it stays an unfinished dataset that every reader refuses.
    Shares batching, map growth, compaction and the manifest's final transaction with
    :func:`pack_lmdb`.

    Args:
        out: the output folder; must not hold a ``data.mdb`` or ``manifest.json`` yet.
        classes: class names, index = label.
        class_to_idx: name → index (default: from ``classes``' order).
        options: recorded as the manifest's ``options``.
        map_size: initial map size in bytes (default: ``expected_bytes`` + headroom, or 1 GiB of
            address space when unknown; it grows as needed either way).
        expected_bytes: the total image bytes expected, for the initial map size.
        commit_count: records per transaction at most.
        commit_bytes: encoded bytes per transaction at most.
        labels: ``"class"`` or ``"none"`` (unlabelled: every label is -1, ``classes`` empty).
        fields: the extra fields records may carry (stored in version-2 records,
            :func:`~shardfeed.readers.format.lmdb_record.encode_record`); the manifest counts them.
        state: ``state() -> dict`` (msgpack-able; ``next_index``: the caller's position after the
            last sample written), stored with the writer's counts under :data:`PACK_STATE_KEY` in
            every commit, so an interrupted write can continue (``resume``); None: no state.
        resume: continue the interrupted write in ``out`` (its ``data.mdb``, written with a
            ``state``): the counts come back, :attr:`resumed` is the caller's last committed state.

    Raises:
        FileExistsError: ``out`` already holds a database (without ``resume``) or a manifest.
        ValueError: a bad ``labels`` or field name; ``resume`` of a database that is not an
            interrupted write with a state.
    """

    def __init__(self, out: str | os.PathLike, *, classes: Sequence[str], class_to_idx: dict | None = None,
                 options: dict | None = None, map_size: int | None = None, expected_bytes: int | None = None,
                 commit_count: int = COMMIT_COUNT, commit_bytes: int = COMMIT_BYTES, labels: str = LABELS_CLASS,
                 fields: Sequence[str] = (), state: Callable[[], dict] | None = None, resume: bool = False):
        if labels not in (LABELS_CLASS, LABELS_NONE):
            raise ValueError(f"labels must be {LABELS_CLASS!r} or {LABELS_NONE!r}, got {labels!r}")
        problem = fields_problem(fields)
        if problem is not None:  # a bad name, or two fields in one member: written twice, or one read for both
            raise ValueError(problem)
        self.labels = labels
        self.field_counts: dict[str, int] = {name: 0 for name in fields}
        #: the manifest's input accounting when set (default: ``{"packed", "skipped"}`` of the records)
        self.files: dict | None = None
        self.out = Path(out)
        for name in (LMDB_DATA_NAME, MANIFEST_NAME):
            if (self.out / name).exists() and not (resume and name == LMDB_DATA_NAME):
                raise FileExistsError(f"{self.out / name}: exists already; choose an empty output folder")
        self.classes = list(classes)
        self.class_to_idx = dict(class_to_idx) if class_to_idx is not None else {c: i for i, c in
                                                                                 enumerate(self.classes)}
        self.options = dict(options or {})
        self.skipped: list[dict] = []
        self.num_samples = 0
        self.payload_bytes = 0
        if map_size is None:
            map_size = int(expected_bytes * 1.25) + MAP_HEADROOM_BYTES if expected_bytes else 1 << 30
        self._store = LmdbStore(self.out, map_size=map_size, commit_count=commit_count, commit_bytes=commit_bytes)
        self._manifest: Manifest | None = None
        self.stats: dict = {}
        #: samples per image extension, recorded in the manifest
        self.extensions: dict[str, int] = {}
        self._state = state
        #: the caller's state at the interrupted write's last commit (``resume``); {} otherwise
        self.resumed: dict = {}
        if resume:
            try:
                self._restore()
            except BaseException:
                self.abort()
                raise

    def _restore(self) -> None:
        """The counts of the interrupted write in ``out`` (its state key, checked as untrusted).

        Raises:
            ValueError: the database is finished, or holds records without a writer's state.
        """
        records, _, finished, state = self._store.existing()  # also the last key, for add()'s order check
        counts = state.get("writer") if isinstance(state, dict) else None
        ok = (isinstance(counts, dict) and all(isinstance(counts.get(k), dict) for k in ("extensions", "fields"))
              and counts.get("num_samples") == records and type(counts.get("payload_bytes")) is int)
        if finished or (records and not ok):
            raise ValueError(f"{self.out / LMDB_DATA_NAME}: not an interrupted write that can continue; start again "
                             "with --overwrite")
        if not ok:
            return
        self.num_samples, self.payload_bytes = records, counts["payload_bytes"]
        self.extensions = {str(k): int(v) for k, v in counts["extensions"].items()}
        self.field_counts.update((str(k), int(v)) for k, v in counts["fields"].items())
        self.resumed = {k: v for k, v in state.items() if k != "writer"}

    def _state_puts(self) -> list[tuple[bytes, bytes]]:
        """The state key to commit with the records (none without a ``state``)."""
        if self._state is None:
            return []
        counts = {"num_samples": self.num_samples, "payload_bytes": self.payload_bytes,
                  "extensions": self.extensions, "fields": self.field_counts}
        return [(PACK_STATE_KEY, msgpack.packb({"v": 1, **self._state(), "writer": counts}, use_bin_type=True))]

    @classmethod
    def create(cls, out: str | os.PathLike, *, classes: Sequence[str], class_to_idx: dict | None = None,
               max_count: int | None = None, max_bytes: int | None = None, prefix: str | None = None,
               skipped: Sequence[dict] | None = None, options: dict | None = None, files: dict | None = None,
               map_size: int | None = None, expected_bytes: int | None = None, labels: str = LABELS_CLASS,
               fields: Sequence[str] = (), **resume) -> "LmdbWriter":
        """The registry's uniform writer factory (same keywords for every format's writer).

        Args:
            out, classes, class_to_idx, options, map_size, expected_bytes, labels, fields: as the
                constructor.
            max_count, max_bytes, prefix: WebDataset shard limits; unused (one ``data.mdb``).
            skipped: ``[{"path", "reason"[, "key"]}]`` carried into the manifest's ``skipped``.
            files: the manifest's input accounting; unused (the LMDB manifest counts its records).
            resume: ``state``, ``resume``, as the constructor.

        Returns:
            An open :class:`LmdbWriter`.

        Raises:
            FileExistsError: as the constructor.
        """
        writer = cls(out, classes=classes, class_to_idx=class_to_idx, options=options, map_size=map_size,
                     expected_bytes=expected_bytes, labels=labels, fields=fields, **resume)
        for item in skipped or []:
            writer.add_skipped(item.get("path", "?"), item.get("key"), item.get("reason", "?"))
        return writer

    def write(self, sample: Sample, fields: dict[str, bytes] | None = None) -> None:
        """Add one sample (keys in increasing order, each once), with its extra fields' bytes.

        Raises:
            ValueError: a key out of order, reserved or duplicated; a label outside the classes;
                a field the writer was not given.
            OSError: a commit failed.
        """
        if self._store is None:
            raise ValueError(f"{self.out}: the writer is closed")
        label = int(sample.label) if self.labels == LABELS_CLASS else -1
        if not 0 <= label < len(self.classes) and self.labels == LABELS_CLASS:
            raise ValueError(f"{self.out}: sample {sample.key!r} has label {label}, outside the "
                             f"{len(self.classes)} classes")
        for name in fields or ():
            if name not in self.field_counts:
                raise ValueError(f"{self.out}: sample {sample.key!r}: field {name!r} is not one of the writer's "
                                 f"fields ({', '.join(self.field_counts) or 'none'})")
            self.field_counts[name] += 1
        ext = normalize_ext(sample.ext)
        value = encode_record(sample.key, bytes(sample.data), ext, label, dict(sample.meta), fields or None)
        self._store.add(sample.key.encode("utf-8"), value)
        self.extensions[ext] = self.extensions.get(ext, 0) + 1
        self.num_samples += 1
        self.payload_bytes += len(sample.data)
        if self._store.batch_full:
            self._store.commit(extra_puts=self._state_puts())

    def add_skipped(self, path: str, key: str | None, reason: str) -> None:
        """List a sample that was not written in the manifest's ``skipped``."""
        item = {"path": path, "reason": reason}
        if key is not None:
            item["key"] = key
        self.skipped.append(item)

    def close(self) -> Manifest:
        """Commit the last records with the manifest, then write ``manifest.json``.

        Returns:
            The dataset's :class:`Manifest` (also its ``stats``: file size, payload, ratio).

        Raises:
            ValueError: nothing was written.
            OSError: the final commit or the manifest write failed.
        """
        if self._manifest is not None:
            return self._manifest
        if self._store is None:
            raise ValueError(f"{self.out}: the writer was aborted")
        if self.num_samples == 0:
            self.abort()
            raise ValueError(f"{self.out}: no sample was written; nothing to close")
        entry = ShardEntry(name=LMDB_DATA_NAME, num_samples=self.num_samples, num_bytes=0)
        manifest = Manifest(format="lmdb", num_samples=self.num_samples, classes=self.classes,
                            class_to_idx=self.class_to_idx, shards=[entry], skipped=self.skipped,
                            options=self.options, extensions=dict(sorted(self.extensions.items())),
                            files=self.files if self.files is not None else
                            {"packed": self.num_samples, "skipped": len(self.skipped)},
                            labels=self.labels, fields=field_summary(self.field_counts, self.num_samples))
        try:
            size = self._store.finalize(manifest, entry, deletes=[PACK_STATE_KEY] if self._state else [])
        finally:
            self._store.close()
            self._store = None
        manifest.write(self.out)
        self.stats = {"lmdb_payload_bytes": self.payload_bytes, "lmdb_file_bytes": size,
                      "lmdb_file_to_payload_ratio": round(size / self.payload_bytes, 4) if self.payload_bytes else None}
        self._manifest = manifest
        return manifest

    def abort(self) -> None:
        """Close without a manifest (the database stays unfinished)."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> "LmdbWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
