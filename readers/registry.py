"""The one registry of dataset formats, keyed by the manifest's ``format``: readers and writers alike.

Each :class:`FormatSpec` names, by dotted reference (``"module:attr"``, imported on first use),
the reader source class that opens a dataset of that format and, when ``shardfeed.convert`` is
installed, the packer (``pack``) and the streaming writer (``convert``) that produce it. This
module lives on the readers side because a training process needs it and ``readers`` never
imports ``convert``: the readers register their sources here, and :mod:`shardfeed.convert.writers`
registers the packers and writers (as dotted references, so nothing heavy is imported early).

Adding a format: a source class under ``readers/`` and
``register_format("name", source="shardfeed.readers.x_source:XSource")``; a writer and a packer
under ``convert/writers/`` registered from ``convert/writers/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

__all__ = ["FormatSpec", "FORMATS", "register_format", "canonical_format", "format_spec", "resolve",
           "source_factory", "packer", "writer_class"]

@dataclasses.dataclass
class FormatSpec:
    """One format's entry.

    Attributes:
        name: the manifest's ``format`` value (``"webdataset"``, ``"lmdb"``).
        aliases: other accepted spellings on the command line and in the API (``"wds"``).
        source: the reader: ``"module:Class"`` or a callable ``(location, manifest, **options)``.
        packer: ``fn(scan, samples, out, options, progress, output_progress=None, *, on_shard_end=None)
            -> (shards, skipped, resumed, extra)``; ``progress(num_samples, input_bytes)``,
            ``output_progress(output_bytes)``, ``on_shard_end(entry, index)`` in the calling process
            as each shard is complete (a pack to a bucket uploads it then).
        writer: the streaming ``Writer`` class (``write(sample)``, ``close() -> Manifest``, a context
            manager) with the uniform factory ``create(out, *, classes, class_to_idx, max_count,
            max_bytes, prefix, skipped, options, files, map_size, expected_bytes)``; each format
            uses the keywords that apply to it.
    """

    name: str
    aliases: tuple[str, ...] = ()
    source: Any = None
    packer: Any = None
    writer: Any = None


#: Formats by canonical name.
FORMATS: dict[str, FormatSpec] = {}


def register_format(name: str, *, aliases: tuple[str, ...] = (), source: Any = None, packer: Any = None,
                    writer: Any = None) -> FormatSpec:
    """Register (or complete) format ``name``; fields left None keep their registered value.

    Args:
        name: the manifest's ``format`` value.
        aliases: more accepted spellings.
        source, packer, writer: ``"module:attr"`` references or the objects themselves.

    Returns:
        The format's :class:`FormatSpec`.
    """
    spec = FORMATS.setdefault(name, FormatSpec(name))
    spec.aliases = tuple(dict.fromkeys(spec.aliases + tuple(aliases)))
    for field, value in (("source", source), ("packer", packer), ("writer", writer)):
        if value is not None:
            setattr(spec, field, value)
    return spec


def canonical_format(name: str) -> str:
    """The canonical name of format ``name`` or one of its aliases (case-insensitive).

    Raises:
        ValueError: an unknown format (the message lists the known ones).
    """
    key = str(name).lower()
    for spec in FORMATS.values():
        if key == spec.name or key in spec.aliases:
            return spec.name
    known = ", ".join(f"{a} ({s.name})" if a != s.name else a for s in FORMATS.values() for a in (*s.aliases, s.name)
                      if a != s.name or not s.aliases)
    raise ValueError(f"unknown format {name!r}: choose one of {known}")


def format_spec(name: str) -> FormatSpec:
    """The :class:`FormatSpec` of ``name`` (or an alias).

    Raises:
        ValueError: an unknown format.
    """
    return FORMATS[canonical_format(name)]


def resolve(ref: Any) -> Any:
    """The object a ``"module:attr"`` reference names (imported now); a non-string is returned as is."""
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _field(fmt: str, field: str, what: str) -> Any:
    spec = format_spec(fmt)
    ref = getattr(spec, field)
    if ref is None:
        raise ValueError(f"format {spec.name!r} has no {what} registered"
                         + (" (import shardfeed.convert.writers)" if field != "source" else ""))
    return resolve(ref)


def source_factory(fmt: str) -> Callable[..., Any]:
    """The reader source class (or factory) of format ``fmt``.

    Raises:
        ValueError: unknown format, or no source registered.
    """
    return _field(fmt, "source", "reader source")


def packer(fmt: str) -> Callable[..., Any]:
    """The packer of format ``fmt`` (registered by :mod:`shardfeed.convert.writers`).

    Raises:
        ValueError: unknown format, or no packer registered.
    """
    return _field(fmt, "packer", "packer")


def writer_class(fmt: str) -> type:
    """The streaming writer class of format ``fmt`` (registered by :mod:`shardfeed.convert.writers`).

    Raises:
        ValueError: unknown format, or no writer registered.
    """
    return _field(fmt, "writer", "writer")


register_format("webdataset", aliases=("wds",), source="shardfeed.readers.webdataset_source:WebDatasetSource")
register_format("lmdb", source="shardfeed.readers.lmdb_source:LMDBSource")
