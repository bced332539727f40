"""The LMDB writer: ``shardfeed pack --format lmdb`` and the :class:`LmdbWriter` for conversions.

One database, ``OUT/data.mdb`` (+ ``lock.mdb``), one record per sample: key = the sample key
(UTF-8 digits, so keys sort in packing order), value = :func:`shardfeed.readers.format.encode_record`
(a versioned msgpack map with a CRC-32 of the image bytes; no pickle anywhere). The manifest is
stored under :data:`~shardfeed.readers.format.LMDB_MANIFEST_KEY` in the final transaction, so a
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
  cursor) says where to continue. Bookkeeping that must survive a ``kill -9`` together with the
  records (the ``--on-error skip`` list and the payload byte count) lives in the reserved key
  :data:`PACK_STATE_KEY`, written in the same transaction as each batch and deleted in the final
  one. ``--resume`` therefore writes exactly the records an uninterrupted pack writes.

Files are read (and re-encoded, through :func:`shardfeed.convert.pack.load_sample_payload`) and
their records encoded in ``workers`` processes; results come back in packing order to the one
writer, with a bounded number of chunks in flight (memory stays bounded when the disk is slower
than the readers). Commit boundaries depend only on the record sequence, so the database is
byte-identical whatever the worker count.

Test hooks (environment variables, read when a pack starts; not for production use):
``SHARDFEED_TEST_LMDB_COMMIT_COUNT`` (records per commit, to get many commits out of a small
folder) and ``SHARDFEED_TEST_SLOW_MS`` (sleep this many ms after every commit, so a test can
``kill -9`` a pack mid-way). ``SHARDFEED_TEST_DELAY_MS`` (per sample read, in
:mod:`shardfeed.convert.pack`) applies too.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import lmdb
import msgpack

from shardfeed.readers.format import (
    LMDB_DATA_NAME,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    RESERVED_KEY_PREFIXES,
    Manifest,
    Sample,
    ShardEntry,
    decode_record,
    encode_record,
    normalize_ext,
)

from . import pack as _pack
from .pack import PACKERS, PackOptions, PlannedSample
from .plan import file_sizes
from .scan import ScanResult

__all__ = [
    "LmdbWriter",
    "LmdbStore",
    "pack_lmdb",
    "estimate_map_size",
    "PACK_STATE_KEY",
    "COMMIT_COUNT",
    "COMMIT_BYTES",
    "COMPACT_MIN_FREE_FRACTION",
    "COMPACT_MIN_FREE_BYTES",
]

log = logging.getLogger(__name__)

#: Records per write transaction at most.
COMMIT_COUNT = 1000
#: Commits between two remaps of ``data.mdb`` (see :meth:`LmdbStore.commit`).
REMAP_EVERY_COMMITS = 4
#: Encoded bytes per write transaction at most (the batch is held in memory until committed).
COMMIT_BYTES = 64 * 1024 * 1024
#: Reserved key of the pack's resume bookkeeping (msgpack ``{"v", "next_index", "payload_bytes",
#: "skipped"}``), written with every batch and deleted in the final transaction. It sorts before
#: every sample key (``!`` < ``0``), so records are still appended at the end of the key order.
PACK_STATE_KEY = b"!shardfeed_pack_state"
#: Compact at the end when free pages are at least this share of the file ...
COMPACT_MIN_FREE_FRACTION = 0.01
#: ... and at least this many bytes.
COMPACT_MIN_FREE_BYTES = 1024 * 1024
#: Headroom added to the payload estimate for the initial map size (bytes). The map is address
#: space, not disk (``writemap=False``), so headroom costs nothing on disk.
MAP_HEADROOM_BYTES = 64 * 1024 * 1024
#: Bytes a record adds to its image bytes (msgpack framing, key, ext, label, small metadata).
RECORD_OVERHEAD_BYTES = 256
_PAGE = 4096
_MAX_KEY_BYTES = 511
_MANIFEST_FIXPOINT_ROUNDS = 12


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def estimate_map_size(sizes: Iterable[int], page_size: int = _PAGE) -> int:
    """Initial LMDB map size for records holding images of these sizes (bytes).

    Each value of more than about half a page lives in its own run of overflow pages (16-byte
    header), so the estimate rounds every record up to whole pages, adds 5 % for leaf and branch
    pages and :data:`MAP_HEADROOM_BYTES`. Growing later is cheap; this only avoids most resizes.

    Args:
        sizes: image sizes in bytes.
        page_size: the LMDB page size (the OS page size, 4096 on x86-64 Linux).

    Returns:
        A map size in bytes, a multiple of ``page_size``.
    """
    pages = 0
    for size in sizes:
        pages += -(-(int(size) + RECORD_OVERHEAD_BYTES + 16) // page_size)
    total = int(pages * page_size * 1.05) + MAP_HEADROOM_BYTES
    return -(-total // page_size) * page_size


def _is_reserved(key: bytes) -> bool:
    return key.startswith(RESERVED_KEY_PREFIXES)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LmdbStore:
    """The one writer of ``OUT/data.mdb``: batched commits, a map that grows, finalisation.

    Records are buffered with :meth:`add` and committed in batches (:data:`COMMIT_COUNT` records or
    :data:`COMMIT_BYTES` encoded bytes, whichever comes first). A batch that hits
    ``MDB_MAP_FULL`` is aborted, the map grown and the batch put again. Keys must be added in
    increasing byte order (they are appended, ``MDB_APPEND``).

    Args:
        out: the dataset folder (created if missing).
        map_size: initial map size in bytes (at least one page).
        commit_count: records per transaction at most.
        commit_bytes: encoded bytes per transaction at most.

    Raises:
        OSError: the database cannot be created or opened (the message names it).
    """

    def __init__(self, out: str | os.PathLike, *, map_size: int, commit_count: int = COMMIT_COUNT,
                 commit_bytes: int = COMMIT_BYTES):
        self.out = Path(out)
        self.path = self.out / LMDB_DATA_NAME
        self.commit_count = max(1, int(commit_count))
        self.commit_bytes = max(1, int(commit_bytes))
        self.map_size = max(_PAGE, -(-int(map_size) // _PAGE) * _PAGE)
        self.num_resizes = 0
        self.num_commits = 0
        self.compacted = False
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._last_key: bytes | None = None
        self._slow_s = _env_int("SHARDFEED_TEST_SLOW_MS", 0) / 1000
        self.out.mkdir(parents=True, exist_ok=True)
        self.env = self._open()

    # -- environment -----------------------------------------------------------------------

    def _open(self) -> lmdb.Environment:
        try:
            env = lmdb.open(str(self.out), map_size=self.map_size, subdir=True, readonly=False, lock=True,
                            writemap=False, map_async=False, sync=True, metasync=True, meminit=True,
                            readahead=False, max_dbs=0, max_readers=16, create=True)
        except lmdb.Error as exc:
            raise OSError(f"{self.path}: cannot open the LMDB database for writing ({exc})") from None
        # LMDB keeps the larger of our map size and the one recorded in the file.
        self.map_size = max(self.map_size, env.info()["map_size"])
        return env

    def close(self) -> None:
        """Close the environment (uncommitted records are dropped)."""
        if self.env is not None:
            self.env.close()
            self.env = None

    @property
    def file_bytes(self) -> int:
        """Current size of ``data.mdb`` in bytes."""
        return self.path.stat().st_size

    # -- resume ----------------------------------------------------------------------------

    def existing(self) -> tuple[int, bytes | None, bool, dict | None]:
        """What a previous run committed.

        Returns:
            ``(num_records, last_record_key, has_manifest, pack_state)``: the number of sample
            records, the largest sample key (None when there is none), whether the manifest key
            exists (the database was finished), and the decoded :data:`PACK_STATE_KEY` (or None).
        """
        with self.env.begin() as txn:
            entries = txn.stat()["entries"]
            has_manifest = txn.get(LMDB_MANIFEST_KEY) is not None
            raw_state = txn.get(PACK_STATE_KEY)
            reserved = sum(1 for k in (LMDB_MANIFEST_KEY, PACK_STATE_KEY) if txn.get(k) is not None)
            last = None
            cur = txn.cursor()
            if cur.last():
                while True:
                    k = cur.key()
                    if not _is_reserved(k):
                        last = bytes(k)
                        break
                    if not cur.prev():
                        break
        state = msgpack.unpackb(raw_state, raw=False) if raw_state is not None else None
        self._last_key = last
        return entries - reserved, last, has_manifest, state

    def stored_manifest(self) -> bytes | None:
        """The raw manifest stored under :data:`LMDB_MANIFEST_KEY` (None when absent)."""
        with self.env.begin() as txn:
            raw = txn.get(LMDB_MANIFEST_KEY)
        return bytes(raw) if raw is not None else None

    def payload_bytes(self) -> int:
        """Sum of the image bytes of every sample record (reads the whole database)."""
        total = 0
        with self.env.begin() as txn:
            for k, v in txn.cursor():
                if not _is_reserved(k):
                    total += len(decode_record(v, verify=False, source=f"{self.path} key {k!r}")["data"])
        return total

    # -- writing ---------------------------------------------------------------------------

    def add(self, key: bytes, value: bytes) -> None:
        """Buffer one record; it is written by the next :meth:`commit`.

        Raises:
            ValueError: the key is not larger than the previous one, reserved, empty or too long.
        """
        if not key or len(key) > _MAX_KEY_BYTES:
            raise ValueError(f"{self.path}: LMDB keys are 1 to {_MAX_KEY_BYTES} bytes, got {len(key)} ({key[:40]!r})")
        if _is_reserved(key):
            raise ValueError(f"{self.path}: key {key!r} is reserved by shardfeed")
        if self._last_key is not None and key <= self._last_key:
            raise ValueError(f"{self.path}: key {key.decode(errors='replace')!r} is not after "
                             f"{self._last_key.decode(errors='replace')!r}; records are written in "
                             "increasing key order, each key once")
        self._pending.append((key, value))
        self._pending_bytes += len(key) + len(value)
        self._last_key = key

    @property
    def batch_full(self) -> bool:
        """True when the buffered records reach the commit count or bytes."""
        return len(self._pending) >= self.commit_count or self._pending_bytes >= self.commit_bytes

    def commit(self, extra_puts: Sequence[tuple[bytes, bytes]] = (), deletes: Sequence[bytes] = ()) -> None:
        """Write the buffered records, then ``extra_puts`` and ``deletes``, in one transaction.

        A transaction that hits ``MDB_MAP_FULL`` is aborted, the map grown and the transaction
        redone, as often as needed.

        Raises:
            OSError: the commit failed otherwise (disk full, I/O error); committed batches stay and a
                pack can be resumed.
        """
        if not self._pending and not extra_puts and not deletes:
            return
        need = self._pending_bytes + sum(len(k) + len(v) for k, v in extra_puts)
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self._pending:
                        txn.put(k, v, append=True)
                    for k, v in extra_puts:
                        txn.put(k, v)
                    for k in deletes:
                        txn.delete(k)
                break
            except lmdb.MapFullError:
                self._grow(need)
            except lmdb.Error as exc:
                raise OSError(f"{self.path}: LMDB commit failed ({type(exc).__name__}: {exc}); free disk "
                              "space or fix the error, then rerun with --resume") from None
        self.num_commits += 1
        self._pending.clear()
        self._pending_bytes = 0
        if self.num_commits % REMAP_EVERY_COMMITS == 0:
            # Map the file anew (same size): drops the pages of data.mdb that reading the B-tree
            # mapped into this process (clean page cache, but counted in its RSS: +3.3 MB over 20
            # commits of 20,000 small files), so the pack's memory stays flat in the dataset size.
            try:
                self.env.set_mapsize(self.map_size)
            except lmdb.Error:  # pragma: no cover - only a live transaction prevents it
                pass
        if self._slow_s:
            time.sleep(self._slow_s)

    def _grow(self, need_bytes: int) -> None:
        # Grow by half at least, and by twice what this transaction needs (pages round up).
        new = max(int(self.map_size * 1.5), self.map_size + 2 * need_bytes + MAP_HEADROOM_BYTES // 4)
        new = -(-new // _PAGE) * _PAGE
        log.info("%s: map full at %d bytes; growing the map to %d bytes", self.path, self.map_size, new)
        self.env.set_mapsize(new)
        self.map_size = new
        self.num_resizes += 1

    # -- finishing -------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Bytes of ``data.mdb`` not used by a live page (free pages and the free list)."""
        with self.env.begin() as txn:
            st = txn.stat()
        used_pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"] + 2  # + 2 meta pages
        return max(0, self.file_bytes - used_pages * st["psize"])

    def compact(self) -> None:
        """Rewrite ``data.mdb`` without free pages, atomically (copy, fsync, rename).

        Raises:
            OSError: the copy failed (the original file is kept).
        """
        tmp = self.out / f".{LMDB_DATA_NAME}.compact.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            try:
                self.env.copy(str(tmp), compact=True)
            except lmdb.Error as exc:
                raise OSError(f"{self.path}: compacting copy failed ({exc})") from None
            fd = os.open(tmp / LMDB_DATA_NAME, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.close()
            os.replace(tmp / LMDB_DATA_NAME, self.path)
            _fsync_dir(self.out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.env is None:
                self.env = self._open()
        self.compacted = True

    def finalize(self, manifest: Manifest, entry: ShardEntry, deletes: Sequence[bytes] = ()) -> int:
        """Commit the last records with the manifest, compact if worth it, fix the file size.

        The last buffered records and ``manifest.dumps(hashes=False)`` under
        :data:`LMDB_MANIFEST_KEY` go into one transaction (with ``deletes``). Then the free pages
        are counted and the file compacted when they pass :data:`COMPACT_MIN_FREE_FRACTION` and
        :data:`COMPACT_MIN_FREE_BYTES`. Finally ``entry.num_bytes`` (``entry`` is the manifest's
        ``data.mdb`` entry) is set to the file's size, and the stored copy rewritten until it names
        that size exactly (a rewrite may add a page or two; two or three rounds settle it), so the
        copy inside the database equals ``manifest.json``.

        Returns:
            The final size of ``data.mdb`` in bytes.
        """
        entry.num_bytes = self.file_bytes
        stored = entry.num_bytes
        self.commit(extra_puts=[(LMDB_MANIFEST_KEY, manifest.dumps(hashes=False))], deletes=deletes)
        self.env.sync(True)
        free = self.free_bytes()
        if free >= COMPACT_MIN_FREE_BYTES and free >= COMPACT_MIN_FREE_FRACTION * self.file_bytes:
            log.info("%s: %d free bytes of %d; compacting", self.path, free, self.file_bytes)
            self.compact()
        for _ in range(_MANIFEST_FIXPOINT_ROUNDS):
            size = self.file_bytes
            if size == stored:
                break
            entry.num_bytes = stored = size
            self.commit(extra_puts=[(LMDB_MANIFEST_KEY, manifest.dumps(hashes=False))])
        else:
            entry.num_bytes = self.file_bytes
            log.warning("%s: the manifest copy inside the database names %d bytes, the file has %d",
                        self.path, stored, entry.num_bytes)
        self.env.sync(True)
        return entry.num_bytes


# ---------------------------------------------------------------------------------------------
# reading and encoding in worker processes, in order, with bounded memory

def _init_reader_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and cleans up


def _encode_chunk(task) -> list[tuple]:
    """Worker: read (and re-encode) the chunk's files and encode their records.

    Returns ``([(key, value | None, stored_image_bytes, skip | None), ...], error | None)``: the
    results in the chunk's order, and with ``on_error="raise"`` the error that stopped the chunk
    (the results before it are kept, so the writer commits them before raising it).
    """
    samples, options = task
    out = []
    for s in samples:
        try:
            data, ext, meta = _pack.load_sample_payload(s, options)
        except (OSError, ValueError) as exc:
            if options.on_error != "skip":
                return out, exc
            out.append((s.key, None, 0, {"path": s.file.rel, "key": s.key, "reason": _pack._skip_reason(exc)}))
            continue
        out.append((s.key, encode_record(s.key, data, ext, s.file.label, meta), len(data), None))
    return out, None


def _chunks(samples: Sequence[PlannedSample], max_count: int, max_bytes: int) -> list[Sequence[PlannedSample]]:
    """Consecutive slices of ``samples`` of at most ``max_count`` samples / ``max_bytes`` input bytes.

    Cut from the file sizes alone; slices of a :class:`~shardfeed.convert.plan.SamplePlan` are O(1)
    views that pickle as their own columns, so no :class:`PlannedSample` of the whole dataset is
    ever held (the pack's memory stays flat in the number of files).
    """
    bounds, a, size = [], 0, 0
    for i, n in enumerate(file_sizes(samples)):
        if i > a and (i - a >= max_count or size + n > max_bytes):
            bounds.append((a, i))
            a, size = i, 0
        size += n
    if a < len(samples):
        bounds.append((a, len(samples)))
    return [samples[a:b] for a, b in bounds]


class _OrderedPool:
    """``fn`` over tasks in worker processes, results in task order, at most ``in_flight`` pending.

    :func:`shardfeed.convert.pack.run_tasks` submits every task at once (fine for WebDataset,
    whose tasks return a few bytes); here results carry image bytes to the single writer, so the
    number of chunks in flight is bounded to keep memory bounded when the writer is the slower side.
    Create it before opening LMDB (workers are forked and must not inherit an open environment).
    """

    def __init__(self, workers: int, num_tasks: int):
        self.workers = max(1, min(workers, num_tasks))
        self.pool = None
        if self.workers > 1:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self.pool = ctx.Pool(self.workers, initializer=_init_reader_worker)

    def imap(self, fn: Callable, tasks: Sequence) -> Iterator:
        if self.pool is None:
            for t in tasks:
                yield fn(t)
            return
        in_flight = 2 * self.workers + 2
        it = iter(tasks)
        pending = collections.deque()
        for t in it:
            pending.append(self.pool.apply_async(fn, (t,)))
            if len(pending) >= in_flight:
                break
        while pending:
            res = pending.popleft().get()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(self.pool.apply_async(fn, (nxt,)))
            yield res

    def close(self, ok: bool) -> None:
        if self.pool is None:
            return
        if ok:
            self.pool.close()
        else:
            self.pool.terminate()
        self.pool.join()
        self.pool = None


# ---------------------------------------------------------------------------------------------
# the packer

def _counted(results: Iterator, executor) -> Iterator:
    """``results``, counting each as a task of ``executor`` (its report's ``num_tasks``): the local
    LMDB packer runs its own bounded pool rather than the executor's."""
    for r in results:
        executor.num_tasks += 1
        yield r


def _state_value(next_index: int, payload_bytes: int, skipped: list) -> bytes:
    return msgpack.packb({"v": 1, "next_index": next_index, "payload_bytes": payload_bytes, "skipped": skipped},
                         use_bin_type=True)


def pack_lmdb(scan: ScanResult, samples: list[PlannedSample], out: Path, options: PackOptions,
              progress: Callable[[int, int], None]) -> tuple[list[ShardEntry], list[dict], int, dict]:
    """Write the planned samples into ``out/data.mdb`` (the ``"lmdb"`` entry of :data:`PACKERS`).

    Files are read and encoded in ``options.workers`` processes; the records are appended in
    packing order by this process, in batches, each batch committed together with the resume
    bookkeeping. The last batch is committed by ``extra["finalize"](manifest)`` together with the
    manifest (:func:`shardfeed.convert.pack.pack` calls it just before writing ``manifest.json``),
    which then also fills the size figures of ``extra``.

    Args:
        scan: the folder scan.
        samples: the packing order (:func:`shardfeed.convert.pack.plan_samples`).
        out: the dataset folder, prepared by :func:`shardfeed.convert.pack.prepare_output`.
        options: the pack options (``workers``, ``on_error``, ``resume``, ``map_size``).
        progress: ``callback(num_samples, num_input_bytes)``.

    Returns:
        ``(shards, skipped, shards_resumed, extra)``: one :class:`ShardEntry` for ``data.mdb``; the
        skipped files (``{"path", "key", "reason"}``); 1 when an interrupted database was continued,
        else 0; ``extra`` with ``finalize`` and, once it ran, ``lmdb_payload_bytes``,
        ``lmdb_file_bytes``, ``lmdb_file_to_payload_ratio``, ``lmdb_map_size``,
        ``lmdb_map_resizes``, ``lmdb_commits``, ``lmdb_compacted``, ``lmdb_records_resumed``.

    Raises:
        ValueError: ``resume`` on a database written from another plan.
        OSError, SourceChangedError, CorruptDataError: as :func:`shardfeed.convert.pack.pack`;
            committed batches stay and ``resume`` continues after them.
    """
    commit_count = _env_int("SHARDFEED_TEST_LMDB_COMMIT_COUNT", COMMIT_COUNT)
    db_exists = (out / LMDB_DATA_NAME).exists()
    if db_exists and not options.resume:
        raise ValueError(f"{out / LMDB_DATA_NAME}: exists already; use --resume to continue it or --overwrite")
    start, payload_bytes, skipped, records_resumed = 0, 0, [], 0
    done = False
    map_size = options.map_size or estimate_map_size(file_sizes(samples))
    pool = None
    store = None
    ok = False
    try:
        if db_exists:
            # Resume: see what the interrupted run committed (before forking any worker).
            store = LmdbStore(out, map_size=map_size, commit_count=commit_count)
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
            store.close()
            store = None
            log.info("%s: resuming after %d committed records (sample %d of %d)", out, records_resumed, start,
                     len(samples))
            progress(start, sum(s.file.size for s in samples[:start]))
        rest = samples[start:]
        # up to 256 samples and 2 MB a task: with 32 small files a task, the process pool's per-task
        # IPC cost more than the reads it spreads (20,000 small files: 1.57 s -> 1.21 s with 2 workers);
        # the 2 MB cap keeps the chunks in flight (and their pickled copies) small for large images
        chunks = _chunks(rest, 256, 2 * 1024 * 1024)
        local = getattr(options, "executor", "local") == "local"
        pool = _OrderedPool(options.workers if local else 1, len(chunks))  # Ray: no forks
        if db_exists:
            # Room for what is there plus what is left.
            map_size = max(map_size, (out / LMDB_DATA_NAME).stat().st_size
                           + estimate_map_size(s.file.size for s in rest))
        store = LmdbStore(out, map_size=map_size, commit_count=commit_count)
        if db_exists:
            store.existing()  # the last key, for the ordering check of add()
        num_records = records_resumed
        next_index = start
        tasks = [(c, options) for c in chunks]
        executor = _pack.active_executor(options)
        ordered = (_counted(pool.imap(_encode_chunk, tasks), executor) if local else  # Ray tasks read, in order
                   executor.map_ordered(_encode_chunk, tasks, required_paths=(scan.root,)))
        for results, error in ordered:
            n_in, b_in = 0, 0
            for (key, value, nbytes, skip), s in zip(results, rest[next_index - start:]):
                next_index += 1
                n_in += 1
                b_in += s.file.size
                if value is None:
                    skipped.append(skip)
                    continue
                store.add(key.encode(), value)
                num_records += 1
                payload_bytes += nbytes
                if store.batch_full:
                    store.commit(extra_puts=[(PACK_STATE_KEY, _state_value(next_index, payload_bytes, skipped))])
            progress(n_in, b_in)
            if error is not None:
                # Keep what was read before the failing file, so --resume starts at that file.
                store.commit(extra_puts=[(PACK_STATE_KEY, _state_value(next_index, payload_bytes, skipped))])
                raise error
        pool.close(ok=True)
        ok = True
    finally:
        if pool is not None:
            pool.close(ok=ok)
        if not ok and store is not None:
            store.close()
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

    extra["finalize"] = finalize
    return [entry], skipped, int(records_resumed > 0 or done), extra


PACKERS["lmdb"] = pack_lmdb


# ---------------------------------------------------------------------------------------------
# the Writer (format conversion)

class LmdbWriter:
    """Write samples into a new LMDB dataset (``OUT/data.mdb`` + ``manifest.json``).

    Implements the ``Writer`` protocol of DESIGN.md: :meth:`write` each :class:`Sample` in
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

    Raises:
        FileExistsError: ``out`` already holds a database or a manifest.
    """

    def __init__(self, out: str | os.PathLike, *, classes: Sequence[str], class_to_idx: dict | None = None,
                 options: dict | None = None, map_size: int | None = None, expected_bytes: int | None = None,
                 commit_count: int = COMMIT_COUNT, commit_bytes: int = COMMIT_BYTES):
        self.out = Path(out)
        for name in (LMDB_DATA_NAME, MANIFEST_NAME):
            if (self.out / name).exists():
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

    def write(self, sample: Sample) -> None:
        """Add one sample (keys in increasing order, each once).

        Raises:
            ValueError: a key out of order, reserved or duplicated; a label outside the classes.
            OSError: a commit failed.
        """
        if self._store is None:
            raise ValueError(f"{self.out}: the writer is closed")
        label = int(sample.label)
        if not 0 <= label < len(self.classes):
            raise ValueError(f"{self.out}: sample {sample.key!r} has label {label}, outside the "
                             f"{len(self.classes)} classes")
        value = encode_record(sample.key, bytes(sample.data), normalize_ext(sample.ext), label, dict(sample.meta))
        self._store.add(sample.key.encode("utf-8"), value)
        self.num_samples += 1
        self.payload_bytes += len(sample.data)
        if self._store.batch_full:
            self._store.commit()

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
                            options=self.options,
                            files={"packed": self.num_samples, "skipped": len(self.skipped)})
        try:
            size = self._store.finalize(manifest, entry)
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
