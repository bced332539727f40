"""The diagnosis of a watched loop from the figures the watch measured, with the figures that decided it.

The rules take plain figures (shares in [0, 1], bytes per second), so each one can be checked on
planted figures. :func:`gather_evidence` collects them from a report's parts; :func:`judge` walks
the rules in order; :func:`diagnose` adds the text and the advice.

Each threshold has a margin. A figure within ``threshold ± margin`` is in the band: when the two
sides of the band lead to different kinds, the verdict is ``borderline`` between them (with the
kind the figure's side leads to first) rather than one kind on one run and the other on the next.

Storage waits are told from CPU starvation by what the workers did while the loop waited: CPU
starvation is time runnable but not running (the scheduler's run-queue wait from
``/proc/PID/schedstat``, else the share of samples in state ``R`` less the CPU busy share); storage
is time asleep, with bytes read from block devices, I/O wait, or a network or user-space mount as
its signs. Data read without any of these came from the page cache: then no storage advice
(``pack``, ``stage``, ``cache="memory"``) is given.
"""

from __future__ import annotations

from .report import fmt_bytes

__all__ = ["DIAGNOSIS_KINDS", "STALL_COMPUTE_BOUND", "WORKER_CPU_SATURATED", "BATCH_READY_HANDOFF",
           "MAIN_CPU_SATURATED", "WORKER_RUNQUEUE_STARVED", "OTHERS_CPU_CONTENDED", "WORKER_SLEEP_STORAGE",
           "PAGE_CACHE_MAX_BLOCK_READ_PER_S", "STORAGE_IOWAIT_SHARE", "gather_evidence", "judge", "diagnose",
           "THRESHOLDS", "kind_label", "predict_batch_interval", "storage_workers", "resize_target",
           "loader_verdict"]

#: The diagnosis kinds, in the order :func:`judge` tries them (``borderline``: two kinds, the evidence split).
DIAGNOSIS_KINDS = ("compute-bound", "main-process-bound", "handoff-bound", "cpu-bound", "cpu-contended",
                   "storage-bound", "borderline", "unknown")
#: A data stall share below this is ``compute-bound``: the loader keeps up.
STALL_COMPUTE_BOUND = 0.10
#: Workers whose CPU busy share reaches this are CPU-saturated: decoding and transforms.
WORKER_CPU_SATURATED = 0.6
#: A stalled loop that spends this share of its waiting time or more on batches that had already
#: come back from a worker when it asked for them is ``handoff-bound``.
BATCH_READY_HANDOFF = 0.8
#: A main process busy this share of the time or more, with idle workers, is ``main-process-bound``.
MAIN_CPU_SATURATED = 0.9
#: Workers runnable but not running this share of the time or more are starved of CPU.
WORKER_RUNQUEUE_STARVED = 0.15
#: Workers asleep this share of the time or more, with signs of storage waits, wait on storage even
#: when they also queue for a core on a busy machine.
WORKER_SLEEP_STORAGE = 0.35
#: Starved workers while other processes take this share of the machine's CPU or more: ``cpu-contended``.
OTHERS_CPU_CONTENDED = 0.25
#: ``{figure: (threshold, margin)}``: the rules' thresholds and the band around each one.
THRESHOLDS = {"stall_share": (STALL_COMPUTE_BOUND, 0.03), "ready_wait_share": (BATCH_READY_HANDOFF, 0.10),
              "workers_cpu_busy_share": (WORKER_CPU_SATURATED, 0.10), "main_cpu_share": (MAIN_CPU_SATURATED, 0.05),
              "workers_runqueue_share": (WORKER_RUNQUEUE_STARVED, 0.05),
              "others_cpu_share": (OTHERS_CPU_CONTENDED, 0.08), "workers_sleep_share": (WORKER_SLEEP_STORAGE, 0.10)}
#: Reads from block devices below this, bytes/s, with I/O wait under :data:`STORAGE_IOWAIT_SHARE`
#: and no network or user-space mount: the data came from the page cache.
PAGE_CACHE_MAX_BLOCK_READ_PER_S = 1024 * 1024
#: The machine's I/O-wait share from which the storage is taken as waited on.
STORAGE_IOWAIT_SHARE = 0.05
#: Workers in uninterruptible sleep (state ``D``, mostly disk reads) this share of the samples or more.
STORAGE_DISK_SLEEP_SHARE = 0.10
#: More tensors than this in one batch are named in the ``handoff-bound`` advice (about 0.3 ms of
#: hand-off each, against about 2 ms for a whole batch of two stacked tensors).
HANDOFF_MANY_TENSORS = 8

_NAMES = {"stall_share": "data stall", "ready_wait_share": "waiting on batches already back",
          "workers_cpu_busy_share": "workers CPU busy", "main_cpu_share": "main process CPU",
          "workers_runqueue_share": "workers runnable but not running", "others_cpu_share": "other processes' CPU",
          "workers_sleep_share": "workers asleep"}


def kind_label(diagnosis: dict) -> str:
    """A diagnosis's kind for a headline: ``"borderline (A or B)"`` for a borderline one."""
    between = diagnosis.get("between")
    return f"borderline ({' or '.join(between)})" if diagnosis.get("kind") == "borderline" and between \
        else str(diagnosis.get("kind"))


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def gather_evidence(*, stall_share: float, num_workers: int | None, workers: dict | None = None,
                    main: dict | None = None, io: dict | None = None, system: dict | None = None,
                    facts: dict | None = None) -> dict:
    """The figures the rules read, from a report's parts; None where not measured.

    Returns:
        ``{"stall_share", "num_workers", "ready_wait_share", "workers_cpu_busy_share",
        "workers_cpu_demand_share", "workers_runqueue_share", "runqueue_source", "workers_disk_sleep_share",
        "main_cpu_share", "others_cpu_share", "machine_cpu_busy_share", "read_bytes_per_s", "workers_sleep_share",
        "read_chars_per_s", "iowait_share", "slow_storage", "remote", "storage_signs", "page_cache"}``:
        shares in [0, 1], rates in bytes/s; ``runqueue_source`` ``"schedstat"`` (the scheduler's
        run-queue wait) or ``"states"`` (running-or-runnable share less the CPU busy share);
        ``storage_signs`` the signs of waits on storage that were seen (block reads, I/O wait,
        uninterruptible sleep, a slow or remote mount); ``page_cache`` True when the bytes read
        from block devices are known and none of those signs was seen (None when not known).
    """
    w, m, io, system, facts = workers or {}, main or {}, io or {}, system or {}, facts or {}
    busy, demand = w.get("cpu_busy_share"), w.get("cpu_demand_share")
    runq, source = w.get("runqueue_share"), "schedstat"
    if runq is None and busy is not None and demand is not None:
        runq, source = max(0.0, demand - busy), "states"
    main_share = None
    if m.get("cpu_busy_share") is not None or m.get("cpu_demand_share") is not None:
        main_share = max(m.get("cpu_busy_share") or 0.0, m.get("cpu_demand_share") or 0.0)
    ev = {"stall_share": stall_share, "num_workers": num_workers, "ready_wait_share": w.get("ready_wait_share"),
          "workers_cpu_busy_share": busy, "workers_cpu_demand_share": demand, "workers_runqueue_share": runq,
          "runqueue_source": source if runq is not None else None,
          "workers_disk_sleep_share": w.get("disk_sleep_share"), "main_cpu_share": main_share,
          "others_cpu_share": system.get("others_cpu_share"), "machine_cpu_busy_share": system.get("cpu_busy_share"),
          "read_bytes_per_s": io.get("read_bytes_per_s"), "read_chars_per_s": io.get("read_chars_per_s"),
          "iowait_share": io.get("iowait_share"), "slow_storage": bool(facts.get("slow_storage")),
          "remote": facts.get("remote")}
    signs = []
    if (ev["read_bytes_per_s"] or 0.0) >= PAGE_CACHE_MAX_BLOCK_READ_PER_S:
        signs.append(f"read from block devices {fmt_bytes(ev['read_bytes_per_s'])}/s")
    if (ev["iowait_share"] or 0.0) >= STORAGE_IOWAIT_SHARE:
        signs.append(f"I/O wait {pct(ev['iowait_share'])} of the machine")
    if (ev["workers_disk_sleep_share"] or 0.0) >= STORAGE_DISK_SLEEP_SHARE:
        signs.append(f"workers in disk sleep {pct(ev['workers_disk_sleep_share'])} of the time")
    if ev["slow_storage"] or ev["remote"]:
        signs.append("remote data" if ev["remote"] else "data on a network or user-space mount")
    ev["storage_signs"] = signs
    ev["workers_sleep_share"] = max(0.0, 1.0 - (busy or 0.0) - runq) if runq is not None else None
    ev["page_cache"] = None if ev["read_bytes_per_s"] is None else not signs
    return ev


def _chain(ev: dict, over) -> str:
    """The rules, in order; ``over(figure)`` says whether a figure is at or above its threshold."""
    if not over("stall_share"):
        return "compute-bound"
    if ev["num_workers"] == 0:
        return "main-process-bound"
    if over("ready_wait_share"):
        return "handoff-bound"
    if all(ev[k] is None for k in ("workers_cpu_busy_share", "workers_cpu_demand_share", "workers_runqueue_share")):
        return "unknown"
    if over("workers_cpu_busy_share"):
        return "cpu-bound"
    if over("main_cpu_share"):
        return "main-process-bound"
    if ev["storage_signs"] and over("workers_sleep_share"):
        return "storage-bound"
    if over("workers_runqueue_share"):
        return "cpu-contended" if over("others_cpu_share") else "cpu-bound"
    return "storage-bound" if ev["storage_signs"] else "unknown"  # storage only from its signs, never by default


def judge(ev: dict) -> dict:
    """The kind :func:`gather_evidence`'s figures lead to, and the figures that decided it.

    Rules, in order: data stall under :data:`STALL_COMPUTE_BOUND` → ``compute-bound``;
    ``num_workers=0`` → ``main-process-bound``; :data:`BATCH_READY_HANDOFF` or more of the waiting
    spent on batches already back from a worker → ``handoff-bound``; no worker figures →
    ``unknown``; workers CPU busy ≥ :data:`WORKER_CPU_SATURATED` → ``cpu-bound`` (decoding and
    transforms); main process busy ≥ :data:`MAIN_CPU_SATURATED` → ``main-process-bound``; workers
    asleep ≥ :data:`WORKER_SLEEP_STORAGE` with signs of storage waits (``storage_signs``) →
    ``storage-bound``; workers runnable but not running ≥ :data:`WORKER_RUNQUEUE_STARVED` → ``cpu-contended`` when other
    processes took :data:`OTHERS_CPU_CONTENDED` of the machine, else ``cpu-bound``; else the workers
    sleep → ``storage-bound`` when storage shows signs of waits, ``unknown`` when it shows none (the
    wait is elsewhere in the dataset's code, or the hand-off when that is not measured): storage is
    never the default. A figure inside its band (:data:`THRESHOLDS`) whose two sides lead to
    different kinds makes the verdict ``borderline``.

    Returns:
        ``{"kind", "between", "decided_by"}``: ``between`` the two kinds of a ``borderline`` verdict
        (the one the figure's side leads to first; else None); ``decided_by`` one
        ``{"figure", "value", "threshold", "margin", "side"}`` per figure compared, ``side``
        ``"above"``, ``"below"`` or ``"band"``.
    """
    decided: list[dict] = []
    band: list[str] = []

    def over(key: str, forced: dict | None = None) -> bool:
        value = ev.get(key)
        if value is None:
            return False
        thr, margin = THRESHOLDS[key]
        side = "above" if value >= thr + margin else "below" if value < thr - margin else "band"
        if forced is None:
            decided.append({"figure": key, "value": value, "threshold": thr, "margin": margin, "side": side})
            if side == "band" and not band:
                band.append(key)
        elif key in forced:
            return forced[key]
        return value >= thr

    kind = _chain(ev, over)
    between = None
    if band:
        key = band[0]
        other = _chain(ev, lambda k: over(k, {key: not ev[key] >= THRESHOLDS[key][0]}))
        if other != kind:
            between = [kind, other]
    return {"kind": "borderline" if between else kind, "between": between, "decided_by": decided}


def _decided_text(decided: list[dict]) -> str:
    parts = []
    for d in decided:
        rel = {"above": "≥", "below": "<", "band": "near"}[d["side"]]
        parts.append(f"{_NAMES.get(d['figure'], d['figure'])} {d['value']:.0%} {rel} {d['threshold']:.0%}"
                     + (f" ± {d['margin'] * 100:.0f} points" if d["side"] == "band" else ""))
    return "; ".join(parts)


def _kind_text(kind: str, ev: dict, wait_mean_s: float | None) -> str:
    """One kind's sentence, naming the figures behind it."""
    nw, busy, demand = ev["num_workers"], ev["workers_cpu_busy_share"], ev["workers_cpu_demand_share"]
    runq, ready, others = ev["workers_runqueue_share"], ev["ready_wait_share"], ev["others_cpu_share"]
    stall_txt = f"the loop waits for data {ev['stall_share']:.0%} of the time"
    shares = f"CPU busy {pct(busy)}, running or runnable {pct(demand)}, runnable but not running {pct(runq)}"
    if kind == "compute-bound":
        return f"{stall_txt}: the loader keeps up; a faster loader would not speed this loop up"
    if kind == "unknown" and all(ev[k] is None for k in ("workers_cpu_busy_share", "workers_cpu_demand_share",
                                                         "workers_runqueue_share")):
        return f"{stall_txt}; the worker processes could not be watched (psutil), so the cause is not known"
    if kind == "main-process-bound" and nw == 0:
        return f"{stall_txt}, and the samples are loaded in the main process (num_workers=0), between the steps"
    if kind == "main-process-bound":
        return (f"{stall_txt} while the workers idle (CPU {pct(busy)}) and the main process is CPU-saturated "
                f"({pct(ev['main_cpu_share'])}): collate, pinning or the step's own CPU work")
    if kind == "handoff-bound":
        per = f"; {wait_mean_s * 1e3:.1f} ms per batch" if wait_mean_s is not None else ""
        return (f"{stall_txt}, {pct(ready)} of that time for batches that had already come back from a worker: "
                f"the wait is the hand-off of each batch to the main process (receiving and unpickling it, mapping "
                f"its shared memory{per}), not the {nw} workers ({shares})")
    if kind == "cpu-bound" and (busy or 0.0) >= WORKER_CPU_SATURATED:
        return (f"{stall_txt} while the {nw} workers are CPU-saturated (CPU busy {pct(busy)}, running or runnable "
                f"{pct(demand)}): decoding and transforms")
    if kind in ("cpu-bound", "cpu-contended"):
        whose = (f"other processes took {pct(others)} of the machine's CPU" if kind == "cpu-contended" else
                 f"the cores are shared with this loop's own processes (other processes took {pct(others)} of "
                 "the machine)")
        return (f"{stall_txt} while the {nw} workers want the CPU (running or runnable {pct(demand)}) but get it "
                f"only part of the time (CPU busy {pct(busy)}; runnable but not running {pct(runq)}): they wait "
                f"for a core; {whose}; decoding and transforms")
    # storage-bound: the workers sleep
    ready_txt = f", {pct(ready)} of that waiting for batches that had already come back" if ready is not None else ""
    reads = ""
    if ev["read_chars_per_s"] is not None:
        reads = f"; reading {fmt_bytes(ev['read_chars_per_s'])}/s"
    handoff = " or in the hand-off of each batch (not measured here)" if ready is None else ""
    if ev["storage_signs"]:
        where = "on storage (opens and reads): " + ", ".join(ev["storage_signs"])
    elif ev["page_cache"]:
        where = (f"no sign of storage: no block device was read and I/O wait is {pct(ev['iowait_share'])}, "
                 "so the data came from the page cache; the wait is elsewhere in the dataset's code "
                 f"(the network, a lock, a sleep){handoff}")
    else:
        where = ("no sign of storage was measured (no block reads or I/O wait figures, no network or user-space "
                 f"mount); the wait is in the dataset's code (storage, the network, a lock, a sleep){handoff}")
    return f"{stall_txt} while the {nw} workers mostly wait ({shares}){ready_txt}: {where}{reads}"


def diagnose(*, stall_share: float, batches: int, num_workers: int | None, workers: dict | None,
             main: dict | None, loader: dict, cpu_count: int, cuda: bool, epochs: int,
             t_wait_s: dict | None = None, io: dict | None = None, data: str | None = None,
             t_step_s: dict | None = None, facts: dict | None = None, system: dict | None = None) -> dict:
    """The diagnosis of a watched loop: ``{"kind", "text", "advice", "between", "evidence", "decided_by"}``.

    ``kind`` is one of :data:`DIAGNOSIS_KINDS`, by :func:`judge`'s rules; ``evidence`` is
    :func:`gather_evidence`'s figures; ``decided_by`` the figures compared with their thresholds
    (also named at the end of ``text``); ``between`` the two kinds of a ``borderline`` verdict.

    ``advice`` follows from the evidence, first action first: workers (more only when they sleep,
    or when CPU-saturated and the machine has cores to spare), ``pin_memory`` + ``non_blocking``,
    ``prefetch_factor``, ``persistent_workers``, then the storage format (``shardfeed pack``,
    ``stage``, ``cache="memory"``: only for a ``storage-bound`` or ``main-process-bound`` loop whose
    data did not come from the page cache), then decode cost (``--resize`` at pack time, scaled
    decoding). ``facts`` (:func:`~shardfeed.readers.measure.watch.data_facts`) says what the loader
    reads and shapes the storage and decode advice (no ``pack`` for a packed dataset, ``stage`` only
    for remote or slow storage, ``--resize N`` only for stored images larger than ``N``, no advice
    for the decoder in use). ``data``: the dataset's folder when known (else ``DATA``).
    """
    if batches < 1:
        return {"kind": "unknown", "text": "no batch was timed", "advice": [], "between": None, "evidence": {},
                "decided_by": []}
    ev = gather_evidence(stall_share=stall_share, num_workers=num_workers, workers=workers, main=main, io=io,
                         system=system, facts=facts)
    verdict = judge(ev)
    kind, between = verdict["kind"], verdict["between"]
    wait_mean = (t_wait_s or {}).get("mean")
    if between:
        text = (f"borderline: {between[0]} or {between[1]}: {_kind_text(between[0], ev, wait_mean)}; "
                f"or else {between[1]}")
    else:
        text = _kind_text(kind, ev, wait_mean)
    text += f" [decided by: {_decided_text(verdict['decided_by'])}]"
    advice: list[str] = []
    for k in (between or [kind]):
        for a in _advice(k, ev, loader, cpu_count, cuda, epochs, t_wait_s, t_step_s, workers, facts or {},
                         data or "DATA"):
            if a not in advice:
                advice.append(a)
    return {"kind": kind, "text": text, "advice": advice, "between": between, "evidence": ev,
            "decided_by": verdict["decided_by"]}


def _advice(kind: str, ev: dict, loader: dict, cpu_count: int, cuda: bool, epochs: int, t_wait_s: dict | None,
            t_step_s: dict | None, workers: dict | None, facts: dict, data: str) -> list[str]:
    """:func:`diagnose`'s advice for one kind, in its one order."""
    if kind == "compute-bound" or (kind == "unknown" and ev["workers_sleep_share"] is None):
        return []
    nw, stall, busy = ev["num_workers"], ev["stall_share"], ev["workers_cpu_busy_share"]
    machine_full = (ev["machine_cpu_busy_share"] or 0.0) >= MAIN_CPU_SATURATED
    advice: list[str] = []
    # 1. workers
    if kind == "main-process-bound" and nw == 0:
        advice.append(f"num_workers=0 → {max(2, min(cpu_count, 8))}: load in worker processes "
                      f"(this machine has {cpu_count} cores)")
    elif kind == "cpu-bound" and nw is not None and nw < cpu_count and not machine_full:
        gain = _gain_text(nw, cpu_count, stall, t_step_s, t_wait_s, workers, cpu_count)
        why = ("the workers are CPU-saturated" if (busy or 0.0) >= WORKER_CPU_SATURATED
               else f"the workers are running or runnable {pct(ev['workers_cpu_demand_share'])} of the time")
        advice.append(f"num_workers={nw} → {cpu_count}: {why} and this machine has {cpu_count} cores{gain}")
    elif kind in ("cpu-bound", "cpu-contended") and machine_full:
        advice.append(f"keep num_workers={nw}: the machine's cores are busy {pct(ev['machine_cpu_busy_share'])} of "
                      f"the time (other processes {pct(ev['others_cpu_share'])}), so more workers would only "
                      "wait longer for a core; free cores or decode less (below)")
    elif kind == "cpu-contended":
        advice.append(f"free cores for the workers: other processes took {pct(ev['others_cpu_share'])} of the "
                      "machine's CPU while the loop ran (see top); more workers would wait for a core as well")
    elif kind in ("storage-bound", "unknown") and nw is not None:  # unknown here: workers that sleep
        more = storage_workers(nw, cpu_count)
        advice.append(f"num_workers={nw} → {more}: the workers sleep rather than compute, so more of "
                      f"them keep more reads in flight (this machine has {cpu_count} cores)"
                      f"{_gain_text(nw, more, stall, t_step_s, t_wait_s, workers, cpu_count)}")
    elif kind == "handoff-bound":
        advice += _handoff_advice(nw, loader, (workers or {}).get("batch_tensors"), t_wait_s)
    # 2. pinned memory
    if cuda and loader.get("pin_memory") is False:
        advice.append("pin_memory=False → True, with batch.to(device, non_blocking=True): the copy to the GPU "
                      "overlaps the step")
    # 3. prefetch
    pf = loader.get("prefetch_factor")
    if nw and pf is not None and t_wait_s and t_wait_s.get("p95", 0) > 3 * max(t_wait_s.get("p50", 0), 1e-4):
        advice.append(f"prefetch_factor={pf} → {2 * pf}: the waits are uneven (p95 {t_wait_s['p95'] * 1e3:.0f} ms, "
                      f"median {t_wait_s['p50'] * 1e3:.0f} ms); more batches ready per worker absorb the slow ones")
    # 4. persistent workers
    if nw and loader.get("persistent_workers") is False and epochs > 1:
        advice.append("persistent_workers=False → True: the workers start again every epoch")
    # 5. storage format: only where the data did not come from the page cache; 6. decode cost
    if kind in ("storage-bound", "main-process-bound") and not ev["page_cache"]:
        advice += _storage_advice(facts, data)
    if kind in ("cpu-bound", "cpu-contended", "main-process-bound"):
        advice += _decode_advice(facts, data)
    return advice


def _handoff_advice(nw: int | None, loader: dict, tensors: int | None, t_wait_s: dict | None) -> list[str]:
    """:func:`diagnose`'s advice for a ``handoff-bound`` loop: fewer tensors and fewer batches to hand over."""
    advice: list[str] = []
    many = tensors is not None and tensors > HANDOFF_MANY_TENSORS
    if many:  # each one a handle of its own
        advice.append(f"a batch holds {tensors} tensors, each handed over through a shared-memory handle of its "
                      "own: collate each field into one tensor (torch.stack in collate_fn, not a list per sample)")
    bs = loader.get("batch_size")
    per = f" ({t_wait_s['mean'] * 1e3:.1f} ms now)" if t_wait_s and t_wait_s.get("mean") is not None else ""
    if isinstance(bs, int) and bs > 0 and not many:  # a batch of per-sample tensors costs more when larger
        advice.append(f"batch_size={bs} → {2 * bs} where the step allows it: a hand-off costs about the same per "
                      f"batch{per} whatever its size, so half as many batches wait half as often")
    if nw:
        advice.append(f"keep num_workers={nw}: the batches are ready before they are asked for, more workers "
                      "would not shorten the wait")
    return advice


def _read_by_us(facts: dict) -> tuple[bool, bool]:
    """Whether shardfeed's reader reads the data, and whether it reads a packed dataset (not a folder)."""
    fmt, ours = facts.get("format"), facts.get("reader") == "shardfeed"
    return ours, bool(ours and fmt is not None and fmt != "folder")


def _storage_advice(facts: dict, data: str) -> list[str]:
    """:func:`diagnose`'s storage advice (pack, stage, ``cache="memory"``), as ``facts`` allow."""
    advice: list[str] = []
    ours, packed = _read_by_us(facts)
    if not packed:
        advice.append(f"shardfeed pack {data} OUT --format wds: a few large shards read sequentially instead of "
                      f"one open and read per sample (then shardfeed verify {data} OUT shows the change)")
        if not ours:  # where the data and OUT lie is not known here
            advice.append("shardfeed stage OUT /local/nvme (or /dev/shm when it fits) when OUT lies on remote "
                          "or network storage: read the shards from local storage")
    elif facts.get("remote") or facts.get("slow_storage"):
        where = "remote" if facts.get("remote") else "on slow (network or user-space) storage"
        advice.append(f"shardfeed stage {data if data != 'DATA' else 'SRC'} /local/nvme (or /dev/shm when it "
                      f"fits): the packed dataset is {where}; read its shards from local storage")
    out = (repr(data) if data != "DATA" else "SRC") if packed else "OUT"
    if not facts.get("in_memory"):
        advice.append(f'make_loader({out}, cache="memory") when the dataset fits in RAM: every sample read '
                      'once')
    return advice


def _decode_advice(facts: dict, data: str) -> list[str]:
    """:func:`diagnose`'s decode-cost advice (``--resize``, scaled decoding, the decoder), as ``facts`` allow."""
    advice: list[str] = []
    ours, packed = _read_by_us(facts)
    image_size = facts.get("image_size") if ours else None
    side = facts.get("image_side")
    target = resize_target(image_size)
    src = "the original images" if packed else data
    if side is None:
        advice.append(f"shardfeed pack {src} OUT --resize N, N a little above the training image size, when "
                      "the stored images are larger than that: decode smaller images (the decode cost grows "
                      "with the pixels)")
    elif side > target:
        advice.append(f"shardfeed pack {src} OUT --resize {target}: decode smaller images (the stored images' "
                      f"shorter side is about {side} px; the decode cost grows with the pixels)")
    decoder = facts.get("decoder")
    if not ours:
        advice.append("make_loader(OUT, image_size=SIZE), SIZE the training size, decodes JPEGs at a reduced "
                      "scale (1/2, 1/4, 1/8) when that keeps the shorter side ≥ image_size, with "
                      "simplejpeg (a dependency of shardfeed) by default")
    elif decoder is not None and decoder != "simplejpeg":
        advice.append(f"decoder='{decoder}' → 'simplejpeg' (pip install simplejpeg): faster JPEG decoding, "
                      f"at a reduced scale when that keeps the shorter side ≥ image_size")
    return advice


def predict_batch_interval(num_workers: int, new_workers: int, wait_s: float, step_s: float,
                           worker_cpu_s_per_batch: float | None, cores: int) -> float:
    """The time per batch, s, with ``new_workers`` instead of ``num_workers`` (a stalled loop).

    While the loop is stalled the workers together deliver one batch per ``wait_s + step_s``
    (means per batch); ``k`` times as many workers deliver ``k`` times as fast, but never faster
    than the step nor than the cores can do the workers' CPU work per batch
    (``worker_cpu_s_per_batch / cores``).
    """
    now = wait_s + step_s
    interval = max(step_s, now * num_workers / max(new_workers, 1))
    if worker_cpu_s_per_batch:
        interval = max(interval, worker_cpu_s_per_batch / max(cores, 1))
    return interval


def _gain_text(nw: int, new: int, stall: float, t_step_s: dict | None, t_wait_s: dict | None, workers: dict | None,
               cores: int) -> str:
    if not nw or not t_step_s or not t_wait_s or not t_step_s.get("total"):
        return ""
    per = (workers or {}).get("per_worker") or []
    n_batches = t_step_s["total"] / t_step_s["mean"] if t_step_s["mean"] > 0 else 0
    cpu_per_batch = sum(w["cpu_s"] for w in per) / n_batches if per and n_batches else None
    wait, step = t_wait_s["mean"], t_step_s["mean"]
    interval = predict_batch_interval(nw, new, wait, step, cpu_per_batch, cores)
    gain = (wait + step) / interval
    new_stall = max(0.0, 1 - step / interval)
    return f"; expected about {gain:.1f}x the batches per second (data stall {stall:.0%} → {new_stall:.0%})"


def storage_workers(num_workers: int, cpu_count: int) -> int:
    """The workers to try when they wait on storage: twice as many (at least 2 more), at most
    ``4 * cpu_count`` (no fewer than 2 more) and 64; sleeping workers keep more reads in flight."""
    return min(max(2 * num_workers, num_workers + 2), max(4 * cpu_count, num_workers + 2), 64)


def resize_target(image_size: int | None) -> int:
    """The shorter side, px, to re-encode stored images to: a little above the training size
    (``ceil(image_size * 8 / 7)``, 256 for 224), at least 256; 256 when the training size is not known."""
    return max(256, -(-image_size * 8 // 7)) if image_size else 256


def loader_verdict(*, num_workers: int, workers_cpu_busy_share: float | None, slow_storage: bool = False,
                   remote: bool | None = None) -> dict:
    """:func:`judge` for a loader with no training loop behind it (the loop taken to wait for data,
    a data stall of 1): ``cpu-bound`` when the workers are CPU-saturated
    (:data:`WORKER_CPU_SATURATED`), ``storage-bound`` when they mostly wait on slow or remote storage,
    ``unknown`` when they mostly wait on nothing known, ``borderline`` between two of these inside the
    band; ``main-process-bound`` with ``num_workers=0``.

    Args:
        num_workers: the loader's workers.
        workers_cpu_busy_share: the share of the workers' time spent on the CPU, in [0, 1] (measured
            or predicted); None: not known.
        slow_storage, remote: the data lies on a network or user-space mount, or behind a URL.

    Returns:
        :func:`judge`'s ``{"kind", "between", "decided_by"}``.
    """
    ev = gather_evidence(stall_share=1.0, num_workers=num_workers, workers={"cpu_busy_share": workers_cpu_busy_share},
                         facts={"slow_storage": slow_storage, "remote": remote})
    return judge(ev)
