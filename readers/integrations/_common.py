"""What the trainer callbacks and the start-up hook share: building the
:class:`~shardfeed.readers.measure.watch.Watch`, seeing a loader through its own ``__iter__``, timing
the train loader's fetch, and logging the report."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["make_watch", "log_report", "Original", "time_fetches", "stop_timing_fetches", "NOT_TIMED_WARNING"]

logger = logging.getLogger("shardfeed.watch")

#: The report's warning when the train loader's fetch could not be timed (an iterable whose class cannot be changed).
NOT_TIMED_WARNING = ("the train loader's fetch could not be timed: the data wait is the time between two steps, "
                     "the trainer's own work there (validation, checkpointing, logging) included")


class Original:
    """A loader seen through a given ``__iter__`` (its original one); every other attribute forwarded."""

    def __init__(self, loader, orig_iter):
        self.__dict__["_loader"] = loader
        self.__dict__["_orig_iter"] = orig_iter

    def __iter__(self):
        return self._orig_iter(self._loader)

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_loader"], name)


def make_watch(loader: Any, options: dict, label: str, *, iterate: bool = False, fetches_reported: bool = False):
    """A :class:`~shardfeed.readers.measure.watch.Watch` in hook mode over ``loader`` (the trainer iterates it).

    Args:
        iterate: time the trainer's fetches by making ``iter(loader)`` go through the watch
            (:func:`time_fetches`); where that cannot be done the watch times the steps only (its
            report says so).
        fetches_reported: the caller reports each fetch (:meth:`~shardfeed.readers.measure.watch.Watch.record_fetch`).
    """
    from ..measure.watch import Watch

    w = Watch(loader if loader is not None else [], label=label, **options)
    timed = fetches_reported
    if iterate:
        timed = loader is not None and time_fetches(loader, w)
        if not timed:
            w._warnings.append(NOT_TIMED_WARNING)
    w.start(time_fetches=timed)
    return w


def _unwatched_copy(cls: type, state: dict) -> Any:
    """A loader of class ``cls`` with ``state`` (what a watched loader pickles or copies as)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


#: ``object``'s own ``__class__`` setter (a class may hide it behind a property, as accelerate's loaders do).
_SET_CLASS = object.__dict__["__class__"].__set__


def time_fetches(loader: Any, w) -> bool:
    """Make every ``iter(loader)`` go through ``w`` (a :class:`~shardfeed.readers.measure.watch.Watch` in
    hook mode), so each fetch the trainer makes from it is timed and counted.

    ``loader``'s class is changed to a subclass of its own whose ``__iter__`` returns ``iter(w)``;
    :func:`stop_timing_fetches` puts it back. A pickled or copied ``loader`` is of its own class,
    unwatched. Returns False (nothing changed) where the class cannot be changed (a built-in iterable).
    """
    cls = type(loader)
    if getattr(cls, "_shardfeed_fetches_timed", False):
        return False
    orig = cls.__iter__

    def __iter__(self):
        return iter(w)

    def __reduce_ex__(self, protocol):
        return _unwatched_copy, (cls, dict(self.__dict__))

    __iter__._shardfeed_watched = True  # the start-up hook of ``shardfeed watch --`` leaves it alone
    try:
        sub = type(cls.__name__, (cls,), {"__iter__": __iter__, "__reduce_ex__": __reduce_ex__,
                                          "__module__": cls.__module__, "_shardfeed_fetches_timed": True,
                                          "_shardfeed_class": cls})
        w.loader = Original(loader, orig)
        _SET_CLASS(loader, sub)
    except TypeError:  # a built-in type, or a layout that refuses the change
        w.loader = loader
        return False
    return True


def stop_timing_fetches(loader: Any) -> None:
    """Undo :func:`time_fetches` (nothing for a loader it did not change)."""
    cls = type(loader)
    if getattr(cls, "_shardfeed_fetches_timed", False):
        _SET_CLASS(loader, cls._shardfeed_class)


def log_report(w) -> Any:
    """Close ``w``, log its summary (logger ``shardfeed.watch``, INFO) and return the report."""
    w.close()
    report = w.report()
    logger.info("%s", report.summary())
    return report
