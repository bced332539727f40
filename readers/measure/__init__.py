"""Throughput measurement: the training-loop harness behind ``shardfeed bench``, ``verify`` and ``tune``.

The method is the one practitioners use to find a data-loading bottleneck (docs/measuring.md): run
a real training loop, and for every batch time

``t_wait_s``
    the wall time the loop is blocked on the loader, *including* the host-to-device copy
    (:func:`shardfeed.readers.loader.to_device`, ``non_blocking`` from pinned memory; on CUDA the
    copy is synchronised before the clock stops, so the figure is time the device sits idle);
``t_compute_s``
    the step: forward + backward + optimizer step of the model. On CUDA it is timed with CUDA
    events and the step is synchronised at its end (so the next wait starts when the device is
    idle); on the CPU with ``time.perf_counter`` after synchronising. ``compute_ms=X`` replaces the
    model by ``time.sleep(X / 1000)``: a step that takes X ms but leaves the CPU to the loader, as
    a GPU step does ("would this loader keep up with a GPU that needs X ms per step?").

From these a :class:`RunReport` gives images/s (samples / measured wall time), mean/p50/p95 of
both times and the data-stall share Σ t_wait / Σ (t_wait + t_compute), together with what the
machine did meanwhile, read through psutil (None where a figure is not readable):

* CPU time of the main process and of the ``DataLoader`` worker processes (live ones read
  directly, finished ones through the parent's reaped-children CPU time), as cores busy;
* bytes read by the same processes: ``read_bytes`` (fetched from the storage device: page-cache
  misses) and ``rchar`` (every ``read()``, cache hits included; Linux);
* resident memory (RSS) of the main process and the workers at the start and end of the measured
  window, with growth of more than :data:`MEMORY_GROWTH_FLAG_BYTES` and
  :data:`MEMORY_GROWTH_FLAG_SHARE` flagged; swap in use; the machine's share of CPU time in I/O
  wait, and the CPU time other processes took;
* on CUDA, GPU utilisation and memory sampled from NVML (``nvidia-ml-py``, the ``gpu`` extra) by
  a background thread every :data:`GPU_SAMPLE_INTERVAL_S`.

``cold=True`` evicts the dataset's files from the page cache first with
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` and checks with ``mincore(2)`` (or the
``fincore`` tool) whether the file system honoured it: tmpfs (``/dev/shm``) keeps the pages, and
the report says so. Pages mapped by a running process are not evicted either. ZFS's ARC ignores
the advice without ``mincore`` noticing. On FUSE and network file systems the residency is not
measurable (FUSE drops pages on open; the server keeps its own cache) and the report says so.


The package, by concern:

* :mod:`.report`: :class:`RunReport`, :class:`TimingStats` (what a run produced);
* :mod:`.sampling`: process (psutil) and NVML sampling for ``bench``, ``verify`` and ``watch``
  (:class:`ProcessSampler`, :class:`GpuSampler`);
* :mod:`.probes`: mounts, memory, stored images and torch's ``DataLoader`` internals;
* :mod:`.cache`: the dataset's files, page-cache residency and eviction;
* :mod:`.harness`: the training loop (:func:`run_training_loop`, :func:`select_device`);
* :mod:`.bench`: one loader on one dataset (:func:`bench_source`);
* :mod:`.check`, :mod:`.verify`: same samples? then before vs after (:func:`compare_sources`);
* :mod:`.verdict`: the verdict from every round, or none when the noise exceeds the effect;
* :mod:`.tune`: the ``DataLoader`` knob sweep (:func:`tune_loader`);
* :mod:`.tables`: the printed tables;
* :mod:`.figures`: the ``--plot`` pictures; :mod:`.html_report`: the ``--html`` page.
"""

from __future__ import annotations

from .bench import bench_source
from .cache import (EVICTION_IGNORED_SHARE, dataset_files, detect_source_format, evict_page_cache, page_cache_residency,
                    settle_disk, warm_page_cache)
from .check import check_same_samples
from .harness import DEFAULT_MEAN, DEFAULT_STD, run_training_loop, select_device
from .report import DatasetMismatchError, RunReport, TimingStats
from .sampling import (GPU_SAMPLE_INTERVAL_S, MEMORY_GROWTH_FLAG_BYTES, MEMORY_GROWTH_FLAG_SHARE, GpuSampler,
                       ProcessSampler)
from .figures import DeliverySeries, plot_delivery, plot_tune, series_of_run, series_of_watch
from .html_report import HtmlTable, render_html_report, write_html_report
from .tables import (TUNE_HEADER, comparison_headline, comparison_rows, decode_cost_note, format_comparison,
                     format_report, format_table, plot_runs, report_rows, tune_rows, verdict_headline, verify_headline)
from .tune import TuneReport, make_loader_call, tune_loader
from .verdict import judge_rounds
from .verify import VerifyReport, compare_sources

__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "GPU_SAMPLE_INTERVAL_S",
    "MEMORY_GROWTH_FLAG_BYTES",
    "MEMORY_GROWTH_FLAG_SHARE",
    "EVICTION_IGNORED_SHARE",
    "DatasetMismatchError",
    "TimingStats",
    "RunReport",
    "VerifyReport",
    "TuneReport",
    "select_device",
    "run_training_loop",
    "bench_source",
    "detect_source_format",
    "dataset_files",
    "page_cache_residency",
    "evict_page_cache",
    "settle_disk",
    "warm_page_cache",
    "ProcessSampler",
    "GpuSampler",
    "check_same_samples",
    "compare_sources",
    "tune_loader",
    "format_table",
    "format_report",
    "format_comparison",
    "comparison_headline",
    "verdict_headline",
    "judge_rounds",
    "make_loader_call",
    "plot_runs",
    "verify_headline",
    "decode_cost_note",
    "comparison_rows",
    "report_rows",
    "tune_rows",
    "TUNE_HEADER",
    "DeliverySeries",
    "plot_delivery",
    "plot_tune",
    "series_of_run",
    "series_of_watch",
    "HtmlTable",
    "render_html_report",
    "write_html_report",
]
