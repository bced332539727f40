"""What the three sources share: decoding, raw samples, ``on_error``, epochs, rank and batching.

Every source turns a stored sample into the same output through :meth:`SourceBase.emit`:

* ``decode=True``: :class:`~shardfeed.readers.transforms.SampleDecoder` →
  ``(image: torch.uint8 [3, H, W], label: int)``;
* ``decode=False``: :class:`~shardfeed.readers.format.Sample` ``(key, data, ext, label, meta)``.

``on_error="skip"`` drops a sample that cannot be read or decoded; each process counts its skips,
logs the first one of an epoch with its reason (WARNING) and the epoch's total when the epoch
ends. ``on_error="raise"`` re-raises, the message naming the file or the shard and key.

The epoch lives in a one-element shared-memory tensor, so :meth:`SourceBase.set_epoch` called in
the main process reaches persistent ``DataLoader`` workers (fork, spawn or forkserver).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from .decode import DEFAULT_MAX_PIXELS
from .format import Sample

__all__ = ["SourceBase", "IMAGE_EXTS", "SIDE_EXTS", "parts_to_raw"]

log = logging.getLogger("shardfeed.readers")

#: Extensions recognised as the image member of a WebDataset sample.
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "webp", "gif", "jpe",
                        "jfif", "jp2", "tga", "ico", "img"})
#: Members that are not the image.
SIDE_EXTS = frozenset({"cls", "json", "txt", "__key__", "__url__", "idx", "meta"})


def parts_to_raw(key: str, parts: dict, class_to_idx: dict, source: str) -> tuple[bytes, str, int, bytes | None]:
    """``(data, ext, label, meta_json_bytes)`` of a WebDataset sample's members.

    The image is the first member whose extension is an image extension (else the first member
    that is not ``cls``/``json``/``txt``); the label is ``{key}.cls`` (ASCII integer), else the
    ``class`` of ``{key}.json`` through ``class_to_idx``.

    Raises:
        CorruptDataError: no image member, or no usable label (names ``source`` and ``key``).
    """
    from .errors import CorruptDataError

    data = ext = None
    for e in parts:
        if e in IMAGE_EXTS:
            data, ext = parts[e], e
            break
    if data is None:
        for e, v in parts.items():
            if e not in SIDE_EXTS:
                data, ext = v, e
                break
    if data is None:
        raise CorruptDataError(f"{source} key {key}: sample has no image member (members: "
                               f"{', '.join(sorted(parts)) or 'none'})")
    meta = parts.get("json")
    cls = parts.get("cls")
    if cls is not None:
        try:
            label = int(cls)
        except ValueError:
            raise CorruptDataError(f"{source} key {key}: {key}.cls holds {cls[:20]!r}, not a class "
                                   "index") from None
    else:
        try:
            label = class_to_idx[json.loads(meta)["class"]]
        except Exception:
            raise CorruptDataError(f"{source} key {key}: no {key}.cls member and no known class in "
                                   f"{key}.json") from None
    if ext == "jpeg":
        ext = "jpg"
    elif ext == "tiff":
        ext = "tif"
    return data, ext, label, meta


class SourceBase:
    """Mixin of the sources (not a dataset by itself).

    Args:
        image_size, train, decoder, transform, max_pixels, seed: the decode path
            (:class:`~shardfeed.readers.transforms.SampleDecoder`).
        decode: False yields raw :class:`~shardfeed.readers.format.Sample` tuples.
        on_error: ``"raise"`` or ``"skip"``.
        shuffle: shuffle each epoch (seeded by ``seed + epoch``).
        pad: fill the remainder ``N % world_size`` by repeating samples instead of dropping it.
        rank, world_size: explicit values (see :func:`~shardfeed.readers.dataset.resolve_rank`).
    """

    #: True for sources read by index (``__getitem__``), False for iterable ones.
    map_style = False

    def _init_common(self, *, image_size: int | None = None, train: bool = False, decoder: str = "pil",
                     decode: bool = True, on_error: str = "raise", transform=None,
                     max_pixels: int | None = DEFAULT_MAX_PIXELS, seed: int = 0, shuffle: bool = True,
                     pad: bool = False, rank: int | None = None, world_size: int | None = None) -> None:
        import torch

        from .dataset import ON_ERROR, resolve_rank
        from .transforms import SampleDecoder

        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.image_size = image_size
        self.decode = bool(decode)
        self.on_error = on_error
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.pad = bool(pad)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.batch_size = 1
        self.drop_last = False
        # always built: validates the options even in raw mode
        self.sample_decoder = SampleDecoder(image_size=image_size, train=train, decoder=decoder,
                                            transform=transform, max_pixels=max_pixels, seed=self.seed)
        # epoch shared with workers: -1 = never set (then each process counts its own iterations)
        self._epoch_state = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        self._local_epoch = 0
        self._ctx_epoch = None
        self._skips = 0
        self._skip_epoch = None
        self._pid = os.getpid()

    # ---- configuration
    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (shard order, shuffle, random transforms)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch_state[0] = int(epoch)

    def set_distributed(self, rank: int | None = None, world_size: int | None = None) -> None:
        """Set (or re-resolve) this reader's rank and world size."""
        from .dataset import resolve_rank

        self.rank, self.world_size = resolve_rank(rank, world_size)

    def worker_init(self, worker_id: int) -> None:
        """Called by the loader's ``worker_init_fn`` in each worker: remember the worker id."""
        self._worker_id = int(worker_id)
        self.sample_decoder.set_context(max(self.epoch_in_use(), 0), self.rank, int(worker_id))

    def configure_batching(self, batch_size: int, drop_last: bool = False) -> None:
        """Tell the source the loader's batch size, so workers split on batch boundaries."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)

    @property
    def classes(self) -> list[str]:
        return list(self._classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return dict(self._class_to_idx)

    @property
    def num_samples(self) -> int:
        """Samples in the whole dataset (N), all ranks together."""
        return self._num_samples

    def epoch_in_use(self) -> int:
        """The epoch the current iteration uses (set, or this process's iteration count)."""
        e = int(self._epoch_state[0])
        return self._local_epoch if e < 0 else e

    def begin_epoch(self, worker: int | None = None) -> int:
        """Called at the start of an iteration in the process that reads; returns the epoch."""
        e = int(self._epoch_state[0])
        if e < 0:
            e = self._local_epoch
            self._local_epoch += 1
        self._enter_epoch(e, worker)
        return e

    def _enter_epoch(self, e: int, worker: int | None) -> None:
        if self._skip_epoch is not None and self._skip_epoch != e:
            self._report_skips()
        self._ctx_epoch = e
        self.sample_decoder.set_context(e, self.rank, worker)

    def end_epoch(self) -> None:
        """Called when an iteration ends: logs the epoch's skip count."""
        self._report_skips()

    def _report_skips(self) -> None:
        if self._skips:
            log.warning("on_error='skip': %d samples skipped in epoch %s (process %d)", self._skips,
                        self._skip_epoch, os.getpid())
        self._skips = 0
        self._skip_epoch = None

    def _map_epoch_check(self) -> None:
        """Map-style sources: follow the shared epoch in each process (for random transforms)."""
        e = int(self._epoch_state[0])
        if e < 0:
            e = 0
        if e != self._ctx_epoch:
            self._enter_epoch(e, None)

    # ---- turning stored samples into outputs
    def emit(self, key: str, data: bytes, ext: str, label: int, meta: Any, where: str):
        """One output item: decoded ``(uint8 [3, H, W], int)`` or a raw ``Sample``.

        Args:
            meta: a dict, or the JSON bytes of one (parsed only in raw mode).
            where: the file, or ``"shard S key K"``, for error messages.
        """
        if self.decode:
            return self.sample_decoder(data, ext, label, where)
        if meta is None:
            meta = {}
        elif not isinstance(meta, dict):
            meta = json.loads(meta)
        return Sample(key, data, ext, label, meta)

    def handle_error(self, exc: BaseException, where: str) -> None:
        """``on_error``: re-raise, or count and log the first skip of the epoch."""
        if self.on_error == "raise":
            raise exc
        if self._skips == 0:
            log.warning("on_error='skip': skipping %s: %s (further skips this epoch are counted)", where, exc)
        self._skips += 1
        self._skip_epoch = self._ctx_epoch

    @property
    def skipped(self) -> int:
        """Samples skipped so far in this epoch, in this process."""
        return self._skips

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_skips"] = 0
        state["_skip_epoch"] = None
        return state
