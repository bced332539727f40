"""What :func:`~shardfeed.convert.write_dataset` records, checked before anything is written.

``write_dataset`` validates everything it records: the ``options``, ``skipped`` and ``files`` it
puts in the manifest are strict JSON (no NaN or infinity, string keys, JSON types only), each
``skipped`` entry is an object naming a ``path`` and a ``reason``, and a sample's ``label`` agrees
with the class its own ``meta`` names. A problem is a ``ValueError`` naming the value (``options['lr']``,
``skipped[3]``, the sample) and the fix, raised before the manifest is written, so a call that
returns wrote a dataset every reader and tool accepts.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["check_recorded", "check_skipped", "json_problem", "check_meta_class", "MAX_JSON_DEPTH"]

#: Deepest nesting of a recorded value (objects and arrays); deeper is refused, not recursed into.
MAX_JSON_DEPTH = 64


def json_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """Why ``value`` is not strict JSON, naming where inside it (``options['lr']``), or None.

    Strict JSON: None, bool, int, finite float, str; lists (or tuples) and dicts with string
    keys of those, at most :data:`MAX_JSON_DEPTH` deep. NaN and infinities are refused by name:
    Python's ``json`` writes them as ``NaN``/``Infinity``, which no JSON reader accepts.
    """
    if depth > MAX_JSON_DEPTH:
        return f"{where}: nested more than {MAX_JSON_DEPTH} levels deep"
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"{where} is {value!r}, which JSON cannot hold; record a finite number, a string or None"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{where}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r} ({type(key).__name__}); JSON object keys are strings"
            problem = json_problem(item, f"{where}[{key!r}]", depth + 1)
            if problem:
                return problem
        return None
    return (f"{where} is a {type(value).__name__} ({value!r:.60}), not a JSON value; record a number, string, "
            "list or dict of them")


def check_skipped(skipped: Any) -> list[dict]:
    """``skipped`` as the manifest records it: a list of ``{"path": str, "reason": str, ...}``.

    Raises:
        ValueError: not a list, an entry that is not such an object, or a value that is not
            strict JSON (:func:`json_problem`); the message names the entry (``skipped[3]``).
    """
    if skipped is None:
        return []
    if isinstance(skipped, (str, bytes, Mapping)) or not isinstance(skipped, (list, tuple)):
        raise ValueError(f"skipped is a {type(skipped).__name__}; it is a list of {{'path': ..., 'reason': ...}} "
                         "objects, one per input left out")
    for i, entry in enumerate(skipped):
        if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) for k in ("path", "reason")):
            raise ValueError(f"skipped[{i}] is {entry!r:.80}; each entry is an object {{'path': str, 'reason': str}} "
                             "(more keys allowed) naming the input left out and why")
        problem = json_problem(entry, f"skipped[{i}]")
        if problem:
            raise ValueError(problem)
    return [dict(e) for e in skipped]


def check_recorded(*, options: Any, skipped: Any, files: Any) -> None:
    """Check the ``options``, ``skipped`` and ``files`` a manifest will record (see the module).

    Raises:
        ValueError: the first problem, naming the value and the fix.
    """
    for name, value in (("options", options), ("files", files)):
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} is a {type(value).__name__}; it is a dict recorded in the manifest")
        problem = json_problem(value, name)
        if problem:
            raise ValueError(problem)
    check_skipped(skipped)


def check_meta_class(meta: Mapping, name: str | None, label: int, where: str) -> None:
    """Refuse a sample whose ``meta["class"]`` names another class than its ``label``.

    Args:
        meta: the sample's metadata.
        name: the class name of ``label`` (None when the classes are not given: then they are
            ``"0"`` .. ``"K-1"``, and the label's name is ``str(label)``).
        label: the sample's class index.
        where: the sample, for the message.

    Raises:
        ValueError: the two disagree; the message names both and the fix.
    """
    if "class" not in meta:
        return
    own = name if name is not None else str(label)
    if meta["class"] != own:
        fix = "" if name is not None else "; pass classes=[...] naming the classes (or leave 'class' out of meta)"
        raise ValueError(f"{where}: label {label} is class {own!r}, but its meta names class {meta['class']!r}; "
                         f"give the label of that class or drop meta['class']{fix}")
