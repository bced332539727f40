"""The trainer callbacks with the real libraries: a tiny Lightning fit and a tiny
``transformers.Trainer`` run for 3 steps on the CPU."""

from __future__ import annotations

import csv
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class _Counted(Dataset):
    """A dataset that counts the samples read from it and times each read by its own clock
    (``read_s``, seconds; in the main process: ``num_workers=0``)."""

    def __init__(self, inner, sleep_s: float = 0.0):
        self.inner, self.sleep_s, self.calls, self.read_s = inner, sleep_s, 0, 0.0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        t0 = time.perf_counter()
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        item = self.inner[i]
        self.read_s += time.perf_counter() - t0
        return item


class _Pairs(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def test_lightning_callback_watches_the_train_dataloader_and_logs_the_stall(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from shardfeed.readers.integrations.lightning import WatchCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = _Counted(TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)))
    loader = DataLoader(data, batch_size=4)
    cb = WatchCallback(log_every_n_steps=1)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", callbacks=[cb], logger=CSVLogger(tmp_path),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), train_dataloaders=loader)
    rep = cb.report
    assert rep is not None
    # every fetch after the first (worker start-up, before the callback starts) is timed: Lightning
    # fetches one batch ahead of the step
    assert rep.batches == data.calls // 4 - 1
    assert rep.num_samples == 2 * 4  # the batches of the 3 steps, the first (warm-up) left out
    assert rep.loader["batch_size"] == 4 and rep.loader["num_workers"] == 0
    assert 0.0 <= rep.stall_share <= 1.0
    # a 3-step loop of 4-sample batches: the step or the main process, or a borderline between them
    kinds = {rep.diagnosis["kind"]} if rep.diagnosis["kind"] != "borderline" else set(rep.diagnosis["between"])
    assert kinds and kinds <= {"compute-bound", "main-process-bound"}, rep.diagnosis
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    logged = [r for r in rows if r.get("shardfeed/stall_share")]
    assert len(logged) >= 2  # per N steps, and at the end
    assert float(logged[-1]["shardfeed/stall_share"]) == pytest.approx(rep.stall_share)


def test_transformers_callback_watches_the_train_dataloader_and_logs_the_stall(tmp_path):
    import transformers

    from shardfeed.readers.integrations.transformers import WatchTrainerCallback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x, labels=None):
            logits = self.lin(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3,
                                          per_device_train_batch_size=4, report_to=[], use_cpu=True,
                                          logging_steps=1, save_strategy="no", dataloader_num_workers=0,
                                          disable_tqdm=True)
    cb = WatchTrainerCallback(log_every_n_steps=1)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=_Pairs(32), callbacks=[cb])
    trainer.train()
    rep = cb.report
    assert rep is not None
    assert rep.batches == 3 - 1
    assert rep.loader["num_workers"] == 0
    assert 0.0 <= rep.stall_share <= 1.0
    logged = [e for e in trainer.state.log_history if "shardfeed/stall_share" in e]
    assert len(logged) >= 2
    assert logged[-1]["shardfeed/stall_share"] == pytest.approx(rep.stall_share)


#: Seconds each validation or evaluation batch sleeps: time between two steps that is no data wait.
_EVAL_SLEEP_S = 0.25
#: Seconds each training sample takes to read: the data wait that must still be seen.
_READ_SLEEP_S = 0.005


def test_lightning_validation_during_the_epoch_is_other_time_not_data_wait(tmp_path):
    import lightning.pytorch as pl

    from shardfeed.readers.integrations.lightning import WatchCallback

    class SlowValidation(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            self.validated = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.lin(x), y)

        def validation_step(self, batch, batch_idx):
            time.sleep(_EVAL_SLEEP_S)
            self.validated += 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    train = _Counted(TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)),
                     sleep_s=_READ_SLEEP_S)
    val = TensorDataset(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
    model = SlowValidation()
    cb = WatchCallback(log_every_n_steps=0)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", callbacks=[cb], logger=False, val_check_interval=4,
                         limit_val_batches=2, num_sanity_val_steps=0, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=DataLoader(train, batch_size=4),
                val_dataloaders=DataLoader(val, batch_size=4))
    rep = cb.report
    planted = model.validated * _EVAL_SLEEP_S
    assert model.validated == 4 * 2  # every 4 of the 16 steps, 2 batches each
    assert rep.num_samples == 64 - 4  # the batches of the steps, the first (warm-up) left out
    # each timed fetch read 4 samples of 5 ms: the wait is seen ...
    assert rep.t_wait_s["total"] >= rep.batches * 4 * _READ_SLEEP_S
    # ... and the validation is not part of it: it is the time between steps that is not a fetch. The
    # reads take longer on a busy machine, so the wait is held to the reads as the dataset timed them
    # plus half the validation (the margin for the loader's own work), not to a fixed figure: a wait
    # that held the validation would exceed that by half the validation
    assert rep.t_other_s["total"] >= planted
    assert rep.t_wait_s["total"] < train.read_s + planted / 2, rep.summary()
    assert rep.stall_share < rep.other_share
    assert "other" in rep.summary()


def _slow_eval_model():
    class SlowEval(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            self.evaluated = 0

        def forward(self, x, labels=None):
            if not self.training:
                time.sleep(_EVAL_SLEEP_S)
                self.evaluated += 1
            logits = self.lin(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    return SlowEval()


def test_transformers_evaluation_is_other_time_and_each_accumulated_fetch_counts(tmp_path):
    import transformers

    from shardfeed.readers.integrations.transformers import WatchTrainerCallback

    model = _slow_eval_model()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6,
                                          per_device_train_batch_size=4, per_device_eval_batch_size=4,
                                          gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2,
                                          report_to=[], use_cpu=True, logging_steps=1, save_strategy="no",
                                          dataloader_num_workers=0, disable_tqdm=True)
    train = _Counted(_Pairs(64), sleep_s=_READ_SLEEP_S)

    class Keeping(WatchTrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            self.given = (train_dataloader, type(train_dataloader))
            super().on_train_begin(args, state, control, train_dataloader=train_dataloader, **kwargs)

    cb = Keeping(log_every_n_steps=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=_Pairs(8),
                                   callbacks=[cb])
    trainer.train()
    rep = cb.report
    planted = model.evaluated * _EVAL_SLEEP_S
    assert model.evaluated == 3 * 2  # at steps 2, 4 and 6, 2 batches each
    # 6 optimizer steps of 2 fetches each: every fetch is timed and counted, the first (warm-up) left out
    assert rep.batches == 6 * 2 - 1
    assert rep.num_samples == (6 * 2 - 1) * 4
    assert rep.t_wait_s["total"] >= rep.batches * 4 * _READ_SLEEP_S
    assert rep.t_other_s["total"] >= planted
    # the reads as the dataset timed them plus half the evaluation: see the Lightning test
    assert rep.t_wait_s["total"] < train.read_s + planted / 2, rep.summary()
    # the trainer's loader is given back as it was
    loader, cls = cb.given
    assert type(loader) is cls


class _SmallTensors(Dataset):
    def __len__(self):
        return 16 * 12

    def __getitem__(self, i):
        return torch.zeros(3, 8, 8)


def _per_sample_list(samples):
    return list(samples)


@pytest.mark.multiprocess
def test_lightning_callback_tells_whether_each_batch_had_come_back_from_the_worker():
    import lightning.pytorch as pl

    from shardfeed.readers.integrations.lightning import WatchCallback, _train_iterator
    from shardfeed.readers.measure.watch import batch_ready

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            # the step ends only once the next batch has come back from the (one, in-order) worker:
            # every later fetch finds its batch ready (the last two have none left to wait for)
            it = _train_iterator(self.trainer)
            deadline = time.monotonic() + 30
            while batch_idx < 10 and not batch_ready(it) and time.monotonic() < deadline:
                time.sleep(0.0002)
            return self.w.sum() * 0.0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    loader = DataLoader(_SmallTensors(), batch_size=16, num_workers=1, collate_fn=_per_sample_list)
    cb = WatchCallback(log_every_n_steps=0)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), train_dataloaders=loader)
    rep = cb.report
    assert rep.workers["batch_tensors"] == 16
    # 12 batches: the first fetch is the warm-up; of the rest, only the one that ends the epoch
    # (no batch left to come back) may find none ready
    n = rep.batches
    assert n >= 11
    assert rep.workers["batch_ready_share"] >= (n - 1) / n, rep.summary()
