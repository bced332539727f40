"""The one writer of an LMDB dataset's ``data.mdb``: batched commits, a growing map, compaction.

Used by the LMDB packer and :class:`~shardfeed.convert.writers.lmdb.LmdbWriter`
(:mod:`shardfeed.convert.writers.lmdb` describes the format and how the classic failures are avoided).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Iterable, Sequence

import lmdb
import msgpack

from shardfeed.readers.format.manifest import LMDB_DATA_NAME, LMDB_MANIFEST_KEY, Manifest, ShardEntry, decode_record
from shardfeed.readers.storage.lmdb_io import is_reserved_key  # the one definition: format.RESERVED_KEY_PREFIXES

__all__ = [
    "LmdbStore",
    "estimate_map_size",
    "PACK_STATE_KEY",
    "COMMIT_COUNT",
    "COMMIT_BYTES",
    "REMAP_EVERY_COMMITS",
    "COMPACT_MIN_FREE_FRACTION",
    "COMPACT_MIN_FREE_BYTES",
    "MAP_HEADROOM_BYTES",
    "RECORD_OVERHEAD_BYTES",
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
        commit_delay_s: sleep this long after every commit (a test fault,
            :class:`~shardfeed.convert.write.faults.FaultHooks`; 0 in production).

    Raises:
        OSError: the database cannot be created or opened (the message names it).
    """

    def __init__(self, out: str | os.PathLike, *, map_size: int, commit_count: int = COMMIT_COUNT,
                 commit_bytes: int = COMMIT_BYTES, commit_delay_s: float = 0.0):
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
        self._slow_s = float(commit_delay_s)
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
                    if not is_reserved_key(k):
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
                if not is_reserved_key(k):
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
        if is_reserved_key(key):
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
