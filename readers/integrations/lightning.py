"""A Lightning ``Callback`` that watches the train dataloader (``pip install 'shardfeed[lightning]'``).

Example::

    from lightning.pytorch import Trainer
    from shardfeed.readers.integrations.lightning import WatchCallback

    cb = WatchCallback(log_every_n_steps=50)
    Trainer(callbacks=[cb]).fit(model, train_dataloaders=loader)
    print(cb.report.summary())

Each training step is timed by the hooks ``on_train_batch_start`` / ``on_train_batch_end``
(:meth:`~shardfeed.readers.measure.watch.Watch.batch_started`, ``batch_ended``): ``t_wait`` is the time
from the end of one step to the start of the next (Lightning fetches the next batch there), so it
holds the loader's wait and Lightning's own work between steps. Every ``log_every_n_steps`` steps
the data stall share so far is logged to the trainer's logger as ``shardfeed/stall_share``; at the
end of fitting the :class:`~shardfeed.readers.measure.watch.WatchReport` is in :attr:`WatchCallback.report`
and its summary is logged (logger ``shardfeed.watch``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from ._common import log_report, make_watch

__all__ = ["WatchCallback"]


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
        self.watch = make_watch(loader, self.watch_options, label=f"Lightning train ({type(loader).__name__})")
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
        self.report = log_report(self.watch)
        if trainer.logger is not None:
            trainer.logger.log_metrics({"shardfeed/stall_share": self.report.stall_share}, step=trainer.global_step)
        self.watch = None
