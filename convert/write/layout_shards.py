"""WebDataset shards of a layout pack (labels file, sidecars, unlabelled folders) as tasks on
the pack's executor, as :mod:`shardfeed.convert.writers.webdataset` writes a class-folder pack.

* Original bytes: every member of a planned sample has a size known before a byte is read (the
  image and its sidecar files from the scan, ``.cls`` and ``.json`` from the label and the path),
  so the shard boundaries are cut up front by :func:`~shardfeed.convert.write.shard_cut.cut_shards`,
  the rule the streaming writer applies as samples come; each shard is then an independent task
  (local processes, ``--workers``, or Ray). Identical to the streaming writer's shards when no
  file is skipped; a file skipped with ``on_error="skip"`` leaves its shard one sample short.
  ``resume`` keeps every shard whose record matches its planned range and writes the others.
* Re-encoded: the stored sizes are known only after encoding, so tasks load and re-encode fixed
  chunks in packing order and this process cuts the shards as they come back, in order; ``resume``
  keeps the finished shards (a prefix) and restarts after them.

Either way the shards are byte-identical whatever the executor and the number of workers. Each
finished shard writes its resume record (``OUT/.shardfeed-pack/NNNNNN.json``: its entry, its
sample range, its samples per field, the files skipped in it). :func:`load_row` loads a planned
sample for both, and for the LMDB stream of :mod:`shardfeed.convert.write.layouts`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Iterator, Sequence

from shardfeed.readers.format.manifest import LABELS_CLASS, LABELS_NONE, Manifest, ShardEntry, field_member
from shardfeed.readers.format.sample_members import class_bytes, decode_field, meta_bytes

from .context import PackContext
from .executors import task_progress
from .pack_state import STATE_DIR, field_counts, finished_prefix, finished_shard_record, write_shard_record
from .readahead import read_ahead
from .reencode import reencode_payload
from .samples import skip_reason
from .shard_cut import ShardLimits, cut_shards, sample_bytes
from ..writers.shard import ShardWriter
from ..writers.webdataset import write_sample_manifest

__all__ = ["MAX_SIDECAR_BYTES", "LayoutRow", "LayoutRows", "layout_rows", "load_row", "read_row", "write_layout_shards",
           "read_checked", "uses_tasks"]

#: Largest sidecar file stored, bytes.
MAX_SIDECAR_BYTES = 1 << 30

#: One planned sample of a layout pack (picklable): ``(key, rel, ext, size, mtime_ns, label or
#: None, meta bytes, ((field, sidecar rel, size, mtime_ns), ...) sorted by field)``.
LayoutRow = tuple


def uses_tasks(options) -> bool:
    """Whether a layout pack with ``options`` writes WebDataset shards here (:func:`write_layout_shards`);
    else (LMDB) its samples, loaded by tasks (:func:`loaded_rows`), stream into the format's writer."""
    from shardfeed.readers.format.registry import describe

    return bool(describe(options.format).sharded)


class LayoutRows(Sequence):
    """The planned samples of a layout plan (``layouts._LayoutPlan``, whose ``planned`` is a
    :class:`~shardfeed.convert.write.plan.SamplePlan`: class code = label) as :data:`LayoutRow`, in
    packing order, built on demand (the plan is not copied; a slice is a list of rows)."""

    def __init__(self, plan, layout):
        self._plan = plan
        self._planned = plan.planned  # a SamplePlan: rows of compact columns, class code = label
        self._files = plan.planned.columns
        self._sidecars = frozenset(layout.sidecars)
        self._idx_to_class = {i: c for c, i in plan.labels.class_to_idx.items()}

    def __len__(self) -> int:
        return len(self._planned)

    def size(self, j: int) -> int:
        """The image's size of row ``j`` (bytes, at the scan), without building the row."""
        return self._files.sizes[self._planned.row(j)]

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        plan, files = self._plan, self._files
        i = self._planned.row(j)
        j = j + len(self) if j < 0 else j
        rel = files.rels[i]
        label = files.class_labels[files.class_codes[i]] if plan.labels.labelled else None
        meta = {"path": rel} if label is None else {"path": rel, "class": self._idx_to_class[label]}
        found = plan.found
        sides = tuple((f, srel, *found.side_stats[srel]) for f, srel in sorted(found.sidecars.get(rel, {}).items())
                      if f in self._sidecars)
        return (self._planned.key_of(j), rel, files.exts[files.ext_codes[i]], files.sizes[i], files.mtimes_ns[i],
                label, meta_bytes(meta), sides)


def layout_rows(plan, layout) -> LayoutRows:
    """The planned samples of a layout plan (``layouts._LayoutPlan``), in packing order (:class:`LayoutRows`)."""
    return LayoutRows(plan, layout)


def _members_bytes(row: LayoutRow) -> int:
    """Bytes the sample of ``row`` takes in a tar shard (every member with its header and padding)."""
    _, _, _, size, _, label, meta, sides = row
    lengths = [size, len(meta), *(s[2] for s in sides)]
    if label is not None:
        lengths.append(len(class_bytes(label)))
    return sample_bytes(lengths)


def _shard_ranges(src: Path, rows: Sequence[LayoutRow], options) -> list[tuple[int, int]]:
    return cut_shards((_members_bytes(r) for r in rows), ShardLimits(options.max_count, options.max_bytes),
                      describe=lambda i: f"{src / rows[i][1]}: this image with its sidecar files")


def read_checked(path: Path, scanned: tuple[int, int], limit: int | None = None) -> bytes:
    """A source file's bytes (an empty image is an error; a sidecar over ``limit`` bytes too).

    The file is checked again as it is opened: a file replaced after the scan by a FIFO or a
    device is an error, never read (a FIFO would block the pack); so is a file whose size or
    modification time is no longer ``scanned`` (``(bytes, ns)``: replaced, by a link or another
    file, or changed); at most ``limit`` bytes are read whatever the size said at the scan.

    Raises:
        ValueError: not a regular file any more; a sidecar over ``limit``; an empty image.
        shardfeed.readers.errors.SourceChangedError: size or modification time changed (an OSError).
        OSError: cannot be opened or read.
    """
    from shardfeed.readers.errors import SourceChangedError

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file (a FIFO, device or socket) any more; not read")
        if (st.st_size, st.st_mtime_ns) != tuple(scanned):
            raise SourceChangedError(f"{path}: changed since the scan (size {scanned[0]} -> {st.st_size} bytes, or "
                                     "its modification time; replaced by another file or a link?); not read: rerun "
                                     "the pack once the folder is stable")
        if limit is not None and st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size} bytes, over the {limit} bytes a sidecar file may have")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError(f"{path}: over the {limit} bytes a sidecar file may have (it grew while read)")
    if limit is None and not data:
        raise ValueError(f"{path}: empty file (0 bytes), not an image; delete it, or pass --on-error skip")
    return data


def read_row(src: Path, row: LayoutRow) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The image's bytes and its sidecar fields' ``[(field, bytes)]`` (in a read-ahead thread)."""
    _, rel, _, size, mtime, _, _, sides = row
    return read_checked(src / rel, (size, mtime)), [
        (f, read_checked(src / srel, (n, t), MAX_SIDECAR_BYTES)) for f, srel, n, t in sides]


def load_row(src: Path, row: LayoutRow, options, value=None) -> tuple[bytes, str, dict, list[tuple[str, bytes]]]:
    """A planned sample's payload: ``(image bytes, ext, new meta, [(field, bytes)])``, read (or
    ``value``, read ahead by :func:`read_row`), its sidecars checked to read back, the image
    re-encoded (``new meta``: its ``orig_*``; {} otherwise) and decode-checked as ``options`` ask.

    Raises:
        OSError, ValueError: as :func:`read_checked`; a sidecar that does not read back; an image
            that fails re-encoding or the decode check (CorruptDataError is a ValueError).
    """
    rel, ext, sides = row[1], row[2], row[7]
    data, extra = value if value is not None else read_row(src, row)
    for (f, field_value), side in zip(extra, sides):  # a .txt that is not UTF-8, a .json that does not
        decode_field(f, field_value, str(src / side[1]))  # parse: named now, not in training
    new_meta: dict = {}
    if options.reencode is not None:  # the image only; sidecars (masks too) stay as they are
        data, ext, new_meta = reencode_payload(data, ext, {}, options.reencode, source=str(src / rel))
    if options.decode_check:
        from shardfeed.readers.decode.image import decode_image

        decode_image(data, ext, source=str(src / rel))
    return data, ext, new_meta, extra


def _add_row(writer: ShardWriter, row: LayoutRow, payload, hint: str = "") -> list[str]:
    """Append a loaded sample to ``writer`` (the streaming writer's members); its fields' names.

    The names are counted by the caller after this call: the sample may have opened a new shard
    (the writer's shard-end hook runs inside it), and its fields are that shard's."""
    key, rel, label, meta = row[0], row[1], row[5], row[6]
    data, ext, new_meta, extra = payload
    if new_meta:  # orig_* of a re-encoded image
        meta = meta_bytes({**new_meta, **json.loads(meta)})
    where = f"sample {key!r} ({rel})"
    if not extra and label is not None:  # the class-folder members: the streaming writer's exact call
        writer.add(key, ext, data, class_bytes(label), meta, describe=where, hint=hint)
        return []
    members = [(ext, data)] + ([("cls", class_bytes(label))] if label is not None else [])
    members += [("json", meta)] + [(field_member(f), value) for f, value in extra]
    writer.add_members(key, members, describe=where, hint=hint)
    return [f for f, _ in extra]


def _count(fields: dict[str, int], names: list[str]) -> None:
    for f in names:
        fields[f] = fields.get(f, 0) + 1


def _write_layout_shard(task) -> tuple[dict | None, list, dict]:
    """Task: write planned shard ``index`` and its resume record; ``(entry json, skipped, fields)``."""
    out_dir, index, start, src, rows, options = task
    src = Path(src)
    progress = task_progress()
    skipped: list[dict] = []
    fields: dict[str, int] = {}
    writer = ShardWriter(out_dir, prefix=options.prefix, limits=ShardLimits(options.max_count, options.max_bytes),
                         first_index=index, max_shards=1)
    with writer:
        for r in read_ahead(rows, lambda row: read_row(src, row), max_in_flight=options.read_ahead,
                            size_of=lambda row: row[3], adaptive=True):
            key, rel, size = r.item[0], r.item[1], r.item[3]
            try:
                if r.error is not None:
                    raise r.error
                payload = load_row(src, r.item, options, r.value)
            except (OSError, ValueError) as exc:
                if options.on_error != "skip":
                    raise
                skipped.append({"path": rel, "key": key, "reason": skip_reason(exc)})
                progress.add(1, 0)
                continue
            _count(fields, _add_row(writer, r.item, payload))
            progress.add(1, size)
    progress.flush()
    entry = writer.shards[0].to_json() if writer.shards else None
    write_shard_record(out_dir, index, {"shard": index, "entry": entry, "skipped": skipped, "fields": fields,
                                        "start": start, "end": start + len(rows)})
    return entry, skipped, fields


def _load_layout_chunk(task) -> list[tuple]:
    """Task: load (and re-encode) a chunk of planned samples, in order:
    ``[(position, payload or None, skip or None)]`` (:func:`load_row`'s payload)."""
    src, start, rows, options = task
    src = Path(src)
    out = []
    for j, row in enumerate(rows, start):
        try:
            out.append((j, load_row(src, row, options), None))
        except (OSError, ValueError) as exc:
            if options.on_error != "skip":
                raise
            out.append((j, None, {"path": row[1], "key": row[0], "reason": skip_reason(exc)}))
    return out


def _finished(out: Path, index: int, a: int, b: int) -> dict | None:
    """Shard ``index``'s resume record when it is finished and holds the planned range ``a..b``."""
    rec = finished_shard_record(out, index)
    if rec is None or rec.get("start") != a or rec.get("end") != b or not field_counts(rec.get("fields")):
        return None
    return rec


def _planned_shards(out: Path, src: Path, rows: LayoutRows, options, context: PackContext,
                    resume: bool) -> list[tuple]:
    """Each planned shard a task on the executor: ``[(entry json, skipped, fields)]`` in shard order."""
    ranges = _shard_ranges(src, rows, options)
    first = context.first_shard
    results: dict[int, tuple] = {}
    if resume:
        for i, (a, b) in enumerate(ranges):
            rec = _finished(out, first + i, a, b)
            if rec is not None:
                results[first + i] = (rec["entry"], rec["skipped"], rec["fields"])
                context.progress(b - a, sum(rows.size(j) for j in range(a, b)))
    tasks = [(str(out.absolute()), first + i, a, str(src), rows[a:b], options) for i, (a, b) in enumerate(ranges)
             if first + i not in results]
    shared = (str(src), str(out.absolute() / STATE_DIR / "plan.json"))  # what every Ray node must see
    for res, task in zip(context.executor.map_ordered(_write_layout_shard, tasks, context.progress,
                                                      required_paths=shared), tasks):
        results[task[1]] = res
        if context.on_shard_end is not None and res[0] is not None:
            context.on_shard_end(ShardEntry(**res[0]), task[1])
    return [results[i] for i in range(first, first + len(ranges))]


def loaded_rows(src: Path, rows: LayoutRows, start: int, options, context: PackContext
                ) -> Iterator[tuple[int, tuple | None, dict | None]]:
    """The planned samples from ``start`` on, loaded (and re-encoded) by tasks on the executor in
    fixed chunks, in packing order: ``(position, payload or None, skip entry or None)``
    (:func:`load_row`'s payload; a skip with ``on_error="skip"``)."""
    from ..writers.webdataset import CHUNK_SAMPLES

    tasks = [(str(src), a, rows[a:a + CHUNK_SAMPLES], options) for a in range(start, len(rows), CHUNK_SAMPLES)]
    for chunk in context.executor.map_ordered(_load_layout_chunk, tasks, lambda n, b: None,
                                              max_in_flight=2 * options.workers + 2, required_paths=(str(src),)):
        yield from chunk


def _reencoded_shards(out: Path, src: Path, rows: LayoutRows, options, context: PackContext,
                      resume: bool) -> list[tuple]:
    """Re-encoded samples: the stored sizes are known only after encoding, so tasks load and
    re-encode fixed chunks in packing order and this process cuts the shards as the samples come
    back, in order (the cut depends on the encoded sizes only: the same shards for any executor);
    a resume keeps the finished shards (a prefix) and restarts after them.
    Returns ``[(entry json, skipped, fields)]`` in shard order."""
    done = finished_prefix(out, len(rows), with_fields=True) if resume else []
    results = [(rec["entry"], rec["skipped"], rec["fields"]) for rec in done]
    start = done[-1]["end"] if done else 0
    context.progress(start, sum(rows.size(j) for j in range(start)))
    cur: dict = {"start": start, "next": start, "skipped": [], "fields": {}}

    def record(entry: ShardEntry | None, index: int) -> None:
        entry_json = entry.to_json() if entry else None
        write_shard_record(out, index, {"shard": index, "entry": entry_json, "skipped": cur["skipped"],
                                        "fields": cur["fields"], "start": cur["start"], "end": cur["next"]})
        results.append((entry_json, cur["skipped"], cur["fields"]))
        cur.update(start=cur["next"], skipped=[], fields={})
        if entry is not None and context.on_shard_end is not None:
            context.on_shard_end(entry, index)

    writer = ShardWriter(out, prefix=options.prefix, limits=ShardLimits(options.max_count, options.max_bytes),
                         first_index=len(done), on_shard_end=record)
    with writer:
        for j, payload, skip in loaded_rows(src, rows, start, options, context):
            if payload is None:
                cur["skipped"].append(skip)
            else:
                cur["next"] = j  # a roll closes the shard before this sample
                names = _add_row(writer, rows[j], payload, hint=" (or lower --resize/--quality)")
                _count(cur["fields"], names)  # after the add: a roll inside it starts the sample's shard
            context.progress(1, rows.size(j))
        cur["next"] = len(rows)
        if writer.is_open:
            writer.close()
        elif cur["skipped"]:  # the last samples were all skipped: a record without a shard
            record(None, writer.next_index)
    return results


def write_layout_shards(out: Path, options, layout, plan, context: PackContext, *, resume: bool) -> Manifest:
    """Write a layout plan's WebDataset shards on ``context.executor`` and the manifest (last).

    Args:
        out: OUT, prepared, its plan written.
        options: the :class:`~shardfeed.convert.write.pack.PackOptions`.
        layout: the :class:`~shardfeed.convert.write.layouts.LayoutOptions`.
        plan: the layout plan (``layouts._LayoutPlan``): its planned images, labels, sidecars,
            recorded options and file counts; ``plan.skipped`` gets the files skipped while read.
        context: the pack's context: its executor runs the tasks, its ``progress`` hears of the
            samples written, its ``on_shard_end(entry, index)`` of each shard this run writes.
        resume: keep the shards whose resume records match the plan.

    Returns:
        The written :class:`~shardfeed.readers.format.manifest.Manifest`.

    Raises:
        ValueError: one sample alone larger than ``max_bytes``; every image skipped.
        OSError, SourceChangedError, CorruptDataError: reading, re-encoding or checking a file
            failed (``on_error="raise"``); finished shards stay.
    """
    src = plan.src.absolute()
    rows = layout_rows(plan, layout)
    if options.reencode is None:
        results = _planned_shards(out, src, rows, options, context, resume)
    else:
        results = _reencoded_shards(out, src, rows, options, context, resume)
    shards: list[ShardEntry] = []
    counts = {f: 0 for f in layout.sidecars}
    for entry, skipped, fields in results:
        plan.skipped.extend(skipped)
        for f, n in fields.items():
            counts[f] = counts.get(f, 0) + n
        if entry is not None:
            shards.append(ShardEntry(**entry))
    labelled = plan.labels.labelled
    if not shards:
        raise ValueError(f"{plan.src}: every image was skipped ({len(plan.skipped)}); nothing to pack")
    files = {**plan.files, "packed": sum(s.num_samples for s in shards), "skipped": len(plan.skipped)}
    return write_sample_manifest(
        out, shards, classes=plan.classes if labelled else [],
        class_to_idx=plan.labels.class_to_idx if labelled else {},
        skipped=plan.skipped, options=plan.recorded, limits=(options.max_count, options.max_bytes, options.prefix),
        files=files, labels=LABELS_CLASS if labelled else LABELS_NONE, field_counts=counts)
