"""The labels of a labels-file pack (``--labels FILE``): the class map and each image's class index.

Rules:

* Integer labels are bounded by the classes they can index: a class map (``--classes-from``: a
  packed dataset or a classes file), or ``--num-classes K`` (classes ``"0" .. "K-1"``). Without
  either, the classes are ``"0" .. "M"`` for the largest label M, and M must be below the number
  of labelled images: one mistyped label (``100000000``) is an error naming the file, the line
  and the fix, never millions of empty classes.
* A label written as digits that is both a class name of the map and another class's index
  (class names that are digits) is refused, naming the file and line, unless ``--label-kind
  name`` or ``--label-kind index`` says which. A label that is only one of them is that one.
* Class names match in any Unicode normalisation (NFC or NFD) when exactly one class has that
  spelling.
"""

from __future__ import annotations

import os
import unicodedata

__all__ = ["LABEL_KINDS", "resolve_labels"]

#: What a label written as digits means: a class name, or a class index.
LABEL_KINDS = ("name", "index")


def resolve_labels(labels_file: str | os.PathLike, rows: dict[str, tuple[str | int, int, bool]],
                   class_to_idx: dict[str, int] | None, *, num_classes: int | None = None,
                   label_kind: str | None = None, max_classes: int) -> tuple[dict[str, int], dict[str, int]]:
    """The class map and ``{image: class index}`` of the labelled images.

    Args:
        labels_file: the labels file, for messages.
        rows: ``{image rel: (label, line, written as text)}`` of the images to pack
            (:func:`~shardfeed.convert.write.layouts.read_label_rows`).
        class_to_idx: the map of ``--classes-from``, or None.
        num_classes: ``--num-classes``: integer labels index the classes ``"0" .. "K-1"``.
        label_kind: ``"name"``, ``"index"`` or None (decided per label, ambiguity refused).
        max_classes: most classes a dataset may have.

    Returns:
        ``(class_to_idx, labels_of)``.

    Raises:
        ValueError: a label that is not a class of the map, an integer label beyond the classes it
            can index, an ambiguous label; ``num_classes`` with ``class_to_idx`` or with name
            labels; a bad ``label_kind``. The message names the file, the line and the fix.
    """
    if label_kind not in (None, *LABEL_KINDS):
        raise ValueError(f"--label-kind {label_kind!r}: give one of {', '.join(LABEL_KINDS)}")
    if num_classes is not None:
        if class_to_idx is not None:
            raise ValueError("--num-classes and --classes-from both give the classes; pass one")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 1 <= num_classes <= max_classes:
            raise ValueError(f"--num-classes {num_classes!r}: give the number of classes, 1 .. {max_classes:,}")
    if class_to_idx is None:
        class_to_idx = _class_map_of_rows(labels_file, rows, num_classes, label_kind, max_classes)
    return class_to_idx, _indices(labels_file, rows, class_to_idx, label_kind)


def _where(labels_file, rows, rel: str) -> str:
    return f"{labels_file} line {rows[rel][1]}"


def _class_map_of_rows(labels_file, rows: dict, num_classes: int | None, label_kind: str | None,
                       max_classes: int) -> dict[str, int]:
    """The class map of a labels file without ``--classes-from``: ``"0" .. "K-1"`` for integer
    labels (K = ``num_classes``, else the largest label + 1, at most the number of images), else
    the label names sorted as ImageFolder sorts folders."""
    ints = bool(rows) and all(isinstance(v[0], int) for v in rows.values())
    if ints and label_kind != "name":
        if num_classes is not None:
            return {str(i): i for i in range(num_classes)}
        top = max(rows, key=lambda rel: rows[rel][0])
        k = rows[top][0] + 1
        if k > max_classes or k > len(rows):
            raise ValueError(
                f"{_where(labels_file, rows, top)}: label {k - 1} (of {top}) would make {k:,} classes "
                f"(\"0\" .. \"{k - 1}\") for {len(rows):,} labelled image(s); a mistyped label? Fix it, or say "
                "which classes there are: --num-classes K (integer labels 0 .. K-1) or --classes-from naming them")
        return {str(i): i for i in range(k)}
    if num_classes is not None:
        first = next(iter(rows))
        raise ValueError(f"{_where(labels_file, rows, first)}: --num-classes numbers integer labels, and "
                         f"{rows[first][0]!r} is a class name; pass --classes-from naming the classes instead")
    names = sorted({str(v[0]) for v in rows.values()})  # as ImageFolder sorts folders
    return {c: i for i, c in enumerate(names)}


def _indices(labels_file, rows: dict, class_to_idx: dict[str, int], label_kind: str | None) -> dict[str, int]:
    """``{image: class index}``; the first bad or ambiguous label is an error naming its line."""
    idx_to_class = {i: c for c, i in class_to_idx.items()}
    nfc_names: dict[str, str] | None = None
    labels_of: dict[str, int] = {}
    bad: list[str] = []
    ambiguous: list[str] = []
    for rel, (v, _, as_text) in rows.items():
        if isinstance(v, int):
            name_index = class_to_idx.get(str(v)) if (as_text or label_kind == "name") else None
            if label_kind == "name" or (label_kind is None and v not in idx_to_class):
                index = name_index
            elif label_kind is None and name_index is not None and name_index != v:
                ambiguous.append(rel)
                continue
            else:
                index = v if v in idx_to_class else None
        else:
            if v not in class_to_idx:  # the same name in another Unicode normalisation is that class
                if nfc_names is None:
                    nfc_names = _nfc_names(class_to_idx)
                v = nfc_names.get(unicodedata.normalize("NFC", v), v)
            index = class_to_idx.get(v)
        if index is None:
            bad.append(rel)
        else:
            labels_of[rel] = index
    if ambiguous:
        rel = ambiguous[0]
        v = rows[rel][0]
        raise ValueError(f"{_where(labels_file, rows, rel)}: label {v} (of {rel}) is both the class named {str(v)!r} "
                         f"(index {class_to_idx[str(v)]}) and the class of index {v} ({idx_to_class[v]!r}); "
                         f"{len(ambiguous)} label(s) so: say which with --label-kind name or --label-kind index")
    if bad:
        rel = bad[0]
        raise ValueError(f"{_where(labels_file, rows, rel)}: label {rows[rel][0]!r} (of {rel}) is not a class of the "
                         f"class map ({len(class_to_idx)} classes); {len(bad)} label(s) are not classes of the "
                         "class map: pass the right --classes-from or --num-classes, or fix the labels")
    return labels_of


def _nfc_names(class_to_idx: dict[str, int]) -> dict[str, str]:
    """``{NFC form: class name}`` of the class names whose NFC form is their own (no two classes
    that differ only in normalisation: such a name matches neither)."""
    by: dict[str, list[str]] = {}
    for c in class_to_idx:
        by.setdefault(unicodedata.normalize("NFC", c), []).append(c)
    return {k: v[0] for k, v in by.items() if len(v) == 1}
