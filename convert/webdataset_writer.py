"""Moved: :mod:`shardfeed.convert.writers.webdataset` (this name stays for existing imports)."""

from .writers.webdataset import WebDatasetWriter

__all__ = ["WebDatasetWriter"]
