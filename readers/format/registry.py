"""The one registry of dataset formats, keyed by the manifest's ``format``: readers and writers alike.

Each :class:`FormatSpec` describes one format: what it is (sharded or one file, readable from a
URL, which pack options apply, the noun a summary uses, which files it owns) and, by dotted
reference (``"module:attr"``, imported on first use), the reader source class that opens it and,
when ``shardfeed.convert`` is installed, the packer (``pack``), the streaming writer
(``convert``), the checker (``check``) and the record reader the tools use. Code outside a
format's own modules asks the description (:func:`describe`) and never tests a format's name.
This module lives on the readers side because a training process needs it and ``readers`` never
imports ``convert``: the readers register their sources and descriptions here, and
:mod:`shardfeed.convert.writers` registers the packers, writers and checkers (as dotted
references, so nothing heavy is imported early).

Adding a format: a source class under ``readers/`` and
``register_format("name", source="shardfeed.readers.x_source:XSource", title=..., sharded=...)``;
a writer and a packer under ``convert/writers/`` registered from ``convert/writers/__init__.py``
(see ``docs/architecture.md``, "A format").
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

__all__ = ["FormatSpec", "FORMATS", "register_format", "canonical_format", "format_spec", "describe",
           "format_choices", "resolve", "source_factory", "packer", "writer_class"]

@dataclasses.dataclass
class FormatSpec:
    """One format's entry.

    Attributes:
        name: the manifest's ``format`` value (``"webdataset"``, ``"lmdb"``).
        aliases: other accepted spellings on the command line and in the API (``"wds"``).
        source: the reader: ``"module:Class"`` or a callable. A
            :class:`~shardfeed.readers.sources.source_base.SourceBase` subclass is called
            ``(location, manifest, read, **own)`` (``read``: the
            :class:`~shardfeed.readers.sources.options.ReadOptions`; ``own``: the options its constructor
            names); any other callable ``(location, manifest, **options)``.
        packer: ``fn(scan, samples, out, options, context) -> PackResult`` (the
            ``shardfeed.convert.write.context.Packer`` protocol): ``context`` (a ``PackContext``) gives
            the executor to run tasks on, ``progress(num_samples, input_bytes)``,
            ``output_progress(output_bytes)`` and ``on_shard_end(entry, index)``, called in the
            packing process as each shard is complete (a pack to a bucket uploads it then); the
            ``PackResult`` holds the shards, the skipped files, the shards resumed, the report's
            extra figures and an optional ``finalize(manifest)``.
        writer: the streaming ``Writer`` class (``write(sample)``, ``close() -> Manifest``, a context
            manager) with the uniform factory ``create(out, *, classes, class_to_idx, max_count,
            max_bytes, prefix, skipped, options, files, map_size, expected_bytes)``; each format
            uses the keywords that apply to it.
        title: the name messages use (``"WebDataset"``, ``"LMDB"``).
        sharded: the dataset is many shard files cut by ``max_count``/``max_bytes`` (resumable shard by
            shard, counted as shards); False: one file (LMDB's ``data.mdb``), counted as one file.
        remote_readable: its source reads it over ``http(s)://`` and ``s3://``; False: from a local
            disk only (``shardfeed stage`` copies it first).
        remote_writable: ``pack`` can write it to a bucket; False: to a local disk only.
        exact_sizes: each manifest shard's ``num_bytes`` is its file's size, checked when a dataset is
            opened; False: the file's size is not the data's (an LMDB file grows in pages).
        tar_shards: the shards are plain WebDataset ``.tar`` files (``PREFIX-NNNNNN.tar`` with
            ``.sfidx`` offset indexes) that other WebDataset tools read: ``pack`` writes the wids
            index and the dataset card beside them.
        options: the :class:`~shardfeed.convert.write.pack.PackOptions` fields that apply to this format
            only (recorded in the manifest's options; ``pack`` refuses them for other formats).
        summary_noun: what a summary calls one of its files (``"shard"``, ``"database"``).
        files: the fixed file names a dataset of this format consists of besides its manifest
            (LMDB: ``data.mdb``, ``lock.mdb``); what ``--overwrite`` may delete without a manifest entry.
        checker: ``fn(location, manifest, report, decode, progress, limit, max_decode_bytes)`` filling a
            :class:`~shardfeed.convert.tools.check.CheckReport` (``shardfeed check``); None: the tar shard check.
        records: ``fn(root, *, verify=True) -> Iterator[(key, record dict | Exception)]`` over a local
            dataset's records, for a format whose samples are records rather than tar members (LMDB);
            ``inspect``, ``convert`` and ``stage`` (a staged copy without file hashes is trusted once
            every record verifies) read it through this. None: the samples are read from tar shards.
    """

    name: str
    aliases: tuple[str, ...] = ()
    source: Any = None
    packer: Any = None
    writer: Any = None
    title: str = ""
    sharded: bool = True
    remote_readable: bool = True
    remote_writable: bool = True
    exact_sizes: bool = True
    tar_shards: bool = False
    options: tuple[str, ...] = ()
    summary_noun: str = "shard"
    files: tuple[str, ...] = ()
    checker: Any = None
    records: Any = None

    def __post_init__(self):
        self.title = self.title or self.name

    def noun(self, count: int) -> str:
        """``summary_noun`` for ``count`` files (``"1 shard"``, ``"3 shards"``, ``"one database"``)."""
        if not self.sharded:
            return f"one {self.summary_noun}"
        return f"{count:,} {self.summary_noun}" + ("" if count == 1 else "s")


#: Formats by canonical name.
FORMATS: dict[str, FormatSpec] = {}


_DESCRIPTION_FIELDS = tuple(f.name for f in dataclasses.fields(FormatSpec) if f.name not in ("name", "aliases"))


def register_format(name: str, *, aliases: tuple[str, ...] = (), **fields: Any) -> FormatSpec:
    """Register (or complete) format ``name``; fields not given (or None) keep their registered value.

    Args:
        name: the manifest's ``format`` value (lower case).
        aliases: more accepted spellings.
        **fields: any other :class:`FormatSpec` field (``source``, ``packer``, ``writer``, ``checker``,
            ``records`` as ``"module:attr"`` references or the objects themselves; ``title``,
            ``sharded``, ``remote_readable``, ...).

    Returns:
        The format's :class:`FormatSpec`.

    Raises:
        TypeError: a field :class:`FormatSpec` does not have.
    """
    unknown = sorted(set(fields) - set(_DESCRIPTION_FIELDS))
    if unknown:
        raise TypeError(f"register_format({name!r}): no field(s) {', '.join(unknown)}; the fields are "
                        f"{', '.join(_DESCRIPTION_FIELDS)}")
    spec = FORMATS.setdefault(name, FormatSpec(name))
    spec.aliases = tuple(dict.fromkeys(spec.aliases + tuple(aliases)))
    for field, value in fields.items():
        if value is not None:
            setattr(spec, field, value)
    return spec


def describe(name: str) -> FormatSpec:
    """The description of format ``name`` (or an alias); a name no format registered (a manifest
    from another tool or version) gets a :class:`FormatSpec` of the defaults: sharded, readable
    remotely, sizes checked, no reader registered.

    Never raises: what can be done with an unknown format is refused where a reader, packer or
    writer is looked up (:func:`source_factory`, :func:`packer`, :func:`writer_class`).
    """
    try:
        return format_spec(name)
    except ValueError:
        return FormatSpec(str(name))


def format_choices() -> list[str]:
    """Every accepted spelling, aliases first within a format, in registration order (the CLI's
    ``--format`` choices: ``["wds", "webdataset", "lmdb"]`` plus any format registered since)."""
    return [a for s in FORMATS.values() for a in (*s.aliases, s.name)]


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


register_format("webdataset", aliases=("wds",), source="shardfeed.readers.sources.webdataset_source:WebDatasetSource",
                title="WebDataset", tar_shards=True, options=("max_count", "max_bytes", "prefix"),
                summary_noun="shard")
register_format("lmdb", source="shardfeed.readers.sources.lmdb_source:LMDBSource", title="LMDB", sharded=False,
                remote_readable=False, remote_writable=False, exact_sizes=False, summary_noun="database",
                files=("data.mdb", "lock.mdb"))
