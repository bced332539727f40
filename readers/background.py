"""Background threads that end before the interpreter does.

A daemon thread still running when Python finalizes is ended by the interpreter at its next
attempt to take the GIL (CPython calls ``pthread_exit`` there, up to 3.13). Unwinding a thread
that way through C++ code (a pybind11 ``gil_scoped_release`` destructor, a ``noexcept`` frame)
aborts the whole process: ``terminate called without an active exception``, exit status -6 (134
from a shell), after a command that had finished its work and written its report. Which thread
happens to wake up at that moment is a matter of timing, so the abort is rare and real.

Every background thread the readers start (read-ahead of the next epoch's spans, a shard's
prefetch over HTTP, the HTTP deadline watchdog, ``watch``'s and the GPU sampler's loops) is
started through :func:`start_thread` with a callable that asks it to stop. At exit (``atexit``,
which runs before finalization) each live thread of this process is asked to stop, then the
sockets of HTTP reads still blocked are shut down (:func:`before_join` hooks: the deadline
watchdog's requests and every open ``HttpRangeStream``, so a thread blocked receiving returns at
once and sees it is to stop), and the threads are joined, all within :data:`EXIT_JOIN_S`. A thread that still has not
ended by then is left to the interpreter, as before. A forked child starts with an empty registry
(the parent's threads do not exist there).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Callable

from .runtime import after_fork_in_child, at_exit, set_signal

__all__ = ["start_thread", "before_join", "stop_all", "expect_children_to_end", "signal_main_thread_again",
           "EXIT_JOIN_S", "SIGNAL_AGAIN_DELAY_S"]

#: Seconds the exit hook waits, in all, for the background threads to end.
EXIT_JOIN_S = 2.0
#: Seconds between a signal handler's swallowed exception and the signal sent to the main thread again.
SIGNAL_AGAIN_DELAY_S = 0.05

_lock = threading.Lock()
#: thread -> (pid that started it, callable asking it to stop); threads that ended drop out
_threads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: callables run at exit after the threads were asked to stop, before they are joined (they may unblock them)
_before_join: list[Callable[[], None]] = []


def start_thread(target: Callable[..., object], *, name: str, stop: Callable[[], None],
                 args: tuple = ()) -> threading.Thread:
    """Start ``target(*args)`` in a daemon thread named ``name`` that :func:`stop_all` (run at
    exit) asks to end by calling ``stop()`` and then joins, bounded.

    Args:
        target: the thread's function.
        name: the thread's name (``shardfeed-...``).
        stop: sets whatever ``target`` polls to end early; must not block and may be called
            after the thread ended.
        args: ``target``'s positional arguments.

    Returns:
        The started thread.
    """
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        _threads[thread] = (os.getpid(), stop)
    thread.start()
    return thread


def before_join(fn: Callable[[], None]) -> None:
    """Run ``fn()`` at exit after the threads were asked to stop and before they are joined
    (e.g. shut down sockets that threads are blocked on)."""
    with _lock:
        _before_join.append(fn)


def stop_all(timeout_s: float = EXIT_JOIN_S) -> list[str]:
    """Ask every live background thread of this process to stop, and join them all within
    ``timeout_s`` seconds in total.

    Returns:
        The names of the threads still running when the time was up (empty when all ended).
    """
    pid = os.getpid()
    with _lock:
        live = [(t, stop) for t, (owner, stop) in list(_threads.items()) if owner == pid and t.is_alive()]
        cuts = list(_before_join)
    if not live:
        return []
    for _, stop in live:  # first, so that a thread woken by a cut below sees it is to stop
        try:
            stop()
        except Exception:  # noqa: BLE001 - the join below is bounded all the same
            pass
    for fn in cuts:
        try:
            fn()
        except Exception:  # noqa: BLE001 - exiting: nothing more to do about it
            pass
    deadline = time.monotonic() + max(0.0, timeout_s)
    for thread, _ in live:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t, _ in live if t.is_alive()]


def _after_fork_in_child() -> None:
    """A fresh lock and no threads in a forked child: the parent's threads do not exist there,
    and the lock may have been held by one of them at the fork."""
    global _lock, _threads
    _lock = threading.Lock()
    _threads = weakref.WeakKeyDictionary()


at_exit(stop_all)
after_fork_in_child(_after_fork_in_child)


def expect_children_to_end() -> None:
    """Once the process is stopping on SIGTERM: its child processes' ends are expected news.

    Where the whole process group got the signal (``timeout``, a container stopping) the DataLoader
    workers die of it too, and PyTorch's SIGCHLD handler raises "DataLoader worker ... is killed by
    signal" wherever the main thread then is (inside an import or an ``atexit`` callback, where it
    is printed with a traceback). A Python SIGCHLD handler is replaced by one that does nothing:
    not ``SIG_DFL``, under which a SIGCHLD already pending for a Python handler is reported as
    "ignored due to race condition". ``SIG_DFL`` and ``SIG_IGN`` (children reaped automatically)
    stay as they are. Call it from the main thread (a signal handler runs there).
    """
    import signal

    if hasattr(signal, "SIGCHLD") and callable(signal.getsignal(signal.SIGCHLD)):
        set_signal(signal.SIGCHLD, _child_ended)


def _child_ended(signum, frame) -> None:
    """The SIGCHLD handler of :func:`expect_children_to_end`: nothing to do."""


def signal_main_thread_again(signum: int, delay_s: float = SIGNAL_AGAIN_DELAY_S) -> None:
    """Send signal ``signum`` to the main thread again in ``delay_s`` seconds, from a short-lived thread.

    For a ``sys.unraisablehook`` that sees the exception of a signal handler swallowed. A signal
    handler runs wherever the main thread is; inside an ``os.register_at_fork`` callback (logging
    has one, so every fork of a DataLoader worker is such a place), a ``__del__`` or a weakref
    callback, the ``KeyboardInterrupt`` or ``SystemExit`` it raises cannot propagate: Python prints
    "Exception ignored in ..." and goes on as if the signal never came. Sent again once the
    callback has returned, the handler raises where the exception propagates. A real signal
    (``pthread_kill``) rather than ``_thread.interrupt_main``: it also ends a blocking wait of the
    main thread. Nothing is sent where the signal's handler is then no longer a Python callable
    (``SIG_DFL`` would kill the process, ``SIG_IGN`` drop it).
    """
    import _thread

    _thread.start_new_thread(_send_to_main_thread, (signum, delay_s))


def _send_to_main_thread(signum: int, delay_s: float) -> None:
    """The short-lived thread of :func:`signal_main_thread_again`."""
    import signal

    time.sleep(delay_s)
    if callable(signal.getsignal(signum)):
        signal.pthread_kill(threading.main_thread().ident, signum)
