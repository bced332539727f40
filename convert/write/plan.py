"""Planning a pack: the packing order, the keys and the shard cuts, kept compact and fast.

:func:`plan_samples` fixes the packing order (a seeded shuffle of the scan, or its sorted order)
and gives each sample its key; :func:`plan_shards` cuts that order into WebDataset shards from
the file sizes alone. The plan is a :class:`SamplePlan`: a read-only sequence of
:class:`PlannedSample` built on demand from the scan's compact columns
(:class:`~shardfeed.convert.write.scan.ScannedFiles`), so a pack's memory hardly grows with the number
of files (peak memory of a 20,000-file pack within 20 % of a 2,000-file one) and a
shard's slice of the plan pickles in a few bytes per sample for the worker processes. A shuffled
plan keeps its order as 4-byte row numbers of the scan's columns, not a reordered copy of them:
the scan and the plan together hold ~55 bytes a file.

Everything here produces exactly what the straightforward code would: :func:`sample_meta_bytes`
is byte-identical to :func:`shardfeed.readers.format.sample_members.meta_bytes` of ``{"path", "class"}``.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import random
from array import array
from typing import Iterator, Sequence, overload

from shardfeed.readers.format.manifest import key_width
from shardfeed.readers.format.path_column import PathColumn
from shardfeed.readers.format.sample_members import class_bytes, meta_bytes

from .scan import ScannedFile, ScannedFiles, ScanResult, new_scanned_file
from .shard_cut import ShardLimits, cut_shards, wds_sample_bytes

__all__ = ["PlannedSample", "SamplePlan", "plan_samples", "plan_files", "plan_shards", "sample_meta_bytes",
           "fast_meta_bytes", "input_bytes", "file_sizes"]

# json.dumps(..., ensure_ascii=False) encodes strings with this very function (C when available)
_encode_str = json.encoder.encode_basestring


def sample_meta_bytes(class_name: str, rel: str) -> bytes:
    """``meta_bytes({"path": rel, "class": class_name})``, without building the dict (same bytes)."""
    return ('{"class":' + _encode_str(class_name) + ',"path":' + _encode_str(rel) + "}").encode("utf-8")


def fast_meta_bytes(meta: dict) -> bytes:
    """:func:`~shardfeed.readers.format.sample_members.meta_bytes`, with a fast path for the plain ``{"path",
    "class"}``."""
    if type(meta) is dict and len(meta) == 2:
        rel, cname = meta.get("path"), meta.get("class")
        if type(rel) is str and type(cname) is str:
            return sample_meta_bytes(cname, rel)
    return meta_bytes(meta)


@dataclasses.dataclass
class PlannedSample:
    """A source file with its place in the packing order.

    Attributes:
        index: global position in packing order (0..N-1).
        key: the sample key (``format_key(index)``).
        file: the scanned source file.
        meta: the sample's metadata (``{"path", "class"}``).
    """

    index: int
    key: str
    file: ScannedFile
    meta: dict

    def wds_bytes(self) -> int:
        """Bytes this sample takes in a tar shard: three members with headers and padding."""
        return wds_sample_bytes(self.file.size, len(class_bytes(self.file.label)), len(meta_bytes(self.meta)))


class SamplePlan(Sequence[PlannedSample]):
    """The packing order: a read-only sequence of :class:`PlannedSample`, built on demand.

    Args:
        files: the scanned files (compact columns).
        start: global index of the plan's first sample (a slice keeps its samples' indexes/keys).
        width: digits of the keys (:func:`~shardfeed.readers.format.manifest.key_width` of the whole plan).
        order: the packing order as row numbers of ``files`` (an ``array`` of 4 bytes an entry,
            not a reordered copy of the columns); None: the columns' own order.

    Slicing (step 1) gives a view in O(1); a view pickles as the columns of its own range only.
    """

    __slots__ = ("_files", "_order", "_lo", "_hi", "start", "width")

    def __init__(self, files: ScannedFiles, start: int = 0, width: int | None = None, *,
                 order: Sequence[int] | None = None, _lo: int = 0, _hi: int | None = None):
        self._files = files
        self._order = order
        total = len(files) if order is None else len(order)
        self._lo = _lo
        self._hi = total if _hi is None else _hi
        self.start = start
        self.width = key_width(total) if width is None else width

    def _rows(self, a: int, b: int) -> Sequence[int]:
        """Column rows of the plan's samples ``a..b-1`` (view positions)."""
        if self._order is None:
            return range(self._lo + a, self._lo + b)
        if self._lo + a == 0 and self._lo + b == len(self._order):
            return self._order  # the whole order: no copy (read-only here)
        return self._order[self._lo + a:self._lo + b]

    @property
    def column_range(self) -> tuple[ScannedFiles, int, int]:
        """``(columns, lo, hi)``: the plan's samples are rows ``lo..hi-1`` of ``columns`` (no copy in
        the columns' own order; in a shuffled order, the view's rows gathered once: call it on a
        shard's slice)."""
        if self._order is None:
            return self._files, self._lo, self._hi
        return self.files, 0, len(self)

    @property
    def files(self) -> ScannedFiles:
        """The plan's files, in packing order, as compact columns (copied once for a view or a
        shuffled order; :meth:`column_chunks` bounds the copy)."""
        if self._order is None and self._lo == 0 and self._hi == len(self._files):
            return self._files
        return self._files.take(self._rows(0, len(self)))

    def column_chunks(self, size: int = 8192) -> Iterator[ScannedFiles]:
        """The plan's files in packing order as consecutive compact columns of at most ``size`` rows
        each (a bounded copy at a time, whatever the plan's length)."""
        for a in range(0, len(self), size):
            yield self._files.take(self._rows(a, min(a + size, len(self))))

    def column_values(self, name: str, size: int = 65536) -> Iterator[array]:
        """A numeric column of the plan's files (``"sizes"``, ``"mtimes_ns"``...) in packing order,
        as consecutive arrays of at most ``size`` entries (the paths are not read)."""
        column = getattr(self._files, name)
        for a in range(0, len(self), size):
            rows = self._rows(a, min(a + size, len(self)))
            if isinstance(rows, range):
                yield column[rows.start:rows.stop]
            else:
                yield array(column.typecode, operator.itemgetter(*rows)(column) if len(rows) > 1 else
                            [column[i] for i in rows])

    def utf8_path_chunks(self, size: int = 4096) -> Iterator[list[bytes]]:
        """The plan's relative paths in packing order, UTF-8 encoded (``surrogateescape``), in
        lists of at most ``size`` (straight from a plain :class:`PathColumn`'s bytes)."""
        rels = self._files.rels
        fast = isinstance(rels, PathColumn) and rels.plain()  # its bytes are the paths' UTF-8
        for a in range(0, len(self), size):
            rows = self._rows(a, min(a + size, len(self)))
            yield rels.utf8_paths(rows) if fast else [rels[i].encode("utf-8", "surrogateescape") for i in rows]

    def files_unordered(self) -> ScannedFiles:
        """The plan's files in no particular order: the scan's columns themselves when the plan
        spans all of them (no copy), else :attr:`files`."""
        if self._lo == 0 and self._hi == len(self._files):
            return self._files
        return self.files

    @property
    def columns(self) -> ScannedFiles:
        """The scanned columns the plan's samples are rows of (:meth:`row`); never copied."""
        return self._files

    def row(self, j: int) -> int:
        """The row of :attr:`columns` that holds the plan's ``j``-th sample (negative ``j`` counts
        from the end).

        Raises:
            IndexError: ``j`` out of range.
        """
        n = self._hi - self._lo
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError("sample index out of range")
        return self._lo + j if self._order is None else self._order[self._lo + j]

    def rekeyed(self, start: int, width: int) -> "SamplePlan":
        """The same samples in the same order, keyed from ``start`` with ``width`` digits (no copy)."""
        return SamplePlan(self._files, start, width, order=self._order, _lo=self._lo, _hi=self._hi)

    def __len__(self) -> int:
        return self._hi - self._lo

    def key_of(self, j: int) -> str:
        """Key of the plan's ``j``-th sample."""
        return str(self.start + j).zfill(self.width)

    @overload
    def __getitem__(self, j: int) -> PlannedSample: ...

    @overload
    def __getitem__(self, j: slice) -> "SamplePlan | list[PlannedSample]": ...

    def __getitem__(self, j):
        n = self._hi - self._lo
        if isinstance(j, slice):
            a, b, step = j.indices(n)
            if step != 1:
                return [self[i] for i in range(a, b, step)]
            b = max(a, b)
            return SamplePlan(self._files, self.start + a, self.width, order=self._order, _lo=self._lo + a,
                              _hi=self._lo + b)
        if j < 0:
            j += n
        f = self._files[self.row(j)]
        return PlannedSample(self.start + j, self.key_of(j), f, {"path": f.rel, "class": f.class_name})

    def __iter__(self) -> Iterator[PlannedSample]:
        width, base = self.width, self.start
        for files in self.column_chunks():
            rels, sizes, mtimes = files.rels, files.sizes, files.mtimes_ns
            codes, ecodes = files.class_codes, files.ext_codes
            names, labels, exts = files.class_names, files.class_labels, files.exts
            path_of = files.path_of
            for i in range(len(files)):
                rel, code = rels[i], codes[i]
                cname = names[code]
                f = new_scanned_file(path_of(i), rel, cname, labels[code], exts[ecodes[i]], sizes[i], mtimes[i])
                yield PlannedSample(base + i, str(base + i).zfill(width), f, {"path": rel, "class": cname})
            base += len(files)

    def wds_sizes(self) -> Iterator[int]:
        """Bytes each sample takes in a tar shard (as :meth:`PlannedSample.wds_bytes`), in order."""
        files = self._files
        cls_lens = [len(class_bytes(label)) for label in files.class_labels]
        # len(sample_meta_bytes(c, rel)) == base[c] + len(_encode_str(rel)) for an ASCII path
        base = [len(sample_meta_bytes(c, "")) - 2 for c in files.class_names]
        names, enc = files.class_names, _encode_str
        rels = files.rels
        if isinstance(rels, PathColumn) and rels.plain():  # JSON adds only its quotes: no path is built
            meta = [b + 2 for b in base]
            sizes, codes = files.sizes, files.class_codes
            rows = self._rows(0, len(self))
            for i, n in zip(rows, rels.utf8_lengths(rows)):
                code = codes[i]
                yield wds_sample_bytes(sizes[i], cls_lens[code], meta[code] + n)
            return
        for chunk in self.column_chunks():
            sizes, codes = chunk.sizes, chunk.class_codes
            for j, rel in enumerate(chunk.rels):
                code = codes[j]
                m = base[code] + len(enc(rel)) if rel.isascii() else len(sample_meta_bytes(names[code], rel))
                yield wds_sample_bytes(sizes[j], cls_lens[code], m)

    def __reduce__(self):
        return (SamplePlan, (self.files, self.start, self.width))

    def __repr__(self) -> str:
        return f"SamplePlan({len(self)} samples from index {self.start})"


def file_sizes(samples: Sequence[PlannedSample]) -> Sequence[int]:
    """The samples' source file sizes, bytes, in order (a column slice for a :class:`SamplePlan`,
    no :class:`PlannedSample` built)."""
    if isinstance(samples, SamplePlan):
        sizes = samples._files.sizes
        if samples._order is None:
            return sizes[samples._lo:samples._hi]
        return array("q", (v for part in samples.column_values("sizes") for v in part))
    return [s.file.size for s in samples]


def input_bytes(samples: Sequence[PlannedSample]) -> int:
    """Total size of the samples' source files, bytes (from the columns for a :class:`SamplePlan`)."""
    if isinstance(samples, SamplePlan):
        return sum(file_sizes(samples))
    return sum(s.file.size for s in samples)


def plan_samples(scan: ScanResult, *, seed: int = 0, shuffle: bool = True) -> SamplePlan:
    """Fix the packing order and the keys.

    The order is a ``random.Random(seed)`` shuffle of the scan's ImageFolder order (so no shard
    holds one class only), or that order itself when ``shuffle`` is False. Key ``i`` is the
    zero-padded position ``i``, so keys sort in packing order.

    Returns:
        A :class:`SamplePlan` (a sequence of :class:`PlannedSample`).
    """
    files = scan.files
    if not isinstance(files, ScannedFiles):
        files = ScannedFiles.from_files(scan.root, files)
    return plan_files(files, seed=seed, shuffle=shuffle)


def plan_files(files: ScannedFiles, *, seed: int = 0, shuffle: bool = True) -> SamplePlan:
    """:func:`plan_samples` of compact columns: the one rule of the packing order and the keys, for
    class folders and for the layouts (a labels file, sidecar files, no labels), whose images are
    columns in their sorted order.

    Returns:
        A :class:`SamplePlan` keyed from 0 (:func:`~shardfeed.readers.format.manifest.key_width` of
        ``len(files)`` digits).
    """
    if not shuffle:
        return SamplePlan(files, 0, key_width(len(files)))
    # 4 bytes an entry ("L" past 2**32 files), kept as the plan's order: no reordered copy of the columns
    order = array("I" if len(files) < 2 ** 32 else "L", range(len(files)))
    random.Random(seed).shuffle(order)  # the same permutation as shuffling the files themselves
    return SamplePlan(files, 0, key_width(len(files)), order=order)


def plan_shards(samples: Sequence[PlannedSample], *, max_count: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut the packing order into shards: ``[(start, end), ...]`` half-open sample ranges.

    A shard closes *before* it would hold more than ``max_count`` samples or its file would pass
    ``max_bytes`` (headers, padding and the end-of-archive blocks included): the rule of
    :func:`~shardfeed.convert.write.shard_cut.cut_shards`, whose rule the shard writer applies while
    writing.

    Raises:
        ValueError: one sample alone is larger than ``max_bytes`` (names the file and the fix).
    """
    sizes = samples.wds_sizes() if isinstance(samples, SamplePlan) else (s.wds_bytes() for s in samples)
    limits = ShardLimits(max_count, max_bytes)
    return cut_shards(sizes, limits, describe=lambda i: f"{samples[i].file.path}: this image")
