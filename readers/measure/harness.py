"""The training-loop harness: per-batch ``t_wait_s`` and ``t_compute_s`` of a real loop.

For every measured batch the loop times

``t_wait_s``
    the wall time the loop is blocked on the loader, *including* the host-to-device copy
    (:func:`shardfeed.readers.loader.to_device`, ``non_blocking`` from pinned memory; on CUDA the
    copy is synchronised before the clock stops, so the figure is time the device sits idle);
``t_compute_s``
    the step: forward + backward + optimizer step of the model. On CUDA it is timed with CUDA
    events and the step is synchronised at its end (so the next wait starts when the device is
    idle); on the CPU with ``time.perf_counter`` after synchronising. ``compute_ms=X`` replaces the
    model by ``time.sleep(X / 1000)``: a step that takes X ms but leaves the CPU to the loader, as
    a GPU step does.

``torch`` is imported lazily, inside the functions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .probes import loader_worker_pids
from .report import RunReport, TimingStats, fmt_bytes
from .sampling import MEMORY_GROWTH_FLAG_BYTES, GpuSampler, ProcessSampler

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DEFAULT_MEAN", "DEFAULT_STD", "select_device", "synchronize", "shutdown_loader", "run_training_loop"]

#: ImageNet mean and standard deviation of R, G, B on the [0, 1] scale (``to_device`` divides by 255 first).
DEFAULT_MEAN = (0.485, 0.456, 0.406)
DEFAULT_STD = (0.229, 0.224, 0.225)

logger = logging.getLogger(__name__)


def select_device(spec: "str | torch.device | None" = "auto") -> "torch.device":
    """Resolve ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ValueError: CUDA asked for but not available, or an index beyond the visible GPUs.
    """
    import torch

    if isinstance(spec, torch.device):
        dev = spec
    else:
        text = (spec or "auto").strip().lower()
        if text == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        try:
            dev = torch.device(text)
        except RuntimeError:
            raise ValueError(f"device {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!s}: CUDA is not available (torch {torch.__version__}); "
                             "use --device cpu or auto")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!s}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", index)
    elif dev.type != "cpu":
        logger.warning("device %s: only cpu and cuda are tested", dev)
    return dev


def synchronize(device: "torch.device") -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _num_classes_of(loader: Any) -> int | None:
    ds = getattr(loader, "dataset", loader)
    for obj in (ds, getattr(ds, "manifest", None)):
        if obj is None:
            continue
        for attr in ("classes", "class_to_idx"):
            value = getattr(obj, attr, None)
            if value:
                return len(value)
    return None


def _unlabelled(loader: Any) -> bool:
    """Whether the loader's dataset is unlabelled (a flat folder, a pack without labels: label -1)."""
    ds = getattr(loader, "dataset", loader)
    return getattr(ds, "labelled", None) is False or getattr(getattr(ds, "manifest", None), "labelled", None) is False


def _set_epoch(loader: Any, epoch: int) -> None:
    for obj in (loader, getattr(loader, "dataset", None), getattr(loader, "sampler", None)):
        fn = getattr(obj, "set_epoch", None)
        if callable(fn):
            fn(epoch)
            return


def shutdown_loader(loader: Any, it: Any) -> None:
    """Stop the worker processes of ``loader`` now, rather than at garbage collection."""
    for obj in (it, getattr(loader, "_iterator", None)):
        fn = getattr(obj, "_shutdown_workers", None)
        if callable(fn):
            with contextlib.suppress(Exception):
                fn()


class _Step:
    """One training step on a batch already on the device; returns its compute time, s."""

    def __init__(self, device: "torch.device", model: Any, compute_ms: float | None, lr: float,
                 channels_last: bool, unlabelled: bool = False):
        import torch

        self.device = device
        self.unlabelled = unlabelled  # label -1: every sample trained as class 0
        self.cuda = device.type == "cuda"
        self.compute_ms = compute_ms
        self.model = None
        self.kind = "sleep" if compute_ms is not None else ("none" if model is None else "train")
        if self.kind == "train":
            self.model = model.to(device)
            if channels_last:
                self.model = self.model.to(memory_format=torch.channels_last)
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
            self.loss_fn = torch.nn.CrossEntropyLoss()
        self.timing = "cuda_events" if self.cuda and self.kind == "train" else "perf_counter"
        if self.timing == "cuda_events":
            self._ev0 = torch.cuda.Event(enable_timing=True)
            self._ev1 = torch.cuda.Event(enable_timing=True)

    def _train(self, x, y) -> None:
        if self.unlabelled:
            y = y.clamp(min=0)
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def __call__(self, x, y) -> float:
        if self.timing == "cuda_events":
            self._ev0.record()
            self._train(x, y)
            self._ev1.record()
            self._ev1.synchronize()
            return self._ev0.elapsed_time(self._ev1) / 1000.0
        t0 = time.perf_counter()
        if self.kind == "sleep":
            time.sleep(self.compute_ms / 1000.0)
        elif self.kind == "train":
            self._train(x, y)
        synchronize(self.device)
        return time.perf_counter() - t0


class _Batches:
    """The loader's batches moved to the device, starting a new epoch when one ends."""

    def __init__(self, loader: Iterable, dev: "torch.device", mean, std, channels_last: bool):
        self.loader = loader
        self.dev = dev
        self.mean, self.std, self.channels_last = mean, std, channels_last
        self.it = None
        self.epochs = 1
        self.last_loader_wait_s = 0.0  # of the last fetch, the time in the loader (before the copy/conversion)

    def worker_pids(self) -> set[int] | None:
        """PIDs of the loader's live worker processes (None: unknown, every child counts)."""
        if self.it is None:  # before the first iter(loader): no worker yet
            return set()
        pids = loader_worker_pids(self.it, self.loader)
        return None if pids is None else set(pids)

    def start(self) -> None:
        """Start the first epoch (and the loader's workers)."""
        self.it = iter(self.loader)

    def _next(self):
        try:
            return next(self.it)
        except StopIteration:
            pass
        _set_epoch(self.loader, self.epochs)
        self.epochs += 1
        self.it = iter(self.loader)
        try:
            return next(self.it)
        except StopIteration:
            raise ValueError("the loader yields no batches (dataset smaller than one batch with drop_last?)") from None

    def fetch(self):
        """The next non-empty batch on the device, the copy finished: ``(float [B, 3, H, W], int64 [B])``."""
        from ..loader import to_device

        t0 = time.perf_counter()
        batch = self._next()
        while len(batch[1]) == 0:  # every sample of the batch skipped (on_error="skip"): keep waiting
            batch = self._next()
        self.last_loader_wait_s = time.perf_counter() - t0
        x, y = to_device(batch, self.dev, mean=self.mean, std=self.std, channels_last=self.channels_last)
        synchronize(self.dev)  # the copy (non_blocking) is part of the wait
        return x, y


def _check_counts(batches: int, warmup: int, compute_ms: float | None, num_threads: int | None) -> None:
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    if warmup < 0:
        raise ValueError(f"warmup must be 0 or more, got {warmup}")
    if compute_ms is not None and compute_ms < 0:
        raise ValueError(f"compute_ms must be 0 or more, got {compute_ms}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")


def _step_threads(loader: Any, dev: "torch.device", num_threads: int | None) -> int | None:
    """The torch thread count for the step (None: leave torch's)."""
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    if num_threads is None and dev.type == "cpu" and num_workers > 0:
        # the step and the loader workers share the CPU: leave the workers their cores
        num_threads = max(1, (os.cpu_count() or 1) - num_workers)
    return num_threads


def _model_object(model: Any, compute_ms: float | None, num_classes: int | None, loader: Any) -> Any:
    """The ``torch.nn.Module`` to train (None: no model)."""
    from .models import build_model

    if compute_ms is not None:
        return None
    if isinstance(model, str):
        n = num_classes or _num_classes_of(loader) or (1 if _unlabelled(loader) else None)
        if n is None and model.strip().lower() != "none":
            raise ValueError(f"model {model!r} needs num_classes (the loader's dataset does not say how many)")
        return build_model(model, n or 1)
    return model


def _measure(src: _Batches, step: _Step, warmup: int, batches: int, sample_gpu: bool, warnings: list) -> dict:
    """Warm up, then time ``batches`` batches; returns the raw figures of the window."""
    dev = src.dev
    whole_run = ProcessSampler(worker_pids=src.worker_pids)  # from before the first batch: warm-up reads too
    whole_run.start()
    t_warmup = time.perf_counter()
    src.start()
    sampler = ProcessSampler(worker_pids=src.worker_pids)
    gpu_sampler = None
    out: dict[str, Any] = {"waits": [], "computes": [], "starts": [], "sizes": [], "num_samples": 0,
                           "gpu_stats": None, "warmup_samples": 0, "loader_waits": []}
    try:
        for _ in range(warmup):
            x, y = src.fetch()
            step(x, y)
            out["warmup_samples"] += int(x.shape[0])
        if dev.type == "cuda" and sample_gpu:
            gpu_sampler = GpuSampler(dev.index or 0)
            if not gpu_sampler.start():
                warnings.append(gpu_sampler.error or "GPU utilisation not sampled")
                gpu_sampler = None
        sampler.start()
        t_start = time.perf_counter()
        out["warmup_s"] = t_start - t_warmup
        for _ in range(batches):
            t0 = time.perf_counter()
            x, y = src.fetch()
            t1 = time.perf_counter()
            t_compute = step(x, y)
            out["starts"].append(t0 - t_start)
            out["waits"].append(t1 - t0)
            out["loader_waits"].append(min(src.last_loader_wait_s, t1 - t0))
            out["computes"].append(t_compute)
            out["sizes"].append(int(x.shape[0]))
            out["num_samples"] += int(x.shape[0])
        out["seconds"] = time.perf_counter() - t_start
        out["cpu"], io, out["memory"], out["system"] = sampler.stop()
        _, io_whole, _, _ = whole_run.stop()
        if io is not None and io_whole is not None:
            io["read_bytes_with_warmup"] = io_whole["read_bytes"]
            io["rchar_with_warmup"] = io_whole["rchar"]
        out["io"] = io
        out["gpu_stats"] = gpu_sampler.stop() if gpu_sampler else None
        gpu_sampler = None
    finally:
        if gpu_sampler is not None:
            gpu_sampler.stop()
    return out


def _resource_warnings(memory: dict | None, system: dict | None) -> list[str]:
    warnings = []
    if memory and memory["growth_flag"]:
        warnings.append(f"memory grew by {fmt_bytes(memory['growth_bytes'])} during the run "
                        f"({fmt_bytes(memory['total_rss_start_bytes'])} -> "
                        f"{fmt_bytes(memory['total_rss_end_bytes'])})")
    if system and system.get("swap_used_end_bytes"):
        if system["swap_used_end_bytes"] > (system.get("swap_used_start_bytes") or 0) + MEMORY_GROWTH_FLAG_BYTES:
            warnings.append("swap use grew during the run: the machine is short of memory")
    return warnings


def _gpu_figures(dev: "torch.device", gpu_stats: dict | None) -> tuple[dict | None, float | None]:
    """``(gpu, gpu_util)`` of :class:`RunReport` (None, None off CUDA)."""
    import torch

    if dev.type != "cuda":
        return None, None
    gpu = {"name": torch.cuda.get_device_name(dev),
           "max_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)), "nvml": gpu_stats}
    return gpu, (gpu_stats["util_mean"] if gpu_stats else None)


def run_training_loop(loader: Iterable, *, model: "str | torch.nn.Module | None" = "tiny",
                      device: "str | torch.device" = "auto", compute_ms: float | None = None, warmup: int = 10,
                      batches: int = 100, num_classes: int | None = None,
                      mean: Sequence[float] | None = DEFAULT_MEAN, std: Sequence[float] | None = DEFAULT_STD,
                      channels_last: bool = False, lr: float = 0.01, config: dict | None = None,
                      label: str | None = None, sample_gpu: bool = True, shutdown: bool = True,
                      num_threads: int | None = None) -> RunReport:
    """Run a training loop over ``loader`` and time every batch (see the module docstring).

    The loader is iterated for ``warmup`` batches (not counted: worker start, first reads,
    allocator and cuDNN warm-up), then for ``batches`` measured ones; when an epoch ends before
    that, the next one starts (``set_epoch`` is called when the loader has it). Each batch is
    moved with :func:`shardfeed.readers.loader.to_device` (``non_blocking``, normalised on the
    device) and fed to the step.

    Args:
        loader: yields ``(uint8 [B, 3, H, W], int64 [B])`` (e.g. from ``make_loader``).
        model: a built-in model name (``tiny``, ``resnet18``, ``resnet50``, ``none``,
            ``module:callable``; see :mod:`shardfeed.readers.measure.models`), a ``torch.nn.Module``, or
            None (no compute).
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``.
        compute_ms: replace the model by a step that sleeps this many ms (leaving the CPU free).
        warmup: batches run before measuring.
        batches: batches measured (≥ 1).
        num_classes: logits of a named model; default: the loader's dataset's class count.
        mean, std: per-channel normalisation after scaling to [0, 1] (None: none).
        channels_last: channels-last memory format for the batch and the model.
        lr: SGD learning rate (momentum 0.9).
        config: recorded in the report as its configuration.
        label: a name for the report.
        sample_gpu: on CUDA, sample utilisation and memory from NVML.
        shutdown: stop the loader's worker processes when done.
        num_threads: ``torch.set_num_threads`` for the step in this process. None: on the CPU
            with worker processes, ``max(1, cores - num_workers)`` (the workers use one thread
            each, and a step with a thread per core fights them for the cores: on 2 cores that
            cost the loader ~30 % here); otherwise torch's default.

    Returns:
        The :class:`RunReport`.

    Raises:
        ValueError: bad counts, an empty loader, a model that needs ``num_classes``.
    """
    import torch

    _check_counts(batches, warmup, compute_ms, num_threads)
    dev = select_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    threads_before = torch.get_num_threads()
    num_threads = _step_threads(loader, dev, num_threads)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model_name = model if isinstance(model, str) else (None if model is None else type(model).__name__)
    step = _Step(dev, _model_object(model, compute_ms, num_classes, loader), compute_ms, lr, channels_last,
                 unlabelled=_unlabelled(loader))
    warnings: list[str] = []
    src = _Batches(loader, dev, mean, std, channels_last)
    try:
        m = _measure(src, step, warmup, batches, sample_gpu, warnings)
    finally:
        if shutdown:
            shutdown_loader(loader, src.it)
        used_threads = torch.get_num_threads()
        torch.set_num_threads(threads_before)
    gpu, gpu_util = _gpu_figures(dev, m["gpu_stats"])
    waits, computes, seconds = m["waits"], m["computes"], m["seconds"]
    total_wait, total_compute = sum(waits), sum(computes)
    stall = total_wait / (total_wait + total_compute) if total_wait + total_compute > 0 else 0.0
    warnings += _resource_warnings(m["memory"], m["system"])
    cfg = {**(config or {})}
    for key, value in (("model", model_name if compute_ms is None else None), ("compute_ms", compute_ms),
                       ("warmup", warmup), ("batches", batches), ("channels_last", channels_last),
                       ("torch_threads", used_threads),
                       ("normalize", {"mean": list(mean) if mean else None, "std": list(std) if std else None})):
        cfg.setdefault(key, value)
    return RunReport(
        images_per_s=m["num_samples"] / seconds if seconds > 0 else 0.0, num_batches=len(waits),
        num_samples=m["num_samples"], seconds=seconds, t_wait_s=TimingStats.of(waits),
        t_compute_s=TimingStats.of(computes), stall_share=stall, device=str(dev), timing=step.timing,
        gpu_util=gpu_util, gpu=gpu, cpu=m["cpu"], io=m["io"], memory=m["memory"], system=m["system"], config=cfg,
        batches={"t_start_s": m["starts"], "t_wait_s": waits, "t_compute_s": computes, "num_samples": m["sizes"]},
        epochs=src.epochs, label=label, warnings=warnings, warmup_s=m["warmup_s"], warmup_samples=m["warmup_samples"],
        t_loader_wait_s=TimingStats.of(m["loader_waits"]))
