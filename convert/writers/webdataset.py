"""WebDataset output: the streaming :class:`WebDatasetWriter` and the two WebDataset packers.

All three write their shards with :class:`~shardfeed.convert.writers.shard.ShardWriter`, so one
rollover rule cuts every shard (a shard closes *before* it would pass ``max_count`` samples or
``max_bytes`` bytes on disk, headers, padding and end blocks included):

* :class:`WebDatasetWriter` (``shardfeed convert`` and other producers that see samples one at a
  time; the ``Writer`` protocol (docs/architecture.md): ``write(sample)``, ``close() -> Manifest``, context
  manager) cuts as samples come, and writes the manifest last, atomically. Leaving the ``with``
  block on an exception drops the shard in progress and writes no manifest.
* :func:`pack_webdataset` (``shardfeed pack``): the boundaries are computed up front by
  :func:`~shardfeed.convert.write.plan.plan_shards` with the same rule from the file sizes (every
  member's size is known before reading a byte), so each shard is an independent task on the
  pack's executor; shards are byte-identical whatever ``workers`` is, and a killed pack resumes by
  rewriting only the shards that were not complete.
* :func:`pack_webdataset_reencoded` (``pack --resize`` ...): the stored sizes are known only after
  encoding, so the workers re-encode fixed chunks of :data:`CHUNK_SAMPLES` samples in packing
  order and this process cuts shards from the encoded sizes as they come back (in order); the cut
  depends only on the sequence of encoded sizes, so shards are byte-identical whatever ``workers``
  is. Each finished shard's record names its sample range; ``resume`` keeps the finished shards
  (a prefix of the shard sequence) and restarts at the first sample after them. (Planning by
  count and rolling over on ``max_bytes`` inside each task was the alternative; it gives
  under-filled shards and shard indices known only at the end, which breaks naming and resume.)
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

from shardfeed.convert.writers.unique_keys import UniqueKeys
from shardfeed.readers.format.manifest import (
    DEFAULT_PREFIX,
    LABELS_CLASS,
    LABELS_NONE,
    MANIFEST_NAME,
    Manifest,
    Sample,
    ShardEntry,
    field_member,
    fields_problem,
)
from shardfeed.readers.format.sample_members import class_bytes, meta_bytes

from ..write.context import PackContext, PackResult
from ..write.executors import ProgressSink, task_progress
from ..write.pack_state import STATE_DIR, finished_prefix, finished_shard_record, write_shard_record
from ..write.plan import SamplePlan, fast_meta_bytes, input_bytes, plan_shards, sample_meta_bytes
from ..write.readahead import DEFAULT_READ_AHEAD, read_ahead
from ..write.samples import (
          ChunkTask,
          load_chunk,
          load_sample_payload,
          payload_from_bytes,
          read_file_checked,
          read_source_bytes,
          skip_reason,
          skip_record,
      )
from .shard import ShardLimits, ShardWriter

__all__ = ["WebDatasetWriter", "field_summary", "write_sample_manifest", "pack_webdataset", "pack_webdataset_reencoded",
           "CHUNK_SAMPLES"]

log = logging.getLogger(__name__)

#: Samples per worker task when packing WebDataset shards with re-encoding (does not change the output).
CHUNK_SAMPLES = 32


class WebDatasetWriter:
    """Write samples into ``out/{prefix}-{index:06d}.tar`` shards with offset indexes and a manifest.

    Each sample becomes the contiguous members ``{key}.{ext}`` (its bytes, unchanged),
    ``{key}.cls`` (ASCII class index) and ``{key}.json`` (its metadata). The on-disk result is
    exactly what ``pack`` writes for the same samples in the same order.

    Args:
        out: output folder; created if missing, must hold no ``manifest.json`` and no shard of
            the same prefix (a finished or half-written dataset is never overwritten silently).
        classes: class names in class-index order (the manifest's ``classes``).
        class_to_idx: name → index (default: from ``classes``' order).
        max_count: samples per shard at most (≥ 1).
        max_bytes: bytes per shard file at most, headers/padding/end blocks included (≥ 4096).
        prefix: shard file prefix (no ``/`` or ``.``).
        skipped: ``[{"path", "reason"}]`` entries to carry into the manifest.
        options: extra provenance recorded in the manifest's ``options`` (``max_count``,
            ``max_bytes``, ``prefix`` and ``format`` are added).
        files: the manifest's input accounting (default: ``{"packed": N}``).
        labels: ``"class"`` (each sample gets ``{key}.cls``) or ``"none"`` (an unlabelled
            dataset: no ``.cls`` member, ``classes`` empty; manifest version 3).
        fields: the extra fields samples may carry (``("txt", "mask.png")``): each becomes the
            member ``{key}.{field_member(name)}``; the manifest counts who has each (version 3).
        resume_shards: the finished shards of an interrupted write (their files stay; the next
            shard gets the next index), ``field_counts`` their samples per field, and
            ``on_shard_end(entry, index)`` is called as each new shard closes (a resume record).

    Raises:
        ValueError: bad limits, prefix or field name; ``out`` already holds a dataset.
        NotADirectoryError: ``out`` is a file.

    Example::

        with WebDatasetWriter("out/wds", classes=["cat", "dog"], max_count=1000) as w:
            for sample in samples:          # shardfeed.readers.format.manifest.Sample
                w.write(sample)
        manifest = w.manifest               # also returned by close()
    """

    format = "webdataset"

    def __init__(self, out: str | os.PathLike, *, classes: list[str], class_to_idx: dict[str, int] | None = None,
                 max_count: int = 10000, max_bytes: int = 256_000_000, prefix: str = DEFAULT_PREFIX,
                 skipped: list[dict] | None = None, options: dict | None = None, files: dict | None = None,
                 labels: str = LABELS_CLASS, fields: tuple[str, ...] | list[str] = (),
                 resume_shards: list[ShardEntry] | None = None, field_counts: dict[str, int] | None = None,
                 on_shard_end: Callable[[ShardEntry, int], None] | None = None):
        limits = ShardLimits(int(max_count), int(max_bytes))
        if labels not in (LABELS_CLASS, LABELS_NONE):
            raise ValueError(f"labels must be {LABELS_CLASS!r} or {LABELS_NONE!r}, got {labels!r}")
        problem = fields_problem(fields)
        if problem is not None:  # a bad name, or two fields in one member: written twice, or one read for both
            raise ValueError(problem)
        if not prefix or "/" in prefix or "." in prefix:
            raise ValueError(f"prefix {prefix!r} must be a plain name without '/' or '.'")
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise NotADirectoryError(f"{self.out}: exists and is a file; choose a folder for the output")
        self.out.mkdir(parents=True, exist_ok=True)
        if (self.out / MANIFEST_NAME).exists() or (resume_shards is None and any(self.out.glob(f"{prefix}-*.tar"))):
            raise ValueError(f"{self.out}: already holds a dataset ({MANIFEST_NAME} or {prefix}-*.tar); "
                             "choose an empty folder")
        self.classes = list(classes)
        self.class_to_idx = dict(class_to_idx) if class_to_idx is not None else {c: i for i, c in enumerate(classes)}
        self.max_count = limits.max_count
        self.max_bytes = limits.max_bytes
        self.prefix = prefix
        self.skipped = list(skipped or [])
        self.options = dict(options or {})
        self.files = files
        self.labels = labels
        #: per extra field: samples that carry it
        self.field_counts: dict[str, int] = {name: 0 for name in fields}
        self.field_counts.update(field_counts or {})
        self.manifest: Manifest | None = None
        self._writer = ShardWriter(self.out, prefix=prefix, limits=limits, first_index=len(resume_shards or ()),
                                   on_shard_end=on_shard_end)
        self._writer.shards = list(resume_shards or ())
        self._keys = UniqueKeys()
        self._closed = False

    @classmethod
    def create(cls, out: str | os.PathLike, *, classes: list[str], class_to_idx: dict[str, int] | None = None,
               max_count: int = 10000, max_bytes: int = 256_000_000, prefix: str = DEFAULT_PREFIX,
               skipped: list[dict] | None = None, options: dict | None = None, files: dict | None = None,
               map_size: int | None = None, expected_bytes: int | None = None, labels: str = LABELS_CLASS,
               fields: tuple[str, ...] | list[str] = (), **resume) -> "WebDatasetWriter":
        """The registry's uniform writer factory (same keywords for every format's writer).

        Args:
            out, classes, class_to_idx, max_count, max_bytes, prefix: as the constructor.
            skipped, options, files, labels, fields: as the constructor.
            resume: ``resume_shards``, ``field_counts``, ``on_shard_end``, as the constructor.
            map_size, expected_bytes: LMDB sizing; unused (shards are cut by ``max_*``).

        Returns:
            An open :class:`WebDatasetWriter`.

        Raises:
            ValueError, NotADirectoryError: as the constructor.
        """
        return cls(out, classes=classes, class_to_idx=class_to_idx, max_count=max_count, max_bytes=max_bytes,
                   prefix=prefix, skipped=skipped, options=options, files=files, labels=labels, fields=fields,
                   **resume)

    @property
    def shards(self) -> list[ShardEntry]:
        """The finished shards' entries, in order."""
        return self._writer.shards

    @property
    def num_samples(self) -> int:
        """Samples written so far."""
        return sum(s.num_samples for s in self.shards) + self._writer.count_in_shard

    def write(self, sample: Sample, fields: dict[str, bytes] | None = None) -> None:
        """Append one sample, first closing the current shard if it would pass a limit.

        Args:
            sample: a :class:`~shardfeed.readers.format.manifest.Sample`; its bytes are stored unchanged
                (its label is not stored in an unlabelled dataset).
            fields: its extra fields' stored bytes, ``{name: bytes}``; names must be among the
                writer's ``fields``.

        Raises:
            ValueError: the key is empty, holds a ``.``, repeats the key just written (a key repeated
                out of order is refused by :meth:`close`), makes a member name longer than 100 bytes
                (nothing of the sample is written), or the sample alone
                is larger than ``max_bytes``; a field the writer was not given; the writer is closed.
        """
        if self._closed:
            raise ValueError(f"{self.out}: writer is closed")
        key = sample.key
        if not key or "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"sample key {key!r}: keys must be non-empty and hold no '.' (WebDataset splits the "
                             "key from the extension at the first dot)")
        if self._keys.repeats_last(key):  # keys out of order are checked for repeats at close
            raise ValueError(f"sample key {key!r} written twice; keys must be unique")
        path = (sample.meta or {}).get("path", "?")
        longest = max(len(m.encode("utf-8")) for m in [sample.ext, "json", *map(field_member, fields or ())])
        if len(key.encode("utf-8")) + 1 + longest > 100:
            raise ValueError(f"sample {key!r} ({path}): its member names ({{key}}.{{extension}}) would be longer than "
                             f"the 100 bytes of a tar member name; use keys of at most {99 - longest} bytes")
        if not fields and self.labels == LABELS_CLASS:  # the class-folder layout: pack's exact members
            self._writer.add(key, sample.ext, sample.data, class_bytes(sample.label), meta_bytes(sample.meta),
                             describe=f"sample {key!r} ({path})")
        else:
            members = [(sample.ext, sample.data)]
            if self.labels == LABELS_CLASS:
                members.append(("cls", class_bytes(sample.label)))
            members.append(("json", meta_bytes(sample.meta)))
            for name in sorted(fields or ()):
                if name not in self.field_counts:
                    raise ValueError(f"sample {key!r} ({path}): field {name!r} is not one of the writer's fields "
                                     f"({', '.join(self.field_counts) or 'none'})")
                members.append((field_member(name), fields[name]))
            self._writer.add_members(key, members, describe=f"sample {key!r} ({path})")
            for name in fields or ():
                self.field_counts[name] += 1
        self._keys.add(key)

    def close(self) -> Manifest:
        """Close the last shard and write ``manifest.json`` (atomically, last).

        Returns:
            The dataset's :class:`~shardfeed.readers.format.manifest.Manifest`.

        Raises:
            ValueError: no sample was written (an empty dataset has no manifest); two samples
                written out of key order have the same key.
        """
        if self._closed:
            if self.manifest is None:
                raise ValueError(f"{self.out}: writer was aborted; no manifest")
            return self.manifest
        self._writer.close()
        self._closed = True
        self._keys.check()  # before the manifest: a dataset with a repeated key is never finished
        self.manifest = write_sample_manifest(
            self.out, self.shards, classes=self.classes, class_to_idx=self.class_to_idx, skipped=self.skipped,
            options=self.options, limits=(self.max_count, self.max_bytes, self.prefix), files=self.files,
            labels=self.labels, field_counts=self.field_counts)
        return self.manifest

    def abort(self) -> None:
        """Drop the shard in progress (complete shards stay; no manifest is written)."""
        self._writer.abort()
        self._closed = True

    def __enter__(self) -> "WebDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()


def write_sample_manifest(out: Path, shards: list[ShardEntry], *, classes: list[str], class_to_idx: dict[str, int],
                          skipped: list[dict], options: dict, limits: tuple[int, int, str], files: dict | None,
                          labels: str, field_counts: dict[str, int]) -> Manifest:
    """Write the manifest of WebDataset ``shards`` (atomically, last) and its consumer files.

    The one manifest builder of the streaming writer and the layout packs: ``options`` are
    recorded with ``format`` and ``limits`` (``(max_count, max_bytes, prefix)``) set;
    ``files`` default to ``{"packed": N}``; ``field_counts`` give the manifest's ``fields``.

    Returns:
        The written :class:`~shardfeed.readers.format.manifest.Manifest`.

    Raises:
        ValueError: no sample in ``shards`` (an empty dataset has no manifest).
    """
    n = sum(s.num_samples for s in shards)
    if n == 0:
        raise ValueError(f"{out}: no sample was written; nothing to describe")
    max_count, max_bytes, prefix = limits
    options = {**options, "format": WebDatasetWriter.format, "max_count": max_count, "max_bytes": max_bytes,
               "prefix": prefix}
    manifest = Manifest(format=WebDatasetWriter.format, num_samples=n, classes=classes, class_to_idx=class_to_idx,
                        shards=list(shards), skipped=skipped, options=options,
                        files=files if files is not None else {"packed": n}, labels=labels,
                        fields=field_summary(field_counts, n))
    manifest.write(out)
    from ..write.consumers import write_consumer_files

    write_consumer_files(out, manifest)  # wids' shardindex.json, the Hugging Face dataset card
    return manifest


def field_summary(counts: dict[str, int], num_samples: int) -> dict[str, dict]:
    """The manifest's ``fields`` from per-field sample counts: ``{name: {"member", "count", "missing"}}``."""
    return {name: {"member": field_member(name), "count": n, "missing": num_samples - n}
            for name, n in sorted(counts.items())}


# ---------------------------------------------------------------------------------------------
# pack: planned shards, one task each


def _limits(options) -> ShardLimits:
    return ShardLimits(options.max_count, options.max_bytes)


def _payload_is_plain(options) -> bool:
    """True when :func:`load_sample_payload` stores every file's bytes, extension and metadata as
    they are: the WebDataset packer then takes its lean loop (:func:`_add_plain_samples`), which
    must stay equivalent to ``load_sample_payload`` + ``ShardWriter.add`` (keep the two in step)."""
    slowed = options.faults is not None and options.faults.sample_delay_s
    return options.reencode is None and not options.decode_check and not slowed


def _plain_reader(files) -> Callable[[int], bytes]:
    """``read(j) -> bytes`` of column row ``j``: :func:`read_file_checked`'s common case inline
    (open, fstat, one read, close), its full checks and precise errors for anything unusual."""
    rels, sizes, mtimes = files.rels, files.sizes, files.mtimes_ns
    prefix = files.path_prefix if os.sep == "/" else None
    open_, fstat, read_, close, rdonly = os.open, os.fstat, os.read, os.close, os.O_RDONLY

    def read(j: int) -> bytes:
        path = prefix + rels[j] if prefix is not None else files.path_of(j)
        size = sizes[j]
        data = None
        try:
            fd = open_(path, rdonly)
            try:
                st = fstat(fd)
                if st.st_size == size and st.st_mtime_ns == mtimes[j]:
                    data = read_(fd, size)
            finally:
                close(fd)
        except OSError:
            pass
        if not data or len(data) != size:  # anything unusual (or an empty file): the full checks
            data = read_file_checked(path, size, mtimes[j])
        return data

    return read


def _add_plain_samples(writer: ShardWriter, plan: SamplePlan, on_error: str, skipped: list,
                       progress: ProgressSink, read_ahead_n: int = 0) -> None:
    """Append the plan's samples to ``shard`` straight from its columns (the hot loop).

    Same bytes as building a :class:`PlannedSample` per sample, calling
    :func:`load_sample_payload` and ``writer.add`` with ``meta_bytes``; none of those
    objects is built (a few microseconds per sample, as much as reading a small file). The files
    are read with up to ``read_ahead_n`` reads in flight once reads wait on storage
    (:func:`~shardfeed.convert.write.readahead.read_ahead`, adaptive), appended in plan order.
    """
    files, lo, hi = plan.column_range  # the plan's range of the columns, no copy
    rels, sizes, codes, ecodes = files.rels, files.sizes, files.class_codes, files.ext_codes
    exts = files.exts
    cls = [class_bytes(label) for label in files.class_labels]
    # meta_bytes({"path": rel, "class": c}) == (meta_head[c] + encode_str(rel) + "}").encode()
    meta_head = [sample_meta_bytes(c, "")[:-3].decode("utf-8") for c in files.class_names]
    enc = json.encoder.encode_basestring
    base, width = plan.start - lo, plan.width  # global index of rels[j] is base + j
    add = writer.add
    n_done = n_bytes = 0
    for r in read_ahead(range(lo, hi), _plain_reader(files), max_in_flight=read_ahead_n,
                        size_of=sizes.__getitem__, adaptive=True):
        j = r.item
        rel = rels[j]
        key = str(base + j).zfill(width)
        if r.error is not None:
            if on_error != "skip" or not isinstance(r.error, (OSError, ValueError)):
                raise r.error
            skipped.append({"path": rel, "key": key, "reason": skip_reason(r.error)})
            n_done += 1
            continue
        data = r.value
        code = codes[j]
        add(key, exts[ecodes[j]], data, cls[code], (meta_head[code] + enc(rel) + "}").encode("utf-8"))
        n_done += 1
        n_bytes += sizes[j]
        if n_done >= 256:
            progress.add(n_done, n_bytes)
            n_done = n_bytes = 0
    progress.add(n_done, n_bytes)


def _write_wds_shard(task) -> tuple[dict, list]:
    """Task: write planned shard ``shard_idx`` and its completion record; ``(entry json, skipped)``."""
    out_dir, shard_idx, samples, options = task
    progress = task_progress()
    skipped = []
    writer = ShardWriter(out_dir, prefix=options.prefix, limits=_limits(options), first_index=shard_idx,
                         max_shards=1)
    with writer:
        n_done = n_bytes = 0  # progress goes out in batches (a call per sample costs as much as a tar header)
        plain = isinstance(samples, SamplePlan) and _payload_is_plain(options)
        read_ahead_n = getattr(options, "read_ahead", DEFAULT_READ_AHEAD)
        if options.faults is not None and options.faults.sample_delay_s:
            read_ahead_n = 0  # the test fault slows the pack per sample: keep its delays one after another
        if plain:
            _add_plain_samples(writer, samples, options.on_error, skipped, progress, read_ahead_n)
        # the reads ahead in threads; the decode check here, one image at a time (bounded memory)
        load = (lambda s: load_sample_payload(s, options)) if read_ahead_n <= 1 else (
            lambda s: read_source_bytes(s.file))
        for r in (() if plain else read_ahead(samples, load, max_in_flight=read_ahead_n,
                                               size_of=lambda s: s.file.size, adaptive=True)):
            s = r.item
            try:
                if r.error is not None:
                    raise r.error
                data, ext, meta = r.value if read_ahead_n <= 1 else payload_from_bytes(s, r.value, options)
            except (OSError, ValueError) as exc:
                if options.on_error != "skip":
                    raise
                skipped.append(skip_record(s, exc))
                n_done += 1
                continue
            writer.add(s.key, ext, data, class_bytes(s.file.label), fast_meta_bytes(meta),
                       describe=f"{s.file.path}: this image")
            n_done += 1
            n_bytes += len(data)
            if n_done >= 64:
                progress.add(n_done, n_bytes)
                n_done = n_bytes = 0
        progress.add(n_done, n_bytes)
    progress.flush()
    entry = writer.shards[0] if writer.shards else None
    result = entry.to_json() if entry else None
    write_shard_record(out_dir, shard_idx, {"shard": shard_idx, "entry": result, "skipped": skipped})
    return result, skipped


def pack_webdataset(scan, samples, out: Path, options, context: PackContext) -> PackResult:
    """Write the planned samples as WebDataset shards (the ``"webdataset"`` packer of the registry;
    :class:`~shardfeed.convert.write.context.Packer`).

    Args:
        scan: the :class:`~shardfeed.convert.write.scan.ScanResult` (its root must be seen by every task).
        samples: the packing order (:func:`~shardfeed.convert.write.plan.plan_samples`).
        out: the output folder, prepared by :func:`~shardfeed.convert.write.pack.prepare_output`.
        options: the :class:`~shardfeed.convert.write.pack.PackOptions`.
        context: the :class:`~shardfeed.convert.write.context.PackContext`: the tasks run on its
            executor; ``progress(num_samples, num_input_bytes)``; ``output_progress`` (the stored
            image bytes) is called only when re-encoding (without it they are the input bytes);
            ``on_shard_end(entry, index)`` is called in this process, in shard order, as each
            shard this run writes is complete (its file, index and completion record in place),
            not for the shards a resumed pack keeps (a pack to a bucket uploads from it).

    Returns:
        A :class:`~shardfeed.convert.write.context.PackResult` (``extra["num_planned_shards"]``).

    Raises:
        ValueError: one sample alone is larger than ``max_bytes`` (names the file).
        OSError, SourceChangedError, CorruptDataError: as
            :func:`~shardfeed.convert.write.samples.load_sample_payload`; finished shards stay.
    """
    if options.reencode is not None:  # sizes are known only after encoding: cut shards as they come
        return pack_webdataset_reencoded(scan, samples, out, options, context)
    progress, on_shard_end = context.progress, context.on_shard_end
    ranges = plan_shards(samples, max_count=options.max_count, max_bytes=options.max_bytes)
    first = context.first_shard  # shard i of the plan is file (and record) first + i
    done: dict[int, dict] = {}
    if options.resume:
        for i in range(first, first + len(ranges)):
            rec = finished_shard_record(out, i)
            if rec is not None:
                done[i] = rec
                a, b = ranges[i - first]
                progress(b - a, input_bytes(samples[a:b]))
    tasks = [(str(out.absolute()), first + i, samples[a:b], options) for i, (a, b) in enumerate(ranges)
             if first + i not in done]
    results: dict[int, tuple] = {i: (rec["entry"], rec["skipped"]) for i, rec in done.items()}
    shared = (scan.root, str(out.absolute() / STATE_DIR / "plan.json"))  # what every Ray node must see
    # the generator first: zip then runs it to its end (a clean pool shutdown), not tasks first
    for res, task in zip(context.executor.map_ordered(_write_wds_shard, tasks, progress, required_paths=shared),
                         tasks):
        results[task[1]] = res
        if on_shard_end is not None and res[0] is not None:
            on_shard_end(ShardEntry(**res[0]), task[1])
    shards, skipped = [], []
    for i in range(first, first + len(ranges)):
        entry, sk = results[i]
        skipped.extend(sk)
        if entry is not None:
            shards.append(ShardEntry(**entry))
    return PackResult(shards, skipped, len(done), {"num_planned_shards": len(ranges)})


# ---------------------------------------------------------------------------------------------
# pack with re-encoding: shards cut from the encoded sizes


def pack_webdataset_reencoded(scan, samples, out: Path, options, context: PackContext) -> PackResult:
    """Write the planned samples, re-encoded, as WebDataset shards cut from the encoded sizes.

    Workers re-encode fixed chunks of :data:`CHUNK_SAMPLES` samples in packing order
    (:func:`~shardfeed.convert.write.samples.load_chunk`); this process appends them to a
    :class:`~shardfeed.convert.writers.shard.ShardWriter` in order (see the module docstring for
    why this keeps shards byte-identical for any ``workers`` and ``resume`` exact).

    Args:
        scan: the :class:`~shardfeed.convert.write.scan.ScanResult` (unused; packer signature).
        samples: the planned samples (:func:`~shardfeed.convert.write.plan.plan_samples`).
        out: the output folder (prepared).
        options: the :class:`~shardfeed.convert.write.pack.PackOptions`, with ``reencode`` set.
        context: as :func:`pack_webdataset`; its ``output_progress(output_bytes)`` hears of the
            re-encoded image bytes stored, before the matching ``progress`` call.

    Returns:
        A :class:`~shardfeed.convert.write.context.PackResult` as every packer.

    Raises:
        ValueError: one re-encoded sample alone is larger than ``max_bytes`` (names the file).
        OSError, CorruptDataError, SourceChangedError: as
            :func:`~shardfeed.convert.write.samples.load_sample_payload` (``on_error="raise"``); finished
            shards stay and ``resume`` continues after them.
    """
    progress, output_progress, on_shard_end = context.progress, context.output_progress, context.on_shard_end

    def report(n: int, b_in: int, b_out: int) -> None:
        if output_progress is not None:
            output_progress(b_out)
        progress(n, b_in)

    done = finished_prefix(out, len(samples)) if options.resume else []
    start = done[-1]["end"] if done else 0
    shards: list[ShardEntry] = []
    skipped: list[dict] = []
    for rec in done:
        skipped.extend(rec["skipped"])
        if rec["entry"] is not None:
            shards.append(ShardEntry(**rec["entry"]))
    if done:
        log.info("%s: resuming after %d finished shards (sample %d of %d)", out, len(done), start, len(samples))
        report(start, sum(s.file.size for s in samples[:start]), sum(s.num_bytes for s in shards))
    # the shard in progress: its first sample, the sample about to be added, its skipped files
    cur = {"start": start, "next": start, "skipped": []}

    def record(entry: ShardEntry | None, index: int) -> None:
        if entry is not None:
            shards.append(entry)
        write_shard_record(out, index, {"shard": index, "entry": entry.to_json() if entry else None,
                                        "skipped": cur["skipped"], "start": cur["start"], "end": cur["next"]})
        skipped.extend(cur["skipped"])
        cur.update(start=cur["next"], skipped=[])
        if entry is not None and on_shard_end is not None:
            on_shard_end(entry, index)

    writer = ShardWriter(out, prefix=options.prefix, limits=_limits(options), first_index=len(done),
                         on_shard_end=record)
    tasks = [ChunkTask(samples[a:a + CHUNK_SAMPLES], options) for a in range(start, len(samples), CHUNK_SAMPLES)]
    with writer:
        for results, _ in context.executor.map_ordered(load_chunk, tasks, lambda n, b: None,
                                                       max_in_flight=2 * options.workers + 2):
            n_in = b_in = b_out = 0
            for index, payload, skip in results:
                s = samples[index]
                n_in += 1
                b_in += s.file.size
                if payload is None:
                    cur["skipped"].append(skip)
                    continue
                data, ext, meta = payload
                cur["next"] = index  # a roll closes the shard before this sample
                writer.add(s.key, ext, data, class_bytes(s.file.label), meta_bytes(meta),
                           describe=f"{s.file.path}: re-encoded, this image",
                           hint=" (or lower --resize/--quality)")
                b_out += len(data)
            report(n_in, b_in, b_out)
        cur["next"] = len(samples)
        if writer.is_open:
            writer.close()
        elif cur["skipped"]:  # the last samples were all skipped: a record without a shard
            record(None, writer.next_index)
    return PackResult(shards, skipped, len(done), {})
