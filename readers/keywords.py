"""Keyword checks for the Python API: a misspelt option names the right one, as the CLI does.

``make_loader(image_sz=64)`` raises ``TypeError: make_loader() got an unexpected keyword argument
'image_sz'; did you mean 'image_size'?`` at the call, instead of an error from deep inside a source
class. The candidates are read from the signatures that finally receive the options (so a new
option of a source is known without a list to keep up to date); close matches come from
:func:`difflib.get_close_matches`, as Click's "Did you mean" for the command line.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Iterable, Mapping

__all__ = ["signature_keywords", "check_keywords"]


def signature_keywords(*funcs: Callable[..., Any]) -> set[str]:
    """The names ``funcs`` accept as keywords (positional-or-keyword and keyword-only parameters;
    ``*args``/``**kwargs`` excluded)."""
    names: set[str] = set()
    for func in funcs:
        for p in inspect.signature(func).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                names.add(p.name)
    return names


def check_keywords(func_name: str, given: Mapping[str, Any] | Iterable[str], known: Iterable[str]) -> None:
    """Refuse keyword arguments ``func_name`` does not take, suggesting the closest known one.

    Args:
        func_name: the public function the user called (``"make_loader"``).
        given: the keyword arguments (or their names) passed through ``**options``.
        known: every name accepted along the way.

    Raises:
        TypeError: one or more unknown names; the message names each, the closest known name
            when there is one, and where the full list is documented.
    """
    known = sorted(set(known))
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"{name!r}; did you mean {close[0]!r}?" if close else f"{name!r}")
    what = "an unexpected keyword argument" if len(unknown) == 1 else "unexpected keyword arguments"
    raise TypeError(f"{func_name}() got {what} {', '.join(parts)} (it takes: {', '.join(known)})")
