"""The on-disk format: manifest schema and validation, key, file and member naming rules.

This module is the single definition of what shardfeed writes and reads. Writers
(``shardfeed.convert``) import it; readers never import the writers. Binding names (the
specification: docs/format.md):

WebDataset
    ``OUT/{prefix}-{index:06d}.tar``; per sample the contiguous members ``{key}.{ext}`` (original
    image bytes), ``{key}.cls`` (ASCII decimal class index) and ``{key}.json`` (UTF-8 metadata).
    Tar members carry fixed metadata (:data:`TAR_MTIME`, :data:`TAR_MODE`, uid/gid 0) so the same
    input gives byte-identical shards. Beside each shard, ``{prefix}-{index:06d}.sfidx`` holds the
    byte offset of every sample's first tar header as little-endian uint64 (manifest version 2;
    version 1 named it ``.idx``, the name NVIDIA DALI's ``wds2idx`` gives its own text index, so
    each tool overwrote the other's file; version-1 datasets are still read, see
    :data:`READABLE_VERSIONS`). ``{prefix}-{index:06d}.idx`` is left to DALI.
    Version 3: a sample may carry extra fields after those members, ``{key}.{field_member(name)}``
    (``{key}.txt``, ``{key}.mask.png``, ``{key}.sidecar.json``), listed in the manifest's
    ``fields``; an unlabelled dataset (``labels: "none"``) has no ``{key}.cls``.

LMDB
    ``OUT/data.mdb`` (+ ``lock.mdb``), one record per sample, key = sample key (UTF-8), value =
    :func:`encode_record` (msgpack map, versioned, pickle-free, with a CRC-32 of the image bytes;
    the codec lives in :mod:`shardfeed.readers.format.lmdb_record` and is re-exported here); a record
    with extra fields is record version 2.
    The manifest is also stored under :data:`LMDB_MANIFEST_KEY` (without file hashes).

manifest.json
    Written last and atomically; a finished manifest means a finished dataset. See
    :class:`Manifest`.

Beside it: the bytes of a sample's members (:mod:`shardfeed.readers.format.sample_members`), the offset
index codec (:mod:`shardfeed.readers.format.offset_index`) and a local folder's manifest loading
(:mod:`shardfeed.readers.storage.local_manifest`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

from ..errors import ManifestError
from ..file_io import MAX_CONTROL_FILE_BYTES, write_bytes_atomic
from .lmdb_record import LMDB_RECORD_VERSION, encode_record
from .lmdb_record import decode_record as _decode_record

__all__ = [
    "FORMAT_VERSION", "MAX_MANIFEST_BYTES", "READABLE_VERSIONS", "INDEX_SUFFIX", "PACK_STATE_DIR",
    "stored_path_problem", "merge_extension_counts", "MANIFEST_NAME", "LMDB_DATA_NAME", "LMDB_MANIFEST_KEY",
    "LMDB_RECORD_VERSION", "DEFAULT_PREFIX", "DEFAULT_EXTENSIONS", "IMAGE_EXTENSIONS", "SIDE_EXTENSIONS",
    "RESERVED_KEY_PREFIXES", "TAR_MTIME", "TAR_MODE", "TAR_BLOCK", "KEY_MIN_DIGITS", "Manifest", "ShardEntry",
    "Sample", "normalize_ext", "format_key", "key_width", "shard_name", "index_name", "split_member_name",
    "tar_member_bytes", "encode_record", "decode_record", "validate_manifest", "plain_file_name_problem",
    "MAX_MANIFEST_COUNT", "created_by", "LABELS_CLASS", "LABELS_NONE", "UNLABELLED", "field_member", "member_clash",
    "field_name_problem", "PATH_INDEX_NAME", "PACK_PLAN_NAME", "WRITE_DATASET_MARK",
]

#: Version of the manifest schema and of the on-disk layout it describes. 2: the offset index is
#: ``.sfidx`` (was ``.idx``, DALI's index name) and the manifest records the image extensions.
#: 3: samples may carry extra fields (``fields``: per-image sidecar files) and a dataset may be
#: unlabelled (``labels: "none"``). A dataset that uses neither is written as version 2, so a
#: class-folder pack's bytes are the same as with a version-2 writer (:meth:`Manifest.written_version`).
FORMAT_VERSION = 3
#: Manifest versions the readers accept (a version-1 dataset names its ``.idx`` indexes).
READABLE_VERSIONS = (1, 2, 3)
#: Suffix of shardfeed's binary offset index (version 2).
INDEX_SUFFIX = ".sfidx"
MANIFEST_NAME = "manifest.json"
LMDB_DATA_NAME = "data.mdb"
#: Reserved LMDB key holding the manifest (no file hashes: the DB's own hash changes with layout).
LMDB_MANIFEST_KEY = b"__shardfeed_manifest__"
DEFAULT_PREFIX = "shard"
#: Extensions packed by default (torchvision's IMG_EXTENSIONS, without the dots).
DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
#: The one list of extensions that make a tar member a sample's image (lower case, no dot): the
#: packing defaults plus the other formats Pillow reads that other WebDataset tools write.
IMAGE_EXTENSIONS = frozenset(DEFAULT_EXTENSIONS) | frozenset(
    {"pbm", "gif", "jpe", "jfif", "jp2", "tga", "ico", "img"})
#: Members of a WebDataset sample that are never its image (``__url__``/``__key__`` and any other
#: ``__name__`` are added by readers, not stored).
SIDE_EXTENSIONS = frozenset({"cls", "json", "txt", "__key__", "__url__", "idx", "meta"})
#: LMDB key prefixes that are shardfeed's bookkeeping (the manifest, the pack state), not samples.
RESERVED_KEY_PREFIXES = (b"__shardfeed_", b"!shardfeed_")
#: Fixed tar member metadata: the same input gives byte-identical shards.
TAR_MTIME = 0
TAR_MODE = 0o644
TAR_BLOCK = 512
#: Keys are the zero-padded global sample index, at least this many digits.
KEY_MIN_DIGITS = 9

class Sample(NamedTuple):
    """One sample as packed and as yielded raw by the readers (``decode=False``).

    Attributes:
        key: the sample key, a zero-padded global index (``"000001234"``).
        data: the encoded image bytes, exactly as stored.
        ext: canonical lower-case extension (``"jpg"``, ``"png"``; see :func:`normalize_ext`).
        label: class index (int).
        meta: JSON object; at least ``"path"`` (source-relative, ``/`` separators) and ``"class"``.
    """

    key: str
    data: bytes
    ext: str
    label: int
    meta: dict[str, Any]


_EXT_ALIASES = {"jpeg": "jpg", "tiff": "tif"}

def created_by() -> str:
    """The ``created_by`` string written into manifests, e.g. ``"shardfeed 0.1.0"``."""
    from ..version import __version__

    return f"shardfeed {__version__}"


def normalize_ext(ext: str) -> str:
    """Lower-case an extension and map aliases (``jpeg``→``jpg``, ``tiff``→``tif``).

    Args:
        ext: an extension with or without its leading dot, any case (``".JPEG"``).

    Returns:
        The canonical extension used in member names and records (``"jpg"``).
    """
    ext = ext.lower().lstrip(".")
    return _EXT_ALIASES.get(ext, ext)



# ---------------------------------------------------------------------------------------------
# version 3: extra fields (sidecar files) and unlabelled datasets

#: ``Manifest.labels`` of a dataset whose samples have class labels (``.cls``; every version-1/2 dataset).
LABELS_CLASS = "class"
#: ``Manifest.labels`` of an unlabelled dataset: no ``.cls`` members, ``classes`` empty, label -1.
LABELS_NONE = "none"
#: The label readers give a sample of an unlabelled dataset (collation and the ``(image, label)``
#: contract stay; ``label < 0`` marks "no label").
UNLABELLED = -1
#: Field names whose member extension is taken by the sample itself (label, metadata): such a
#: field is stored as ``{key}.sidecar.{name}``.
_RESERVED_MEMBERS = frozenset({"cls", "json"})
#: Names a field cannot take (the keys of a :func:`shardfeed.convert.write_dataset` sample dict).
RESERVED_FIELD_NAMES = frozenset({"image", "ext", "label", "key", "meta", "path", "class"})
_FIELD_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$")
#: Longest field name (a tar member name is at most 100 bytes, the key takes up to ~20).
MAX_FIELD_NAME = 40
#: Most extra fields a manifest may list.
MAX_FIELDS = 64


def field_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an extra field (``"txt"``, ``"json"``, ``"mask.png"``), or None.

    A field is named by the file suffix after the image's stem (``x.mask.png`` → ``mask.png``):
    lower-case letters, digits, ``_``, ``-``, dot-separated, at most :data:`MAX_FIELD_NAME`
    characters; not an image extension alone (``png`` beside ``x.jpg`` would be a second image
    member), not ``__*__`` and not a sample dict key (:data:`RESERVED_FIELD_NAMES`).
    """
    if not isinstance(name, str) or not _FIELD_RE.match(name) or len(name) > MAX_FIELD_NAME:
        return (f"field {name!r}: a field is a file suffix of lower-case letters, digits, '_' and '-', "
                f"dot-separated, at most {MAX_FIELD_NAME} characters (e.g. txt, json, mask.png)")
    if name in IMAGE_EXTENSIONS or normalize_ext(name) in IMAGE_EXTENSIONS:
        return (f"field {name!r} is an image extension: it would be a second image member of the sample; "
                f"name the files with a longer suffix (x.mask.{name}) and pass that (mask.{name})")
    if name in RESERVED_FIELD_NAMES:
        return f"field {name!r} is reserved (one of {', '.join(sorted(RESERVED_FIELD_NAMES))})"
    return None


def decode_record(value: bytes, *, verify: bool = True, source: str = "<lmdb>",
                  key: bytes | None = None) -> dict[str, Any]:
    """:func:`shardfeed.readers.format.lmdb_record.decode_record` with this format's field-name policy
    (:func:`field_name_problem`): a record whose extra field is not a field name is damaged."""
    return _decode_record(value, verify=verify, source=source, key=key, field_problem=field_name_problem)


def field_member(name: str) -> str:
    """The member extension that stores field ``name``: ``name`` itself, or ``sidecar.json`` /
    ``sidecar.cls`` for the two extensions the sample uses for its metadata and label."""
    return f"sidecar.{name}" if name in _RESERVED_MEMBERS else name


def member_clash(image_exts: Iterable[str], fields: Iterable[str]) -> str | None:
    """Why a sample with images of ``image_exts`` and the extra ``fields`` would store two things
    under one member name (a tar member, or an LMDB record's field), or None.

    Taken member names: each image extension (canonical, :func:`normalize_ext`), the label
    (``cls``), the metadata (``json``), the other :data:`SIDE_EXTENSIONS`, and each field's
    :func:`field_member` (``json`` -> ``sidecar.json``). An image extension that is a reserved
    member (``--extensions json``), a field stored under an image extension (``--extensions dat
    --sidecars dat``) and two fields stored under one member (``json`` and ``sidecar.json``) clash.
    The message names both and the fix.
    """
    taken: dict[str, str] = {}
    for ext in image_exts:
        canonical = normalize_ext(ext)
        if canonical in SIDE_EXTENSIONS:
            return (f"image extension {ext!r} is the member {canonical!r} every sample already holds "
                    f"({', '.join(sorted(SIDE_EXTENSIONS))}): drop it from the image extensions")
        taken.setdefault(canonical, f"image extension {ext!r}")
    for name in fields:
        member = field_member(name)
        if member in taken:
            return (f"field {name!r} and {taken[member]} would both be stored as member {member!r}; "
                    "rename one (a sidecar suffix names its field)")
        taken[member] = f"field {name!r}"
    return None


def fields_problem(fields: Iterable[str]) -> str | None:
    """Why the extra ``fields`` cannot be one dataset's fields, or None: the first name
    :func:`field_name_problem` refuses, else two fields stored under one member
    (:func:`member_clash`). Writers check it before anything is written."""
    fields = list(fields)
    for name in fields:
        problem = field_name_problem(name)
        if problem is not None:
            return problem
    return member_clash((), fields)


def key_width(num_samples: int) -> int:
    """Digits of the zero-padded keys of a dataset of ``num_samples`` samples (at least 9)."""
    return max(KEY_MIN_DIGITS, len(str(max(num_samples - 1, 0))))


def format_key(index: int, width: int = KEY_MIN_DIGITS) -> str:
    """The key of the sample at global position ``index`` in packing order (``000001234``).

    Keys contain no ``.`` (WebDataset splits key from extension at the first dot) and sort in
    packing order because they are zero-padded to a common width.
    """
    return str(index).zfill(width)


def shard_name(index: int, prefix: str = DEFAULT_PREFIX) -> str:
    """File name of WebDataset shard number ``index``: ``{prefix}-{index:06d}.tar``."""
    return f"{prefix}-{index:06d}.tar"


def index_name(index: int, prefix: str = DEFAULT_PREFIX) -> str:
    """File name of the offset index of shard ``index``: ``{prefix}-{index:06d}.sfidx``.

    Not ``.idx``: that is the name NVIDIA DALI's ``wds2idx`` gives its text index of the same shard.
    """
    return f"{prefix}-{index:06d}{INDEX_SUFFIX}"


_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def stored_path_problem(rel: str) -> str | None:
    """The one name policy for the relative paths a dataset stores (``meta["path"]``, class names).

    ``pack`` checks every file against it (a file that fails is refused, naming it, or skipped
    under ``on_error="skip"``) and every tool that writes those paths back as files (``unpack``)
    honours the same rule, so what ``pack`` accepts ``unpack`` writes, on every system. A path
    fails when it is not valid UTF-8, is empty, absolute or starts with a drive (``C:``), has an
    empty, ``.`` or ``..`` component, or holds a backslash (a folder separator on Windows) or NUL.

    Args:
        rel: the path relative to the dataset's source root, ``/`` separators.

    Returns:
        None when the path is fine, else the reason and the fix, for a message.
    """
    if rel.isascii() and "\\" not in rel and "\0" not in rel:
        ok_chars = True
    else:
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            return ("name not valid UTF-8 (bytes shown as %XX): rename the file or folder to UTF-8, e.g. "
                    "`convmv -r -f latin1 -t utf8 --notest SRC`")
        ok_chars = "\\" not in rel and "\0" not in rel
    if not ok_chars:
        return ("name holds a backslash or NUL (a backslash separates folders on Windows, so shardfeed refuses it "
                "everywhere: a dataset unpacks the same on every system): rename it, e.g. replace \\ with _")
    if not rel or rel.startswith("/") or _DRIVE_RE.match(rel):
        return "path is empty, absolute or starts with a drive letter (C:): rename the folder"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "path has an empty, '.' or '..' component: rename it"
    return None


def merge_extension_counts(counts: "Sequence[dict[str, int] | None]") -> dict[str, int] | None:
    """Sum per-shard ``{ext: num_samples}`` counts (None if any shard's is unknown), sorted by ext."""
    total: dict[str, int] = {}
    for c in counts:
        if c is None:
            return None
        for ext, n in c.items():
            total[ext] = total.get(ext, 0) + int(n)
    return dict(sorted(total.items()))


def split_member_name(name: str) -> tuple[str, str]:
    """Split a tar member name into ``(key, ext)`` the way WebDataset does.

    The key is everything before the first dot of the basename (directories kept), the extension
    everything after it: ``"a/000001.seg.png"`` → ``("a/000001", "seg.png")``.
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:]


def tar_member_bytes(size: int) -> int:
    """Bytes one tar member of ``size`` data bytes takes on disk: a 512-byte header + padded data."""
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


# ---------------------------------------------------------------------------------------------
# manifest

#: The largest count or byte size a manifest may state (2**53: exact as a JSON number everywhere);
#: anything larger is a damaged or hostile manifest, not a dataset.
MAX_MANIFEST_COUNT = 1 << 53
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


def plain_file_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name inside a dataset's folder, or None when it is.

    A manifest names its shards and offset indexes by bare file name: no folder part (``/`` or
    ``\\``), not absolute, no drive (``C:``), no URL (``http://...``, ``s3://...``), not ``.``
    or ``..``, no NUL, not hidden (a leading ``.``: shardfeed's own bookkeeping files), at most
    255 characters. Such a name can only point at a file of the dataset itself.
    """
    if not isinstance(name, str):
        return f"is {type(name).__name__} {name!r}, not a file name (a string)"
    if not name or len(name) > 255:
        return "is empty or longer than 255 characters"
    if "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} holds a folder separator or NUL; a manifest names files inside the dataset's folder only"
    if ":" in name:
        return f"{name!r} holds ':' (a URL or a drive letter); a manifest names files inside the dataset's folder only"
    if name.startswith("."):
        return f"{name!r} is '.', '..' or a hidden file; a manifest names the dataset's own files only"
    return None


_MANIFEST_FIX = "the manifest is damaged or was edited: restore it, or rebuild it with `shardfeed index`"


def _bad(where: str, field: str, problem: str, fix: str | None = None) -> ManifestError:
    return ManifestError(f"{where}: field {field} {problem}; {fix or _MANIFEST_FIX}")


def _count(doc: dict[str, Any], key: str, where: str, field: str, *, required: bool = True) -> None:
    if key not in doc:
        if required:
            raise _bad(where, field, "is missing")
        return
    v = doc[key]
    if type(v) is not int:
        raise _bad(where, field, f"is {type(v).__name__} {v!r}, not an integer")
    if not 0 <= v <= MAX_MANIFEST_COUNT:
        raise _bad(where, field, f"is {v}, outside 0..{MAX_MANIFEST_COUNT}")


def _ext_counts(value: object, where: str, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad(where, field, f"is {type(value).__name__}, not an object of extension -> count")
    for ext, n in value.items():
        if type(n) is not int or not 0 <= n <= MAX_MANIFEST_COUNT:
            raise _bad(where, f"{field}[{ext!r}]", f"is {n!r}, not a count of samples")


def validate_manifest(doc: object, where: str) -> None:
    """Check a parsed ``manifest.json`` before anything reads by it (every reader and tool does).

    A manifest comes from outside (a download, an edited file, a server), so every field is
    checked for type and range, and for consistency with the others:

    * ``format`` and ``created_by`` are strings; ``version`` is checked by :meth:`Manifest.from_json`;
    * ``num_samples``, every shard's ``num_samples`` and ``num_bytes`` are integers in
      ``0..``:data:`MAX_MANIFEST_COUNT` (``"8"`` is refused, not converted), and the shards'
      sample counts add up to ``num_samples``;
    * every shard and offset-index name is a plain file name inside the dataset's folder
      (:func:`plain_file_name_problem`: no ``../``, no absolute path, no ``/``, no URL), and no
      file is listed twice;
    * ``sha256``/``index_sha256`` are 64 lower-case hex digits; ``extensions`` map an extension
      to a non-negative count;
    * ``classes`` is a list of distinct strings and ``class_to_idx`` maps exactly those names to
      distinct non-negative integers, in the order of ``classes`` (``classes`` sorted by index);
    * ``skipped`` is a list of objects, ``options`` and ``files`` are objects.

    Args:
        doc: the parsed JSON document.
        where: the manifest's path or URL, named in the error.

    Raises:
        ManifestError: the first problem found, naming the file, the field and the fix.
    """
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: a manifest is a JSON object, not {type(doc).__name__}; rebuild it with "
                            "`shardfeed index` or repack")
    for key in ("format", "created_by"):
        if key in doc and not isinstance(doc[key], str):
            raise _bad(where, key, f"is {type(doc[key]).__name__} {doc[key]!r}, not a string")
    if "format" not in doc:
        raise _bad(where, "format", "is missing")
    _count(doc, "num_samples", where, "num_samples")
    for key, kind in (("options", dict), ("files", dict), ("skipped", list)):
        if key in doc and not isinstance(doc[key], kind):
            raise _bad(where, key, f"is {type(doc[key]).__name__}, not a JSON {'object' if kind is dict else 'array'}")
    if any(not isinstance(item, dict) for item in doc.get("skipped", [])):
        raise _bad(where, "skipped", "holds an entry that is not an object")
    _ext_counts(doc.get("extensions"), where, "extensions")

    classes = doc.get("classes")
    if not isinstance(classes, list):
        raise _bad(where, "classes", "is missing or not a list of class names")
    for i, c in enumerate(classes):
        if not isinstance(c, str):
            raise _bad(where, f"classes[{i}]", f"is {type(c).__name__} {c!r}, not a class name")
    if len(set(classes)) != len(classes):
        dup = next(c for c in classes if classes.count(c) > 1)
        raise _bad(where, "classes", f"lists {dup!r} twice")
    c2i = doc.get("class_to_idx")
    if not isinstance(c2i, dict):
        raise _bad(where, "class_to_idx", "is missing or not an object of class name -> index")
    for name, idx in c2i.items():
        if type(idx) is not int or not 0 <= idx <= MAX_MANIFEST_COUNT:
            raise _bad(where, f"class_to_idx[{name!r}]", f"is {idx!r}, not a non-negative integer class index")
    if set(c2i) != set(classes):
        extra = sorted(set(c2i) - set(classes))[:3]
        missing = sorted(set(classes) - set(c2i))[:3]
        raise _bad(where, "class_to_idx", f"does not name the same classes as field classes (only in class_to_idx: "
                                          f"{extra}, only in classes: {missing})")
    if len(set(c2i.values())) != len(c2i):
        raise _bad(where, "class_to_idx", "gives two classes the same index")
    if sorted(classes, key=c2i.__getitem__) != classes:
        raise _bad(where, "classes", "is not in class index order (class_to_idx disagrees with it)")

    shards = doc.get("shards")
    if not isinstance(shards, list):
        raise _bad(where, "shards", "is missing or not a list")
    seen: dict[str, str] = {}
    total = 0
    for i, entry in enumerate(shards):
        field = f"shards[{i}]"
        if not isinstance(entry, dict):
            raise _bad(where, field, f"is {type(entry).__name__}, not an object")
        for key in ("name", "index"):
            if key == "index" and entry.get("index") is None:
                continue
            problem = plain_file_name_problem(entry.get(key))
            if problem:
                raise _bad(where, f"{field}.{key}", problem,
                           "list each file by its bare name, beside manifest.json (rebuild the manifest with "
                           "`shardfeed index`)")
            name = entry[key]
            if name in seen:
                raise _bad(where, f"{field}.{key}", f"{name!r} is listed twice (also as {seen[name]})",
                           "each shard and index is listed once: restore the manifest or rebuild it with "
                           "`shardfeed index`")
            seen[name] = f"{field}.{key}"
        _count(entry, "num_samples", where, f"{field}.num_samples")
        _count(entry, "num_bytes", where, f"{field}.num_bytes")
        for key in ("sha256", "index_sha256"):
            v = entry.get(key)
            if v is not None and not (isinstance(v, str) and _HEX64_RE.match(v)):
                raise _bad(where, f"{field}.{key}", f"is {v!r}, not 64 lower-case hex digits")
        _ext_counts(entry.get("extensions"), where, f"{field}.extensions")
        total += entry["num_samples"]
    if total != doc["num_samples"]:
        raise _bad(where, "num_samples", f"is {doc['num_samples']}, but the shards' sample counts add up to {total}")

@dataclasses.dataclass
class ShardEntry:
    """One shard (or ``data.mdb``) of a dataset, as listed in the manifest.

    Attributes:
        name: file name relative to the dataset root (``shard-000000.tar``).
        num_samples: samples it holds.
        num_bytes: its size on disk, bytes.
        sha256: hex digest of the whole file (None for LMDB and inside the DB's own copy).
        index: offset-index file name (WebDataset only).
        index_sha256: hex digest of the offset index.
        extensions: ``{image extension: samples}`` in this shard (version 2; None when unknown).
    """

    name: str
    num_samples: int
    num_bytes: int
    sha256: str | None = None
    index: str | None = None
    index_sha256: str | None = None
    extensions: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "num_samples": self.num_samples, "num_bytes": self.num_bytes}
        for field in ("sha256", "index", "index_sha256", "extensions"):
            if getattr(self, field) is not None:
                d[field] = getattr(self, field)
        return d


@dataclasses.dataclass
class Manifest:
    """The description of a packed dataset (``manifest.json``).

    Attributes:
        format: ``"webdataset"`` or ``"lmdb"``.
        num_samples: total samples N (epoch length).
        classes: class names; index = class index (order as torchvision.datasets.ImageFolder:
            sorted sub-folder names, unless a class map was given).
        class_to_idx: name → index.
        shards: the files, in shard-index order (a large manifest's is a read-only
            :class:`~shardfeed.readers.format.manifest_table.ShardTable` that equals the list).
        skipped: ``[{"path", "reason"}]`` for files not packed because of errors (``--on-error skip``).
        options: the packing options (for ``--resume`` and provenance).
        files: accounting of the input: ``{"found", "packed", "skipped", "ignored"}``.
        extensions: ``{image extension: samples}`` over the dataset (``{"jpg": 900, "png": 100}``):
            which image members a consumer must expect (version 2; None when unknown, as in
            version-1 manifests).
        version: :data:`FORMAT_VERSION` when written; a version of :data:`READABLE_VERSIONS`
            when read.
        created_by: ``"shardfeed X.Y.Z"``.
        labels: :data:`LABELS_CLASS` (``.cls`` members, versions 1-3) or :data:`LABELS_NONE`
            (version 3: unlabelled, ``classes`` empty, readers give label :data:`UNLABELLED`).
        fields: the samples' extra fields (version 3; empty: none), ``{name: {"member": member
            extension (:func:`field_member`), "count": samples that have it, "missing": samples
            without it}}``, e.g. ``{"txt": {"member": "txt", "count": 998, "missing": 2}}``.
    """

    format: str
    num_samples: int
    classes: list[str]
    class_to_idx: dict[str, int]
    shards: list[ShardEntry]
    skipped: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = FORMAT_VERSION
    created_by: str = dataclasses.field(default_factory=created_by)
    extensions: dict[str, int] | None = None
    labels: str = LABELS_CLASS
    fields: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def written_version(self) -> int:
        """The version :meth:`to_json` records: 3 for a dataset with extra fields or without
        labels, else at most 2 (a class-folder dataset keeps its version-2 bytes)."""
        if self.fields or self.labels != LABELS_CLASS:
            return max(self.version, 3)
        return min(self.version, 2)

    @property
    def labelled(self) -> bool:
        """Whether samples carry class labels (False: :data:`LABELS_NONE`)."""
        return self.labels != LABELS_NONE

    def __post_init__(self) -> None:
        if self.extensions is None:  # from the shards, when every shard records its own
            self.extensions = merge_extension_counts([s.extensions for s in self.shards]) if self.shards else None

    @property
    def image_extensions(self) -> list[str] | None:
        """The image extensions present, sorted (None when the manifest does not record them)."""
        return None if self.extensions is None else sorted(self.extensions)

    def to_json(self, *, hashes: bool = True) -> dict[str, Any]:
        """The manifest as a JSON-able dict (``hashes=False`` drops the file hashes)."""
        shards = [s.to_json() for s in self.shards]
        if not hashes:
            for s in shards:
                s.pop("sha256", None)
                s.pop("index_sha256", None)
        d = {
            "format": self.format, "version": self.written_version(), "created_by": self.created_by,
            "num_samples": self.num_samples, "classes": list(self.classes),
            "class_to_idx": dict(self.class_to_idx), "shards": shards,
            "skipped": list(self.skipped), "options": dict(self.options), "files": dict(self.files),
        }
        if self.extensions is not None:
            d["extensions"] = dict(self.extensions)
        if self.labels != LABELS_CLASS:
            d["labels"] = self.labels
        if self.fields:
            d["fields"] = {k: dict(v) for k, v in self.fields.items()}
        return d

    def dumps(self, *, hashes: bool = True) -> bytes:
        """Serialise to UTF-8 JSON bytes (indented, stable key order)."""
        return (json.dumps(self.to_json(hashes=hashes), indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: dict[str, Any] | bytes | str, source: str = "<manifest>") -> "Manifest":
        """Parse and validate a manifest (:func:`validate_manifest`).

        Raises:
            ManifestError: not JSON, another format version, or a field of the wrong type or
                range, inconsistent with the others (see :func:`validate_manifest`).
        """
        if isinstance(data, (bytes, str)):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ManifestError(f"{source}: not valid JSON ({exc}); rebuild the dataset with "
                                    "`shardfeed pack` or `shardfeed index`") from None
            except RecursionError:
                raise ManifestError(f"{source}: JSON nested too deeply to be a manifest; rebuild the dataset "
                                    "with `shardfeed pack` or `shardfeed index`") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{source}: a manifest is a JSON object")
        version = data.get("version")
        if version not in READABLE_VERSIONS or type(version) is not int:
            fix = ("upgrade shardfeed to read it" if isinstance(version, int) and version > FORMAT_VERSION
                   else "repack it with this shardfeed version")
            raise ManifestError(f"{source}: manifest version {version!r} is not supported (this "
                                f"shardfeed reads versions {', '.join(map(str, READABLE_VERSIONS))}); {fix}")
        validate_manifest(data, source)
        try:
            shards = [ShardEntry(**{k: s.get(k) for k in ("name", "num_samples", "num_bytes", "sha256",
                                                           "index", "index_sha256", "extensions")})
                      for s in data["shards"]]
            exts = data.get("extensions")
            m = cls(format=data["format"], num_samples=int(data["num_samples"]),
                    classes=list(data["classes"]),
                    class_to_idx={k: int(v) for k, v in data["class_to_idx"].items()},
                    shards=shards, skipped=list(data.get("skipped", [])),
                    options=dict(data.get("options", {})), files=dict(data.get("files", {})),
                    version=version, created_by=data.get("created_by", "?"),
                    extensions=None if exts is None else {str(k): int(v) for k, v in dict(exts).items()},
                    labels=str(data.get("labels", LABELS_CLASS)) if version >= 3 else LABELS_CLASS,
                    fields=_parse_fields(data.get("fields"), source) if version >= 3 else {})
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{source}: malformed manifest ({exc!r} missing or wrong type)") from None
        if m.labels not in (LABELS_CLASS, LABELS_NONE):
            raise ManifestError(f"{source}: labels {m.labels!r} is not {LABELS_CLASS!r} or {LABELS_NONE!r}")
        over = next((f for f, d in m.fields.items() if max(d["count"], d["missing"]) > m.num_samples), None)
        if over is not None:
            raise ManifestError(f"{source}: field {over!r}: count {m.fields[over]['count']} / missing "
                                f"{m.fields[over]['missing']} exceed num_samples={m.num_samples}")
        if sum(s.num_samples for s in m.shards) != m.num_samples:
            raise ManifestError(f"{source}: shard sample counts add up to "
                                f"{sum(s.num_samples for s in m.shards)}, not num_samples={m.num_samples}")
        return m

    def write(self, root: str | os.PathLike[str]) -> Path:
        """Write ``root/manifest.json`` atomically (last step of a pack). Returns its path."""
        path = Path(root) / MANIFEST_NAME
        write_bytes_atomic(path, self.dumps())
        return path


def _parse_fields(raw: Any, source: str) -> dict[str, dict[str, Any]]:
    """The ``fields`` of a version-3 manifest, checked (names, member names, counts)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: 'fields' must be an object of field name -> description")
    if len(raw) > MAX_FIELDS:
        raise ManifestError(f"{source}: {len(raw)} extra fields, more than the {MAX_FIELDS} a dataset may have")
    out: dict[str, dict[str, Any]] = {}
    for name, desc in raw.items():
        problem = field_name_problem(name)
        if problem is not None:
            raise ManifestError(f"{source}: {problem}")
        if not isinstance(desc, dict) or desc.get("member", field_member(name)) != field_member(name):
            raise ManifestError(f"{source}: field {name!r}: its member must be {field_member(name)!r}")
        clash = member_clash((), [*out, name])
        if clash is not None:  # two fields in one member: a reader would give one's bytes for both
            raise ManifestError(f"{source}: {clash}")
        counts = {k: desc.get(k, 0) for k in ("count", "missing")}
        if any(type(v) is not int or v < 0 for v in counts.values()):  # not "5", 1.7, true or -3
            raise ManifestError(f"{source}: field {name!r}: count and missing must be integers >= 0, got "
                                f"{counts['count']!r} and {counts['missing']!r}")
        out[name] = {"member": field_member(name), **counts}
    return out


#: The state folder an unfinished pack keeps in its output (``OUT/.shardfeed-pack/``, in a bucket
#: the keys under ``PREFIX/.shardfeed-pack/``).
PACK_STATE_DIR = ".shardfeed-pack"
#: A WebDataset pack's path index (``--append`` reads it; readers never open it).
PATH_INDEX_NAME = ".shardfeed-paths"
#: In :data:`PACK_STATE_DIR`: the plan of a pack or a ``convert``, and the mark of a ``write_dataset``.
PACK_PLAN_NAME, WRITE_DATASET_MARK = "plan.json", "write_dataset.json"


#: A manifest larger than this is refused (a manifest of 10 million samples' shards is a few MiB).
MAX_MANIFEST_BYTES = MAX_CONTROL_FILE_BYTES


