"""The hook mode of :class:`~shardfeed.readers.measure.watch.Watch`: for trainers that iterate the
loader themselves (Lightning, ``transformers.Trainer``; :mod:`shardfeed.readers.integrations`).

The trainer's callbacks call :meth:`HookMode.start`, then :meth:`HookMode.batch_started` and
:meth:`HookMode.batch_ended` around each step. With ``time_fetches`` the train loader's fetches
are timed too (the trainer iterates the watch, or each fetch is reported with
:meth:`HookMode.record_fetch`): the data wait is the time blocked in the loader's ``next()``, and
the time between steps that is not a fetch is ``t_other`` (validation, evaluation, checkpointing,
logging).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["HookMode"]


class HookMode:
    """The hook-mode methods of :class:`~shardfeed.readers.measure.watch.Watch` (its state lives there)."""

    def start(self, *, time_fetches: bool = False) -> None:
        """Start watching without iterating: the trainer iterates ``loader`` and calls
        :meth:`batch_started` / :meth:`batch_ended` around each step. Worker processes are the
        main process's children unless the fetches go through this watch.

        Args:
            time_fetches: the trainer's fetches from the train loader are timed: it iterates this
                watch (``iter(watch)``, as :func:`~shardfeed.readers.integrations._common.time_fetches`
                arranges) or reports each fetch with :meth:`record_fetch`. Then ``t_wait`` is the
                time blocked in the loader's ``next()``, one per fetch (each batch of a
                gradient-accumulation step); ``t_step`` the step between the hooks, its fetches
                left out; ``t_other`` the time between steps that is not a fetch (validation,
                evaluation, checkpointing, logging). Without it ``t_wait`` is the time from the end
                of one step to the start of the next: the loader's wait and the trainer's own work.
                The first ``warmup`` fetches and steps are left out.
        """
        if self._sampler is None and self.epochs == 0:
            self._resolve_device()
            self._start_sampling()
            self.epochs = 1
        if time_fetches:
            self._fetch_hooked = True
        self._hook_mark = time.perf_counter()

    def record_fetch(self, dt: float, batch: Any = None, ready: bool | None = None) -> None:
        """A fetch from the train loader took ``dt`` seconds (hook mode with ``time_fetches``); ``batch``
        the batch fetched (None: its samples are counted at :meth:`batch_started`); ``ready`` whether
        the batch due had already come back from a worker when it was asked for (None: not known)."""
        self._record_wait(float(dt), batch, ready, count=batch is not None)

    def batch_started(self, batch: Any = None) -> None:
        """A step begins on ``batch`` (hook mode): records the wait since the last step ended
        (with ``time_fetches``: the time between the steps that was not a fetch, and ``batch``'s samples)."""
        now = time.perf_counter()
        if self._hook_mark is None:
            self.start()
            now = time.perf_counter()
        if self._fetch_hooked:
            if self._after_step and self._steps_warmup_left == 0:
                self.others.append(max(0.0, now - self._hook_mark - self._fetch_in_window))
            if batch is not None and self._steps_warmup_left == 0:
                self._count(batch)
                if self.batch_tensors is None and self.ready and self.ready[-1] is not None:
                    self.batch_tensors = count_tensors(batch)  # the hand-off's tensors, as in the loop mode
            self._fetch_in_window = 0.0
            self._hook_mark = now
            return
        self._record_wait(now - self._hook_mark, batch)
        self._hook_mark = time.perf_counter()

    def batch_ended(self) -> None:
        """The step ends (hook mode): on CUDA after synchronising, so the GPU work counts in it."""
        if self._cuda_sync:
            import torch

            torch.cuda.synchronize(self._device)
        now = time.perf_counter()
        mark = self._hook_mark
        if self._fetch_hooked:
            if self._steps_warmup_left > 0:
                self._steps_warmup_left -= 1
            elif mark is not None:
                self.steps.append(max(0.0, now - mark - self._fetch_in_window))
            self._fetch_in_window = 0.0
            self._after_step = True
            self._hook_mark = now
            return
        if mark is not None:
            self._record_step(now - mark)
        self._hook_mark = time.perf_counter()

    def train_ended(self) -> None:
        """Training ends (hook mode with ``time_fetches``): the time since the last step that was not a
        fetch (the last validation, the last checkpoint) counts as ``t_other``."""
        if self._fetch_hooked and self._after_step and self._steps_warmup_left == 0 and self._hook_mark is not None:
            self.others.append(max(0.0, time.perf_counter() - self._hook_mark - self._fetch_in_window))
            self._fetch_in_window = 0.0
            self._after_step = False

    def epoch_started(self) -> None:
        """A new pass over the loader begins (hook mode)."""
        if self.epochs == 0:
            self.start()
        else:
            self.epochs += 1
        if not self._fetch_hooked:  # with the fetches timed, the time between epochs is no wait
            self._hook_mark = time.perf_counter()


def count_tensors(batch: Any, limit: int = 100_000) -> int:
    """Tensors in ``batch`` (nested tuples, lists and dicts, at most 8 levels and ``limit`` items
    walked): each one crosses from a DataLoader worker to the main process through a
    shared-memory handle of its own."""
    import torch

    count, seen, stack = 0, 0, [(batch, 0)]
    while stack and seen < limit:
        obj, depth = stack.pop()
        seen += 1
        if isinstance(obj, torch.Tensor):
            count += 1
        elif depth < 8 and isinstance(obj, (tuple, list)):
            stack.extend((x, depth + 1) for x in obj[:limit])
        elif depth < 8 and isinstance(obj, dict):
            stack.extend((x, depth + 1) for x in list(obj.values())[:limit])
    return count
