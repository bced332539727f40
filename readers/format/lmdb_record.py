"""The LMDB record codec: one sample as a versioned, pickle-free msgpack map with a CRC-32.

Part of the on-disk format (:mod:`shardfeed.readers.format.manifest` re-exports :func:`encode_record`,
:func:`decode_record` and :data:`LMDB_RECORD_VERSION`, the names other code uses). Binding layout:
see :func:`encode_record`. ``msgpack`` is imported on first use.
"""

from __future__ import annotations

import zlib
from typing import Callable

from ..errors import CorruptDataError

__all__ = ["LMDB_RECORD_VERSION", "LMDB_RECORD_VERSION_FIELDS", "decode_record", "encode_record"]

#: Version of the LMDB record layout (the ``"v"`` field of every record without extra fields).
LMDB_RECORD_VERSION = 1
#: Version of a record that carries extra fields (sidecar files): version 1 plus ``"fields"``
#: and ``"fields_crc32"``. Readers take both versions.
LMDB_RECORD_VERSION_FIELDS = 2
_READABLE = (LMDB_RECORD_VERSION, LMDB_RECORD_VERSION_FIELDS)


def encode_record(key: str, data: bytes, ext: str, label: int, meta: dict,
                  fields: dict[str, bytes] | None = None) -> bytes:
    """Encode one sample as an LMDB value (pickle-free, versioned).

    Layout (msgpack map, ``use_bin_type=True``), readable with ``msgpack`` alone::

        {"v": 1,                 # LMDB_RECORD_VERSION
         "key": str,             # the sample key (also the LMDB key)
         "ext": str,             # canonical extension: jpg, png, ...
         "label": int,           # class index
         "meta": {...},          # {"path": ..., "class": ..., ...}
         "crc32": int,           # zlib.crc32 of "data" (unsigned 32-bit)
         "data": bytes}          # the original encoded image bytes

    With ``fields`` (extra fields, e.g. ``{"txt": b"a caption"}``) the record is version 2
    (:data:`LMDB_RECORD_VERSION_FIELDS`): ``"v": 2`` and, before ``"data"``, ``"fields": {name:
    bytes}`` and ``"fields_crc32": {name: zlib.crc32 of its bytes}``. Without them the bytes are
    exactly version 1's. ``label`` is -1 in an unlabelled dataset.

    Returns:
        The encoded value (bytes).
    """
    import msgpack

    if fields:
        head = msgpack.packb({"v": LMDB_RECORD_VERSION_FIELDS, "key": key, "ext": ext, "label": int(label),
                              "meta": meta, "crc32": zlib.crc32(data),
                              "fields": {k: bytes(v) for k, v in fields.items()},
                              "fields_crc32": {k: zlib.crc32(v) for k, v in fields.items()},
                              "data": bytes(data)}, use_bin_type=True)
        return head

    # the same bytes as packb of the whole map, with the image copied once (packb copies it into
    # its buffer, then into the result): the six small fields as a map of 6, its header made 7,
    # then "data" and the image as msgpack bin 8/16/32
    head = msgpack.packb({"v": LMDB_RECORD_VERSION, "key": key, "ext": ext, "label": int(label), "meta": meta,
                          "crc32": zlib.crc32(data)}, use_bin_type=True)
    n = len(data)
    if n < 1 << 8:
        bin_header = b"\xc4" + n.to_bytes(1, "big")
    elif n < 1 << 16:
        bin_header = b"\xc5" + n.to_bytes(2, "big")
    elif n < 1 << 32:
        bin_header = b"\xc6" + n.to_bytes(4, "big")
    else:
        raise ValueError(f"sample {key}: {n} bytes of image do not fit one LMDB record (msgpack bin: < 4 GiB)")
    return b"".join((b"\x87", memoryview(head)[1:], b"\xa4data", bin_header, data))


def decode_record(value: bytes, *, verify: bool = True, source: str = "<lmdb>", key: bytes | None = None,
                  field_problem: Callable[[str], str | None] | None = None) -> dict:
    """Decode an LMDB value written by :func:`encode_record`.

    Args:
        value: the raw value bytes.
        verify: check the CRC-32 of the image bytes.
        source: named in error messages (the database, e.g. ``"data/train.lmdb/data.mdb"``, or
            ``"... key 000000042"``).
        key: the record's LMDB key, appended to ``source`` in error messages when given (the
            message string is built only when there is an error). Error messages also name the
            sample's original file (``meta["path"]``) when that part of the record can be read.
        field_problem: the field-name policy (``name -> reason or None``) extra fields are held
            to; :func:`shardfeed.readers.format.manifest.decode_record` passes
            :func:`~shardfeed.readers.format.manifest.field_name_problem` (the format module imports this
            one, so the policy is passed in, not imported). None: names are not checked.

    Returns:
        ``{"key", "ext", "label", "meta", "crc32", "data", "v"}``.

    Raises:
        CorruptDataError: undecodable value, unknown version, a field missing or of the wrong type,
            an extra field whose name is not a field name (``..``, ``/``: see
            :func:`~shardfeed.readers.format.manifest.field_name_problem`), or checksum mismatch.
    """
    global _unpackb
    if _unpackb is None:
        import msgpack

        _unpackb = msgpack.unpackb
    try:
        rec = _unpackb(value, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptDataError(f"{_record_where(source, key, value)}: undecodable record ({exc})") from None
    if type(rec) is not dict or rec.get("v") not in _READABLE:
        raise CorruptDataError(
            f"{_record_where(source, key, value)}: record version {rec.get('v') if isinstance(rec, dict) else '?'} is "
            f"not {LMDB_RECORD_VERSION} or {LMDB_RECORD_VERSION_FIELDS}; rebuild the database with this shardfeed "
            "version")
    if rec["v"] == LMDB_RECORD_VERSION_FIELDS:
        fields, crcs = rec.get("fields"), rec.get("fields_crc32")
        if (type(fields) is not dict or type(crcs) is not dict or set(fields) != set(crcs)
                or any(type(v) is not bytes for v in fields.values())):
            raise CorruptDataError(f"{_record_where(source, key, value)}: damaged record (bad extra fields)")
        bad_name = None if field_problem is None else next((k for k in fields if field_problem(k) is not None), None)
        if bad_name is not None:  # a name becomes a file name (unpack writes x.{name}): the field policy holds
            raise CorruptDataError(f"{_record_where(source, key, value)}: damaged record (extra field name "
                                   f"{bad_name[:60]!r} is not a field name)")
        if verify:
            bad_f = [k for k, v in fields.items() if zlib.crc32(v) != crcs[k]]
            if bad_f:
                raise CorruptDataError(f"{_record_where(source, key, value)}: field(s) {', '.join(bad_f)} fail "
                                       "their CRC-32 check (record is damaged)")
    try:  # valid msgpack, damaged fields: named here, with the record's original file
        bad = [f for f, t in _RECORD_FIELDS if type(rec[f]) is not t]
        ok = zlib.crc32(rec["data"]) == rec["crc32"] if verify else True
    except (KeyError, TypeError) as exc:
        what = f"no field {exc}" if isinstance(exc, KeyError) else f"a bad field: {exc}"
        raise CorruptDataError(f"{_record_where(source, key, value)}: damaged record ({what})") from None
    if bad:
        raise CorruptDataError(f"{_record_where(source, key, value)}: damaged record (a bad field: "
                               f"{', '.join(bad)} of the wrong type)")
    if verify:
        if not ok:
            raise CorruptDataError(f"{_record_where(source, key, value)}: image bytes fail their CRC-32 check "
                                   "(record is damaged)")
    return rec


_unpackb = None  # msgpack.unpackb, imported on first use
_RECORD_FIELDS = (("key", str), ("ext", str), ("label", int), ("meta", dict), ("data", bytes))


def _record_where(source: str, key: bytes | None, value: bytes | None = None) -> str:
    where = source if key is None else f"{source} key {key.decode('utf-8', 'replace')}"
    path = None if value is None else _record_path(value)
    if path is not None:
        return f"{where} (original file {path!r})"
    if value is not None:
        return f"{where} (original file unknown: the record's metadata is unreadable)"
    return where


def _record_path(value: bytes) -> str | None:
    """The ``meta["path"]`` of a possibly damaged record, or None.

    The fields are read one by one, in the order :func:`encode_record` writes them (the image
    bytes come last), so a record whose image bytes are damaged or cut short still gives its path.
    """
    import msgpack

    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(value), 1))
        unpacker.feed(value)
        for _ in range(unpacker.read_map_header()):
            name = unpacker.unpack()
            if name == "data":
                return None  # the image comes last: no meta before it
            field = unpacker.unpack()
            if name == "meta":
                path = field.get("path") if isinstance(field, dict) else None
                return path if isinstance(path, str) else None
    except Exception:  # damaged before the meta field: msgpack raises several unrelated types
        return None
    return None
