"""The trainer callbacks with the real libraries: a tiny Lightning fit and a tiny
``transformers.Trainer`` run for 3 steps on the CPU."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


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
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    loader = DataLoader(data, batch_size=4)
    cb = WatchCallback(log_every_n_steps=1)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", callbacks=[cb], logger=CSVLogger(tmp_path),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), train_dataloaders=loader)
    rep = cb.report
    assert rep is not None
    assert rep.batches == 3 - 1  # 3 steps, the first is the warm-up
    assert rep.num_samples == 2 * 4
    assert rep.loader["batch_size"] == 4 and rep.loader["num_workers"] == 0
    assert 0.0 <= rep.stall_share <= 1.0
    assert rep.diagnosis["kind"] in ("compute-bound", "main-process-bound")
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
