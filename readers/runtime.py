"""Process-wide hooks of shardfeed, each kind installed in one place.

Modules add callbacks here instead of installing hooks of their own:

* :func:`after_fork_in_child`: run in a child made by ``os.fork`` (a DataLoader worker), in the
  order added. One ``os.register_at_fork`` serves them all.
* :func:`at_exit`: run at interpreter exit (``atexit``), the last added first.
* :func:`set_signal` and :func:`set_unraisablehook`: the only places that change a signal's handler
  or ``sys.unraisablehook``; each returns what was there, for the caller to put back.

A callback that raises an ``Exception`` has its traceback printed to stderr and the next callback
still runs. A ``KeyboardInterrupt`` or ``SystemExit`` (a signal handler that ran inside a
callback) is raised again once every callback has run.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import traceback
from typing import Any, Callable

__all__ = ["after_fork_in_child", "at_exit", "set_signal", "set_unraisablehook"]

_AFTER_FORK: list[Callable[[], object]] = []
_AT_EXIT: list[Callable[[], object]] = []


def _run(callbacks: list[Callable[[], object]]) -> None:
    """Call each of ``callbacks``; see the module docstring for what a raising one does."""
    pending: BaseException | None = None
    for fn in list(callbacks):
        try:
            fn()
        except Exception:  # noqa: BLE001 - reported; the other callbacks still run
            traceback.print_exc()
        except BaseException as exc:  # a signal handler's exit: raised once all have run
            pending = pending or exc
    if pending is not None:
        raise pending


def after_fork_in_child(fn: Callable[[], object]) -> None:
    """Call ``fn()`` in every child this process forks from now on, right after the fork (give
    fresh locks, forget the parent's threads, sockets and pools). Callbacks run in the order added."""
    _AFTER_FORK.append(fn)


def at_exit(fn: Callable[[], object]) -> None:
    """Call ``fn()`` at interpreter exit, before the interpreter finalizes (the last added runs first)."""
    _AT_EXIT.append(fn)


def _run_at_exit() -> None:
    _run(_AT_EXIT[::-1])


def set_signal(signum: int, handler: Any) -> Any:
    """Install ``handler`` for signal ``signum`` (a callable, ``signal.SIG_DFL`` or
    ``signal.SIG_IGN``); returns the previous handler. Only from the main thread.

    Raises:
        ValueError: not called from the main thread, or ``signum`` is not a valid signal.
    """
    return signal.signal(signum, handler)


def set_unraisablehook(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    """Install ``hook`` as ``sys.unraisablehook``; returns the previous one."""
    previous = sys.unraisablehook
    sys.unraisablehook = hook
    return previous


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _run(_AFTER_FORK))
atexit.register(_run_at_exit)
