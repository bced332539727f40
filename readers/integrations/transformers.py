"""A Hugging Face ``TrainerCallback`` that watches the train dataloader (``pip install 'shardfeed[transformers]'``).

Example::

    from transformers import Trainer
    from shardfeed.readers.integrations.transformers import WatchTrainerCallback

    cb = WatchTrainerCallback(log_every_n_steps=50)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    print(cb.report.summary())

The data wait is the time the Trainer is blocked in the train dataloader's ``next()``: while
training, ``iter(train_dataloader)`` goes through the watch
(:func:`~shardfeed.readers.integrations._common.time_fetches`), which times each fetch (each batch of
a gradient-accumulation step) and counts its samples. Each optimizer step is timed by
``on_step_begin`` / ``on_step_end``; the time between two steps that is not a fetch (evaluation,
checkpointing, logging) is reported apart (``t_other_s``, ``other_share``), never as data wait.
Every ``log_every_n_steps`` steps the data stall
share so far is appended to the trainer's log (``state.log_history``, key ``shardfeed/stall_share``)
and added to the next ``on_log`` record the reporting integrations see; at the end of training the
:class:`~shardfeed.readers.measure.watch.WatchReport` is in :attr:`WatchTrainerCallback.report` and its
summary is logged (logger ``shardfeed.watch``).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ._common import log_report, make_watch, stop_timing_fetches

__all__ = ["WatchTrainerCallback"]

_KEY = "shardfeed/stall_share"


class WatchTrainerCallback(TrainerCallback):
    """Watch the train dataloader of a ``transformers.Trainer`` (see the module docstring).

    Args:
        log_every_n_steps: log the stall share every this many steps (0: only at the end).
        **watch_options: keyword arguments of :class:`~shardfeed.readers.measure.watch.Watch`.

    Attributes:
        report: the :class:`~shardfeed.readers.measure.watch.WatchReport` after ``train()`` (None before).
    """

    def __init__(self, log_every_n_steps: int = 50, **watch_options: Any):
        if log_every_n_steps < 0:
            raise ValueError(f"log_every_n_steps must be 0 or more, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self.watch_options = watch_options
        self.watch = None
        self.report = None
        self._epoch = None
        self._loader = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.watch_options.setdefault("device", getattr(args, "device", None))
        self.watch = make_watch(train_dataloader, self.watch_options,
                                label=f"transformers train ({type(train_dataloader).__name__})", iterate=True)
        self._loader = train_dataloader
        self._epoch = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.watch is not None:
            if self._epoch is not None:
                self.watch.epoch_started()
            self._epoch = state.epoch

    def on_step_begin(self, args, state, control, **kwargs):
        if self.watch is not None:
            self.watch.batch_started(None)

    def on_step_end(self, args, state, control, **kwargs):
        if self.watch is None:
            return
        self.watch.batch_ended()
        n = self.log_every_n_steps
        if n and state.global_step and state.global_step % n == 0:
            state.log_history.append({_KEY: self.watch.report().stall_share, "step": state.global_step})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch is not None and logs is not None and self.watch.steps:
            logs[_KEY] = self.watch.report().stall_share

    def on_train_end(self, args, state, control, **kwargs):
        if self.watch is None:
            return
        self.watch.train_ended()
        stop_timing_fetches(self._loader)
        self._loader = None
        self.report = log_report(self.watch)
        state.log_history.append({_KEY: self.report.stall_share, "step": state.global_step})
        self.watch = None
