"""Watch every ``DataLoader`` an unmodified script iterates (behind ``shardfeed watch -- CMD``).

``shardfeed watch`` starts the command with a ``sitecustomize.py`` first on ``PYTHONPATH`` that
calls :func:`install` at interpreter start-up, in every Python process of the command (a
``torchrun`` launcher's ranks included). :func:`install` adds an import hook that waits for
``torch.utils.data.dataloader`` to be imported (torch is not imported early) and then replaces
``DataLoader.__iter__`` (and the ``__iter__`` of every subclass that has one of its own):
each ``iter(loader)`` returns the iterator of one
:class:`~shardfeed.readers.measure.watch.Watch` per loader (one pass = one epoch), which forwards every
attribute to the loader's own iterator. The watch sees what the script's loop receives.
At exit (also on Ctrl-C, and on SIGTERM where the script sets
no handler of its own: it then exits with status 143) each process that iterated a loader writes
``{"pid", "loaders": [WatchReport JSON, ...]}`` to ``$SHARDFEED_WATCH_DIR/<pid>.json``. A process
forked from the script (``os.fork``, ``multiprocessing`` with fork) reports the loaders it iterates
itself, at its exit (a ``multiprocessing`` child's or ``sys.exit``; not ``os._exit()``).

Environment (set by ``shardfeed watch``): ``SHARDFEED_WATCH_DIR`` (the report folder; without it
:func:`install` does nothing) and ``SHARDFEED_WATCH_OPTIONS`` (JSON: keyword arguments of
:class:`~shardfeed.readers.measure.watch.Watch`: ``device``, ``sample_interval_s``, ``status_every_s``,
``warmup``, ``sample_gpu``).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time

from ..background import expect_children_to_end, signal_main_thread_again
from ..runtime import after_fork_in_child, set_signal, set_unraisablehook
from ._common import Original

__all__ = ["install", "patch_dataloader", "watched_reports", "MAX_WATCHED_LOADERS", "ENV_DIR", "ENV_OPTIONS"]

ENV_DIR = "SHARDFEED_WATCH_DIR"
ENV_OPTIONS = "SHARDFEED_WATCH_OPTIONS"
#: Loaders watched per process at most (a script that builds a loader per epoch stays bounded).
MAX_WATCHED_LOADERS = 64
_OPTION_KEYS = ("device", "sample_interval_s", "status_every_s", "warmup", "sample_gpu")

_watches: list = []
_lock = threading.Lock()
_state = {"installed": False, "patched": False, "pid": None, "skipped": 0, "sigterm_exit": False,
          "sigterm_at": 0.0, "sigint_at": -1e9, "repeat_exit": False, "exit_mark_registered": False,
          "exit_begun": False, "exits_raised_again": 0, "report_pid": None,
          "multiprocessing_exit_pid": None}
#: Seconds after a SIGTERM in which another one is the same stop (ignored while its exit is under way).
SAME_STOP_S = 5.0
#: Seconds after a SIGINT in which another one is the same stop (the terminal's and the one watch passed on).
SAME_INTERRUPT_S = 1.0
#: Times a SIGTERM exit that Python swallowed is raised again, at most (then the process dies of the signal).
MAX_EXITS_RAISED_AGAIN = 20


def _options() -> dict:
    try:
        opts = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in opts.items() if k in _OPTION_KEYS} if isinstance(opts, dict) else {}


def patch_dataloader(dataloader_cls=None) -> None:
    """Replace ``DataLoader.__iter__`` so every loader is watched (idempotent).

    A subclass with an ``__iter__`` of its own (shardfeed's ``make_loader``, which hands the loop
    its own batches built from the ``DataLoader``'s) is watched through that ``__iter__``: the watch
    counts what the loop receives. Subclasses defined later are patched as they are defined
    (``__init_subclass__``); the ``DataLoader.__iter__`` such a subclass reaches through ``super()``
    is not watched a second time.
    """
    if _state["patched"]:
        return
    if dataloader_cls is None:
        from torch.utils.data import DataLoader as dataloader_cls
    opts = _options()
    if opts.get("status_every_s"):  # the status lines go to stderr, whatever logging the script configures
        import logging

        log = logging.getLogger("shardfeed.watch")
        log.setLevel(logging.INFO)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("shardfeed watch: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    _patch_iter(dataloader_cls, opts)
    _report_at_multiprocessing_exit()
    stack, seen = list(dataloader_cls.__subclasses__()), 0
    while stack and seen < MAX_PATCHED_SUBCLASSES:  # subclasses defined before the patch
        cls = stack.pop()
        seen += 1
        _patch_iter(cls, opts)
        stack.extend(cls.__subclasses__())
    previous = dataloader_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):
        if previous is not None:
            previous.__get__(None, cls)(**kwargs)
        else:
            super(dataloader_cls, cls).__init_subclass__(**kwargs)
        _patch_iter(cls, opts)

    dataloader_cls.__init_subclass__ = classmethod(__init_subclass__)
    _state["patched"] = True


#: Subclasses of ``DataLoader`` defined before the patch that are looked at, at most.
MAX_PATCHED_SUBCLASSES = 4096


def _patch_iter(cls, opts: dict) -> None:
    """Watch ``iter(loader)`` for the loaders whose ``__iter__`` is ``cls``'s own (none: nothing to do)."""
    orig = cls.__dict__.get("__iter__")
    if orig is None or getattr(orig, "_shardfeed_watched", False):
        return
    from ..measure.watch import Watch

    def __iter__(self):
        if type(self).__iter__ is not __iter__:  # reached through super() from a subclass's own __iter__
            return orig(self)
        owned = self.__dict__.get("_shardfeed_watch")  # (pid, watch): a forked child watches its own passes
        w = owned[1] if isinstance(owned, tuple) and owned[0] == os.getpid() else None
        if w is None:
            with _lock:
                if len(_watches) >= MAX_WATCHED_LOADERS:
                    _state["skipped"] += 1
                    return orig(self)
                ds = getattr(self, "dataset", None)
                label = f"{type(self).__name__} #{len(_watches) + 1} ({type(ds).__name__})"
                w = Watch(Original(self, orig), label=label, **opts)
                _watches.append(w)
            object.__setattr__(self, "_shardfeed_watch", (os.getpid(), w))
        return iter(w)

    __iter__.__wrapped__ = orig
    __iter__._shardfeed_watched = True
    cls.__iter__ = __iter__


class _AfterFork:
    """The token :func:`multiprocessing.util.register_after_fork` holds (weakly; this module keeps it)."""


_AFTER_FORK = _AfterFork()


def _forked_child() -> None:
    """In a process forked from a watched one (``os.fork``, ``multiprocessing`` with fork, a
    ``DataLoader`` worker): the loaders it iterates are its own to report, at its exit, in a report
    of its own; the parent's are the parent's."""
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _watches.clear()
    _state["report_pid"] = os.getpid()
    _state["skipped"] = 0


def _report_at_multiprocessing_exit(_token: object = None) -> None:
    """Write this process's report also where it ends through ``multiprocessing`` (a ``Process``
    child ends with ``os._exit()``, after ``multiprocessing``'s own exit callbacks, not the
    interpreter's): in each child it forks from now on, and in this one if it is such a child."""
    import multiprocessing.util as mp_util

    if _token is None:
        mp_util.register_after_fork(_AFTER_FORK, _report_at_multiprocessing_exit)
        if os.getpid() == _state["pid"]:
            return
    if _state["multiprocessing_exit_pid"] != os.getpid():
        _state["multiprocessing_exit_pid"] = os.getpid()
        mp_util.Finalize(None, _write_reports_now, exitpriority=0)


def watched_reports() -> list:
    """The :class:`~shardfeed.readers.measure.watch.WatchReport` of every loader watched in this process."""
    with _lock:
        return [w.report() for w in _watches]


def _write_reports() -> None:
    """The exit callback of :func:`install` (registered first, so it runs last): write this process's
    report; after a SIGTERM, the signal is then ignored for the interpreter's last teardown."""
    try:
        _write_reports_now()
    finally:
        _ignore_sigterm_once_reported()


def _ignore_sigterm_once_reported() -> None:
    """After a SIGTERM's exit wrote the report: ignore SIGTERM for the rest of the exit.

    The interpreter's teardown, after the exit callbacks, puts Python's signal handlers back to
    ``SIG_DFL``; the same stop's second SIGTERM (a process group's and the one ``shardfeed watch``
    passes on) landing there would turn the exit status 143 into a death by the signal. An ignored
    signal stays ignored through the teardown.
    """
    import signal

    if _state["sigterm_exit"] and os.getpid() == _state["pid"] \
            and threading.current_thread() is threading.main_thread():
        set_signal(signal.SIGTERM, signal.SIG_IGN)


def _write_reports_now() -> None:
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir or os.getpid() != _state["report_pid"] or not _watches:
        return
    reports = []
    for w in list(_watches):
        try:
            w.close()
            reports.append(w.report().to_json())
        except Exception as exc:  # never fail the user's exit
            reports.append({"label": w.label, "error": f"{type(exc).__name__}: {exc}"})
    doc = {"pid": os.getpid(), "argv": list(sys.argv), "loaders": reports, "not_watched": _state["skipped"]}
    path = os.path.join(out_dir, f"{os.getpid()}.json")
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError as exc:
        print(f"shardfeed watch: cannot write {path}: {exc}", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``DataLoader`` right after ``torch.utils.data.dataloader`` is executed."""

    target = "torch.utils.data.dataloader"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch_dataloader(module.DataLoader)

        loader.exec_module = exec_and_patch
        return spec


def install() -> bool:
    """Watch every ``DataLoader`` of this process and write the reports at exit.

    Returns False (and does nothing) without ``$SHARDFEED_WATCH_DIR``. Safe to call twice.
    """
    if _state["installed"] or not os.environ.get(ENV_DIR):
        return False
    _state["installed"] = True
    _state["pid"] = _state["report_pid"] = os.getpid()
    after_fork_in_child(_forked_child)
    if "torch.utils.data.dataloader" in sys.modules:
        patch_dataloader(sys.modules["torch.utils.data.dataloader"].DataLoader)
    else:
        sys.meta_path.insert(0, _Finder())
    atexit.register(_write_reports)
    _exit_on_sigterm()
    _one_interrupt_per_stop()
    return True


def _one_interrupt_per_stop() -> None:
    """Ctrl-C to the process group reaches the script twice: from the terminal, and passed on by
    ``shardfeed watch`` (which passes on every SIGINT it receives, also one sent to it alone). Where
    the script keeps Python's own SIGINT handler, a SIGINT within :data:`SAME_INTERRUPT_S` of the
    last one is that same stop and is ignored (a second ``KeyboardInterrupt`` would cut the script's
    clean-up and the report short); any other raises ``KeyboardInterrupt`` as Python's handler does."""
    import signal

    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        set_signal(signal.SIGINT, _interrupted)


def _interrupted(signum, frame) -> None:
    """The SIGINT handler of :func:`_one_interrupt_per_stop`."""
    if os.getpid() == _state["pid"]:
        now = time.monotonic()
        if now - _state["sigint_at"] < SAME_INTERRUPT_S:
            return
        _state["sigint_at"] = now
    raise KeyboardInterrupt


def _exit_on_sigterm() -> None:
    """SIGTERM ends the script through ``sys.exit(143)`` (so the report is written) where the
    script has not set a handler of its own; the exit status stays that of a SIGTERM death's shell
    convention (128 + 15)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        set_signal(signal.SIGTERM, _exit_terminated)
        _state["previous_unraisablehook"] = set_unraisablehook(_exit_swallowed)
        after_fork_in_child(_default_sigterm_in_child)  # once: install() runs this once per process


def _default_sigterm_in_child() -> None:
    """In a child forked from the watched script (a ``DataLoader`` worker): SIGTERM back to its default,
    as in the unwatched script.

    The child then dies of a SIGTERM at once, in the kernel. An inherited Python handler would run
    only when the child's main thread next reaches Python code; where the process group is
    signalled while the parent fetches a batch's file descriptor from the child, the child's
    ``multiprocessing.resource_sharer`` thread would print the broken connection's traceback in
    that time. A handler of the script's own is left as it is.
    """
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) is _exit_terminated:
            set_signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the child's main thread: the handler's own check still applies
        pass


def _exit_terminated(signum, frame) -> None:
    """The SIGTERM handler of :func:`_exit_on_sigterm`: exit with status 143, the report written at exit;
    where there is no report to write, die of the signal as the unwatched script does.

    Where the whole process group got the signal (``timeout``, a container stopping) the script's
    DataLoader workers die of it too, and PyTorch's SIGCHLD handler would raise "DataLoader worker
    ... is killed by signal" wherever the exit then is (in an ``atexit`` callback, printed with a
    traceback the script never caused): their end is expected now
    (:func:`~shardfeed.readers.background.expect_children_to_end`).

    A second SIGTERM within :data:`SAME_STOP_S` of the one whose exit is under way is the same stop
    (the group's signal and the one ``shardfeed watch`` passes on) and is ignored: it would cut the
    script's clean-up short. A later one raises ``SystemExit`` again, which ends an exit callback
    that hangs; the report, written by the last exit callback, is still written.
    """
    import signal

    if os.getpid() != _state["pid"] or not _watches:
        # no report to write (nothing iterated yet, as while torch is imported; or a forked worker):
        # end as the script would unwatched, of the signal, rather than unwind a half-done import
        set_signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    now = time.monotonic()
    if _state["sigterm_exit"] and now - _state["sigterm_at"] < SAME_STOP_S:
        return  # the same stop, its exit under way: a process group's SIGTERM and the one watch passed on
    _state["sigterm_at"] = now
    expect_children_to_end()
    if not _state["exit_mark_registered"]:
        _state["exit_mark_registered"] = True
        atexit.register(_mark_exit_begun)  # registered last, it runs first of the exit callbacks
    _state["repeat_exit"] = _state["sigterm_exit"]  # an earlier SIGTERM's exit still under way
    _state["sigterm_exit"] = True
    sys.exit(128 + signal.SIGTERM)


def _mark_exit_begun() -> None:
    """The first exit callback after a SIGTERM: a swallowed exit is no longer raised again."""
    _state["exit_begun"] = True


def _exit_swallowed(unraisable) -> None:
    """``sys.unraisablehook`` while the SIGTERM handler is installed: the handler's exit is raised again
    where Python swallowed it.

    Where the handler ran inside a callback whose exceptions Python can only print (an at-fork
    callback, as every fork of a DataLoader worker runs logging's; a ``__del__``), its ``SystemExit``
    was dropped and the script ran on for ever. The signal is sent to the main thread again
    (:func:`~shardfeed.readers.background.signal_main_thread_again`), at most
    :data:`MAX_EXITS_RAISED_AGAIN` times; then the process dies of the signal, as the unwatched script
    does. A swallowed exit of a later SIGTERM, while the first one's exit is still under way (Python
    waiting for the script's threads, the exit callbacks), is left dropped: that exit goes on. Every
    other unraisable exception goes to the previous hook.
    """
    import signal

    ours = (unraisable.exc_type is SystemExit and getattr(unraisable.exc_value, "code", None) == 128 + signal.SIGTERM
            and _state["sigterm_exit"] and not _state["repeat_exit"] and not _state["exit_begun"]
            and os.getpid() == _state["pid"])
    if not ours:
        _state["previous_unraisablehook"](unraisable)
        return
    _state["sigterm_exit"] = False
    _state["exits_raised_again"] += 1
    if _state["exits_raised_again"] > MAX_EXITS_RAISED_AGAIN:
        set_signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal_main_thread_again(signal.SIGTERM)
