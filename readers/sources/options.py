"""The reading options as typed values: what every source shares, and how a dataset is opened.

:func:`~shardfeed.readers.sources.dataset.open_dataset` takes its options as keywords (one flat list, with
"did you mean" for a misspelt one, :mod:`~shardfeed.readers.keywords`) and sorts them, once, into

* :class:`ReadOptions`: what every source shares (the decode path, ``on_error``, the epoch's
  shuffle and split, extra fields); a source built on
  :class:`~shardfeed.readers.sources.source_base.SourceBase` takes it whole;
* :class:`OpenOptions`: how the dataset is opened (``storage_options``, ``timeout_s``,
  ``retries``, ``check_files``, ``cache``, ``cache_dir``, ``cache_limit``), used before any source exists;
* the chosen source's own keywords, the explicit parameters of its constructor
  (``shuffle_buffer`` and ``readahead`` of the WebDataset source, ``readahead`` and ``verify``
  of LMDB, ``class_to_idx`` and ``extensions`` of an image folder).

Each value is checked once, where it enters: ``on_error``, ``cache`` and ``fields`` when these
objects are built (before any I/O), the decode options (``image_size``, ``decoder``,
``max_pixels`` ...) by :class:`~shardfeed.readers.decode.transforms.SampleDecoder`, which the source
builds from them.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ..decode.image import DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_PIXELS
from ..errors import check_on_error

if TYPE_CHECKING:
    import torch

__all__ = ["ReadOptions", "OpenOptions", "READ_OPTION_NAMES", "OPEN_OPTION_NAMES", "CACHE_CHOICES", "check_seed",
           "check_flag", "check_shuffle_buffer"]

#: The values of ``cache``: None (read from the source) or ``"memory"`` (every sample's bytes in RAM).
CACHE_CHOICES = (None, "memory")


def check_seed(seed: Any) -> int:
    """``seed`` as an ``int``: an integer (Python or NumPy), never a bool, string or float.

    Raises:
        TypeError: ``seed`` is not an integer (names the value: ``"1"`` or ``1.5`` would otherwise
            be read as another seed than the one meant).
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    return int(seed)


def check_shuffle_buffer(size: Any) -> int:
    """``shuffle_buffer`` (samples; 0 or 1: no buffer) as an ``int``.

    Raises:
        TypeError: not an integer (a bool, string or float; names the value).
        ValueError: negative.
    """
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"shuffle_buffer must be an integer number of samples, got {size!r} ({type(size).__name__})")
    if size < 0:
        raise ValueError(f"shuffle_buffer must be >= 0 samples (0 or 1: no buffer), got {size}")
    return int(size)


@dataclass(frozen=True)
class ReadOptions:
    """The options every source shares (frozen; built once by
    :func:`~shardfeed.readers.sources.dataset.open_dataset`, or by hand for a source built directly).

    Args:
        image_size: ``N``: resize the shorter side to N and center-crop N x N (training: random
            resized crop N and a flip); None keeps the decoded size.
        train: training transforms (random resized crop + horizontal flip, seeded).
        decoder: ``"auto"``, ``"simplejpeg"``, ``"pil"`` or ``"cv2"``.
        decode: False yields raw :class:`~shardfeed.readers.format.manifest.Sample` tuples.
        on_error: ``"raise"`` or ``"skip"``.
        transform: callable ``uint8 [3, H, W] -> tensor`` replacing the built-in resize/crop.
        max_pixels: the largest image (width x height, pixels) a decode accepts; None: any.
        max_decode_bytes: the memory one decode may allocate (bytes, checked on the header); None:
            unchecked.
        resize_size: evaluation: the shorter side (pixels) before the central ``image_size`` crop.
        crop_pct: timm's spelling of the same: ``resize_size = floor(image_size / crop_pct)``.
        seed: the run's seed (shuffling and random transforms); stored as ``int``.
        shuffle: shuffle each epoch (keyed by ``(seed, epoch)``).
        pad: fill the remainder ``N % world_size`` by repeating samples instead of dropping it.
        rank, world_size: explicit values (None: from ``torch.distributed`` or the environment, see
            :func:`~shardfeed.readers.order.epoch.resolve_rank`).
        fields: extra fields to yield beside image and label (manifest version 3, e.g.
            ``("txt", "json")``); a single name or a list is stored as a tuple, None as ``()``.

    Raises:
        ValueError: ``on_error`` is not ``"raise"`` or ``"skip"``.
        TypeError: ``seed`` is not an integer (a bool, string or float: :func:`check_seed`);
            ``decode``, ``shuffle`` or ``pad`` is not True/False (:func:`check_flag`: a string
            such as ``"false"`` is refused); ``fields`` is not a name or a sequence of non-empty names.
    """

    image_size: int | None = None
    train: bool = False
    decoder: str = "auto"
    decode: bool = True
    on_error: str = "raise"
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    max_decode_bytes: int | None = DEFAULT_MAX_DECODE_BYTES
    resize_size: int | None = None
    crop_pct: float | None = None
    seed: int = 0
    shuffle: bool = True
    pad: bool = False
    rank: int | None = None
    world_size: int | None = None
    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_on_error(self.on_error)
        object.__setattr__(self, "seed", check_seed(self.seed))
        for name in ("decode", "shuffle", "pad"):
            object.__setattr__(self, name, check_flag(name, getattr(self, name)))
        object.__setattr__(self, "fields", _field_names(self.fields))

    def decoder_options(self) -> dict[str, Any]:
        """The keywords of :class:`~shardfeed.readers.decode.transforms.SampleDecoder` (the decode path)."""
        return dict(image_size=self.image_size, train=self.train, decoder=self.decoder, transform=self.transform,
                    max_pixels=self.max_pixels, seed=self.seed, max_decode_bytes=self.max_decode_bytes,
                    resize_size=self.resize_size, crop_pct=self.crop_pct)


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a ``bool``: ``True``/``False`` (NumPy's too) or the integers 1/0.

    A string is refused rather than read as ``bool("false") == True``.

    Raises:
        TypeError: anything else, naming ``name`` and the value.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _field_names(fields: Any) -> tuple[str, ...]:
    if fields is None:
        return ()
    if isinstance(fields, str):
        return (fields,)
    try:
        names = tuple(fields)
    except TypeError:
        raise TypeError(f"fields must be a field name or a sequence of names, got {type(fields).__name__}") from None
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise TypeError(f"fields must be non-empty field names (str), got {bad[0]!r} in {fields!r}")
    return names


@dataclass(frozen=True)
class OpenOptions:
    """How :func:`~shardfeed.readers.sources.dataset.open_dataset` opens a dataset (frozen).

    Args:
        storage_options: object stores (``s3://``): ``endpoint_url``, ``region_name``,
            ``profile``, ``anon`` ... (see :mod:`~shardfeed.readers.storage.objstore`); ignored locally.
        timeout_s: HTTP and object stores: seconds a read may wait (None: the default).
        retries: HTTP and object stores: attempts after a failed read (None: the default).
        check_files: refuse a packed dataset whose files are missing or of another size than
            the manifest says (False reads anyway; damage is then named while reading). A local
            WebDataset's shards are checked as each is opened for reading (one ``fstat``), not at
            open. An image folder has no manifest and ignores it.
        cache: None, or ``"memory"``: every sample's raw bytes loaded once into one buffer.
        cache_dir: a local folder where the shards and offset indexes of a remote WebDataset are
            kept once downloaded (:mod:`~shardfeed.readers.storage.shard_cache`); None: read from the remote
            every epoch. A local dataset, an image folder and LMDB ignore it.
        cache_limit: bytes the files in ``cache_dir`` may take (an int, or a size such as
            ``"50GB"``; stored as an int); the least recently used are evicted. None: no limit.

    Raises:
        ValueError: ``cache`` is not None or ``"memory"``; ``retries`` is negative or not an
            integer; ``cache_dir`` is a URL; ``cache_limit`` without ``cache_dir``, or below 1 byte.
        TypeError: ``check_files`` is not True/False (:func:`check_flag`); ``cache_dir`` is not a
            path; ``cache_limit`` is not an integer or a size string.
    """

    storage_options: dict[str, Any] | None = None
    timeout_s: float | None = None
    retries: int | None = None
    check_files: bool = True
    cache: str | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None

    def __post_init__(self) -> None:
        if self.cache not in CACHE_CHOICES:
            raise ValueError(f"cache must be None or 'memory', got {self.cache!r}")
        self._check_cache_dir()
        object.__setattr__(self, "check_files", check_flag("check_files", self.check_files))
        retries = self.retries
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, numbers.Integral)
                                    or retries < 0):
            raise ValueError(f"retries must be an integer >= 0 (or None: the default), got {self.retries!r}")


    def _check_cache_dir(self) -> None:
        from ..storage.opener import is_remote
        from ..storage.shard_cache import check_cache_limit

        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)):
                raise TypeError(f"cache_dir must be a local folder (str or path), got {type(self.cache_dir).__name__}")
            if is_remote(str(self.cache_dir)):
                raise ValueError(f"cache_dir must be a local folder, not a URL: {self.cache_dir}")
        elif self.cache_limit is not None:
            raise ValueError("cache_limit bounds the shard cache: give cache_dir (a local folder) too")
        object.__setattr__(self, "cache_limit", check_cache_limit(self.cache_limit))


#: The keywords that make a :class:`ReadOptions`.
READ_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(ReadOptions))
#: The keywords that make an :class:`OpenOptions`.
OPEN_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(OpenOptions))


def split_options(options: Mapping[str, Any]) -> tuple[ReadOptions, OpenOptions, dict[str, Any]]:
    """Sort :func:`~shardfeed.readers.sources.dataset.open_dataset`'s keywords (already checked against
    the known names) into ``(ReadOptions, OpenOptions, the source's own keywords)``.

    Raises:
        ValueError, TypeError: what :class:`ReadOptions` and :class:`OpenOptions` raise; a
            ``shuffle_buffer`` that is not an integer >= 0 (:func:`check_shuffle_buffer`, checked
            for every source, also those that ignore it).
    """
    read = ReadOptions(**{k: v for k, v in options.items() if k in READ_OPTION_NAMES})
    opened = OpenOptions(**{k: v for k, v in options.items() if k in OPEN_OPTION_NAMES})
    own = {k: v for k, v in options.items() if k not in READ_OPTION_NAMES and k not in OPEN_OPTION_NAMES}
    if "shuffle_buffer" in own:
        own["shuffle_buffer"] = check_shuffle_buffer(own["shuffle_buffer"])
    return read, opened, own
