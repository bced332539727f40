"""shardfeed.readers: the on-disk format and the readers that feed a training loop.

Everything a training process needs, without the packing side (``shardfeed.readers`` never
imports ``shardfeed.convert``):

* :func:`open_dataset` opens an image folder or a packed dataset (local path, ``http(s)://``,
  ``s3://``) as a PyTorch dataset; :func:`make_loader` wraps it in a resumable ``DataLoader``
  (:class:`ShardfeedLoader`); :func:`to_device` copies a batch and normalises it on the device.
  Their options as typed values: :class:`ReadOptions` (what every source shares),
  :class:`OpenOptions` (how a dataset is opened) and :class:`LoaderOptions` (the ``DataLoader``'s
  own keywords).
* :class:`Manifest`, :func:`load_manifest` and :class:`Sample`: the binding on-disk format
  (:mod:`shardfeed.readers.format.manifest`; specification: docs/format.md).
* The errors (:class:`ShardfeedError` and its family, :mod:`shardfeed.readers.errors`).
* Storage: :class:`Location` (the one interface of local folders, HTTP and object stores),
  :func:`open_location` and :func:`register_location` / :func:`unregister_location` (a storage
  for a new URL scheme).
* The measuring harness behind ``shardfeed bench``/``verify``/``tune``: :func:`bench_source`,
  :func:`compare_sources`, :func:`tune_loader`; :func:`watch` times the user's own training loop
  and says what stalls it.

The names are imported on first use (module ``__getattr__``), so ``import shardfeed.readers``
stays cheap and does not import torch; type checkers see them through the ``TYPE_CHECKING``
imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .sources.dataset import open_dataset
    from .errors import (
        CorruptDataError,
        DataSourceError,
        IncompleteDatasetError,
        ManifestError,
        ResumeStateError,
        ShardfeedError,
        SourceChangedError,
        UnsupportedURLError,
    )
    from .format.manifest import Manifest, Sample
    from .device import to_device
    from .loader import LoaderOptions, ShardfeedLoader, make_loader
    from .storage.location import LocalLocation, Location, LocationBase
    from .measure.bench import bench_source
    from .measure.tune import tune_loader
    from .measure.verify import compare_sources
    from .measure.watch import watch
    from .storage.opener import load_manifest, open_location, register_location, unregister_location
    from .sources.options import OpenOptions, ReadOptions

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "open_dataset": "shardfeed.readers.sources.dataset",
    "make_loader": "shardfeed.readers.loader",
    "to_device": "shardfeed.readers.device",
    "watch": "shardfeed.readers.measure.watch",
    "ShardfeedLoader": "shardfeed.readers.loader",
    "LoaderOptions": "shardfeed.readers.loader",
    "ReadOptions": "shardfeed.readers.sources.options",
    "OpenOptions": "shardfeed.readers.sources.options",
    "Manifest": "shardfeed.readers.format.manifest",
    "Sample": "shardfeed.readers.format.manifest",
    "load_manifest": "shardfeed.readers.storage.opener",
    "ShardfeedError": "shardfeed.readers.errors",
    "ManifestError": "shardfeed.readers.errors",
    "IncompleteDatasetError": "shardfeed.readers.errors",
    "CorruptDataError": "shardfeed.readers.errors",
    "SourceChangedError": "shardfeed.readers.errors",
    "DataSourceError": "shardfeed.readers.errors",
    "ResumeStateError": "shardfeed.readers.errors",
    "UnsupportedURLError": "shardfeed.readers.errors",
    "bench_source": "shardfeed.readers.measure.bench",
    "compare_sources": "shardfeed.readers.measure.verify",
    "tune_loader": "shardfeed.readers.measure.tune",
    "Location": "shardfeed.readers.storage.location",
    "LocationBase": "shardfeed.readers.storage.location",
    "LocalLocation": "shardfeed.readers.storage.location",
    "open_location": "shardfeed.readers.storage.opener",
    "register_location": "shardfeed.readers.storage.opener",
    "unregister_location": "shardfeed.readers.storage.opener",
}

__all__ = ["__version__", "open_dataset", "make_loader", "to_device", "ShardfeedLoader", "ReadOptions", "OpenOptions",
           "LoaderOptions", "Manifest", "Sample",
           "load_manifest", "ShardfeedError", "ManifestError", "IncompleteDatasetError", "CorruptDataError",
           "SourceChangedError", "DataSourceError", "ResumeStateError", "UnsupportedURLError", "bench_source",
           "compare_sources", "tune_loader", "watch", "Location", "LocationBase", "LocalLocation", "open_location",
           "register_location", "unregister_location"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed.readers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
