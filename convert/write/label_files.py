"""Labels files and classes files, read for ``pack --labels`` and ``--classes-from``, and the
``--sidecars`` list: bounded reads of untrusted text (CSV/TSV or JSON Lines rows; LF, CRLF and
CR-only line ends alike), each path checked against the stored-path policy."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

from shardfeed.readers.file_io import read_at_most
from shardfeed.readers.format.manifest import (
    field_name_problem,
    stored_path_problem,
)


from .. import writers  # noqa: F401  (registers every format's writer)



log = logging.getLogger(__name__)

#: Largest labels file read, bytes (ImageNet's 50,000-row validation file is ~2 MB).
MAX_LABELS_FILE_BYTES = 1 << 30
#: Most rows of a labels file.
MAX_LABEL_ROWS = 50_000_000
#: Longest path or label in a labels file, characters.
MAX_LABEL_FIELD_CHARS = 4096
#: Largest classes file, bytes; most classes.
MAX_CLASSES_FILE_BYTES = 64 << 20
MAX_CLASSES = 10_000_000


def _check_rel(rel: str, where: str) -> str:
    """A labels-file path, checked: relative, ``/`` separators, no ``..``, the stored-path policy."""
    if not isinstance(rel, str):
        raise ValueError(f"{where}: path {rel!r} is not a string; a path is text relative to SRC")
    if not rel:
        raise ValueError(f"{where}: empty path")
    rel = rel.replace("\\", "/") if "\\" in rel and "/" not in rel else rel
    if rel.startswith("./"):
        rel = rel[2:]
    parts = rel.split("/")
    if rel.startswith("/") or (len(rel) > 1 and rel[1] == ":") or ".." in parts or "" in parts or "." in parts:
        raise ValueError(f"{where}: path {rel!r} must be relative to SRC, without '..', '.' or empty components")
    problem = stored_path_problem(rel)
    if problem is not None:
        raise ValueError(f"{where}: path {rel!r}: {problem}")
    return rel


def read_labels_file(path: str | os.PathLike) -> dict[str, str | int]:
    """Read a labels file: ``{relative path: label}``, a label a class name or an int index.

    Formats, by content: JSON Lines (every non-empty line an object with ``"path"`` and
    ``"label"``) when the first non-space character is ``{``; else CSV, or TSV when the first
    line holds a tab (``path,label``; a first row whose label column reads ``label``/``class``
    is a header). Lines end at LF, CRLF or CR alike (a spreadsheet's "CSV (Macintosh)").
    Labels that are all decimal integers are class indices, else class names.

    Bounds: at most :data:`MAX_LABELS_FILE_BYTES` bytes, :data:`MAX_LABEL_ROWS` rows and
    :data:`MAX_LABEL_FIELD_CHARS` characters a path or label; paths relative to SRC without
    ``..`` (checked by the stored-path policy); each path once.

    Raises:
        FileNotFoundError: no such file.
        ValueError: over a bound, a malformed row, a bad or repeated path; the message names
            the file and the line.
    """
    return {rel: v[0] for rel, v in read_label_rows(path).items()}


def read_label_rows(path: str | os.PathLike) -> dict[str, tuple[str | int, int, bool]]:
    """:func:`read_labels_file` with where each label comes from: ``{relative path: (label,
    line number, whether an integer label was written as text)}`` (a JSON number is an index;
    digits in a CSV cell or a JSON string could also be a class name).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_labels_file`.
    """
    p = Path(path)
    raw = _read_bounded(p, MAX_LABELS_FILE_BYTES, "a labels file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc}); save the labels file as UTF-8") from None
    rows: list[tuple[int, str, Any]] = []
    if text.lstrip().startswith("{"):
        # lines end at \n, \r\n or \r (never raw inside a JSON string); a raw U+2028 or U+0085 inside a
        # string is text, not a line end (str.splitlines would split there)
        for n, line in enumerate(re.split(r"\r\n|\r|\n", text), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:
                what = exc if isinstance(exc, ValueError) else "nested too deeply"
                raise ValueError(f"{p} line {n}: not a JSON object ({what})") from None
            if not isinstance(obj, dict) or "path" not in obj or "label" not in obj:
                raise ValueError(f'{p} line {n}: each line is {{"path": ..., "label": ...}}')
            rows.append((n, obj["path"], obj["label"]))
            if len(rows) > MAX_LABEL_ROWS:
                raise ValueError(f"{p}: more than {MAX_LABEL_ROWS} rows")
    else:
        text = text.replace("\r\n", "\n").replace("\r", "\n")  # LF, CRLF and CR read alike
        first = text.split("\n", 1)[0]
        delimiter = "\t" if "\t" in first else ","
        reader = csv.reader(io.StringIO(text), delimiter=delimiter)
        for row in _csv_rows(reader, p):
            n = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 2:
                raise ValueError(f"{p} line {n}: {len(row)} columns; each row is path{delimiter}label")
            if not rows and n == 1 and row[1].strip().lower() in ("label", "class", "class_name", "label_idx"):
                continue  # a header
            rows.append((n, row[0].strip(), row[1].strip()))
            if len(rows) > MAX_LABEL_ROWS:
                raise ValueError(f"{p}: more than {MAX_LABEL_ROWS} rows")
    if not rows:
        raise ValueError(f"{p}: no rows; a labels file has one row per image (path,label)")
    out: dict[str, Any] = {}
    lines: dict[str, tuple[int, bool]] = {}
    for n, rel, label in rows:
        where = f"{p} line {n}"
        if isinstance(rel, str) and len(rel) > MAX_LABEL_FIELD_CHARS:
            raise ValueError(f"{where}: path longer than {MAX_LABEL_FIELD_CHARS} characters")
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise ValueError(f"{where}: label {label!r} is neither a class name nor an index")
        if isinstance(label, str):
            if not label or len(label) > MAX_LABEL_FIELD_CHARS:
                raise ValueError(f"{where}: empty label, or longer than {MAX_LABEL_FIELD_CHARS} characters")
            if _NEGATIVE_INT.match(label):
                label = int(label)
        if isinstance(label, int) and label < 0:
            raise ValueError(f"{where}: label {label} is negative; a class index is 0 .. K-1 (leave an "
                             "unlabelled image out of the labels file, or pack with --no-labels)")
        rel = _check_rel(rel, where)
        if rel in out:
            raise ValueError(f"{where}: {rel!r} is listed twice; each image has one label")
        out[rel] = label
        lines[rel] = (n, isinstance(label, str))
    values = list(out.values())
    if all(isinstance(v, int) or (isinstance(v, str) and v.isdigit() and v.isascii()) for v in values):
        out = {k: int(v) for k, v in out.items()}
    else:
        ints = [v for v in values if isinstance(v, int) or (v.isdigit() and v.isascii())]
        if ints:
            raise ValueError(f"{p}: labels mix class names and integer indices (e.g. {ints[0]}); use one kind")
        out = {k: str(v) for k, v in out.items()}
    return {k: (v, *lines[k]) for k, v in out.items()}


MEMBER_EXT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_NEGATIVE_INT = re.compile(r"^-[0-9]+$")


def _read_bounded(p: Path, limit: int, what: str) -> bytes:
    """The bytes of ``p``, at most ``limit`` (read so: a file that grows, or a pipe such as
    ``--labels <(...)``, is bounded too, not just one whose size says so)."""
    with open(p, "rb") as f:
        data = read_at_most(f, limit)  # in chunks: memory follows the file, never the limit
    if data is None:
        raise ValueError(f"{p}: over the {limit} bytes {what} may have")
    return data


def _csv_rows(reader, p: Path):
    """The rows of ``reader``, a malformed one (a field over csv's limit, a stray quote) a
    ValueError naming the file and line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ValueError(f"{p} line {reader.line_num}: malformed CSV ({exc})") from None
        yield row


def read_classes_file(path: str | os.PathLike) -> dict[str, int]:
    """The class map of ``--classes-from``: a packed dataset (its folder or ``manifest.json``), or
    a classes file (one class name per line, index = line number; blank lines and ``#`` comments
    skipped; or a JSON list of names or object name -> index).

    Every source is checked the same way: names are non-empty strings of at most
    :data:`MAX_LABEL_FIELD_CHARS` characters, each once; indices are the integers 0 .. K-1, each
    once (``classes[i]`` of the manifest written is class ``i``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: over :data:`MAX_CLASSES_FILE_BYTES` or :data:`MAX_CLASSES`, a repeated or
            non-string name, indices that are not 0 .. K-1; names the file.
    """
    p = Path(path)
    if p.is_dir() or p.name == "manifest.json":
        from shardfeed.readers.storage.local_manifest import load_manifest

        m = load_manifest(p, check_files=False)
        if not m.labelled:
            raise ValueError(f"{p}: an unlabelled dataset has no classes to align with")
        mapping = checked_class_map(dict(m.class_to_idx), p)
        if list(m.classes) != sorted(mapping, key=mapping.__getitem__):
            raise ValueError(f"{p}: its classes and class_to_idx disagree (classes[i] is not the class of index i); "
                             "the manifest is damaged: repack that dataset, or pass a classes file")
        return mapping
    try:
        text = _read_bounded(p, MAX_CLASSES_FILE_BYTES, "a classes file").decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc}); save the classes file as UTF-8") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{p}: not valid JSON ({exc if isinstance(exc, ValueError) else 'nested too deeply'})"
                             ) from None
        if isinstance(data, dict) and "class_to_idx" in data:  # a manifest under another name
            data = data["class_to_idx"]
        names = data if isinstance(data, list) else None
        mapping = {str(k): v for k, v in data.items()} if isinstance(data, dict) else None
    else:
        names = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        mapping = None
    if names is not None:
        bad = next((c for c in names if not isinstance(c, str)), None)
        if bad is not None:
            raise ValueError(f"{p}: class name {bad!r} is not a string; a classes file lists names")
        if len(set(names)) != len(names):
            dup = next(c for i, c in enumerate(names) if c in names[:i])
            raise ValueError(f"{p}: class name {dup!r} is listed twice")
        mapping = {c: i for i, c in enumerate(names)}
    if not isinstance(mapping, dict):
        raise ValueError(f"{p}: a classes file is one name per line, a JSON list of names, or a JSON object "
                         "name -> index")
    return checked_class_map(mapping, p)


def checked_class_map(mapping: dict, p: Path | str) -> dict[str, int]:
    """``mapping`` (name -> index) checked as :func:`read_classes_file` says, or a ValueError naming ``p``."""
    if not mapping or len(mapping) > MAX_CLASSES:
        raise ValueError(f"{p}: no classes, or more than {MAX_CLASSES}")
    bad = next((c for c in mapping if not isinstance(c, str) or not c or len(c) > MAX_LABEL_FIELD_CHARS), None)
    if bad is not None:
        raise ValueError(f"{p}: class name {bad!r} is empty or longer than {MAX_LABEL_FIELD_CHARS} characters")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in mapping.values()) \
            or sorted(mapping.values()) != list(range(len(mapping))):
        raise ValueError(f"{p}: class indices must be the integers 0 .. {len(mapping) - 1}, each once "
                         "(index i is the i-th class)")
    return dict(mapping)


def parse_sidecars(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"txt,json,mask.png"`` -> ``("txt", "json", "mask.png")`` (a leading dot dropped).

    Raises:
        ValueError: a name that cannot be a field (:func:`~shardfeed.readers.format.manifest.field_name_problem`).
    """
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        item = item.strip().lower().lstrip(".")
        if not item:
            continue
        problem = field_name_problem(item)
        if problem is not None:
            raise ValueError(f"--sidecars: {problem}")
        out.append(item)
    return tuple(dict.fromkeys(out))


