"""shardfeed.convert: scan image folders and pack them into WebDataset shards or LMDB.

:func:`write_dataset` (from :mod:`shardfeed.convert.layouts`, imported on first use) writes any
iterable of sample dicts as a dataset, with ``pack``'s format, manifest and indexes.
"""

__all__ = ["write_dataset"]


def __getattr__(name):
    if name == "write_dataset":
        from .layouts import write_dataset

        return write_dataset
    raise AttributeError(f"module 'shardfeed.convert' has no attribute {name!r}")
