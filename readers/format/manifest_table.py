"""A parsed manifest in a compact binary form (``.sfman``) that other processes map read-only.

A large ``manifest.json`` (100,000 shards: ~30 MB of JSON, seconds to parse and validate) is
parsed once per node: :mod:`shardfeed.readers.storage.manifest_cache` writes this form and every
later process maps it. The layout (all little-endian):

* header (:data:`_HEAD`): magic ``SFMAN\\0\\0\\1``, layout version, number of shards, the lengths
  of the JSON block and of the name pool, and the SHA-256 of the ``manifest.json`` bytes it holds;
* a JSON block: every manifest field except the shards;
* the shard table, one fixed-width record (:data:`_REC`) per shard: samples, bytes, the packing
  index of its first sample, the name's and the offset index's offset and length in the pool,
  the per-shard extension counts (JSON) offset and length, flags, the raw SHA-256 of the shard
  and of its offset index;
* the name pool (UTF-8);
* the SHA-256 of everything before it.

The file is input like any other: :func:`decode_manifest_table` checks the sizes, the trailing
digest, the manifest digest, every offset and the fields (by :meth:`Manifest.from_json`) before
anything is used, and raises ``ValueError`` for anything else; its caller rebuilds the file. A
shard's file names are checked as its entry is built (:class:`ShardTable`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import Any, Iterator

from ..errors import ManifestError
from .manifest import MAX_MANIFEST_COUNT, Manifest, ShardEntry, plain_file_name_problem

__all__ = ["MANIFEST_TABLE_SUFFIX", "encode_manifest_table", "decode_manifest_table", "ShardTable",
           "shard_sample_counts"]

#: File suffix of the compact form.
MANIFEST_TABLE_SUFFIX = ".sfman"
_MAGIC = b"SFMAN\0\0\1"
_LAYOUT = 1
#: magic, layout, reserved, shards, JSON block bytes, pool bytes, manifest SHA-256
_HEAD = struct.Struct("<8sIIQQQ32s")
#: samples, bytes, first sample, name (offset, length), index name (offset, length),
#: extensions JSON (offset, length), flags, SHA-256, index SHA-256
_REC = struct.Struct("<QQQIHIHIIB32s32s")
_HAS_SHA, _HAS_INDEX, _HAS_INDEX_SHA, _HAS_EXT = 1, 2, 4, 8
_MAX_POOL = (1 << 32) - 1
_META_FIELDS = ("format", "num_samples", "classes", "class_to_idx", "skipped", "options", "files", "version",
                "created_by", "extensions", "labels", "fields")


def encode_manifest_table(manifest: Manifest, manifest_sha256: bytes) -> bytes:
    """The compact form of a validated ``manifest`` whose JSON bytes have SHA-256 ``manifest_sha256``.

    Raises:
        ValueError: a name or the pool exceeds the layout's field widths (then keep the JSON).
    """
    meta = {k: getattr(manifest, k) for k in _META_FIELDS}
    meta_raw = json.dumps(meta, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    pool, recs, start, no_hash = bytearray(), [], 0, bytes(32)
    exts: dict[tuple, tuple[int, int]] = {}  # one copy of each distinct extension count in the pool

    def put(raw: bytes) -> tuple[int, int]:
        off = len(pool)
        pool.extend(raw)
        return off, len(raw)

    for s in manifest.shards:
        name = put(s.name.encode("utf-8"))
        index = (0, 0) if s.index is None else put(s.index.encode("utf-8"))
        ext = (0, 0)
        if s.extensions is not None:
            memo = tuple(s.extensions.items())
            ext = exts.get(memo) or exts.setdefault(memo, put(json.dumps(s.extensions).encode("utf-8")))
        flags = ((_HAS_SHA if s.sha256 else 0) | (_HAS_INDEX if s.index is not None else 0)
                 | (_HAS_INDEX_SHA if s.index_sha256 else 0) | (_HAS_EXT if s.extensions is not None else 0))
        if name[1] > 0xFFFF or index[1] > 0xFFFF or len(pool) > _MAX_POOL:
            raise ValueError("a shard name or the name pool is too long for the compact form")
        recs.append(_REC.pack(s.num_samples, s.num_bytes, start, *name, *index, *ext, flags,
                              bytes.fromhex(s.sha256) if s.sha256 else no_hash,
                              bytes.fromhex(s.index_sha256) if s.index_sha256 else no_hash))
        start += s.num_samples
    body = b"".join([_HEAD.pack(_MAGIC, _LAYOUT, 0, len(recs), len(meta_raw), len(pool), manifest_sha256),
                     meta_raw, *recs, bytes(pool)])
    return body + hashlib.sha256(body).digest()


def decode_manifest_table(buf: Any, manifest_sha256: bytes) -> Manifest:
    """The :class:`Manifest` held in ``buf`` (bytes or a read-only ``mmap``), its shards a
    :class:`ShardTable` over ``buf`` (kept referenced).

    Raises:
        ValueError: ``buf`` is truncated, damaged, of another layout, or holds another manifest
            than the one of digest ``manifest_sha256``.
    """
    size = len(buf)
    if size < _HEAD.size + 32:
        raise ValueError(f"{size} bytes: shorter than a header")
    magic, layout, _, n, meta_len, pool_len, digest = _HEAD.unpack_from(buf, 0)
    if magic != _MAGIC or layout != _LAYOUT:
        raise ValueError("not a compact manifest of this layout")
    if digest != manifest_sha256:
        raise ValueError("holds another manifest")
    if n > size // _REC.size or _HEAD.size + meta_len + n * _REC.size + pool_len + 32 != size:
        raise ValueError("its sizes do not add up (truncated or damaged)")
    view = memoryview(buf)
    if hashlib.sha256(view[:size - 32]).digest() != bytes(view[size - 32:]):
        raise ValueError("its digest does not match its content (damaged)")
    meta = json.loads(bytes(view[_HEAD.size:_HEAD.size + meta_len]))
    if not isinstance(meta, dict) or set(meta) != set(_META_FIELDS):
        raise ValueError("its JSON block is not a manifest's fields")
    table = ShardTable(view, _HEAD.size + meta_len, n, pool_len)
    if table.total_samples != meta["num_samples"]:
        raise ValueError("its shard table does not add up to the manifest's sample count")
    manifest = Manifest.from_json(_stand_in_doc(meta, table), "the compact manifest")
    manifest.shards = table  # after __post_init__: extensions come from the JSON block
    manifest.extensions = meta["extensions"]
    return manifest


def _stand_in_doc(meta: dict, table: "ShardTable") -> dict:
    """A ``manifest.json`` document of ``meta`` for :meth:`Manifest.from_json` to check its fields
    by the JSON's rules: one stand-in shard holds every sample, one more carries each distinct
    extension count of the table. (Each shard's file names are checked as its entry is built.)"""
    shards = [{"name": f"s{i}", "num_samples": 0, "num_bytes": 0, "extensions": json.loads(table._text(off, length))}
              for i, (off, length) in enumerate(table._extension_spans())]
    return {**meta, "shards": [*shards, {"name": "all", "num_samples": meta["num_samples"], "num_bytes": 0}]}


class ShardTable(Sequence):
    """The shards of a manifest, read-only, each :class:`ShardEntry` built from its record as it
    is asked for (``table[i]``, iteration, slices give lists). Compares equal to a list of the
    same entries. Pickles as its bytes.

    Args:
        view: the compact form's bytes (a memoryview of bytes or of a read-only ``mmap``).
        table_at: offset of the first record in ``view``.
        num_shards: records.
        pool_len: bytes of the name pool after the records.

    Raises:
        ValueError: a record's counts or offsets are out of range (every record is checked here).
        ManifestError: (as an entry is built) its file name is not a plain file name
            (:func:`~shardfeed.readers.format.manifest.plain_file_name_problem`).
    """

    def __init__(self, view: memoryview, table_at: int, num_shards: int, pool_len: int) -> None:
        import numpy as np

        self._view, self._at, self._n, self._pool_len = view, table_at, num_shards, pool_len
        self._pool_at = table_at + num_shards * _REC.size
        dtype = np.dtype([("samples", "<u8"), ("bytes", "<u8"), ("start", "<u8"), ("name_off", "<u4"),
                          ("name_len", "<u2"), ("index_off", "<u4"), ("index_len", "<u2"), ("ext_off", "<u4"),
                          ("ext_len", "<u4"), ("flags", "u1"), ("sha", "V32"), ("index_sha", "V32")])
        assert dtype.itemsize == _REC.size
        rec = np.frombuffer(view, dtype=dtype, count=num_shards, offset=table_at)
        samples = rec["samples"]
        if num_shards and (samples.max() > MAX_MANIFEST_COUNT or rec["bytes"].max() > MAX_MANIFEST_COUNT):
            raise ValueError("a shard's count is out of range")
        starts = np.cumsum(samples, dtype=np.uint64) - samples
        ok = (np.array_equal(starts, rec["start"]) and not (rec["flags"] > 15).any()
              and not (rec["name_len"] == 0).any()
              and all((rec[f"{k}_off"].astype(np.uint64) + rec[f"{k}_len"] <= pool_len).all()
                      for k in ("name", "index", "ext")))
        if not ok:
            raise ValueError("a shard record is out of range")
        self.total_samples = int(samples.sum(dtype=np.uint64)) if num_shards else 0
        self._counts = samples
        self._rec = rec

    def _extension_spans(self) -> list[tuple[int, int]]:
        """The distinct (offset, length) in the pool of the records' extension counts."""
        import numpy as np

        has = (self._rec["flags"] & _HAS_EXT) != 0
        keys = np.sort((self._rec["ext_off"][has].astype(np.uint64) << np.uint64(32)) | self._rec["ext_len"][has])
        if keys.size:  # distinct values of the sorted keys (np.unique would import numpy.ma: ~10 ms at start-up)
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        return [(int(k) >> 32, int(k) & 0xFFFFFFFF) for k in keys.tolist()]

    def __len__(self) -> int:
        return self._n

    def _text(self, off: int, length: int) -> str:
        return str(self._view[self._pool_at + off:self._pool_at + off + length], "utf-8")

    def _entry(self, i: int) -> ShardEntry:
        return self._build(_REC.unpack_from(self._view, self._at + i * _REC.size), {})

    def _build(self, rec: tuple, ext_memo: dict[tuple[int, int], dict]) -> ShardEntry:
        samples, nbytes, _, name_off, name_len, index_off, index_len, ext_off, ext_len, flags, sha, index_sha = rec
        ext = None
        if flags & _HAS_EXT:  # shards share a few distinct counts: each decoded once per pass, copied
            got = ext_memo.get((ext_off, ext_len))
            if got is None:
                got = ext_memo[ext_off, ext_len] = json.loads(self._text(ext_off, ext_len))
            ext = dict(got)
        pool = self._pool_at
        name = str(self._view[pool + name_off:pool + name_off + name_len], "utf-8")
        index = self._text(index_off, index_len) if flags & _HAS_INDEX else None
        problem = plain_file_name_problem(name) or (plain_file_name_problem(index) if index is not None else None)
        if problem:
            raise ManifestError(f"a shard record of a parsed-manifest cache file: its file name {problem}; delete "
                                "the files of the manifest cache ($SHARDFEED_MANIFEST_CACHE, else "
                                "~/.cache/shardfeed/manifests) and open the dataset again")
        return ShardEntry(name=name, num_samples=samples, num_bytes=nbytes,
                          sha256=sha.hex() if flags & _HAS_SHA else None, index=index,
                          index_sha256=index_sha.hex() if flags & _HAS_INDEX_SHA else None, extensions=ext)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._entry(j) for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("shard index out of range")
        return self._entry(i)  # a new entry each time: a caller may change its copy

    def __iter__(self) -> Iterator[ShardEntry]:
        memo: dict[tuple[int, int], dict] = {}
        for rec in _REC.iter_unpack(self._view[self._at:self._pool_at]):
            yield self._build(rec, memo)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def sample_counts(self) -> list[int]:
        """Each shard's sample count, in order (without building the entries)."""
        return self._counts.tolist()

    def __reduce__(self):
        return (_table_from_bytes, (bytes(self._view[self._at:self._pool_at + self._pool_len]), self._n))

    def __repr__(self) -> str:
        return f"ShardTable({self._n} shards)"


def _table_from_bytes(raw: bytes, num_shards: int) -> ShardTable:
    return ShardTable(memoryview(raw), 0, num_shards, len(raw) - num_shards * _REC.size)


def shard_sample_counts(shards: Sequence[ShardEntry]) -> list[int]:
    """Each shard's sample count, in order: from the table's column for a :class:`ShardTable`."""
    if isinstance(shards, ShardTable):
        return shards.sample_counts()
    return [s.num_samples for s in shards]
