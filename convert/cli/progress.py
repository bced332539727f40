"""Progress bars of the commands (tqdm, on stderr): the pack's images and bytes, a folder scan's files.

None is shown with ``-q/--quiet`` or when stderr is not a terminal.
"""

from __future__ import annotations

import sys

__all__ = ["progress_bar", "scan_progress"]


class _NoBar:
    """Stands in for a tqdm bar when none is shown."""

    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(total_samples: int | None, total_bytes: int | None, desc: str, quiet: bool):
    """A tqdm bar counting images, with MB/s in its postfix; returns (bar, callback).

    The callback is ``update(num_samples, input_bytes, output_bytes=0)`` and is thread-safe: pass
    it as a ``progress(num_samples, input_bytes)`` callback, and where the stored bytes differ from
    the input (``pack --resize``) also report them, as ``pack``'s
    ``output_progress=lambda b: update(0, 0, b)`` does; once output bytes arrive, the postfix shows
    input -> output MB. No bar
    (and no ``tqdm`` import, ~30 ms of a short command's start-up) with ``quiet`` or when stderr
    is not a terminal (a log file would fill with carriage-return redraws).
    """
    if quiet or not _stderr_is_tty():
        return _NoBar(), lambda n, nbytes, output_bytes=0: None
    import threading
    import time

    from tqdm import tqdm

    bar = tqdm(total=total_samples, unit="img", unit_scale=True, desc=desc, disable=quiet,
               dynamic_ncols=True, file=sys.stderr, smoothing=0.1)
    state = {"in": 0, "out": 0, "t0": time.perf_counter(), "last": 0.0}
    lock = threading.Lock()

    def update(n: int, nbytes: int, output_bytes: int = 0) -> None:
        with lock:
            state["in"] += nbytes
            state["out"] += output_bytes
            bar.update(n)
            now = time.perf_counter()
            if now - state["last"] > 0.25 or (total_samples is not None and bar.n >= total_samples):
                state["last"] = now
                mb_s = state["in"] / 1e6 / max(now - state["t0"], 1e-9)
                done = f"{state['in'] / 1e6:.0f}/{total_bytes / 1e6:.0f} MB"
                if state["out"]:
                    done += f" -> {state['out'] / 1e6:.1f} MB, {mb_s:.1f} MB/s in"
                else:
                    done += f", {mb_s:.1f} MB/s"
                bar.set_postfix_str(done, refresh=False)

    return bar, update


def scan_progress(desc: str, quiet: bool):
    """A tqdm bar for a folder scan (``progress`` of
    :func:`~shardfeed.readers.format.imagefolder.scan_image_folder`); returns ``(bar, callback)``.

    It counts the files found while the folders are listed (no total yet), then the files checked
    (stat'ed) of those listed, with a rate and an ETA; it is erased when closed (``leave=False``),
    so the pack's own bar follows. On stderr, and (as :func:`progress_bar`) none with ``quiet`` or
    when stderr is not a terminal.
    """
    if quiet or not _stderr_is_tty():
        return _NoBar(), lambda phase, n: None
    from tqdm import tqdm

    bar = tqdm(desc=f"{desc}: listing folders", unit="file", unit_scale=True, leave=False, dynamic_ncols=True,
               file=sys.stderr)
    state = {"listed": 0, "checking": False}

    def update(phase: str, n: int) -> None:
        if phase == "listed":
            state["listed"] += n
        elif not state["checking"]:
            state["checking"] = True
            bar.set_description_str(f"{desc}: checking files", refresh=False)
            bar.reset(total=state["listed"])
        bar.update(n)

    return bar, update
