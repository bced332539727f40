"""``cache="memory"``: every sample's raw bytes in one contiguous buffer, for data that fits in RAM.

:meth:`MemoryCachedSource.from_source` reads the source once (WebDataset shards in order, the LMDB
database or the folder's files) into

* ``data``: one ``uint8`` buffer holding all encoded images back to back,
* ``offsets``: ``int64 [N + 1]`` (sample ``i`` is ``data[offsets[i]:offsets[i + 1]]``),
* ``labels``: ``int64 [N]``, ``ext_codes``: ``uint8 [N]`` (index into ``exts``),
* ``meta``/``meta_offsets``: the metadata as JSON bytes, the same way (for ``decode=False``).

These are a handful of large tensors, not millions of Python objects: forked ``DataLoader``
workers share them without copy-on-write growth (reading a slice touches no reference count in
the buffer's pages), and under ``spawn``/``forkserver`` torch passes them through shared memory.

Before loading, the bytes needed (from the manifest's file sizes, or the folder's file sizes) are
compared with ``MemAvailable`` from ``/proc/meminfo`` (less a 10 % / 256 MiB margin): a dataset
that would not fit is refused with a :class:`MemoryError` that says how big it is and what to use
instead. The cached dataset is map-style and gives the same samples as the source.
"""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import torch
import torch.utils.data

from ..format.sample_members import meta_bytes
from .options import ReadOptions
from .source_base import SourceBase, name_original_file, parts_to_raw

__all__ = ["MemoryCachedSource", "available_memory_bytes", "MEMORY_MARGIN_BYTES"]

log = logging.getLogger(__name__)

#: Memory left free besides 10 % of what is available.
MEMORY_MARGIN_BYTES = 256 * 1024 * 1024


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _source_bytes(src) -> int:
    from .folder_source import FolderSource

    if isinstance(src, FolderSource):
        rels = (src.rel_path(i) for i in range(len(src)))
        if src.store is None:
            return sum(os.path.getsize(os.path.join(src.root, rel)) for rel in rels)
        # a bucket prefix: one listing gives every size; an image missing from it is asked alone
        sizes = src.store.list_sizes()
        return sum(sizes[rel] if rel in sizes else src.store.head_size(rel) for rel in rels)
    return sum(s.num_bytes for s in src.manifest.shards)


def _iter_source(src):
    """``(key, data, ext, label, meta_json_bytes)`` for every sample, in dataset order."""
    from .webdataset_source import WebDatasetSource

    if isinstance(src, WebDatasetSource):
        c2i = src.class_to_idx
        labels = frozenset(c2i.values())
        for i, entry in enumerate(src.manifest.shards):
            for key, parts, _ in src.iter_range(i, 0, entry.num_samples):
                data, ext, label, meta = parts_to_raw(key, parts, c2i, parts["__url__"], labels,
                                                      labelled=src.manifest.labelled)
                yield key, data, ext, label, meta if meta is not None else b"{}"
    else:
        for i in range(len(src)):
            key, data, ext, label, meta = src.read_raw(i)
            yield key, data, ext, label, meta_bytes(meta)


class MemoryCachedSource(SourceBase, torch.utils.data.Dataset):
    """Map-style dataset over raw samples held in memory (see the module docstring).

    Build it with :meth:`from_source` (``open_dataset(..., cache="memory")``).
    ``ds[i]`` is ``(image uint8 [3, H, W], label int)``, a raw
    :class:`~shardfeed.readers.format.manifest.Sample` with ``decode=False``, or None when skipped.
    """

    map_style = True

    @classmethod
    def from_source(cls, src: SourceBase, *, available_bytes: int | None = None) -> "MemoryCachedSource":
        """Load every sample of ``src`` into memory.

        Args:
            src: an opened source (WebDataset, LMDB or folder).
            available_bytes: memory to fit in (default: ``MemAvailable``).

        Raises:
            MemoryError: the dataset would not fit (the message gives both sizes).
            CorruptDataError, OSError: reading the source failed (names the shard or file).
        """
        need = _source_bytes(src)
        avail = available_memory_bytes() if available_bytes is None else int(available_bytes)
        if avail is not None:
            usable = int(avail * 0.9) - MEMORY_MARGIN_BYTES
            if need > usable:
                raise MemoryError(
                    f"{getattr(src, 'location', None) or getattr(src, 'root', '')}: cache='memory' needs about "
                    f"{need / 1e9:.2f} GB but only {max(usable, 0) / 1e9:.2f} GB of memory is available "
                    f"(MemAvailable {avail / 1e9:.2f} GB less a margin); read it without cache (cache=None) "
                    "or pack it as WebDataset shards on fast local storage")
        t0 = time.perf_counter()
        n = src.num_samples
        data = np.empty(max(need, 1), dtype=np.uint8)
        offsets = np.zeros(n + 1, dtype=np.int64)
        labels = np.empty(n, dtype=np.int64)
        ext_codes = np.empty(n, dtype=np.uint8)
        exts: list[str] = []
        ext_index: dict[str, int] = {}
        keys: list[str] = []
        metas: list[bytes] = []
        pos = 0
        i = 0
        for key, blob, ext, label, meta in _iter_source(src):
            if i >= n:
                raise ValueError(f"{src}: more samples than the manifest's {n}")
            size = len(blob)
            if pos + size > len(data):
                data = np.resize(data, max(pos + size, int(len(data) * 1.25)))
            data[pos:pos + size] = np.frombuffer(blob, dtype=np.uint8)
            pos += size
            offsets[i + 1] = pos
            labels[i] = label
            code = ext_index.get(ext)
            if code is None:
                code = ext_index[ext] = len(exts)
                exts.append(ext)
            ext_codes[i] = code
            keys.append(key)
            metas.append(meta)
            i += 1
        if i != n:
            raise ValueError(f"{src}: read {i} samples, the manifest says {n}")
        self = cls.__new__(cls)
        self._data = torch.from_numpy(data[:pos])  # untouched tail pages of `data` were never committed
        self._offsets = torch.from_numpy(offsets)
        self._labels = torch.from_numpy(labels)
        self._ext_codes = torch.from_numpy(ext_codes)
        self._exts = exts
        meta_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(m) for m in metas], out=meta_off[1:])
        self._meta = torch.from_numpy(np.frombuffer(b"".join(metas), dtype=np.uint8).copy())
        self._meta_offsets = torch.from_numpy(meta_off)
        self._keys = torch.from_numpy(np.array([k.encode() for k in keys]).view(np.uint8).copy())
        self._key_width = max((len(k) for k in keys), default=1)
        self._classes = src.classes
        self._class_to_idx = src.class_to_idx
        self._num_samples = n
        self.source_repr = repr(src)
        self.source_fingerprint = src.fingerprint
        self.num_bytes = pos
        self._init_common(ReadOptions(
            image_size=src.image_size, train=src.sample_decoder.train, decoder=src.sample_decoder.decoder,
            decode=src.decode, on_error=src.on_error, transform=src.sample_decoder.transform,
            max_pixels=src.sample_decoder.max_pixels, seed=src.seed, shuffle=src.shuffle, pad=src.pad,
            rank=src.rank, world_size=src.world_size, max_decode_bytes=src.sample_decoder.max_decode_bytes,
            resize_size=src.sample_decoder.resize_size))
        self._np = None
        log.info("cache='memory': %d samples, %.1f MB loaded in %.2f s", n, pos / 1e6, time.perf_counter() - t0)
        return self

    def __repr__(self) -> str:
        return f"MemoryCachedSource({self.source_repr}, num_bytes={self.num_bytes})"

    def __len__(self) -> int:
        return self._num_samples

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the source it was loaded from."""
        return self.source_fingerprint

    def __getstate__(self):
        state = super().__getstate__()
        state["_np"] = None
        return state

    def _views(self):
        pid = os.getpid()
        if self._np is None or self._np[0] != pid:
            self._np = (pid, self._data.numpy(), self._offsets.numpy(), self._labels.numpy(),
                        self._ext_codes.numpy(), self._meta.numpy(), self._meta_offsets.numpy(),
                        self._keys.numpy())
        return self._np

    def read_raw(self, i: int) -> tuple[str, bytes, str, int, dict]:
        """``(key, data, ext, label, meta)`` of sample ``i`` (a copy of its bytes)."""
        _, data, off, labels, codes, meta, moff, keys = self._views()
        w = self._key_width
        key = keys[i * w:(i + 1) * w].tobytes().rstrip(b"\0").decode()
        return (key, data[off[i]:off[i + 1]].tobytes(), self._exts[codes[i]], int(labels[i]),
                json.loads(meta[moff[i]:moff[i + 1]].tobytes()))

    def __getitem__(self, i: int):
        if not 0 <= i < self._num_samples:
            raise IndexError(f"sample index {i} is outside [0, {self._num_samples})")
        self._map_epoch_check()
        _, data, off, labels, codes, meta, moff, keys = self._views()
        w = self._key_width
        key = keys[i * w:(i + 1) * w].tobytes().rstrip(b"\0").decode()
        where = f"{self.source_repr} (memory cache) key {key}"
        try:
            blob = data[off[i]:off[i + 1]].tobytes()
            m = meta[moff[i]:moff[i + 1]].tobytes() if not self.decode else None
            return self.emit(key, blob, self._exts[codes[i]], int(labels[i]), m, where, index=i)
        except ValueError as exc:
            self.handle_error(name_original_file(exc, meta[moff[i]:moff[i + 1]].tobytes()), where)
            return None
