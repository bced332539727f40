"""The report of a pack (:class:`PackReport`: what ``shardfeed pack`` prints, and ``--json``
writes), and the report of ``resume`` on a dataset that is finished already."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
import time

from shardfeed.readers.format.manifest import MANIFEST_NAME, Manifest
from shardfeed.readers.format.registry import describe

__all__ = ["PackReport", "finished_report", "finished_manifest_report", "manifest_report", "plural", "reason_counts"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PackReport:
    """Summary of a pack (printed by the CLI; ``--json`` writes :meth:`to_json`)."""

    source: str
    output: str
    format: str
    num_samples: int
    num_shards: int
    num_bytes: int
    input_bytes: int
    seconds: float
    workers: int
    files: dict
    skipped: list
    ignored: list
    empty_classes: list
    num_classes: int
    shards_resumed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["images_per_s"] = round(self.images_per_s, 1)
        d["mb_per_s"] = round(self.mb_per_s, 2)
        return d

    def summary(self) -> str:
        """The one-line human summary."""
        shards = describe(self.format).noun(self.num_shards)
        classes = ("(no labels)" if self.extra.get("layout") == "unlabelled"
                   else "in " + plural(self.num_classes, 'class', 'classes'))
        if self.extra.get("already_complete"):
            return (f"{self.output} already holds this finished dataset ({plural(self.num_samples, 'sample')} "
                    f"{classes}, {shards}, {_size(self.num_bytes)}); nothing to resume")
        s = (f"packed {plural(self.num_samples, 'sample')} {classes} "
             f"into {shards} ({self.format}, {_size(self.num_bytes)}) "
             f"at {self.output} in {self.seconds:.2f} s: {self.images_per_s:,.0f} images/s, "
             f"{self.mb_per_s:.1f} MB/s")
        if "download_seconds" in self.extra:
            s += (f", after {self.extra['download_seconds']:.2f} s listing and downloading SRC from the bucket "
                  f"({self.extra['download_seconds'] + self.seconds:.2f} s in all)")
        if "duplicates" in self.extra:  # an append: num_classes counts the classes of the new samples
            s += f"; appended: {plural(self.extra.get('new_classes', 0), 'new class', 'new classes')}"
            s += f"; the dataset holds {plural(self.extra.get('dataset_samples', 0), 'sample')}"
            if "dataset_classes" in self.extra:
                s += f" in {plural(self.extra['dataset_classes'], 'class', 'classes')}"
            s += f"; {plural(self.extra['duplicates'], 'image')} already in it skipped"
            if self.extra.get("changed"):
                s += f" ({self.extra['changed']:,} of them changed since they were packed: --skip-changed)"
        if self.skipped:
            s += (f"; {plural(len(self.skipped), 'file')} skipped ({reason_counts(self.skipped)}; listed in the "
                  "manifest)")
        if self.ignored:
            s += f"; {plural(len(self.ignored), 'file')} ignored ({reason_counts(self.ignored)})"
        if self.shards_resumed:
            spec = describe(self.format)
            done = spec.summary_noun if not spec.sharded else spec.noun(self.shards_resumed)
            s += f"; {done} kept from the interrupted run"
        if self.extra.get("executor", "local") != "local":
            n_nodes = len(self.extra.get("nodes") or [])
            s += (f"; {self.extra['executor']}: {self.extra.get('num_tasks', 0)} tasks on {n_nodes} "
                  f"{'node' if n_nodes == 1 else 'nodes'}")
            if self.extra.get("task_retries"):
                s += f", {self.extra['task_retries']} retried"
        return s


def manifest_report(manifest: Manifest, *, source: str, output: str, input_bytes: int, seconds: float,
                    workers: int, ignored: list, empty_classes: list, shards_resumed: int = 0,
                    extra: dict | None = None) -> PackReport:
    """The report of a pack from the manifest it wrote (samples, shards and their bytes, files,
    skipped files, classes, as recorded) and what the manifest does not hold: every pack's report.

    Args:
        manifest: the dataset's manifest.
        source, output: SRC and OUT as the report names them.
        input_bytes: the source bytes read (bytes); ``seconds``: the pack's time (s).
        workers: the pack's workers; ``ignored``, ``empty_classes``: from the scan.
        shards_resumed: shards kept from an interrupted run; ``extra``: more figures.
    """
    return PackReport(
        source=source, output=output, format=manifest.format, num_samples=manifest.num_samples,
        num_shards=len(manifest.shards), num_bytes=sum(s.num_bytes for s in manifest.shards), input_bytes=input_bytes,
        seconds=seconds, workers=workers, files=dict(manifest.files or {}), skipped=list(manifest.skipped),
        ignored=ignored, empty_classes=empty_classes, num_classes=len(manifest.classes), shards_resumed=shards_resumed,
        extra=extra if extra is not None else {})


def reason_counts(items: list[dict], most: int = 4) -> str:
    """``"2 hidden file, 1 extension not packed"``: how many of ``items`` (``{"reason": ...}``)
    were left out for each reason (the reason's words before any detail in parentheses or after
    a colon), the most frequent first, at most ``most`` reasons then ``"..."``."""
    counts = collections.Counter(re.split(r" \(|: ", str(item.get("reason", "?")), maxsplit=1)[0]
                                 for item in items)
    parts = [f"{n:,} {reason}" for reason, n in counts.most_common(most)]
    return ", ".join(parts) + (", ..." if len(counts) > most else "")


def plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} KB"


def finished_report(manifest: Manifest, where: str, scan, options,
                    t0: float) -> PackReport:
    """``resume`` on a finished dataset: its report when it is this run's dataset, else the refusal.

    ``scan`` is this run's :class:`~shardfeed.convert.write.scan.ScanResult`, ``options`` its
    :class:`~shardfeed.convert.write.pack.PackOptions`.

    "This run's" means the manifest records the same options (those of
    :meth:`PackOptions.fingerprint_fields`), the same source folder and class map, and as many
    files found as this scan (a script that always passes ``--resume`` reruns a finished pack
    without error; a changed command is told to rebuild with ``overwrite``).

    Raises:
        ValueError: the dataset in ``where`` was packed with other options or from another source.
    """
    expected = json.loads(json.dumps({**options.fingerprint_fields(), "source": scan.recorded_source}))
    recorded = json.loads(json.dumps(manifest.options or {}))
    same = (recorded == expected and dict(manifest.class_to_idx) == dict(scan.class_to_idx)
            and (manifest.files or {}).get("found") == scan.num_found)
    if not same:
        from .ownership import flag

        changed = [k for k in sorted(set(recorded) | set(expected)) if recorded.get(k) != expected.get(k)]
        why = (f"options differ: {', '.join(changed)}" if changed else "the class map or the number of files differs")
        raise ValueError(f"{where}: already holds a finished dataset ({MANIFEST_NAME}) packed with other options or "
                         f"from another source ({why}); nothing to resume: rebuild it with {flag('overwrite')}, or "
                         "choose another output location")
    log.info("%s: already holds this finished dataset; nothing to resume", where)
    return finished_manifest_report(manifest, source=scan.root, output=where, t0=t0, workers=options.workers,
                                    ignored=scan.ignored, empty_classes=scan.empty_classes)


def finished_manifest_report(manifest: Manifest, *, source: str, output: str, t0: float, workers: int,
                             ignored: list, empty_classes: list, extra: dict | None = None) -> PackReport:
    """The report of ``resume`` on a dataset finished already (this very pack's: checked by the caller)."""
    return manifest_report(
        manifest, source=source, output=output, input_bytes=0, seconds=time.perf_counter() - t0, workers=workers,
        ignored=ignored, empty_classes=empty_classes, shards_resumed=len(manifest.shards),
        extra={**(extra or {}), "already_complete": True})
