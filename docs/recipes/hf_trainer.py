"""Train with the Hugging Face ``Trainer`` from packed shards (one process, or ``torchrun`` for DDP).

    python docs/recipes/hf_trainer.py out/train --epochs 2 --output-dir out/hf
    torchrun --standalone --nproc_per_node=2 docs/recipes/hf_trainer.py out/train --epochs 2 --output-dir out/hf

The ``Trainer`` builds its own ``DataLoader`` from a map-style dataset and shards it with
``accelerate``. To feed it shardfeed's loader instead, override ``get_train_dataloader`` and return
it as it is: shardfeed already splits every epoch across ranks (rank and world size from
``torch.distributed``, which the ``Trainer`` has initialised under ``torchrun``), so the loader is not
passed through ``accelerator.prepare`` (which would shard it a second time).

The Trainer passes each batch to the model as keyword arguments, so the loader's ``(images,
labels)`` tuples become ``{"pixel_values": uint8 [B, 3, H, W], "labels": int64 [B]}`` (a thin
wrapper, :class:`DictBatches`); the model converts and normalises on the device.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from shardfeed.readers import load_manifest, make_loader

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class SmallCNN(nn.Module):
    """``pixel_values`` uint8 ``[B, 3, H, W]`` (and ``labels`` int64 ``[B]``) -> ``{"loss", "logits"}``."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1) * 255)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net((pixel_values.float() - self.mean) / self.std)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class DictBatches:
    """A shardfeed loader whose ``(images, labels)`` batches come out as the Trainer's dicts."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.batch_size = loader.batch_size
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for images, labels in self.loader:
            yield {"pixel_values": images, "labels": labels}


class ShardfeedTrainer(Trainer):
    def __init__(self, *args, shardfeed_loader_options: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shardfeed_loader_options = shardfeed_loader_options

    def get_train_dataloader(self):
        # one loader per process; each pass over it is the next epoch, split across the ranks
        return DictBatches(make_loader(**self.shardfeed_loader_options))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a packed dataset (local path)")
    ap.add_argument("--output-dir", default="out/hf-trainer")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="per device")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=2)
    args = ap.parse_args()

    num_classes = len(load_manifest(args.data).classes)
    training_args = TrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=0.05, logging_steps=5, save_strategy="no", report_to=[], disable_tqdm=True,
        use_cpu=not torch.cuda.is_available())
    trainer = ShardfeedTrainer(
        model=SmallCNN(num_classes), args=training_args,
        shardfeed_loader_options=dict(source_or_dataset=args.data, batch_size=args.batch_size,
                                      image_size=args.image_size, train=True, num_workers=args.num_workers))
    result = trainer.train()
    print(f"rank {training_args.process_index}: {result.global_step} steps, training loss "
          f"{result.training_loss:.4f}")


if __name__ == "__main__":
    main()
