"""LMDB source: a map-style dataset over a shardfeed LMDB database.

* The environment is opened lazily, once per process (checked by PID, so a ``fork`` after the
  parent read from the database opens a fresh one in the child), read-only and without a lock,
  through :func:`shardfeed.readers.storage.lmdb_io.open_lmdb_readonly`. Only the path and options are
  pickled, so it works under the ``fork``, ``spawn`` and ``forkserver`` start methods.
* Sample ``i`` is the ``i``-th key in key order (packing order). When the keys are exactly
  ``format_key(0) .. format_key(N - 1)`` (the normal case) nothing is stored per sample; when
  packing skipped files (gaps), the keys are listed once at open time into one fixed-width numpy
  bytes array (no per-key Python objects for forked workers to copy).
* Epoch split: :func:`~shardfeed.readers.loader.make_loader` reads it with
  :class:`~shardfeed.readers.loader.EpochSampler` (same sample-range rule as WebDataset, over a
  seeded permutation), and iterating it directly follows the same rule (shuffled, this rank's
  share; see :mod:`~shardfeed.readers.sources.source_base`); ``torch.utils.data.DistributedSampler``
  works too (``len(ds)`` is N, the range of ``ds[i]``).
* Each record's CRC-32 is checked (``verify=True``).

``readahead``: default None = automatic, :func:`shardfeed.readers.storage.lmdb_io.choose_readahead` by the
size of ``data.mdb`` against physical memory (on up to half the RAM, off above; the measurements
are in :mod:`shardfeed.readers.storage.lmdb_io`). Pass True/False to force it. One environment is opened
per process and database, so the first source to open it in a process decides.

Slow storage (a network or FUSE mount): a loader asks for a batch's samples at once
(``__getitems__``). When a record's read takes longer than
:data:`~shardfeed.readers.storage.shard_readahead.SLOW_READ_S` (its pages were not in memory and a
page fault is a round trip to the storage), the rest of the batch is read ahead by the read
pool of :mod:`~shardfeed.readers.storage.shard_readahead` through
:mod:`~shardfeed.readers.storage.lmdb_readahead`: each record's range in ``data.mdb`` is found from the
B-tree's pages and fetched with one ``os.pread`` (one request per record, several in flight),
at most :attr:`LMDBSource.read_ahead_records` records and :attr:`LMDBSource.read_ahead_bytes`
bytes ahead of the decoder, and decoded in order. Through the map a record costs about two
faults in series (the kernel's 128 KiB read-around) and twice its bytes fetched. That is for
reads of at least :data:`PREAD_LATENCY_S` (a round trip to a network or FUSE mount); reads
slow but faster than that (a local disk with a cold page cache, where the read-around fetches
neighbouring records in the same request) are read ahead through the map by the pool, and
where the pages cannot be parsed (another layout) too. Reads that come back fast again (page
cache) turn it off: on a warm local disk nothing changes.

Read by ``pread``, a batch's reads also reach into the batch the process will most likely be
asked for next, so that its first records are in memory when it arrives instead of costing a
round trip or two before decoding can start. The loader's sampler order is a function of the
seed, epoch, rank, world size, batch size, padding and resume plan, so each process computes it
again (once per epoch: a seeded permutation of N indices, 1-2 s of CPU for a million), finds
the batch it was given in it, and queues the one the ``DataLoader``'s round robin hands it next
(``num_workers`` batches on; with persistent workers or none, after its last batch of an epoch,
its first of the next) behind the current batch, in the same bounds (records and bytes ahead of
the decoder). Those reads serve the next batch only when it is exactly the one guessed (same
indices, same order; each record's CRC is still checked); otherwise they are cancelled and
dropped. With another sampler the guesses fail, and after a few batches not found in the order
a process stops guessing for that epoch.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from ..errors import CorruptDataError, ManifestError
from ..storage.lmdb_io import process_env
from ..order.epoch import RankOrder
from ..storage.lmdb_readahead import MAX_BYTES, ValueReader, ValueStream
from .options import ReadOptions
from ..storage.shard_readahead import SLOW_READ_S, read_pool
from ..format.manifest import UNLABELLED, Manifest, decode_record, field_member, format_key, key_width
from ..format.sample_members import label_problem
from ..runtime import after_fork_in_child
from .source_base import SourceBase, name_original_file

__all__ = ["LMDBSource", "DEFAULT_READAHEAD", "READ_AHEAD_RECORDS", "READ_AHEAD_BYTES", "PREAD_LATENCY_S"]

#: ``readahead`` used unless the caller passes one: None, automatic by database size (see above).
DEFAULT_READAHEAD = None

#: Records of a batch read ahead of the decoder on slow storage (each holds one record's bytes).
READ_AHEAD_RECORDS = 32
#: Bytes of a batch read ahead of the decoder on slow storage, at most.
READ_AHEAD_BYTES = MAX_BYTES
#: Reads ahead go by ``pread`` (:mod:`~shardfeed.readers.storage.lmdb_readahead`) when reads take at least
#: this long (seconds, the median of the last batch's); faster ones (a local disk with a cold page
#: cache) through the map, whose read-around fetches neighbouring records at once (module docstring).
PREAD_LATENCY_S = 0.0015

_UNREAD = object()  # read_record: no value given, read it


class _Unreadable:
    """A record LMDB failed on (a damaged page): :meth:`LMDBSource.read_record` raises it at its sample."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason



#: Batches in a row not found in the epoch's order after which a process stops guessing its
#: next batch in that epoch (a sampler other than the loader's own).
_MAX_GUESS_MISSES = 3


def _locate(order: RankOrder, batch: list, size: int, hints: list) -> int | None:
    """Where ``batch`` starts in ``order`` on a batch boundary (a multiple of ``size``): at one of
    ``hints`` (places, or None) or found by its first index; None when it is not there."""
    n = len(batch)
    if n == 0 or n > len(order):
        return None
    want = np.asarray(batch, dtype=np.int64)
    for p in hints:
        if p is not None and 0 <= p <= len(order) - n and np.array_equal(order.slice(p, p + n), want):
            return int(p)
    for p in order.places_of(int(want[0]))[:8]:  # a padded epoch repeats an index at most a few times
        if p % size == 0 and p + n <= len(order) and np.array_equal(order.slice(p, p + n), want):
            return int(p)
    return None


def _taken(stream, indices: list):
    """``(value, seconds)`` of each of ``indices`` from ``stream``, which holds them in this order."""
    for i in indices:
        tag, value, took = stream.take()
        if tag != i:  # the stream is made or kept only for exactly these indices
            raise RuntimeError(f"read-ahead out of step: sample {tag} where {i} was asked for")
        yield value, took


#: Bumped in a child after ``fork``: per-thread read transactions of the parent are not reused
#: there (checking it costs less than ``os.getpid()``, a system call, on every sample).
_FORK_GENERATION = [0]


def _after_fork_in_child() -> None:
    _FORK_GENERATION[0] += 1


after_fork_in_child(_after_fork_in_child)


class LMDBSource(SourceBase, torch.utils.data.Dataset):
    """Map-style dataset over ``ROOT/data.mdb``.

    Args:
        location: the dataset directory (local path; LMDB is not read over HTTP: stage it first).
        manifest: its validated manifest.
        read: the options every source shares (:class:`~shardfeed.readers.sources.options.ReadOptions`;
            default ``ReadOptions()``).
        readahead: kernel read-around on page faults: True, False, or None (default): automatic,
            :func:`~shardfeed.readers.storage.lmdb_io.choose_readahead` by the size of ``data.mdb``.
        verify: check each record's CRC-32.

    ``ds[i]`` is ``(image uint8 [3, H, W], label int)``, a raw
    :class:`~shardfeed.readers.format.manifest.Sample` with ``decode=False``, or None when skipped
    (``on_error="skip"``).

    Raises:
        ValueError: ``location`` is a URL.
        ManifestError: the database holds another number of samples than the manifest says.
        IncompleteDatasetError: the database has no stored manifest (unfinished pack).
    """

    map_style = True
    #: Records a batch reads ahead on slow storage (see the module docstring); 0: never.
    read_ahead_records = READ_AHEAD_RECORDS
    #: Most bytes a batch reads ahead of the decoder on slow storage (a single larger record is read alone).
    read_ahead_bytes = READ_AHEAD_BYTES
    #: Whether this process's last reads were slow (set per process by ``__getitems__``).
    _reads_slow = False
    #: The median seconds of this process's last batch's reads ahead (or of its first slow read).
    _read_latency = 0.0
    #: Whether the next epoch is read in these same processes (persistent workers, or none; set by
    #: :func:`~shardfeed.readers.loader.make_loader`): a process's last batch of an epoch then reads
    #: ahead the first one it gets of the next epoch (see :meth:`_guess_next_batch`).
    next_epoch_ahead = False

    def __init__(self, location: Any, manifest: Manifest, read: ReadOptions | None = None, *,
                 readahead: bool | None = DEFAULT_READAHEAD, verify: bool = True) -> None:
        if not isinstance(location, (str, os.PathLike)):
            raise ValueError(f"{location}: LMDB datasets are read from a local path, not over HTTP; copy it "
                             "first (e.g. `shardfeed stage`) or pack the dataset as WebDataset shards")
        self.root = Path(location)
        self._db_path = str(self.root / "data.mdb")
        self.manifest = manifest
        if readahead is None:
            from ..storage.lmdb_io import choose_readahead

            data = self.root / "data.mdb"
            readahead = choose_readahead(data.stat().st_size) if data.is_file() else True
        #: the readahead in use (resolved when the caller left it automatic)
        self.readahead = bool(readahead)
        self.verify = bool(verify)
        self._classes = list(manifest.classes)
        self._class_to_idx = dict(manifest.class_to_idx)
        self._labels = frozenset(self._class_to_idx.values())
        self._num_samples = manifest.num_samples
        self._width = key_width(manifest.num_samples)
        self._env = None
        self._env_pid = None
        self._local = threading.local()  # this thread's (fork generation, read transaction)
        self._keys = self._list_keys()
        self._init_common(ReadOptions() if read is None else read)

    def __repr__(self) -> str:
        return f"LMDBSource({str(self.root)!r}, num_samples={self._num_samples}, readahead={self.readahead})"

    def _open_env(self):
        return process_env(self.root, self.readahead)

    def _list_keys(self):
        """None when the keys are 0..N-1 zero-padded; else a numpy ``S`` array of the keys."""
        from ..storage.lmdb_io import is_reserved_key, read_lmdb_manifest

        env = self._open_env()
        stored = read_lmdb_manifest(env)
        n = self._num_samples
        if stored.num_samples != n:
            raise ManifestError(f"{self.root}: manifest.json says {n} samples, the database's own manifest "
                                f"{stored.num_samples}; the files are from different packs: repack")
        with env.begin(buffers=False) as txn:
            cur = txn.cursor()
            entries = env.stat()["entries"]
            reserved = 0
            first = last = None
            if cur.first():
                while is_reserved_key(cur.key()):
                    reserved += 1
                    if not cur.next():
                        break
                first = cur.key()
            if cur.last():
                while is_reserved_key(cur.key()):
                    reserved += 1
                    if not cur.prev():
                        break
                last = cur.key()
            w = self._width
            if (entries - reserved == n and n > 0 and first == format_key(0, w).encode()
                    and last == format_key(n - 1, w).encode()):
                return None
            keys = [k for k in cur.iternext(keys=True, values=False)] if cur.first() else []
        keys = [k for k in keys if not is_reserved_key(k)]
        if len(keys) != n:
            raise ManifestError(f"{self.root}: the database holds {len(keys)} samples but its manifest says {n}; "
                                f"run `shardfeed check {self.root}` and repack")
        return np.array(keys)

    def __getstate__(self):
        state = super().__getstate__()
        state["_env"] = None
        state["_env_pid"] = None
        state["_local"] = None
        for name in ("_reader", "_ahead", "_orders", "_guess_at", "_guess_misses"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def _read_txn(self):
        """This thread's read transaction, begun on first use and kept (a read-only database
        does not change under it; ``begin`` + ``abort`` per sample cost 0.5 us). A transaction of
        the parent is never used after ``fork``; each thread has its own (LMDB transactions are
        single-threaded)."""
        local = self._local
        gen = _FORK_GENERATION[0]
        held = getattr(local, "txn", None)
        if held is not None and held[0] == gen:
            return held[1]
        txn = self.env().begin(buffers=False)
        local.txn = (gen, txn)
        return txn

    def env(self):
        """This process's read-only environment (opened on first use; reopened after ``fork``)."""
        pid = os.getpid()
        if self._env is None or self._env_pid != pid:
            self._env = self._open_env()
            self._env_pid = pid
        return self._env

    def __len__(self) -> int:
        return self._num_samples

    def key(self, i: int) -> bytes:
        """The LMDB key of sample ``i``."""
        if self._keys is None:
            return format_key(i, self._width).encode()
        return bytes(self._keys[i])

    def _txn_get(self, k: bytes):
        """``k``'s stored value through this thread's read transaction (None: no such key), or an
        :class:`_Unreadable` where LMDB fails on a damaged page. After any LMDB error the
        transaction is dropped (LMDB refuses every later read through it) and the next read
        begins a fresh one.

        Raises:
            lmdb.Error: an LMDB error other than a damaged page.
        """
        import lmdb

        try:
            return self._read_txn().get(k)
        except lmdb.Error as exc:
            held = getattr(self._local, "txn", None)
            self._local.txn = None
            if held is not None:
                try:
                    held[1].abort()
                except lmdb.Error:
                    pass
            if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError)):
                return _Unreadable(f"{type(exc).__name__}: {exc}")
            raise

    def _get(self, i: int) -> tuple[bytes | None, float]:
        """Sample ``i``'s stored value (None: no such key; an :class:`_Unreadable`: a damaged
        page) and the seconds its read took."""
        k = b"%0*d" % (self._width, i) if self._keys is None else bytes(self._keys[i])
        t0 = time.perf_counter()
        value = self._txn_get(k)
        return value, time.perf_counter() - t0

    def read_record(self, i: int, value=_UNREAD) -> dict:
        """The decoded record of sample ``i`` (:func:`~shardfeed.readers.format.manifest.decode_record`).

        ``value``: its stored bytes when already read (``__getitems__``); read here otherwise.

        Raises:
            CorruptDataError: the record is missing, on a page LMDB cannot read, undecodable or
                fails its CRC (names the key).
        """
        k = b"%0*d" % (self._width, i) if self._keys is None else bytes(self._keys[i])
        if value is _UNREAD:
            value = self._txn_get(k)
        if isinstance(value, _Unreadable):
            raise CorruptDataError(f"{self._db_path} key {k.decode('utf-8', 'replace')}: LMDB cannot read the "
                                   f"record ({value.reason}); run `shardfeed check {self.root}`")
        if value is None:
            raise CorruptDataError(f"{self._db_path} key {k.decode()}: record missing; run "
                                   f"`shardfeed check {self.root}`")
        return decode_record(value, verify=self.verify, source=self._db_path, key=k)

    def read_raw(self, i: int, value=_UNREAD) -> tuple[str, bytes, str, int, dict]:
        """``(key, data, ext, label, meta)`` of sample ``i`` (label -1 in an unlabelled dataset).

        ``value``: as for :meth:`read_record`.

        Raises:
            CorruptDataError: the record is missing, undecodable or fails its CRC (names the key).
        """
        rec = self.read_record(i, value)
        k = self.key(i)
        try:
            label = int(rec["label"])
            if label not in self._labels and (self.manifest.labelled or label != UNLABELLED):
                raise CorruptDataError(f"{self._db_path} key {k.decode('utf-8', 'replace')}: "
                                       f"{label_problem(label, self._labels)}")
            return rec["key"], rec["data"], rec["ext"], label, rec["meta"]
        except (KeyError, TypeError, ValueError) as exc:  # valid msgpack, damaged fields
            if isinstance(exc, CorruptDataError):
                raise
            what = f"no field {exc}" if isinstance(exc, KeyError) else f"a bad field: {exc}"
            raise CorruptDataError(f"{self._db_path} key {k.decode('utf-8', 'replace')}: damaged record ({what}); "
                                   f"run `shardfeed check {self.root}`") from None

    def __getitem__(self, i: int, value=_UNREAD):
        if not 0 <= i < self._num_samples:
            raise IndexError(f"sample index {i} is outside [0, {self._num_samples})")
        self._map_epoch_check()
        meta = None
        try:
            if self.fields:
                rec = self.read_record(i, value)
                meta = rec["meta"]
                where = f"{self._db_path} key {rec['key']}"
                stored = {field_member(k): v for k, v in (rec.get("fields") or {}).items()}
                return self.emit(rec["key"], rec["data"], rec["ext"], int(rec["label"]), meta, where, index=i,
                                 extra=self.field_values(stored, where))
            key, data, ext, label, meta = self.read_raw(i, value)
            return self.emit(key, data, ext, label, meta, f"{self._db_path} key {key}", index=i)
        except (CorruptDataError, ValueError) as exc:
            self.handle_error(name_original_file(exc, meta), f"{self.root / 'data.mdb'} key {self.key(i).decode()}")
            return None

    def __getitems__(self, indices) -> list:
        """``[self[i] for i in indices]`` (what a loader's batch asks for), the records read ahead
        on slow storage (see the module docstring): at most :attr:`read_ahead_records` records
        held ahead of the decoder.

        The records are read in this thread, each read timed, until one proves slow (or from the
        start, when the last batch's did); the rest then go to the read pool. A batch with fewer
        than one slow read in eight lets the next one start in this thread again. Read by
        ``pread``, the reads of the batch this process most likely gets next follow in the same
        bounds (:meth:`_guess_next_batch`), kept while any read of the batch was slow; they serve
        that batch only when it is exactly the one asked for, and are dropped otherwise.

        Raises:
            What ``self[i]`` raises, at that sample.
        """
        indices = [int(i) for i in indices]
        held = self._take_ahead()
        depth = int(self.read_ahead_records)
        if held is not None and (depth <= 0 or held.tags() != indices):
            held.close()  # read for a batch this one is not
            held = None
        if depth <= 0 or len(indices) < 2:
            if held is not None:
                held.close()  # a batch of one sample is read in this thread
            return [self[i] for i in indices]
        out = []
        n = 0
        latency = self._read_latency
        if not self._reads_slow and held is None:
            while n < len(indices):
                i = indices[n]
                if not 0 <= i < self._num_samples:
                    raise IndexError(f"sample index {i} is outside [0, {self._num_samples})")
                value, took = self._get(i)
                out.append(self.__getitem__(i, value))
                n += 1
                if took > SLOW_READ_S:
                    latency = took
                    break
            if n >= len(indices):
                return out
        rest = indices[n:]
        bad = next((i for i in rest if not 0 <= i < self._num_samples), None)
        if bad is not None:  # the batch fails at its first bad index, as ``self[i]`` would
            rest = rest[:rest.index(bad)]
        reader = self._value_reader() if latency >= PREAD_LATENCY_S or held is not None else None
        stream = None
        if reader is None:
            if held is not None:
                held.close()
            reads = self._pool_reads(rest, depth)
        else:
            stream = self._stream_for(reader, rest, None if bad is not None else indices, depth, held)
            reads = _taken(stream, rest)
        took_s = []
        try:
            for i, (value, took) in zip(rest, reads):
                took_s.append(took)
                if value is None and reader is not None:
                    # not found in the pages parsed by pread: LMDB itself says whether it is there
                    value = self._get(i)[0]
                out.append(self.__getitem__(i, value))
            slow = sum(t > SLOW_READ_S for t in took_s)
            if took_s:
                self._read_latency = sorted(took_s)[len(took_s) // 2]
            if bad is not None:
                raise IndexError(f"sample index {bad} is outside [0, {self._num_samples})")
            # page cache warm again (hardly a read slow): the next batch starts in this thread
            self._reads_slow = 8 * slow >= len(rest)
            if stream is not None and slow and len(stream):  # storage still slow, if partly cached
                self._ahead, stream = (os.getpid(), stream), None  # the next batch's reads, kept
        finally:
            reads.close()
            if stream is not None:
                stream.close()
        return out

    def _take_ahead(self):
        """The :class:`~shardfeed.readers.storage.lmdb_readahead.ValueStream` the last batch left with
        the reads of the guessed next batch (None: none, or one of the parent before a ``fork``)."""
        held = self.__dict__.pop("_ahead", None)
        if held is None or held[0] != os.getpid():
            return None
        return held[1]

    def _stream_for(self, reader, rest: list, batch: list | None, depth: int, held):
        """The stream that yields ``rest``'s values: ``held`` when what it holds is exactly
        ``rest`` (the guess was right) read by ``reader``, else a new one (``held`` is closed); the guessed next
        batch after ``batch`` (:meth:`_guess_next_batch`; None: none) is queued behind."""
        stream = held
        if stream is not None and (stream.reader is not reader or stream.tags() != rest):
            stream.close()
            stream = None
        if stream is None:
            stream = ValueStream(reader, read_pool(), fallback=lambda i: self._get(i)[0], max_records=depth,
                                 max_bytes=int(self.read_ahead_bytes))
            stream.extend((self.key(i), i) for i in rest)
        nxt = self._guess_next_batch(batch) if batch else None
        if nxt:
            stream.extend((self.key(i), i) for i in nxt)
        return stream

    def _guess_next_batch(self, batch: list) -> list | None:
        """The indices this process will most likely be asked for after ``batch``, or None.

        A loader's sampler (:class:`~shardfeed.readers.loader.EpochSampler`) gives this rank's
        share of the epoch in an order that depends only on the seed, epoch, rank, world size,
        batch size, padding and resume plan (:meth:`_epoch_order` computes it again here), and
        the ``DataLoader`` hands its batches to the workers in turn: after the batch at position
        ``p`` of that order a worker gets the one at ``p + num_workers * batch_size``, and after
        its last one of the epoch (with :attr:`next_epoch_ahead`) its first of the next epoch.
        None where ``batch`` is not a batch of that order (another sampler: after a few such
        batches the epoch is not searched again) or nothing follows it.
        """
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (max(1, int(info.num_workers)), int(info.id))
        size = int(self.batch_size)
        epoch = max(int(self._epoch_state[0]), 0)
        misses = self.__dict__.get("_guess_misses", (epoch, 0))
        if size < 1 or (misses[0] == epoch and misses[1] >= _MAX_GUESS_MISSES):
            return None
        order = self._epoch_order(epoch)
        at = self.__dict__.get("_guess_at")
        p = _locate(order, batch, size, [at[1] if at and at[0] == epoch else None, worker * size])
        if p is None:
            self._guess_misses = (epoch, misses[1] + 1 if misses[0] == epoch else 1)
            return None
        self._guess_misses = (epoch, 0)
        q = p + workers * size
        if q >= len(order):
            if not self.next_epoch_ahead:
                return None
            epoch, q = epoch + 1, worker * size
            order = self._epoch_order(epoch)
        self._guess_at = (epoch, q)
        return order.slice(q, q + size).tolist() or None

    def _epoch_order(self, epoch: int) -> RankOrder:
        """This rank's sample indices of ``epoch`` in the order :class:`~shardfeed.readers.loader.EpochSampler`
        yields them (its resume plan included), computed a slice at a time; kept for the latest two epochs
        asked for."""
        segments = self.resume_segments(epoch)
        key = (epoch, repr(segments), self.seed, self.shuffle, self.pad, self.drop_last, self.rank,
               self.world_size, self.batch_size, self._num_samples)
        orders = self.__dict__.setdefault("_orders", {})
        order = orders.get(key)
        if order is None:
            try:
                order = self.rank_order(epoch)
            except ValueError:  # a resume plan that does not fit: nothing to guess from
                order = RankOrder(0, rank=0, world_size=1, batch_size=1, seed=0, epoch=0, shuffle=False)
            while len(orders) >= 2:
                orders.pop(next(iter(orders)))
            orders[key] = order
        return order

    def _value_reader(self):
        """This process's :class:`~shardfeed.readers.storage.lmdb_readahead.ValueReader` of the database
        (None where it cannot be made: the records are then read through the map)."""
        env = self.env()
        held = self.__dict__.get("_reader")
        if held is not None and held[0] == self._env_pid and held[1] is env:
            return held[2]
        if held is not None and held[2] is not None:
            held[2].close()
        try:
            reader = ValueReader(env, self._db_path)
        except OSError:
            reader = None
        self._reader = (self._env_pid, env, reader)
        return reader

    def _pool_reads(self, indices: list, depth: int):
        """``(value, seconds)`` of each index, read by the read pool up to ``depth`` ahead (through the map)."""
        pool = read_pool()
        pending: collections.deque = collections.deque()
        try:
            for k in range(len(indices)):
                while len(pending) < depth and k + len(pending) < len(indices):
                    pending.append(pool.submit(self._get, indices[k + len(pending)]))
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
