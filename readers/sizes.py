"""Sizes as people write them (``"512MB"``, ``"1GiB"``, ``"500KB"``): the one parser for the
command line's size options and the readers' ``cache_limit``."""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


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
