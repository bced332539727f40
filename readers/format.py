"""The on-disk format: manifest schema, key and member naming, offset index, LMDB record codec.

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
    the codec lives in :mod:`shardfeed.readers.lmdb_record` and is re-exported here); a record
    with extra fields is record version 2.
    The manifest is also stored under :data:`LMDB_MANIFEST_KEY` (without file hashes).

manifest.json
    Written last and atomically; a finished manifest means a finished dataset. See
    :class:`Manifest`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

from .errors import CorruptDataError, IncompleteDatasetError, ManifestError, UnsupportedURLError
from .lmdb_record import LMDB_RECORD_VERSION, encode_record
from .lmdb_record import decode_record as _decode_record
from .registry import describe

__all__ = [
    "FORMAT_VERSION",
    "MAX_MANIFEST_BYTES",
    "read_small_file",
    "READABLE_VERSIONS",
    "INDEX_SUFFIX",
    "is_dali_index",
    "PACK_STATE_DIR",
    "unfinished_pack_error",
    "describe_unfinished",
    "stored_path_problem",
    "merge_extension_counts",
    "MANIFEST_NAME",
    "LMDB_DATA_NAME",
    "LMDB_MANIFEST_KEY",
    "LMDB_RECORD_VERSION",
    "DEFAULT_PREFIX",
    "DEFAULT_EXTENSIONS",
    "IMAGE_EXTENSIONS",
    "SIDE_EXTENSIONS",
    "RESERVED_KEY_PREFIXES",
    "sample_from_members",
    "label_problem",
    "TAR_MTIME",
    "TAR_MODE",
    "TAR_BLOCK",
    "KEY_MIN_DIGITS",
    "Manifest",
    "ShardEntry",
    "Sample",
    "normalize_ext",
    "format_key",
    "key_width",
    "shard_name",
    "index_name",
    "split_member_name",
    "class_bytes",
    "meta_bytes",
    "tar_member_bytes",
    "encode_index",
    "decode_index",
    "read_index",
    "encode_record",
    "decode_record",
    "parse_size",
    "write_bytes_atomic",
    "load_manifest",
    "validate_manifest",
    "plain_file_name_problem",
    "MAX_MANIFEST_COUNT",
    "find_manifest_path",
    "check_files_present",
    "created_by",
    "LABELS_CLASS",
    "LABELS_NONE",
    "UNLABELLED",
    "field_member",
    "member_clash",
    "field_name_problem",
    "decode_field",
    "encode_field",
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
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def created_by() -> str:
    """The ``created_by`` string written into manifests, e.g. ``"shardfeed 0.1.0"``."""
    from .version import __version__

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


def label_problem(label: int, labels: "frozenset[int]") -> str:
    """The message for a class index that is not one of the dataset's (``labels``: its class indexes)."""
    span = f"0..{max(labels)}" if labels else "none"
    return (f"class index {label} is not one of the manifest's {len(labels)} classes ({span}); the shard is "
            "damaged or does not belong to this manifest (run `shardfeed check`)")


def sample_from_members(key: str, parts: dict[str, Any], class_to_idx: dict[str, int] | None,
                        source: str, labels: "frozenset[int] | None" = None, *,
                        labelled: bool = True) -> tuple[bytes, str, int, bytes | None]:
    """Group one WebDataset sample's members into ``(data, ext, label, meta_json_bytes)``.

    The one rule, used by the training readers and by every tool (``check``, ``convert``,
    ``unpack``, ``index``, ``inspect``), so they never disagree about a shard:

    * the image is the one member whose extension is in :data:`IMAGE_EXTENSIONS` (any case);
      with none, the one member that is not a side member (:data:`SIDE_EXTENSIONS`, ``__*__``),
      so a dataset packed with ``--extensions heic`` reads back; zero or several candidates is an
      error, never a silent pick; extra-field members (``{key}.txt``, ``{key}.mask.png``,
      ``{key}.sidecar.json``: their extension has a dot or is a side extension) are never it;
    * the label is ``{key}.cls`` (ASCII decimal integer, surrounding white space allowed), else the
      ``"class"`` of ``{key}.json`` looked up in ``class_to_idx``; in an unlabelled dataset
      (``labelled=False``, manifest ``labels: "none"``) a sample without ``.cls`` has label
      :data:`UNLABELLED` (-1);
    * the metadata is the ``{key}.json`` member's bytes (None without one), not parsed here.

    Args:
        key: the sample key.
        parts: member extension -> bytes (``{"jpg": b"...", "cls": b"3", "json": b"{...}"}``).
        class_to_idx: class name -> index, for samples without ``.cls`` (None: none known).
        source: the shard's path or URL, named in errors.
        labels: the dataset's class indexes (``frozenset(manifest.class_to_idx.values())``); a
            label outside them is an error. None: not checked.

    Returns:
        ``(data, ext, label, meta)``: image bytes, canonical extension (:func:`normalize_ext`),
        class index, JSON metadata bytes or None.

    Raises:
        CorruptDataError: no image member or several, an unreadable ``.cls``, no label, or a
            label not in ``labels`` (the message names ``source`` and ``key``).
    """
    image = None
    images: list[str] = []
    others: list[str] = []
    for e in parts:
        if e in IMAGE_EXTENSIONS or (e not in SIDE_EXTENSIONS and e.lower() in IMAGE_EXTENSIONS):
            images.append(e)
        elif e not in SIDE_EXTENSIONS and not e.startswith("__"):
            others.append(e)
    # an extra field's member has a dot (``mask.png``): the image only when nothing else can be
    candidates = images or [e for e in others if "." not in e] or others
    if len(candidates) != 1:
        members = ", ".join(sorted(e for e in parts if not e.startswith("__"))) or "none"
        what = ("no image member" if not candidates else
                f"{len(candidates)} {'image ' if images else ''}members that could be its image "
                f"({', '.join(candidates)}), not one")
        raise CorruptDataError(f"{source} key {key}: sample has {what} (members: {members})")
    image = candidates[0]
    meta = parts.get("json")
    cls = parts.get("cls")
    if cls is not None:
        try:
            label = int(cls)
        except ValueError:
            raise CorruptDataError(f"{source} key {key}: {key}.cls holds {cls[:20]!r}, not a class "
                                   "index") from None
    elif not labelled:
        label = UNLABELLED
    else:
        try:
            if meta is None or class_to_idx is None:
                raise KeyError("class")
            label = class_to_idx[json.loads(meta)["class"]]
        except Exception:
            raise CorruptDataError(f"{source} key {key}: no {key}.cls member and no known class in "
                                   f"{key}.json") from None
    if labels is not None and label not in labels and (labelled or label != UNLABELLED):
        raise CorruptDataError(f"{source} key {key}: {label_problem(label, labels)}")
    ext = image if image in _CANONICAL_EXTS else normalize_ext(image)
    return parts[image], ext, label, meta


_CANONICAL_EXTS = frozenset(e for e in IMAGE_EXTENSIONS if e not in _EXT_ALIASES)


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
    """:func:`shardfeed.readers.lmdb_record.decode_record` with this format's field-name policy
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


def encode_field(name: str, value: Any) -> bytes:
    """A field's value as stored: bytes unchanged, ``str`` as UTF-8, anything else as JSON
    (:func:`meta_bytes`' encoding). Raises TypeError for a value JSON cannot hold (NaN and
    infinities included: strict JSON)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        # strict JSON: NaN and Infinity are not JSON, and JSON readers other than Python's refuse them
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"field {name!r}: {type(value).__name__} is neither bytes, str nor JSON ({exc})") from None


def decode_field(name: str, data: bytes, source: str = "<sample>") -> Any:
    """A stored field as readers yield it: ``str`` for a ``.txt`` suffix (UTF-8), the parsed
    value for ``.json``, ``bytes`` otherwise (``mask.png``: the file's bytes).

    Raises:
        CorruptDataError: a ``.txt`` field that is not UTF-8 or a ``.json`` one that does not
            parse, nested arrays and objects too deep included (names ``source``).
    """
    last = name.rsplit(".", 1)[-1]
    try:
        if last == "txt":
            return bytes(data).decode("utf-8")
        if last == "json":
            return json.loads(bytes(data))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than Python parses
        what = exc if isinstance(exc, ValueError) else "nested too deeply to parse"
        raise CorruptDataError(f"{source}: field {name!r} is not valid {last.upper()} ({what})") from None
    return bytes(data)


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


def is_dali_index(head: bytes) -> bool:
    """Whether a file starting with ``head`` is an NVIDIA DALI WebDataset index (text: a version
    line ``v1.0``/``v1.1``/``v1.2 N``, then one line per sample), not shardfeed's binary index."""
    # shardfeed's index starts with the first sample's offset, 0: eight zero bytes
    return re.match(rb"v\d+\.\d+ \d+\s", head) is not None


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


def class_bytes(label: int) -> bytes:
    """Content of the ``{key}.cls`` member: the class index as ASCII decimal, no newline."""
    return str(int(label)).encode("ascii")


def meta_bytes(meta: dict[str, Any]) -> bytes:
    """Content of the ``{key}.json`` member: compact UTF-8 JSON with sorted keys."""
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def tar_member_bytes(size: int) -> int:
    """Bytes one tar member of ``size`` data bytes takes on disk: a 512-byte header + padded data."""
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


def encode_index(offsets: Sequence[int]) -> bytes:
    """Encode sample offsets (bytes from the start of the shard) as little-endian uint64."""
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def decode_index(data: bytes, source: str = "<index>") -> list[int]:
    """Decode an offset index written by :func:`encode_index`.

    Raises:
        CorruptDataError: the length is not a multiple of 8 bytes, or the offsets are not strictly
            increasing multiples of the tar block (512 bytes): a damaged index, which would
            otherwise send a reader to the wrong bytes.
    """
    if is_dali_index(data[:64]):
        raise CorruptDataError(f"{source}: holds an NVIDIA DALI index (text, as DALI's wds2idx writes it), not "
                               "shardfeed's binary offset index: a version-1 dataset names its index .idx, DALI's "
                               "name; upgrade the dataset with `shardfeed index DIR --overwrite` (it writes .sfidx "
                               "beside DALI's .idx, manifest version 2), or repack")
    if len(data) % 8:
        raise CorruptDataError(f"{source}: offset index of {len(data)} bytes is not a multiple of 8")
    offsets = list(struct.unpack(f"<{len(data) // 8}Q", data))
    previous = -1
    for i, offset in enumerate(offsets):
        if offset <= previous or offset % TAR_BLOCK:
            raise CorruptDataError(f"{source}: damaged offset index (entry {i}: {offset} is not a tar block boundary "
                                   f"after {previous}); rebuild it with `shardfeed index`, then `shardfeed check`")
        previous = offset
    return offsets


def read_index(path: str | os.PathLike[str]) -> list[int]:
    """Read a local ``.sfidx`` file (``.idx`` in version-1 datasets): the byte offset of every sample's first header."""
    with open(path, "rb") as f:
        return decode_index(f.read(), str(path))


# ---------------------------------------------------------------------------------------------
# sizes and atomic files

def parse_size(text: str | int) -> int:
    """Parse a size: ``"512MB"`` (powers of 1000), ``"1GiB"`` (powers of 1024), or a plain int.

    Returns:
        The size in bytes.

    Raises:
        ValueError: unparseable or not positive.
    """
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ValueError(f"cannot parse size {text!r}: use e.g. 256MB, 1GiB, 500KB or a byte count")
        unit = m.group(2).lower() if m.group(2) else None
        value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def write_temp_beside(path: str | os.PathLike[str], data: bytes) -> str:
    """Write ``data`` to a new temporary file beside ``path`` (``.NAME.XXXXXXXX.tmp``, fsynced,
    the usual mode) and return its path; the caller renames it over ``path`` or removes it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file its usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink_missing_ok(tmp)
        raise
    return tmp


def _unlink_missing_ok(path: str | os.PathLike[str]) -> None:
    """Remove ``path``; one already gone is fine (the clean-up of a failed write)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsync, rename."""
    tmp = write_temp_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_missing_ok(tmp)
        raise


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
        shards: the files, in shard-index order.
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


def describe_unfinished(root: str | os.PathLike[str]) -> tuple[str, str]:
    """What an unfinished pack left in local folder ``root`` and what finishes it, as
    ``(found, fix)`` phrases: a stopped ``convert``, a stopped pack (its plan), a stopped
    ``write_dataset`` (its mark) or a state folder without a plan. The one description of every
    command that meets such a folder (readers and ``index`` alike)."""
    root = Path(root)
    state = root / PACK_STATE_DIR
    try:
        plan = json.loads(read_small_file(state / PACK_PLAN_NAME, max_bytes=1 << 20, what="the pack plan"))
    except (OSError, ValueError, RecursionError):
        plan = None
    plan = plan if isinstance(plan, dict) else {}
    if plan.get("command") == "convert":
        return (f"an unfinished `shardfeed convert` ({state}/{PACK_PLAN_NAME})",
                f"run the same `shardfeed convert SRC {root} --overwrite` again (a convert is not resumed)")
    if plan:
        done = sum(1 for n in _names_in(state) if re.fullmatch(r"[0-9]{6,}\.json", n))
        return (f"an unfinished pack ({state}/{PACK_PLAN_NAME}, {done} finished shard record(s))",
                f"finish it with `shardfeed pack SRC {root} --resume` (the same source and options), or rebuild it "
                "with --overwrite")
    if (state / WRITE_DATASET_MARK).is_file():
        return (f"a write_dataset that stopped ({state}/{WRITE_DATASET_MARK})",
                "call write_dataset again into an empty folder (its shards are not all there)")
    return (f"a pack's state folder {state}/ without a plan (stopped as it started)",
            f"run the pack again (`shardfeed pack SRC {root} --resume` starts it afresh)")


def _names_in(folder: Path, limit: int = 1_000_000) -> list[str]:
    """The names in ``folder`` (at most ``limit``; none when it cannot be listed)."""
    try:
        with os.scandir(folder) as it:
            return [e.name for _, e in zip(range(limit), it)]
    except OSError:
        return []


def unfinished_pack_error(root: str) -> IncompleteDatasetError:
    """The error for a dataset location whose pack did not finish (its state, no manifest): for a
    local folder, what was found there and what finishes it (:func:`describe_unfinished`); for a
    bucket prefix, the pack's fix (``--resume``)."""
    if "://" not in str(root) and os.path.isdir(Path(root) / PACK_STATE_DIR):
        found, fix = describe_unfinished(root)
        return IncompleteDatasetError(f"{root}: no {MANIFEST_NAME}; the command that wrote it did not finish: it "
                                      f"holds {found}: {fix}")
    return IncompleteDatasetError(f"{root}: no {MANIFEST_NAME}; the pack that wrote it did not finish. Finish it "
                                  f"with `shardfeed pack SRC {root} --resume`, or rebuild it")


def find_manifest_path(path: str | os.PathLike[str]) -> Path:
    """Resolve a dataset directory or a manifest file path to the manifest file path."""
    p = Path(path)
    return p / MANIFEST_NAME if p.is_dir() else p


#: A manifest larger than this is refused (a manifest of 10 million samples' shards is a few MiB).
MAX_MANIFEST_BYTES = 256 << 20


def read_small_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES,
                    what: str = "the file", error: type[Exception] = ManifestError) -> bytes:
    """The content of a local control file (a manifest, a pack plan, a shard record), bounded.

    The file is opened non-blocking (a FIFO does not wait for a writer) and must be a regular
    file (a link to ``/dev/zero``, a FIFO or a device is refused before anything is read); at most
    ``max_bytes + 1`` bytes are read.

    Args:
        path: the file (a link is followed).
        max_bytes: the largest size accepted, in bytes.
        what: how a message names the file (``"the manifest"``).
        error: the exception class raised for a file that is not regular or too large.

    Raises:
        FileNotFoundError, OSError: the file cannot be opened or read.
        error: not a regular file, or larger than ``max_bytes`` (the message names the file).
    """
    import stat

    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise error(f"{path}: {what} is not a regular file (a folder, a FIFO, a device or a link to one); refused")
    with os.fdopen(fd, "rb") as f:
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = f.read(min(max_bytes + 1 - got, 16 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    if got > max_bytes:
        raise error(f"{path}: {what} is more than {max_bytes:,} bytes; refused (is this the right file?)")
    return b"".join(chunks)


def load_manifest(path: str | os.PathLike[str], *, check_files: bool = True) -> Manifest:
    """Load and validate a local manifest (a dataset directory or its ``manifest.json``).

    Args:
        path: the dataset directory or the manifest file: a local path or a ``file://`` URL
            (any storage, URLs included: :func:`shardfeed.readers.load_manifest`, which is
            :func:`~shardfeed.readers.opener.load_manifest`).
        check_files: also check that every listed file exists with the listed size (cheap; hashes
            are for ``shardfeed check``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IncompleteDatasetError: the directory holds shards but no manifest (interrupted pack).
        ManifestError: bad manifest, a local manifest that is not a regular file or is larger than
            :data:`MAX_MANIFEST_BYTES`, or files missing / of the wrong size.
        UnsupportedURLError: a URL other than ``file://``.
    """
    if isinstance(path, str) and "://" in path:
        if not path.lower().startswith("file://"):
            raise UnsupportedURLError(f"{path}: this function reads a local manifest; for a URL use "
                                      "shardfeed.readers.load_manifest (or open_location(url).load_manifest())")
        path = path[len("file://"):]
    p = Path(path)
    if not p.exists() and p.name == MANIFEST_NAME and p.parent.is_dir():
        p = p.parent  # "DIR/manifest.json" that is not there: say what DIR is
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    mpath = find_manifest_path(p)
    if not mpath.exists():
        root = mpath.parent
        state_left = any(p.name != PATH_INDEX_NAME for p in root.glob(".shardfeed-*"))  # a pack's, not its path index
        if any(root.glob("*.tar")) and not (root / LMDB_DATA_NAME).exists() and not state_left:
            # no pack state: not an interrupted shardfeed pack (--resume would refuse it)
            raise ManifestError(
                f"{root}: .tar shards but no {MANIFEST_NAME} (and no unfinished shardfeed pack): shards written by "
                f"another tool, or a dataset whose manifest was lost. Make them readable with "
                f"`shardfeed index {root}` (writes the manifest and offset indexes beside them)")
        if (root / LMDB_DATA_NAME).exists() or state_left:
            raise unfinished_pack_error(str(root))
        if any(d.is_dir() and not d.name.startswith(".") for d in root.iterdir()):
            raise ManifestError(f"{root}: an image folder (or other folder), not a packed dataset: pack it first "
                                f"with `shardfeed pack {root} OUT`")
        raise ManifestError(f"{root}: no {MANIFEST_NAME}: not a packed dataset (pack it with `shardfeed pack`, "
                            "or write a manifest for existing shards with `shardfeed index`)")
    manifest = Manifest.from_json(read_small_file(mpath, max_bytes=MAX_MANIFEST_BYTES, what="the manifest"), str(mpath))
    if check_files:
        check_files_present(manifest, mpath.parent)
    return manifest


def check_files_present(manifest: Manifest, root: str | os.PathLike[str]) -> None:
    """Check that each shard (and offset index) exists; shards must have the listed size.

    Raises:
        ManifestError: a file is missing or has another size; the message says how to fix it.
    """
    root = Path(root)
    for s in manifest.shards:
        f = root / s.name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{f}: listed in {MANIFEST_NAME} but missing; restore it, or run "
                                f"`shardfeed check {root}` and repack (to read the other shards meanwhile, open "
                                f"it with check_files=False and on_error=\"skip\")") from None
        if size != s.num_bytes and describe(manifest.format).exact_sizes:
            raise ManifestError(f"{f}: {size} bytes on disk but {s.num_bytes} in {MANIFEST_NAME}; the file was "
                                f"changed or truncated: run `shardfeed check {root}` and repack")
        if s.index and not (root / s.index).exists():
            raise ManifestError(f"{root / s.index}: offset index missing; rebuild it with "
                                f"`shardfeed index {root}`")

