"""Watch every ``DataLoader`` an unmodified script iterates (behind ``shardfeed watch -- CMD``).

``shardfeed watch`` starts the command with a ``sitecustomize.py`` first on ``PYTHONPATH`` that
calls :func:`install` at interpreter start-up, in every Python process of the command (a
``torchrun`` launcher's ranks included). :func:`install` adds an import hook that waits for
``torch.utils.data.dataloader`` to be imported (torch is not imported early) and then replaces
``DataLoader.__iter__``: each ``iter(loader)`` returns the iterator of one
:class:`~shardfeed.readers.measure.watch.Watch` per loader (one pass = one epoch), which forwards every
attribute to torch's own iterator. At exit (also on Ctrl-C, and on SIGTERM where the script sets
no handler of its own: it then exits with status 143) each process that iterated a loader writes
``{"pid", "loaders": [WatchReport JSON, ...]}`` to ``$SHARDFEED_WATCH_DIR/<pid>.json``.

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

__all__ = ["install", "patch_dataloader", "watched_reports", "MAX_WATCHED_LOADERS", "ENV_DIR", "ENV_OPTIONS"]

ENV_DIR = "SHARDFEED_WATCH_DIR"
ENV_OPTIONS = "SHARDFEED_WATCH_OPTIONS"
#: Loaders watched per process at most (a script that builds a loader per epoch stays bounded).
MAX_WATCHED_LOADERS = 64
_OPTION_KEYS = ("device", "sample_interval_s", "status_every_s", "warmup", "sample_gpu")

_watches: list = []
_lock = threading.Lock()
_state = {"installed": False, "patched": False, "pid": None, "skipped": 0, "sigterm_exit": False,
          "sigterm_at": 0.0, "repeat_exit": False, "exit_mark_registered": False, "exit_begun": False,
          "exits_raised_again": 0, "transfer_deferrals": 0}
#: Seconds after a SIGTERM in which another one is the same stop (ignored while its exit is under way).
SAME_STOP_S = 5.0
#: Times a SIGTERM exit that Python swallowed is raised again, at most (then the process dies of the signal).
MAX_EXITS_RAISED_AGAIN = 20
#: Times a SIGTERM is put off while the main thread takes a file descriptor from another process, at most
#: (each time by :data:`~shardfeed.readers.background.SIGNAL_AGAIN_DELAY_S`).
MAX_TRANSFER_DEFERRALS = 20
#: Frames a SIGTERM handler looks through for a file-descriptor transfer under way, at most.
MAX_FRAMES_SEARCHED = 256


class _Original:
    """The loader seen through its original ``__iter__`` (attributes forwarded to it)."""

    def __init__(self, loader, orig_iter):
        self.__dict__["_loader"] = loader
        self.__dict__["_orig_iter"] = orig_iter

    def __iter__(self):
        return self._orig_iter(self._loader)

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self.__dict__["_loader"], name)


def _options() -> dict:
    try:
        opts = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in opts.items() if k in _OPTION_KEYS} if isinstance(opts, dict) else {}


def patch_dataloader(dataloader_cls=None) -> None:
    """Replace ``DataLoader.__iter__`` so every loader is watched (idempotent)."""
    if _state["patched"]:
        return
    if dataloader_cls is None:
        from torch.utils.data import DataLoader as dataloader_cls
    from ..measure.watch import Watch

    orig = dataloader_cls.__iter__
    opts = _options()
    if opts.get("status_every_s"):  # the status lines go to stderr, whatever logging the script configures
        import logging

        log = logging.getLogger("shardfeed.watch")
        log.setLevel(logging.INFO)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("shardfeed watch: %(message)s"))
        log.addHandler(handler)
        log.propagate = False

    def __iter__(self):
        w = self.__dict__.get("_shardfeed_watch")
        if w is None:
            with _lock:
                if len(_watches) >= MAX_WATCHED_LOADERS:
                    _state["skipped"] += 1
                    return orig(self)
                ds = getattr(self, "dataset", None)
                label = f"DataLoader #{len(_watches) + 1} ({type(ds).__name__})"
                w = Watch(_Original(self, orig), label=label, **opts)
                _watches.append(w)
            object.__setattr__(self, "_shardfeed_watch", w)
        return iter(w)

    __iter__.__wrapped__ = orig
    dataloader_cls.__iter__ = __iter__
    _state["patched"] = True


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
    if not out_dir or os.getpid() != _state["pid"] or not _watches:
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
    _state["pid"] = os.getpid()
    if "torch.utils.data.dataloader" in sys.modules:
        patch_dataloader(sys.modules["torch.utils.data.dataloader"].DataLoader)
    else:
        sys.meta_path.insert(0, _Finder())
    atexit.register(_write_reports)
    _exit_on_sigterm()
    return True


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
    if _in_a_descriptor_transfer(frame) and _state["transfer_deferrals"] < MAX_TRANSFER_DEFERRALS:
        _state["transfer_deferrals"] += 1
        signal_main_thread_again(signal.SIGTERM)
        return
    _state["sigterm_at"] = now
    expect_children_to_end()
    if not _state["exit_mark_registered"]:
        _state["exit_mark_registered"] = True
        atexit.register(_mark_exit_begun)  # registered last, it runs first of the exit callbacks
    _state["repeat_exit"] = _state["sigterm_exit"]  # an earlier SIGTERM's exit still under way
    _state["sigterm_exit"] = True
    sys.exit(128 + signal.SIGTERM)


def _in_a_descriptor_transfer(frame) -> bool:
    """Whether the main thread, at ``frame``, is taking a file descriptor from another process: a
    DataLoader worker's batch shared through ``multiprocessing.resource_sharer``.

    An exit raised there closes the connection half-way, and the worker's ``resource_sharer`` thread
    prints the broken connection's traceback if it runs before the worker's own SIGTERM ends it. The
    exit is put off (:data:`MAX_TRANSFER_DEFERRALS` times at most) until the transfer is done.
    """
    sharer = sys.modules.get("multiprocessing.resource_sharer")
    if sharer is None:
        return False  # no descriptor was ever shared in this process
    for _ in range(MAX_FRAMES_SEARCHED):
        if frame is None:
            return False
        if frame.f_code.co_filename == sharer.__file__:
            return True
        frame = frame.f_back
    return False


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
