"""Train a PyTorch Lightning model from packed shards (one process, or DDP across devices).

    python docs/recipes/lightning_train.py out/train --epochs 2                       # CPU, one process
    python docs/recipes/lightning_train.py out/train --devices 2 --strategy ddp       # DDP, 2 processes
    python docs/recipes/lightning_train.py out/train --accelerator gpu --devices 8 --strategy ddp \
        --image-size 224 --batch-size 256

Two things matter with Lightning:

* ``Trainer(use_distributed_sampler=False)``: shardfeed's loader already gives every rank its own
  share of each epoch (it reads rank and world size from ``torch.distributed``, which Lightning has
  initialised by the time it calls ``train_dataloader``). Left on, Lightning would try to replace
  the loader's sampler with a ``DistributedSampler``.
* ``make_loader`` is called in ``train_dataloader`` (in every process, after the process group
  exists), not in ``__init__``.

Batches are ``uint8 [B, 3, H, W]`` and ``int64 [B]``; Lightning moves them to the device and the
model converts and normalises them there (``to_device`` does both for a hand-written loop).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardfeed.readers import load_manifest, make_loader

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Classifier(L.LightningModule):
    """A small CNN; swap in any model. ``uint8 [B, 3, H, W]`` in, logits ``float32 [B, C]`` out."""

    def __init__(self, num_classes: int, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1) * 255)
        self.lr = lr
        self.samples_seen = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() - self.mean) / self.std  # on the device
        return self.net(x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.samples_seen += len(labels)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(labels), sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ShardData(L.LightningDataModule):
    def __init__(self, data: str, batch_size: int, image_size: int, num_workers: int) -> None:
        super().__init__()
        self.data, self.batch_size, self.image_size, self.num_workers = data, batch_size, image_size, num_workers

    def train_dataloader(self):
        # rank and world size come from torch.distributed (initialised by Lightning under DDP)
        return make_loader(self.data, batch_size=self.batch_size, image_size=self.image_size, train=True,
                           num_workers=self.num_workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a packed dataset (local path)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--accelerator", default="auto")
    ap.add_argument("--devices", default="1")
    ap.add_argument("--strategy", default="auto")
    args = ap.parse_args()

    num_classes = len(load_manifest(args.data).classes)
    model = Classifier(num_classes)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator=args.accelerator, devices=args.devices,
                        strategy=args.strategy, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=ShardData(args.data, args.batch_size, args.image_size, args.num_workers))
    print(f"rank {trainer.global_rank}: {model.samples_seen} samples in {args.epochs} epochs")


if __name__ == "__main__":
    main()
