"""Pack an image folder into a WebDataset or LMDB dataset: plan, write in parallel, resume.

The flow (DESIGN.md): scan the folder (:mod:`shardfeed.convert.scan`), fix the packing order (a
seeded shuffle of the whole dataset, or sorted order), give every sample its key (the zero-padded
position in that order), then hand the plan to the format's packer from :data:`PACKERS`.

For WebDataset the shard boundaries are computed up front from the sample order and the file
sizes (every member's size on disk is known before reading a byte), so each shard is an
independent task: shards are byte-identical whatever ``workers`` is, and a killed pack resumes by
rewriting only the shards that were not complete. Pack state lives in ``OUT/.shardfeed-pack/``
(the plan's fingerprint and one record per finished shard) until the manifest, written last and
atomically, marks the dataset finished.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
import warnings
from array import array
from pathlib import Path
from typing import Callable, Sequence

from shardfeed.readers.errors import CorruptDataError, ShardfeedError, SourceChangedError
from shardfeed.readers.format import (
    DEFAULT_PREFIX,
    LMDB_DATA_NAME,
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    class_bytes,
    index_name,
    load_manifest,
    shard_name,
    write_bytes_atomic,
)

from .executors import active_executor, check_executor, make_executor, use_executor
from .reencode import ReencodeOptions, reencode_payload
from .plan import PlannedSample, SamplePlan, fast_meta_bytes, input_bytes, plan_samples, plan_shards, sample_meta_bytes
from .scan import ScanResult, ScannedFile, ScannedFiles, scan_image_folder
from .tarwriter import TarShardFile

__all__ = [
    "PackOptions",
    "PlannedSample",
    "PackReport",
    "pack",
    "plan_samples",
    "plan_shards",
    "read_source_bytes",
    "PACKERS",
    "FORMAT_ALIASES",
    "STATE_DIR",
    "prepare_output",
    "ProgressSink",
    "load_class_map",
    "run_tasks",
    "load_sample_payload",
    "SamplePlan",
    "read_file_checked",
]

log = logging.getLogger(__name__)

STATE_DIR = ".shardfeed-pack"
#: Test hook: ``SHARDFEED_TEST_DELAY_MS`` slows every sample read so tests can kill a pack mid-way.
_TEST_DELAY_S = float(os.environ.get("SHARDFEED_TEST_DELAY_MS", "0") or 0) / 1000
FORMAT_ALIASES = {"wds": "webdataset", "webdataset": "webdataset", "lmdb": "lmdb"}


@dataclasses.dataclass
class PackOptions:
    """Options of :func:`pack` (CLI flags are their kebab-case: ``max_bytes`` ↔ ``--max-bytes``).

    Attributes:
        format: ``"webdataset"`` (alias ``"wds"``) or ``"lmdb"``.
        max_count: samples per shard at most (WebDataset).
        max_bytes: bytes per shard file at most, headers and padding included (WebDataset).
        prefix: shard file prefix (``shard`` → ``shard-000000.tar``).
        workers: processes that read and write (default: CPU count).
        seed: seed of the packing-order shuffle.
        shuffle: False keeps sorted ImageFolder order.
        extensions: extensions to pack (None: the defaults).
        on_error: ``"raise"`` (stop, naming the file) or ``"skip"`` (list it in the manifest), the
            readers' spelling; ``"fail"`` (the old spelling) is accepted with a DeprecationWarning.
            Manifests keep recording ``"fail"`` for ``"raise"`` (their bytes do not change).
        decode_check: fully decode every image while packing (readers' decode rules).
        class_to_idx: fixed class map (``--classes-from``); None: from the folder.
        resume: continue an interrupted pack in OUT.
        overwrite: replace an existing dataset in OUT.
        reencode: re-encode every image (resize / quality / format,
            :class:`~shardfeed.convert.reencode.ReencodeOptions` or a dict of its fields); None
            stores the original bytes unchanged.
        executor: where the tasks run: ``"local"`` (``workers`` processes) or ``"ray"`` (a Ray
            cluster, :mod:`shardfeed.convert.executors`); the output bytes are the same.
        ray_address: the Ray cluster (``auto``, ``HOST:PORT``); None: ``RAY_ADDRESS`` when set,
            else a local Ray instance.
    """

    format: str = "webdataset"
    max_count: int = 10000
    max_bytes: int = 256_000_000
    prefix: str = DEFAULT_PREFIX
    workers: int | None = None
    seed: int = 0
    shuffle: bool = True
    extensions: tuple[str, ...] | None = None
    on_error: str = "raise"
    decode_check: bool = False
    class_to_idx: dict | None = None
    resume: bool = False
    overwrite: bool = False
    #: LMDB: initial map size in bytes (None: payload + headroom). Tests use a tiny one.
    map_size: int | None = None
    reencode: ReencodeOptions | None = None
    #: not part of fingerprint_fields(): the executor does not change the output bytes
    executor: str = "local"
    ray_address: str | None = None

    def __post_init__(self):
        self.executor = str(self.executor).lower()
        check_executor(self.executor)
        if self.ray_address and self.executor != "ray":
            raise ValueError(f"ray_address {self.ray_address!r} applies to the ray executor only; add --executor ray")
        if isinstance(self.reencode, dict):
            self.reencode = ReencodeOptions(**self.reencode)
        if self.reencode is not None and not isinstance(self.reencode, ReencodeOptions):
            raise TypeError(f"reencode must be a ReencodeOptions, a dict or None, got {type(self.reencode).__name__}")
        fmt = FORMAT_ALIASES.get(str(self.format).lower())
        if fmt is None:
            raise ValueError(f"unknown format {self.format!r}: choose one of wds (webdataset), lmdb")
        self.format = fmt
        if self.max_count < 1:
            raise ValueError(f"--max-count (max_count) must be at least 1, got {self.max_count}")
        if self.max_bytes < 4096:
            raise ValueError(f"--max-bytes (max_bytes) must be at least 4096 bytes (KB/MB/GB are powers of 1000, "
                             f"KiB/MiB/GiB of 1024), got {self.max_bytes}")
        if self.on_error == "fail":
            warnings.warn("PackOptions(on_error='fail') is deprecated: use on_error='raise'", DeprecationWarning,
                          stacklevel=3)
            self.on_error = "raise"
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.workers is None:
            self.workers = os.cpu_count() or 1
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if "/" in self.prefix or not self.prefix or "." in self.prefix:
            raise ValueError(f"prefix {self.prefix!r} must be a plain name without '/' or '.'")

    def fingerprint_fields(self) -> dict:
        """The options that decide the output bytes (recorded in the manifest; checked on resume)."""
        d = {"format": self.format, "seed": self.seed, "shuffle": self.shuffle,
             "extensions": list(self.extensions) if self.extensions else None,
             # manifests record the old spelling "fail" for "raise": same bytes, resumable packs
             "on_error": "fail" if self.on_error == "raise" else self.on_error, "decode_check": self.decode_check}
        if self.format == "webdataset":
            d.update(max_count=self.max_count, max_bytes=self.max_bytes, prefix=self.prefix)
        if self.reencode is not None:  # only then: manifests of packs that keep the bytes are unchanged
            d["reencode"] = self.reencode.fingerprint_fields()
        return d


@dataclasses.dataclass
class PackReport:
    """Summary of a pack (printed by the CLI; ``--json`` writes :meth:`to_json`)."""

    source: str
    output: str
    format: str
    num_samples: int
    num_shards: int
    num_bytes: int
    input_bytes: int
    seconds: float
    workers: int
    files: dict
    skipped: list
    ignored: list
    empty_classes: list
    num_classes: int
    shards_resumed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["images_per_s"] = round(self.images_per_s, 1)
        d["mb_per_s"] = round(self.mb_per_s, 2)
        return d

    def summary(self) -> str:
        """The one-line human summary."""
        shards = "one database" if self.format == "lmdb" else _plural(self.num_shards, "shard")
        s = (f"packed {_plural(self.num_samples, 'sample')} in {_plural(self.num_classes, 'class', 'classes')} "
             f"into {shards} ({self.format}, {_size(self.num_bytes)}) "
             f"at {self.output} in {self.seconds:.2f} s: {self.images_per_s:,.0f} images/s, "
             f"{self.mb_per_s:.1f} MB/s")
        if self.skipped:
            s += f"; {_plural(len(self.skipped), 'file')} skipped (listed in the manifest)"
        if self.ignored:
            s += f"; {_plural(len(self.ignored), 'file')} ignored (hidden, other extensions, outside class folders)"
        if self.shards_resumed:
            done = "database" if self.format == "lmdb" else _plural(self.shards_resumed, "shard")
            s += f"; {done} kept from the interrupted run"
        if self.extra.get("executor", "local") != "local":
            n_nodes = len(self.extra.get("nodes") or [])
            s += (f"; {self.extra['executor']}: {self.extra.get('num_tasks', 0)} tasks on {n_nodes} "
                  f"{'node' if n_nodes == 1 else 'nodes'}")
            if self.extra.get("task_retries"):
                s += f", {self.extra['task_retries']} retried"
        return s


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} KB"


# ---------------------------------------------------------------------------------------------
# planning (PlannedSample, plan_samples, plan_shards: shardfeed.convert.plan)

def _fingerprint(scan: ScanResult, samples: Sequence[PlannedSample], options: PackOptions) -> str:
    """The plan's identity (options, classes, and every sample's key, path, size and mtime).

    Hashed column by column (keys, paths, sizes and mtimes as little-endian int64) rather than
    line by line: the same information, a few milliseconds for 20,000 files instead of ~20.
    """
    h = hashlib.sha256()
    h.update(json.dumps(options.fingerprint_fields(), sort_keys=True).encode())
    h.update(json.dumps(scan.class_to_idx, sort_keys=True).encode())
    if isinstance(samples, SamplePlan):
        files, start, width = samples.files, samples.start, samples.width
        keys = (str(i).zfill(width) for i in range(start, start + len(files)))
    else:
        files = ScannedFiles.from_files(scan.root, [s.file for s in samples])
        keys = (s.key for s in samples)
    # in chunks: a bounded temporary string whatever the number of files
    h.update(b"keys\0")
    for chunk in iter(lambda: list(itertools.islice(keys, 4096)), []):
        h.update("".join([k + "\n" for k in chunk]).encode())
    h.update(b"\0paths\0")
    rels = files.rels
    for a in range(0, len(rels), 4096):
        h.update("".join([r + "\0" for r in rels[a:a + 4096]]).encode("utf-8", "surrogateescape"))
    for column in (files.sizes, files.mtimes_ns):
        col = array("q", column)
        if sys.byteorder != "little":
            col.byteswap()
        h.update(b"\0" + col.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# reading sources (in worker processes)

def read_source_bytes(f: ScannedFile) -> bytes:
    """Read a source file, checking it is the file the scan saw.

    Raises:
        SourceChangedError: the file vanished, or its size or mtime changed since the scan.
        OSError: it cannot be read (permissions, I/O error); the message names the file.
    """
    return read_file_checked(f.path, f.size, f.mtime_ns)


def read_file_checked(path: str, size: int, mtime_ns: int) -> bytes:
    """Read ``path``, checking that its size and mtime are still ``size`` and ``mtime_ns``.

    Four system calls (open, fstat, one read, close) in the common case.

    Raises:
        SourceChangedError: the file vanished, or its size or mtime changed since the scan.
        OSError: it cannot be read (permissions, I/O error); the message names the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SourceChangedError(f"{path}: disappeared after the scan; rerun the pack") from None
    except OSError as exc:
        raise OSError(exc.errno, f"{path}: cannot open ({exc.strerror}); fix its permissions, or pass "
                                 "--on-error skip to pack without it (then --resume)") from None
    try:
        st = os.fstat(fd)
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            raise SourceChangedError(f"{path}: changed while packing (size {size} -> {st.st_size} bytes); "
                                     "rerun the pack once the folder is stable")
        data = os.read(fd, size) if size else b""
        if len(data) < size:  # a short read: keep reading until EOF
            chunks = [data]
            remaining = size - len(data)
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, ShardfeedError):
            raise
        raise OSError(exc.errno, f"{path}: read failed ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) != size:
        raise SourceChangedError(f"{path}: shrank while packing ({size} -> {len(data)} bytes); rerun the pack")
    if not size:
        raise CorruptDataError(f"{path}: empty file (0 bytes), not an image; delete it, or pass --on-error skip")
    return data


def load_sample_payload(s: PlannedSample, options: PackOptions) -> tuple[bytes, str, dict]:
    """The bytes, extension and metadata to store for one planned sample.

    Reads the file (:func:`read_source_bytes`), re-encodes it when ``options.reencode`` is set
    (:func:`shardfeed.convert.reencode.reencode_payload`: new bytes and extension, ``orig_*`` added
    to a copy of the metadata) and, with ``decode_check``, decodes the bytes to store with the
    readers' exact rules so that a file that packs also decodes in training.

    Raises:
        SourceChangedError, OSError: as :func:`read_source_bytes`.
        shardfeed.readers.errors.CorruptDataError: the image does not decode (``decode_check``).
    """
    if _TEST_DELAY_S:
        time.sleep(_TEST_DELAY_S)
    data = read_source_bytes(s.file)
    ext, meta = s.file.ext, s.meta
    if options.reencode is not None:
        data, ext, meta = reencode_payload(data, ext, meta, options.reencode, source=s.file.path)
    if options.decode_check:
        from shardfeed.readers.decode import decode_image

        decode_image(data, ext, source=s.file.path)
    return data, ext, meta


def _payload_is_plain(options: PackOptions) -> bool:
    """True when :func:`load_sample_payload` stores every file's bytes, extension and metadata as
    they are: the WebDataset packer then takes its lean loop (:func:`_add_plain_samples`), which
    must stay equivalent to ``load_sample_payload`` + ``add_sample`` (keep the two in step)."""
    return options.reencode is None and not options.decode_check and not _TEST_DELAY_S


def _add_plain_samples(shard: TarShardFile, plan: SamplePlan, on_error: str, skipped: list,
                       progress: "ProgressSink") -> None:
    """Append the plan's samples to ``shard`` straight from its columns (issue 8's hot loop).

    Same bytes as building a :class:`PlannedSample` per sample, calling
    :func:`load_sample_payload` and ``shard.add_sample`` with ``meta_bytes``; none of those
    objects is built (a few microseconds per sample, as much as reading a small file).
    """
    files, lo, hi = plan._files, plan._lo, plan._hi  # the plan's range of the columns, no copy
    rels, sizes, mtimes, codes, ecodes = files.rels, files.sizes, files.mtimes_ns, files.class_codes, files.ext_codes
    exts = files.exts
    cls = [class_bytes(label) for label in files.class_labels]
    # meta_bytes({"path": rel, "class": c}) == (meta_head[c] + encode_str(rel) + "}").encode()
    meta_head = [sample_meta_bytes(c, "")[:-3].decode("utf-8") for c in files.class_names]
    enc = json.encoder.encode_basestring
    prefix = files.path_prefix if os.sep == "/" else None
    base, width = plan.start - lo, plan.width  # global index of rels[j] is base + j
    add = shard.add_wds_sample
    open_, fstat, read, close, rdonly = os.open, os.fstat, os.read, os.close, os.O_RDONLY
    n_done = n_bytes = 0
    for j in range(lo, hi):
        rel = rels[j]
        key = str(base + j).zfill(width)
        path = prefix + rel if prefix is not None else files.path_of(j)
        size = sizes[j]
        data = None
        try:  # read_file_checked's common case, inline: open, fstat, one read, close
            fd = open_(path, rdonly)
            try:
                st = fstat(fd)
                if st.st_size == size and st.st_mtime_ns == mtimes[j]:
                    data = read(fd, size)
            finally:
                close(fd)
        except OSError:
            pass
        if not data or len(data) != size:
            try:  # anything unusual (or an empty file): the full checks, and their precise errors
                data = read_file_checked(path, size, mtimes[j])
            except (OSError, ValueError) as exc:
                if on_error != "skip":
                    raise
                skipped.append({"path": rel, "key": key, "reason": _skip_reason(exc)})
                n_done += 1
                continue
        code = codes[j]
        add(key, exts[ecodes[j]], data, cls[code], (meta_head[code] + enc(rel) + "}").encode("utf-8"))
        n_done += 1
        n_bytes += size
        if n_done >= 256:
            progress.add(n_done, n_bytes)
            n_done = n_bytes = 0
    progress.add(n_done, n_bytes)


def _skip_reason(exc: BaseException) -> str:
    """The error's message without its path prefix, and without the advice to pass
    ``--on-error skip`` (the file *was* skipped that way)."""
    msg = str(exc)
    reason = msg.split(": ", 1)[1] if ": " in msg else (msg or type(exc).__name__)
    if "--on-error skip" in reason and "; " in reason:
        reason = reason.rsplit("; ", 1)[0]
    return reason


class ProgressSink:
    """Collects progress increments (samples, input bytes) from the packers; thread-safe.

    In worker processes the increments travel through a multiprocessing queue; the main process
    drains it into a tqdm bar.
    """

    def __init__(self, q=None, callback: Callable[[int, int], None] | None = None):
        self._q = q
        self._callback = callback
        self._pending = [0, 0]
        self._last = time.monotonic()

    def add(self, samples: int, nbytes: int) -> None:
        if self._callback is not None:
            self._callback(samples, nbytes)
            return
        self._pending[0] += samples
        self._pending[1] += nbytes
        now = time.monotonic()
        if now - self._last > 0.1:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if self._q is not None and (self._pending[0] or self._pending[1]):
            self._q.put(tuple(self._pending))
            self._pending = [0, 0]


# ---------------------------------------------------------------------------------------------
# WebDataset packer

_worker_progress: ProgressSink | None = None


def _init_worker(q) -> None:
    global _worker_progress
    _worker_progress = ProgressSink(q)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and cleans up
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # file-size limit: get EFBIG, not death


def _write_wds_shard(task) -> tuple[dict, list]:
    out_dir, shard_idx, samples, options = task
    progress = _worker_progress or ProgressSink()
    skipped = []
    name, iname = shard_name(shard_idx, options.prefix), index_name(shard_idx, options.prefix)
    with TarShardFile(out_dir, name, iname) as shard:
        n_done = n_bytes = 0  # progress goes out in batches (a call per sample costs as much as a tar header)
        plain = isinstance(samples, SamplePlan) and _payload_is_plain(options)
        if plain:
            _add_plain_samples(shard, samples, options.on_error, skipped, progress)
        for s in (() if plain else samples):
            try:
                data, ext, meta = load_sample_payload(s, options)
            except (OSError, ValueError) as exc:
                if options.on_error != "skip":
                    raise
                skipped.append({"path": s.file.rel, "key": s.key, "reason": _skip_reason(exc)})
                n_done += 1
                continue
            shard.add_sample(s.key, [(ext, data), ("cls", class_bytes(s.file.label)), ("json", fast_meta_bytes(meta))])
            n_done += 1
            n_bytes += len(data)
            if n_done >= 64:
                progress.add(n_done, n_bytes)
                n_done = n_bytes = 0
        progress.add(n_done, n_bytes)
        if not shard.offsets:
            shard.abort()
            entry = None
        else:
            entry = shard.close()
    progress.flush()
    result = entry.to_json() if entry else None
    record = {"shard": shard_idx, "entry": result, "skipped": skipped}
    write_bytes_atomic(Path(out_dir) / STATE_DIR / f"{shard_idx:06d}.json", json.dumps(record).encode())
    return result, skipped


def _shard_done(out_dir: Path, shard_idx: int, prefix: str) -> dict | None:
    rec_path = out_dir / STATE_DIR / f"{shard_idx:06d}.json"
    try:
        record = json.loads(rec_path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    entry = record.get("entry")
    if entry is None:
        return record  # every sample of that shard was skipped
    tar = out_dir / entry["name"]
    idx = out_dir / entry["index"]
    if tar.exists() and idx.exists() and tar.stat().st_size == entry["num_bytes"]:
        return record
    return None


def run_tasks(fn, tasks: list, workers: int, progress: Callable[[int, int], None],
              max_in_flight: int | None = None):
    """Run ``fn(task)`` for each task in ``workers`` processes (inline when 1); yield results in order.

    Progress increments sent by the tasks through their :class:`ProgressSink` reach ``progress``.
    Ctrl-C terminates the workers promptly; their temporary files are removed. With
    ``max_in_flight``, at most that many tasks are submitted ahead of the consumer (memory stays
    bounded when results are large and the consumer is the slower side).
    """
    if workers <= 1 or len(tasks) <= 1:
        global _worker_progress
        _worker_progress = ProgressSink(callback=progress)
        try:
            for t in tasks:
                yield fn(t)
        finally:
            _worker_progress = None
        return
    import multiprocessing as mp  # here: 10 ms of imports a one-process pack does not need

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    stop = threading.Event()

    def drain():
        while not stop.is_set() or not q.empty():
            try:
                n, b = q.get(timeout=0.05)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            progress(n, b)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    pool = ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(q,))
    try:
        if max_in_flight is None:
            for r in pool.imap(fn, tasks):
                yield r
        else:
            it = iter(tasks)
            pending = collections.deque(pool.apply_async(fn, (t,)) for t in itertools.islice(it, max_in_flight))
            while pending:
                r = pending.popleft().get()
                pending.extend(pool.apply_async(fn, (t,)) for t in itertools.islice(it, 1))
                yield r
        pool.close()
        pool.join()
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    finally:
        stop.set()
        t.join(timeout=2)


def pack_webdataset(scan: ScanResult, samples: list[PlannedSample], out: Path, options: PackOptions,
                    progress: Callable[[int, int], None]) -> tuple[list[ShardEntry], list[dict], int, dict]:
    """Write the planned samples as WebDataset shards; returns (shards, skipped, resumed, extra)."""
    if options.reencode is not None:  # sizes are known only after encoding: cut shards as they come
        from .reencode import pack_webdataset_reencoded

        return pack_webdataset_reencoded(scan, samples, out, options, progress)
    ranges = plan_shards(samples, max_count=options.max_count, max_bytes=options.max_bytes)
    done: dict[int, dict] = {}
    if options.resume:
        for i in range(len(ranges)):
            rec = _shard_done(out, i, options.prefix)
            if rec is not None:
                done[i] = rec
                a, b = ranges[i]
                progress(b - a, input_bytes(samples[a:b]))
    tasks = [(str(out.absolute()), i, samples[a:b], options) for i, (a, b) in enumerate(ranges) if i not in done]
    results: dict[int, tuple] = {i: (rec["entry"], rec["skipped"]) for i, rec in done.items()}
    shared = (scan.root, str(out.absolute() / STATE_DIR / "plan.json"))  # what every Ray node must see
    # the generator first: zip then runs it to its end (a clean pool shutdown), not tasks first
    for res, task in zip(active_executor(options).map_ordered(_write_wds_shard, tasks, progress,
                                                              required_paths=shared), tasks):
        results[task[1]] = res
    shards, skipped = [], []
    for i in range(len(ranges)):
        entry, sk = results[i]
        skipped.extend(sk)
        if entry is not None:
            shards.append(ShardEntry(**entry))
    return shards, skipped, len(done), {"num_planned_shards": len(ranges)}


#: Packers by canonical format name: fn(scan, samples, out, options, progress) ->
#: (shards, skipped, shards_resumed, extra). The LMDB packer registers itself on import.
PACKERS: dict[str, Callable] = {"webdataset": pack_webdataset}


def _packer(fmt: str) -> Callable:
    if fmt not in PACKERS and fmt == "lmdb":
        from . import lmdb_writer  # noqa: F401  (registers itself)
    try:
        return PACKERS[fmt]
    except KeyError:
        raise ValueError(f"format {fmt!r} has no packer") from None


# ---------------------------------------------------------------------------------------------
# output folder

_OURS = (MANIFEST_NAME, LMDB_DATA_NAME, "lock.mdb", STATE_DIR)


def prepare_output(src: Path, out: Path, *, resume: bool, overwrite: bool, check_only: bool = False) -> None:
    """Check OUT before anything is written, then create it, or clear it for ``overwrite``.

    With ``check_only`` nothing is created or removed (the CLI checks before scanning).

    Raises:
        ValueError: OUT equals SRC or lies inside it; OUT is not empty (without ``resume`` or
            ``overwrite``); OUT is already a finished dataset (with ``resume``); OUT holds files
            shardfeed did not write (with ``overwrite``).
        NotADirectoryError: OUT is a file.
    """
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r:
        raise ValueError(f"{out}: OUT is the source folder itself; choose another output folder")
    if src_r in out_r.parents:
        raise ValueError(f"{out}: OUT lies inside the source folder {src} (it would be scanned as a class); "
                         "choose an output folder outside it")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder for the output")
    if not out.exists() or not any(out.iterdir()):
        if not check_only:
            out.mkdir(parents=True, exist_ok=True)
        return
    if resume:
        if (out / MANIFEST_NAME).exists():
            raise ValueError(f"{out}: already holds a finished dataset ({MANIFEST_NAME}); nothing to resume "
                             "(use --overwrite to rebuild it)")
        if not (out / STATE_DIR).exists():
            raise ValueError(f"{out}: not an interrupted shardfeed pack (no {STATE_DIR}/); "
                             "choose an empty folder or use --overwrite")
        return
    if not overwrite:
        if (out / STATE_DIR).exists() and not (out / MANIFEST_NAME).exists():
            raise ValueError(f"{out}: holds an unfinished pack ({STATE_DIR}/, kept when a pack stops): --resume "
                             "finishes it with the same source and options; after changing either (a file fixed "
                             "or removed, --on-error), start again with --overwrite")
        raise ValueError(f"{out}: output folder is not empty; use --overwrite to replace it, "
                         "--resume to finish an interrupted pack, or choose an empty folder")
    foreign = [p.name for p in out.iterdir() if not _is_ours(p.name)]
    if foreign:
        raise ValueError(f"{out}: holds files shardfeed did not write ({', '.join(sorted(foreign)[:5])}); "
                         "refusing to delete them with --overwrite: choose an empty folder")
    if check_only:
        return
    for p in out.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _is_ours(name: str) -> bool:
    if name in _OURS or name.endswith((".tar", ".idx", ".tmp")):
        return True
    return name.startswith(".") and (name.endswith(".tmp") or name.startswith("." + MANIFEST_NAME))


# ---------------------------------------------------------------------------------------------
# entry point

def pack(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions | None = None, *,
         progress: Callable[[int, int], None] | None = None,
         scan: ScanResult | None = None) -> PackReport:
    """Pack the image folder ``src`` into ``out`` (WebDataset shards or LMDB) with a manifest.

    Args:
        src: an ImageFolder root (``SRC/CLASS/IMAGE``).
        out: output folder (created; must be empty unless ``resume``/``overwrite``).
        options: :class:`PackOptions`.
        progress: ``callback(num_samples, num_input_bytes)`` called as samples are written.
        scan: a scan of ``src`` done already (to avoid scanning twice).

    Returns:
        A :class:`PackReport`.

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file; OUT a file.
        ValueError: empty SRC, OUT not empty, bad options, a sample larger than ``max_bytes``.
        SourceChangedError: a file changed during the pack (``on_error="raise"``).
        shardfeed.readers.errors.CorruptDataError: an image failed ``decode_check``.
        OSError: reading a source or writing OUT failed (disk full: ``ENOSPC``/``EFBIG``); complete
            shards stay and ``resume`` continues.
    """
    options = options or PackOptions()
    src, out = Path(src), Path(out)
    t0 = time.perf_counter()
    if scan is None:
        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx)
    prepare_output(src, out, resume=options.resume, overwrite=options.overwrite)
    samples = plan_samples(scan, seed=options.seed, shuffle=options.shuffle)
    fingerprint = _fingerprint(scan, samples, options)
    state = out / STATE_DIR
    plan_path = state / "plan.json"
    if options.resume:
        try:
            old = json.loads(plan_path.read_text())
        except (FileNotFoundError, ValueError):
            old = {}
        if old.get("fingerprint") != fingerprint:
            raise ValueError(f"{out}: the interrupted pack used other options or another version of the source "
                             f"folder (plan fingerprint differs); rerun with the same options, or use --overwrite")
    else:
        state.mkdir(exist_ok=True)
        write_bytes_atomic(plan_path, json.dumps({"fingerprint": fingerprint,
                                                  "options": options.fingerprint_fields()}).encode())
    progress = progress or (lambda n, b: None)
    try:
        with use_executor(make_executor(options)) as executor:  # the packers run their tasks on it
            shards, skipped, resumed, extra = _packer(options.format)(scan, samples, out, options, progress)
    except BaseException:
        # Ctrl-C, disk full, a bad file: keep complete shards for --resume, drop partial ones
        for tmp in out.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        raise
    num_samples = sum(s.num_samples for s in shards)
    if num_samples == 0:
        raise ValueError(f"{src}: every image was skipped ({len(skipped)}); nothing to pack")
    manifest = Manifest(
        format=options.format, num_samples=num_samples, classes=scan.classes, class_to_idx=scan.class_to_idx,
        shards=shards, skipped=skipped,
        options={**options.fingerprint_fields(), "source": scan.root},
        files={"found": scan.num_found, "packed": num_samples, "skipped": len(skipped),
               "ignored": len(scan.ignored)},
    )
    extra.update(executor.describe())  # executor, num_tasks, nodes, task_retries
    finalize = extra.pop("finalize", None)
    if finalize is not None:
        finalize(manifest)  # e.g. LMDB stores its copy of the manifest in its final transaction
    manifest.write(out)
    shutil.rmtree(state, ignore_errors=True)
    seconds = time.perf_counter() - t0
    return PackReport(
        source=scan.root, output=str(out), format=options.format, num_samples=num_samples,
        num_shards=len(shards), num_bytes=sum(s.num_bytes for s in shards),
        input_bytes=input_bytes(samples), seconds=seconds, workers=options.workers,
        files=manifest.files, skipped=skipped, ignored=scan.ignored, empty_classes=scan.empty_classes,
        num_classes=len(scan.classes), shards_resumed=resumed, extra=extra,
    )


def load_class_map(manifest_path: str | os.PathLike) -> dict[str, int]:
    """The ``class_to_idx`` of a packed dataset's manifest (for ``--classes-from``)."""
    return load_manifest(manifest_path, check_files=False).class_to_idx
