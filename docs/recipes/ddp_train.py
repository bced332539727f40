"""Distributed data-parallel training from packed shards with ``torchrun``: CPU (gloo) or CUDA (nccl).

    # CPU, 2 processes on one machine (gloo):
    torchrun --standalone --nproc_per_node=2 docs/recipes/ddp_train.py out/train --epochs 2
    # one process per GPU (nccl), here 8 GPUs:
    torchrun --standalone --nproc_per_node=8 docs/recipes/ddp_train.py out/train --image-size 224 \
        --batch-size 256 --model resnet50 --checkpoint ckpt.pt
    # a weighted mix of two remote datasets, through one shard cache per machine:
    torchrun --standalone --nproc_per_node=8 docs/recipes/ddp_train.py s3://bucket/a/ https://host/b/ \
        --weights 3 1 --samples-per-epoch 1000000 --cache-dir /local/nvme/cache --cache-limit 500GB

What it shows:

* every rank calls ``make_loader`` with the same arguments and reads its own share of each epoch
  (no ``DistributedSampler``, no ``set_epoch``: each pass over the loader is the next epoch), and
  every rank yields ``len(loader)`` batches, so the gradient all-reduce never waits on a rank that
  ran out of data;
* the batches are ``uint8 [B, 3, H, W]`` / ``int64 [B]`` on the host; ``to_device`` copies them
  (``non_blocking`` from pinned memory on CUDA) and normalises on the device;
* ``--checkpoint PATH`` saves the model, the optimizer and the loader's position every
  ``--save-every`` steps and at the end of each epoch; rerunning the same command resumes
  mid-epoch at the next batch (``loader.load_state_dict``);
* several datasets (or ``--samples-per-epoch``) make a mix: each epoch takes a fixed number of samples
  from each dataset by weight; each batch says which dataset each sample came from, and the model
  sees one class space: each dataset's classes after those of the datasets before it;
* ``--cache-dir`` keeps the shards of remote datasets on a local disk, shared by every process of
  the machine: each shard is downloaded once.

At the end of each epoch rank 0 prints one JSON line: the epoch, the batches and samples every rank
read, the label counts over all ranks and the mean loss. ``--max-steps N`` stops after N steps of
this run (after saving a checkpoint and printing the same line for the part of the epoch read), as
an interruption would.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from shardfeed.readers import make_loader, to_device

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def build_model(name: str, num_classes: int) -> nn.Module:
    """``tiny`` (a small CNN, torch only) or a torchvision model by name (``resnet50``)."""
    if name == "tiny":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
    import torchvision

    return torchvision.models.get_model(name, num_classes=num_classes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="+", help="packed datasets: local folders, http(s):// or s3:// URLs")
    ap.add_argument("--weights", type=float, nargs="+", default=None, help="one per dataset (default: equal)")
    ap.add_argument("--samples-per-epoch", type=int, default=None,
                    help="samples per epoch, all ranks together (default: one pass over one dataset)")
    ap.add_argument("--cache-dir", default=None, help="keep remote shards here (a local disk)")
    ap.add_argument("--cache-limit", default=None, help="bytes, or a size such as 500GB")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    ap.add_argument("--model", default="tiny", help="tiny, or a torchvision model name (resnet50)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default=None, help="save/resume here (model, optimizer, loader position)")
    ap.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps of this run")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                    help="auto: nccl when CUDA is available, else gloo")
    args = ap.parse_args()

    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)  # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # leave the cores to the loader workers

    # rank and world size come from torch.distributed: each rank gets its own share of every epoch
    options = dict(image_size=args.image_size, train=True, num_workers=args.num_workers, seed=args.seed)
    if args.cache_dir:
        options.update(cache_dir=args.cache_dir, cache_limit=args.cache_limit)
    mixing = len(args.data) > 1 or args.samples_per_epoch is not None
    if mixing:  # epochs of samples_per_epoch samples, drawn from the datasets by weight
        loader = make_loader(args.data, args.batch_size, weights=args.weights,
                             samples_per_epoch=args.samples_per_epoch, fields=("source",), **options)
        class_lists = loader.dataset.classes  # one list of class names per dataset
        sizes = [len(c) for c in class_lists]
        offsets = torch.tensor([sum(sizes[:i]) for i in range(len(sizes))])  # dataset i's first class
        num_classes = sum(sizes)
    else:
        loader = make_loader(args.data[0], args.batch_size, **options)
        num_classes = len(loader.dataset.classes)  # the class map of the manifest
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = build_model(args.model, num_classes).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    if args.checkpoint and os.path.exists(args.checkpoint):  # every rank loads, before iterating
        ckpt = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # rank 0's loader state restores every rank
        if rank == 0:
            print(json.dumps({"resumed": True, "epoch": loader.epoch}), flush=True)

    def save() -> None:
        if args.checkpoint and rank == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict()}, tmp)
            os.replace(tmp, args.checkpoint)  # a crash while saving leaves the previous checkpoint
        dist.barrier()

    def report(epoch: int, stats: torch.Tensor, **extra) -> None:
        """One JSON line on rank 0: what every rank read in this run's part of ``epoch``."""
        per_rank = [torch.zeros_like(stats) for _ in range(world)]
        dist.all_gather(per_rank, stats)
        if rank == 0:
            total = torch.stack(per_rank).sum(0)
            print(json.dumps({
                "epoch": epoch, "world_size": world, "batches_per_rank": [int(s[0]) for s in per_rank],
                "samples_per_rank": [int(s[1]) for s in per_rank],
                "label_counts": [int(c) for c in total[3:]],
                "mean_loss": round(float(total[2] / max(total[1], 1)), 4), **extra}), flush=True)

    steps = 0
    for epoch in range(loader.epoch, args.epochs):  # loader.epoch: the epoch the next iteration reads
        stats = torch.zeros(3 + num_classes, dtype=torch.float64, device=device)  # batches, samples, loss, labels
        for batch in loader:
            images, labels = batch[0], batch[1]
            if mixing:  # batch[2]: the dataset of each sample; its labels follow the classes of the datasets before
                labels = labels + offsets[torch.as_tensor(batch[2])]
            x, y = to_device((images, labels), device, mean=MEAN, std=STD)
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients: every rank must take every step
            optimizer.step()
            stats[0] += 1
            stats[1] += len(y)
            stats[2] += loss.item() * len(y)
            stats[3:] += torch.bincount(y, minlength=num_classes).to(stats)
            steps += 1
            if args.save_every and steps % args.save_every == 0:
                save()  # after the step: that batch counts as consumed
            if args.max_steps is not None and steps >= args.max_steps:
                save()
                report(epoch, stats, stopped_after_steps=steps)
                dist.destroy_process_group()
                return
        report(epoch, stats)
        save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
