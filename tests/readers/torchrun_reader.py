"""Run under torchrun by test_distributed.py: read each dataset, write what this rank saw.

Usage: python -m torch.distributed.run --nproc_per_node=2 torchrun_reader.py OUT_DIR \\
    NAME=SOURCE,BATCH,WORKERS,EPOCHS ...
Writes ``OUT_DIR/{NAME}-rank{R}.json``: ``{"rank", "world_size", "len", "epochs": [[[key, ...], ...], ...]}``.
"""

import json
import sys

import torch.distributed as dist

from shardfeed.readers import make_loader


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for spec in sys.argv[2:]:
        name, _, rest = spec.partition("=")
        source, batch, workers, epochs = rest.split(",")
        loader = make_loader(source, int(batch), num_workers=int(workers), decode=False, seed=5)
        report = {"rank": rank, "world_size": dist.get_world_size(), "len": len(loader), "epochs": []}
        for _ in range(int(epochs)):
            report["epochs"].append([[s.key for s in b] for b in loader])
        with open(f"{out_dir}/{name}-rank{rank}.json", "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
