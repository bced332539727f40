"""A Lightning ``Callback`` that watches the train dataloader (``pip install 'shardfeed[lightning]'``).

Example::

    from lightning.pytorch import Trainer
    from shardfeed.readers.integrations.lightning import WatchCallback

    cb = WatchCallback(log_every_n_steps=50)
    Trainer(callbacks=[cb]).fit(model, train_dataloaders=loader)
    print(cb.report.summary())

The data wait is the time Lightning is blocked fetching the next train batch: the callback stands
in for the trainer's profiler while fitting and times the fetches Lightning profiles as
``train_dataloader_next`` (the profiler in use still sees every action). Each training step is
timed by the hooks ``on_train_batch_start`` / ``on_train_batch_end``; the time between two steps
that is not a fetch (validation, checkpointing, logging) is reported apart (``t_other_s``,
``other_share``), never as data wait. The samples are counted from the batch each step receives.
At each fetch it also looks whether the batch due had already come back from a worker (one train
``DataLoader``), which tells a hand-off from idle workers. The first fetch and the first step
(worker start-up) are left out (``warmup``). Every ``log_every_n_steps`` steps the data stall
share so far is logged to the trainer's logger as ``shardfeed/stall_share``; at the end of fitting
the :class:`~shardfeed.readers.measure.watch.WatchReport` is in :attr:`WatchCallback.report` and its
summary is logged (logger ``shardfeed.watch``).
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.callbacks import Callback

from ..measure.probes import batch_ready, held_out_of_order
from ._common import log_report, make_watch

__all__ = ["WatchCallback"]

#: The end of the name of the profiler action Lightning wraps around each fetch of a train batch.
_FETCH_ACTION = "train_dataloader_next"


def _train_iterator(trainer: Any) -> Any:
    """The iterator of the one train ``DataLoader`` Lightning is fetching from (its fetcher's
    ``CombinedLoader``); None where there are several, or Lightning's internals differ."""
    try:
        it = trainer.fit_loop._data_fetcher.iterator
        its = getattr(getattr(it, "_iterator", it), "iterators", None)
    except AttributeError:
        return None
    return its[0] if isinstance(its, list) and len(its) == 1 else None


class _FetchTimer:
    """The trainer's profiler, with each train-batch fetch timed for a watch; everything else forwarded."""

    def __init__(self, inner: Any, watch: Any, trainer: Any = None):
        self.__dict__.update(_inner=inner, _watch=watch, _trainer=trainer, _t0=None, _it=None, _ready=None,
                             _held=None)

    def start(self, action_name: str) -> None:
        self._inner.start(action_name)
        if action_name.endswith(_FETCH_ACTION):
            it = _train_iterator(self._trainer)
            ready = batch_ready(it) if it is not None else None
            held = held_out_of_order(it) if ready else None
            self.__dict__.update(_it=it, _ready=ready, _held=held, _t0=time.perf_counter())

    def stop(self, action_name: str) -> None:
        t0 = self._t0
        if action_name.endswith(_FETCH_ACTION) and t0 is not None:
            dt = time.perf_counter() - t0
            ready, held = self._ready, self._held
            if held is not None and (held_out_of_order(self._it) or 0) > held:
                ready = False  # a later batch came back and was held while the due one was awaited
            self.__dict__.update(_t0=None, _it=None)
            self._watch.record_fetch(dt, ready=ready)
        self._inner.stop(action_name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class WatchCallback(Callback):
    """Watch the train dataloader of a Lightning ``Trainer`` (see the module docstring).

    Args:
        log_every_n_steps: log ``shardfeed/stall_share`` every this many steps (0: never).
        **watch_options: keyword arguments of :class:`~shardfeed.readers.measure.watch.Watch`
            (``device``, ``sample_interval_s``, ``sample_gpu``, ``warmup``, ``status_every_s``).

    Attributes:
        report: the :class:`~shardfeed.readers.measure.watch.WatchReport` after ``fit`` (None before).
        watch: the :class:`~shardfeed.readers.measure.watch.Watch` while fitting.
    """

    def __init__(self, log_every_n_steps: int = 50, **watch_options: Any):
        super().__init__()
        if log_every_n_steps < 0:
            raise ValueError(f"log_every_n_steps must be 0 or more, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self.watch_options = watch_options
        self.watch = None
        self.report = None
        self._steps = 0

    def on_train_start(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        loader = getattr(loader, "iterables", loader)  # a CombinedLoader holds the user's loader(s)
        if isinstance(loader, (list, tuple)) and len(loader) == 1:
            loader = loader[0]
        self.watch_options.setdefault("device", pl_module.device)
        self.watch = make_watch(loader, self.watch_options, label=f"Lightning train ({type(loader).__name__})",
                                fetches_reported=True)
        trainer.profiler = _FetchTimer(trainer.profiler, self.watch, trainer)
        self._steps = 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.watch is not None and trainer.current_epoch > 0:
            self.watch.epoch_started()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.watch is not None:
            self.watch.batch_started(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.watch is None:
            return
        self.watch.batch_ended()
        self._steps += 1
        if self.log_every_n_steps and self._steps % self.log_every_n_steps == 0 and trainer.logger is not None:
            rep = self.watch.report()
            trainer.logger.log_metrics({"shardfeed/stall_share": rep.stall_share}, step=trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.watch is None:
            return
        self.watch.train_ended()
        self._restore_profiler(trainer)
        self.report = log_report(self.watch)
        if trainer.logger is not None:
            trainer.logger.log_metrics({"shardfeed/stall_share": self.report.stall_share}, step=trainer.global_step)
        self.watch = None

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore_profiler(trainer)

    @staticmethod
    def _restore_profiler(trainer) -> None:
        profiler = trainer.profiler
        if isinstance(profiler, _FetchTimer):
            trainer.profiler = profiler.__dict__["_inner"]
