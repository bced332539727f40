"""What the trainer callbacks share: building the :class:`~shardfeed.readers.measure.watch.Watch` and logging it."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["make_watch", "log_report"]

logger = logging.getLogger("shardfeed.watch")


def make_watch(loader: Any, options: dict, label: str):
    """A :class:`~shardfeed.readers.measure.watch.Watch` in hook mode over ``loader`` (the trainer iterates it)."""
    from ..measure.watch import Watch

    w = Watch(loader if loader is not None else [], label=label, **options)
    w.start()
    return w


def log_report(w) -> Any:
    """Close ``w``, log its summary (logger ``shardfeed.watch``, INFO) and return the report."""
    w.close()
    report = w.report()
    logger.info("%s", report.summary())
    return report
