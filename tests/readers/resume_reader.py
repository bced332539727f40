"""Read batches from a loader, optionally after ``load_state_dict``; used by test_resume.py.

As a module: :func:`run_job`. As a script (a fresh process, or under torchrun):

    python resume_reader.py JOBS.json OUT_DIR

``JOBS.json`` is a list of jobs ``{"name", "source", "batch_size", "kw", "state", "num_batches",
"save_after"}``; under torchrun (``RANK`` set) the process group is initialised (gloo) and
``{name}-rank{R}.json`` is written, else ``{name}.json``. A job reads ``num_batches`` batches
across epochs (after loading ``state`` when given) and records, per batch, the epoch, the sample
keys (raw mode) or a hash of each image tensor (decoded mode) and the labels; ``save_after``
lists the batch counts after which ``loader.state_dict()`` is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def _describe(batch, decoded: bool) -> tuple[list, list]:
    if decoded:
        images, labels = batch
        return ([hashlib.sha256(img.numpy().tobytes()).hexdigest()[:16] for img in images],
                [int(x) for x in labels])
    return [s.key for s in batch], [int(s.label) for s in batch]


def run_job(job: dict) -> dict:
    """Run one job in this process; returns ``{"batches": [[epoch, ids, labels], ...], "states":
    {count: state}, "len": len(loader)}``."""
    from shardfeed.readers import make_loader

    kw = dict(job.get("kw", {}))
    decoded = kw.get("decode", True)
    loader = make_loader(job["source"], job["batch_size"], **kw)
    if job.get("state") is not None:
        loader.load_state_dict(job["state"])
    save_after = set(job.get("save_after", []))
    out = {"batches": [], "states": {}, "len": len(loader)}
    if 0 in save_after:
        out["states"]["0"] = loader.state_dict()
    want = int(job["num_batches"])
    empty_epochs = 0
    while len(out["batches"]) < want:
        epoch = loader.epoch
        got = 0
        for batch in loader:
            ids, labels = _describe(batch, decoded)
            out["batches"].append([epoch, ids, labels])
            got += 1
            n = len(out["batches"])
            if n in save_after:
                out["states"][str(n)] = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint keeps
            if n >= want:
                break
        empty_epochs = empty_epochs + 1 if got == 0 else 0
        if empty_epochs > 2:
            raise RuntimeError("the loader yields nothing")
    return out


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    out_dir = sys.argv[2]
    dist = None
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    suffix = f"-rank{dist.get_rank()}" if dist is not None else ""
    for job in jobs:
        result = run_job(job)
        with open(os.path.join(out_dir, f"{job['name']}{suffix}.json"), "w") as f:
            json.dump(result, f)
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
