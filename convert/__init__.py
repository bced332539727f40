"""shardfeed.convert: scan image folders and pack them into WebDataset shards or LMDB.

* :func:`pack` with :class:`PackOptions` (and :class:`ReencodeOptions` for ``--resize``) packs an
  ImageFolder-style folder (local or ``s3://``) and returns a :class:`PackReport`; the streaming
  writers :class:`WebDatasetWriter` and :class:`LmdbWriter` write samples you produce yourself.
* The packer joint (a format's packer, see docs/architecture.md): :class:`PackContext` (the
  executor, progress sinks, shard-end hook, storage options and fault hooks a pack hands down),
  :class:`PackResult` (what a packer returns) and the :class:`Packer` protocol.
* The dataset tools, one function per ``shardfeed`` command: :func:`inspect_dataset`,
  :func:`check_dataset`, :func:`unpack`, :func:`convert_dataset`, :func:`stage`,
  :func:`index_shards`, :func:`serve_directory`.
* :func:`write_dataset` writes any iterable of sample dicts (image bytes, label, extra fields) as
  a dataset, with ``pack``'s format, manifest and indexes.

Importing this package imports neither torch nor webdataset (packing starts fast and runs where
torch is broken): the names are imported on first use (module ``__getattr__``); type checkers see
them through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardfeed.readers.version import __version__

# Imported now, not on first use: ``pack`` is also the name of the submodule ``convert/write/pack.py``,
# and importing a submodule sets the package attribute of that name to the module, so a lazy
# ``pack`` would read as the module once anything had imported ``shardfeed.convert.write.pack``.
# (It imports neither torch nor webdataset.)
from .write.pack import PackOptions, PackReport, pack

if TYPE_CHECKING:
    from .write.context import PackContext, Packer, PackResult
    from .write.reencode import ReencodeOptions
    from .write.scan import scan_image_folder
    from .tools.check import check_dataset
    from .tools.convert import convert_dataset
    from .tools.index import index_shards
    from .tools.inspect import inspect_dataset
    from .tools.serve import serve_directory
    from .tools.stage import stage
    from .write.dataset_writer import write_dataset
    from .tools.unpack import unpack
    from .writers.lmdb import LmdbWriter
    from .writers.webdataset import WebDatasetWriter

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "PackContext": "shardfeed.convert.write.context",
    "PackResult": "shardfeed.convert.write.context",
    "Packer": "shardfeed.convert.write.context",
    "ReencodeOptions": "shardfeed.convert.write.reencode",
    "scan_image_folder": "shardfeed.convert.write.scan",
    "WebDatasetWriter": "shardfeed.convert.writers.webdataset",
    "LmdbWriter": "shardfeed.convert.writers.lmdb",
    "inspect_dataset": "shardfeed.convert.tools.inspect",
    "check_dataset": "shardfeed.convert.tools.check",
    "unpack": "shardfeed.convert.tools.unpack",
    "convert_dataset": "shardfeed.convert.tools.convert",
    "stage": "shardfeed.convert.tools.stage",
    "index_shards": "shardfeed.convert.tools.index",
    "serve_directory": "shardfeed.convert.tools.serve",
    "write_dataset": "shardfeed.convert.write.dataset_writer",
}

__all__ = ["__version__", "pack", "PackOptions", "PackReport", "PackContext", "PackResult", "Packer",
           "ReencodeOptions", "scan_image_folder",
           "WebDatasetWriter", "LmdbWriter", "inspect_dataset", "check_dataset", "unpack", "convert_dataset",
           "stage", "index_shards", "serve_directory", "write_dataset"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed.convert' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
