"""Trainer integrations of :func:`shardfeed.readers.watch` (each imports its library only there).

* :mod:`.lightning`: :class:`~shardfeed.readers.integrations.lightning.WatchCallback` for
  Lightning's ``Trainer`` (the ``lightning`` extra);
* :mod:`.transformers`: :class:`~shardfeed.readers.integrations.transformers.WatchTrainerCallback`
  for Hugging Face ``transformers.Trainer`` (the ``transformers`` extra);
* :mod:`.autowatch`: the start-up hook behind ``shardfeed watch -- python train.py``: it patches
  ``torch.utils.data.DataLoader.__iter__`` in an unmodified script.
"""

__all__: list[str] = []
