"""The bytes of a sample's members: how a sample's tar members group into image, label and
metadata, and how the label, the metadata and extra fields are stored and read back.

The format specification: docs/format.md. Writers and readers both use these, so a packed sample
reads back as it was written.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CorruptDataError
from .manifest import IMAGE_EXTENSIONS, SIDE_EXTENSIONS, UNLABELLED, normalize_ext

__all__ = ["label_problem", "sample_from_members", "class_bytes", "meta_bytes", "encode_field", "decode_field"]


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



_CANONICAL_EXTS = frozenset(e for e in IMAGE_EXTENSIONS if normalize_ext(e) == e)


def class_bytes(label: int) -> bytes:
    """Content of the ``{key}.cls`` member: the class index as ASCII decimal, no newline."""
    return str(int(label)).encode("ascii")


def meta_bytes(meta: dict[str, Any]) -> bytes:
    """Content of the ``{key}.json`` member: compact UTF-8 JSON with sorted keys."""
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")



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
