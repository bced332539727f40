#!/usr/bin/env python3
"""Does ``watch`` name the bottleneck that was planted? A confusion matrix, and the stall against the loop's own clock.

Each scenario plants one bottleneck in a short loop (a few seconds) over a plain ``DataLoader``:

* ``storage-2ms`` / ``storage-10ms``: a user's ``Dataset`` of small JPEG files on the storage
  emulator (scripts/storage_emulator.py, FUSE), 2 or 10 ms per open and per read request;
* ``cpu-decode``: large JPEGs (1600 x 1200) decoded and resized by one worker;
* ``cpu-others``: the same decoding by two workers while CPU-burning processes (two per core) hold the cores;
* ``handoff``: batches of 64 tensors (one per sample) handed from one worker to the main process;
* ``compute``: a long step (500 ms) over small local files. The loop still waits about 5 to 15 ms
  per batch on a busy machine (the hand-off of each batch and waking the main process); against a
  150 ms step that was a stall of 7 to 12 %, inside the band of the 10 % threshold (± 3 points).
  Against 500 ms it is 1 to 3.6 %, at least 3.4 points below the band's lower edge (7 %);
* ``validation``: a Lightning trainer whose validation takes about as long as training (a fast
  train loader: the data wait is small, the validation is "other" time).

Each runs through ``watch(loader)`` in this process (``inproc``), an unmodified script under
``shardfeed watch --`` (``cli``), and the Lightning and Hugging Face callbacks (``lightning``,
``hf``) where they apply, ``--runs`` times each, optionally with ``--burners`` CPU-burning
processes beside the whole matrix. The loop times its own waits in ``next()`` with
``time.perf_counter`` (a trainer's loader is a ``DataLoader`` subclass whose iterator times each
``next()``; the window runs from the end of the first step to the end of training, as the callbacks'
own does: time after the last step, such as a last validation, is part of the run), and the table
gives the watch's stall share beside that one.

Accepted kinds: the planted kind, and for ``cpu-decode`` also ``cpu-contended`` (a busy machine's
other processes take cores too; the CPU is the limit either way); a ``borderline`` verdict counts
when both its kinds are accepted. Targets: 95 % of runs name an
accepted kind, no run over page-cache data (every scenario but the storage ones) is called
``storage-bound``, and the stall within 5 points of the loop's own.

Example::

    python scripts/validate_watch.py --runs 5 --burners 2 --json out/bench/validate_watch.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["main", "SCENARIOS"]

#: scenario: (planted kind, accepted kinds, modes, loader settings)
SCENARIOS = {
    "storage-2ms": ("storage-bound", {"storage-bound"}, ("inproc", "cli", "lightning", "hf"),
                    dict(data="mount", batch_size=8, workers=2, step_ms=5, latency_ms=2)),
    "storage-10ms": ("storage-bound", {"storage-bound"}, ("inproc", "cli"),
                     dict(data="mount", batch_size=8, workers=2, step_ms=5, latency_ms=10, max_batches=16)),
    "cpu-decode": ("cpu-bound", {"cpu-bound", "cpu-contended"}, ("inproc", "cli", "lightning", "hf"),
                   dict(data="large", batch_size=2, workers=1, step_ms=5)),
    "cpu-others": ("cpu-contended", {"cpu-contended"}, ("inproc", "cli"),
                   dict(data="large", batch_size=2, workers=2, step_ms=5, burners_per_core=2)),
    "handoff": ("handoff-bound", {"handoff-bound"}, ("inproc", "cli", "lightning"),
                dict(data="tensors", batch_size=64, workers=1, step_ms=8)),
    "compute": ("compute-bound", {"compute-bound"}, ("inproc", "cli", "lightning", "hf"),
                dict(data="small", batch_size=8, workers=2, step_ms=500, max_batches=12)),
    "validation": ("compute-bound", {"compute-bound"}, ("lightning",),
                   dict(data="tensors-fast", batch_size=4, workers=0, step_ms=10, max_batches=40)),
}
#: Storage scenarios read through the emulator; every other one reads local files or memory (the page cache).
STORAGE = {"storage-2ms", "storage-10ms"}


# ---------------------------------------------------------------------------------------------
# data and loaders (also run in the child process of ``cli``)


def make_images(root: Path, count: int, size: tuple[int, int]) -> list[Path]:
    """``count`` JPEGs of ``size`` (w, h) under ``root`` (a gradient with noise: a photo-like cost to decode)."""
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w, h = size
    base = (np.add.outer(np.arange(h), np.arange(w)) % 256).astype(np.uint8)
    paths = []
    for i in range(count):
        path = root / f"{i:05d}.jpg"
        if not path.exists():
            noise = rng.integers(0, 32, (h, w, 3), dtype=np.uint8)
            Image.fromarray(np.dstack([base, base[::-1], base[:, ::-1]]) + noise).save(path, quality=90)
        paths.append(path)
    return paths


class FilesDataset:
    """A user's map-style ``Dataset``: open, PIL decode, resize to 32 px, ``(uint8 [3, 32, 32], 0)``."""

    def __init__(self, paths):
        self.paths = [str(p) for p in paths]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image

        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB").resize((32, 32))
        return torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous(), 0


class SmallTensors:
    """8 x 8 zero images, ready at once (with :func:`per_sample_list`: one tensor per sample in a batch)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        return torch.zeros(3, 8, 8, dtype=torch.uint8), 0


def per_sample_list(samples):
    return [x for x, _ in samples]


class TimedIter:
    """A ``DataLoader`` iterator that times each ``next()`` by the loop's own clock (``log``: (start, end), and
    (start, end, False) for the call that ends the pass: no batch, the workers shut down)."""

    def __init__(self, it, log: list):
        self._it, self._log = it, log

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __getattr__(self, name):
        return getattr(self.__dict__["_it"], name)

    def __next__(self):
        t0 = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._log.append((t0, time.perf_counter(), False))
            raise
        self._log.append((t0, time.perf_counter()))
        return batch


def make_loader(spec: dict, dirs: dict, timed_log: list | None = None, dict_batches: bool = False):
    """The scenario's ``DataLoader`` (a subclass timing each ``next()`` into ``timed_log`` when given)."""
    from torch.utils.data import DataLoader

    kind = spec["data"]
    collate = None
    if kind in ("mount", "large", "small"):
        ds = FilesDataset(sorted(Path(dirs[kind]).glob("*.jpg")))
    elif kind == "tensors":
        ds, collate = SmallTensors(64 * 24), per_sample_list
    else:
        ds = SmallTensors(spec["batch_size"] * spec.get("max_batches", 40))
    if dict_batches:  # the Hugging Face Trainer calls model(**batch)
        import torch
        from torch.utils.data import default_collate

        inner, stacked = collate or default_collate, collate is None
        collate = (lambda s: {"x": inner(s)[0] if stacked else inner(s), "labels": torch.zeros(len(s))})
    cls = DataLoader
    if timed_log is not None:
        class TimedLoader(DataLoader):
            def __iter__(self):
                return TimedIter(super().__iter__(), timed_log)
        cls = TimedLoader
    return cls(ds, batch_size=spec["batch_size"], num_workers=spec["workers"], collate_fn=collate, shuffle=False)


def own_loop(loader, spec: dict) -> tuple[list, list]:
    """Iterate ``loader`` with the scenario's step; the waits and steps by this loop's own perf_counter."""
    waits, steps = [], []
    it = iter(loader)
    for _ in range(spec.get("max_batches", 10 ** 9)):
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        time.sleep(spec["step_ms"] / 1000)
        waits.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    shutdown = getattr(it, "_shutdown_workers", None)  # a pass left early: stop its workers now, here
    if callable(shutdown):
        shutdown()
    return waits, steps


def own_stall(waits: list, steps: list) -> float | None:
    """Σ wait / Σ (wait + step), the first batch left out (the watch's warm-up)."""
    w, s = sum(waits[1:]), sum(steps[1:])
    return w / (w + s) if w + s > 0 else None


def window_stall(fetches: list, t_first_step_end: float | None, t_end: float | None) -> float | None:
    """A trainer's stall by its own clock: fetch time inside ``[end of the first step, end of training]`` over that
    window. A call that ended the pass (``(start, end, False)``: no batch) is neither data wait nor training: its
    time is left out of the window, as the callbacks leave it out."""
    if t_first_step_end is None or t_end is None or t_end <= t_first_step_end:
        return None
    inside = {True: 0.0, False: 0.0}
    for a, b, *rest in fetches:
        if t_first_step_end <= a < t_end:
            inside[bool(rest[0]) if rest else True] += min(b, t_end) - a
    window = t_end - t_first_step_end - inside[False]
    return inside[True] / window if window > 0 else None


# ---------------------------------------------------------------------------------------------
# one run per mode: (the watch's report as JSON, the loop's own stall)


def run_inproc(spec: dict, dirs: dict) -> tuple[dict, float | None]:
    from shardfeed.readers import watch

    w = watch(make_loader(spec, dirs))
    waits, steps = own_loop(w, spec)
    rep = w.report()
    w.close()
    return rep.to_json(), own_stall(waits, steps)


def run_cli(name: str, dirs: dict, work: Path) -> tuple[dict, float | None]:
    report, own = work / f"{name}-watch.json", work / f"{name}-own.json"
    cmd = [sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report), "--", sys.executable,
           str(Path(__file__).resolve()), "--child", name, "--own", str(own), "--dirs", json.dumps(dirs)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not report.exists():
        raise RuntimeError(f"shardfeed watch -- exited {r.returncode}: {r.stderr[-2000:]}")
    mine = json.loads(own.read_text())
    return json.loads(report.read_text())["loaders"][0], own_stall(mine["waits"], mine["steps"])


def _step(spec: dict) -> None:
    time.sleep(spec["step_ms"] / 1000)


def run_lightning(name: str, spec: dict, dirs: dict) -> tuple[dict, float | None]:
    import lightning.pytorch as pl
    import torch

    from shardfeed.readers.integrations.lightning import WatchCallback

    fetches, marks, ends = [], [], []
    heavy_val = name == "validation"

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            _step(spec)
            return self.w.sum() * 0.0

        def on_train_batch_end(self, outputs, batch, i):
            marks.append(time.perf_counter())

        def validation_step(self, batch, i):
            time.sleep(0.015)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    loader = make_loader(spec, dirs, fetches)
    val = make_loader(dict(spec, data="tensors-fast", batch_size=1, workers=0, max_batches=8), dirs) if heavy_val else None
    class End(pl.Callback):  # before the watch's callback, which then builds its report
        def on_train_end(self, trainer, module):
            ends.append(time.perf_counter())

    cb = WatchCallback()
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=spec.get("max_batches", 1.0), accelerator="cpu",
                         callbacks=[End(), cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         val_check_interval=10 if heavy_val else None, limit_val_batches=8 if heavy_val else 0)
    trainer.fit(Module(), train_dataloaders=loader, val_dataloaders=val)
    return cb.report.to_json(), window_stall(fetches, marks[0] if marks else None, ends[-1] if ends else None)


def run_hf(spec: dict, dirs: dict, work: Path) -> tuple[dict, float | None]:
    import torch
    import transformers

    from shardfeed.readers.integrations.transformers import WatchTrainerCallback

    fetches, marks, ends = [], [], []
    loader = make_loader(spec, dirs, fetches, dict_batches=True)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, labels=None):
            _step(spec)
            return {"loss": self.w.sum() * 0.0}

    class Marks(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):  # before the watch's callback builds its report
            ends.append(time.perf_counter())

    class Trainer(transformers.Trainer):
        def get_train_dataloader(self):
            return loader

    steps = min(len(loader), spec.get("max_batches", 10 ** 9))
    args = transformers.TrainingArguments(output_dir=str(work / "hf"), max_steps=steps, report_to=[], use_cpu=True,
                                          save_strategy="no", disable_tqdm=True, logging_steps=10 ** 6,
                                          per_device_train_batch_size=spec["batch_size"])
    cb = WatchTrainerCallback()
    Trainer(model=Model(), args=args, train_dataset=loader.dataset, callbacks=[Marks(), cb]).train()
    return cb.report.to_json(), window_stall(fetches, marks[0] if marks else None, ends[-1] if ends else None)


def child(name: str, own: Path, dirs: dict) -> int:
    """The unmodified script of the ``cli`` mode: a plain loop that writes its own timings."""
    spec = SCENARIOS[name][3]
    waits, steps = own_loop(make_loader(spec, dirs), spec)
    own.write_text(json.dumps({"waits": waits, "steps": steps}))
    return 0


# ---------------------------------------------------------------------------------------------
# the matrix


def start_burners(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_burners(procs: list) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


def one_run(name: str, mode: str, dirs: dict, work: Path) -> dict:
    """One scenario through one mode: the named kind, both stalls, the figures that decided it."""
    spec = SCENARIOS[name][3]
    burners = start_burners(spec.get("burners_per_core", 0) * (os.cpu_count() or 1))
    try:
        if mode == "inproc":
            rep, own = run_inproc(spec, dirs)
        elif mode == "cli":
            rep, own = run_cli(name, dirs, work)
        elif mode == "lightning":
            rep, own = run_lightning(name, spec, dirs)
        else:
            rep, own = run_hf(spec, dirs, work)
    finally:
        stop_burners(burners)
        gc.collect()  # a trainer's loader iterators, and so their workers, go now, not during the next run
    d = rep["diagnosis"]
    return {"scenario": name, "mode": mode, "planted": SCENARIOS[name][0], "named": d["kind"],
            "between": d.get("between"), "ok": _accepted(d, SCENARIOS[name][1]), "stall": rep["stall_share"],
            "own_stall": own, "other_share": rep.get("other_share"), "decided_by": d.get("decided_by"),
            "evidence": d.get("evidence"),
            "batches": rep["batches"]}


def _accepted(diagnosis: dict, kinds: set) -> bool:
    """An accepted kind, or a borderline verdict between two accepted kinds."""
    between = diagnosis.get("between") or []
    return diagnosis["kind"] in kinds or (diagnosis["kind"] == "borderline" and set(between) <= kinds)


def run_matrix(names: list, modes: set, runs: int, data_root: Path, work: Path) -> list:
    from storage_emulator import StorageEmulator, fuse_unavailable_reason

    dirs = {"small": str(data_root / "small"), "large": str(data_root / "large")}
    make_images(Path(dirs["small"]), 256, (64, 64))
    make_images(Path(dirs["large"]), 48, (1600, 1200))
    fuse_reason = fuse_unavailable_reason()
    rows = []
    for name in names:
        spec = SCENARIOS[name][3]
        emu = None
        if spec["data"] == "mount":
            if fuse_reason:
                print(f"validate_watch: {name} left out: {fuse_reason}", file=sys.stderr)
                continue
            ms = spec["latency_ms"]
            emu = StorageEmulator(dirs["small"], open_ms=ms, read_ms=ms).start()
            dirs["mount"] = str(emu.mountpoint)
        try:
            for mode in SCENARIOS[name][2]:
                if mode not in modes:
                    continue
                for _ in range(runs):
                    try:
                        row = one_run(name, mode, dirs, work)
                    except Exception as exc:  # noqa: BLE001 - a failed run is a row of the table, not the end
                        row = {"scenario": name, "mode": mode, "planted": SCENARIOS[name][0], "named": "error",
                               "ok": False, "stall": None, "own_stall": None, "error": str(exc)[-500:]}
                    rows.append(row)
                    print(_row_line(row), flush=True)
        finally:
            if emu is not None:
                emu.stop()
    return rows


def pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _row_line(r: dict) -> str:
    delta = abs(r["stall"] - r["own_stall"]) * 100 if r.get("stall") is not None and r.get("own_stall") is not None \
        else None
    named = r["named"] + (f" ({' or '.join(r['between'])})" if r.get("between") else "")
    return (f"| {r['scenario']} | {r['mode']} | {r['planted']} | {named} | {'yes' if r['ok'] else 'NO'} | "
            f"{pct(r.get('stall'))} | {pct(r.get('own_stall'))} | "
            f"{'n/a' if delta is None else f'{delta:.1f}'} | {pct(r.get('other_share'))} |"
            + (f" {r['error']}" if r.get("error") else ""))


def summarise(rows: list) -> dict:
    """The confusion matrix (planted kind → named kind → runs) and the targets' figures."""
    matrix: dict = {}
    for r in rows:
        cell = matrix.setdefault(r["planted"], {})
        cell[r["named"]] = cell.get(r["named"], 0) + 1
    deltas = [abs(r["stall"] - r["own_stall"]) for r in rows if r.get("stall") is not None
              and r.get("own_stall") is not None]
    page_cache_storage = sum(1 for r in rows if r["scenario"] not in STORAGE and r["named"] == "storage-bound")
    return {"runs": len(rows), "named_planted_share": sum(r["ok"] for r in rows) / len(rows) if rows else None,
            "page_cache_called_storage": page_cache_storage,
            "stall_delta_max_points": max(deltas) * 100 if deltas else None, "matrix": matrix}


def print_report(rows: list, summary: dict) -> None:
    print("\n| scenario | mode | planted | named | right | stall (watch) | stall (own clock) | Δ points | other |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(_row_line(r))
    kinds = sorted({k for cell in summary["matrix"].values() for k in cell})
    print("\n| planted \\ named | " + " | ".join(kinds) + " |")
    print("| --- |" + " --- |" * len(kinds))
    for planted, cell in sorted(summary["matrix"].items()):
        print(f"| {planted} | " + " | ".join(str(cell.get(k, "")) for k in kinds) + " |")
    print(f"\nnamed the planted kind: {pct(summary['named_planted_share'])} of {summary['runs']} runs (target ≥ 95%); "
          f"page-cache runs called storage-bound: {summary['page_cache_called_storage']} (target 0); "
          f"largest stall difference: {summary['stall_delta_max_points']:.1f} points (target ≤ 5)"
          if summary["stall_delta_max_points"] is not None else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each scenario and mode (default 5)")
    p.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside the whole matrix")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--modes", default="inproc,cli,lightning,hf")
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardfeed-validate-watch")
    p.add_argument("--json", type=Path, help="write every run and the matrix here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--own", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--dirs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.own, json.loads(args.dirs))
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not 1 <= args.runs <= 100 or not 0 <= args.burners <= 64:
        p.error(f"unknown scenarios {unknown}" if unknown else "--runs 1..100, --burners 0..64")
    burners = start_burners(args.burners)
    try:
        with tempfile.TemporaryDirectory(prefix="validate-watch-") as work:
            rows = run_matrix(names, set(args.modes.split(",")), args.runs, args.data, Path(work))
    finally:
        stop_burners(burners)
    summary = summarise(rows)
    print_report(rows, summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": args.runs, "burners": args.burners, "rows": rows,
                                         "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
