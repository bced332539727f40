"""``doctor``'s sample of an image folder: stratified by format and size, spread over the folders,
grown until the prediction's expected error is small.

The files listed are put in *strata*: their format (from the extension) and their size bucket
(a factor of 4 per bucket: under 4 KiB, 4-16 KiB, 16-64 KiB, ...). Each file sampled is read
(cold where the page cache can be evicted) and decoded, and its costs are kept per file. The
costs per image are the strata's means weighted by each stratum's share of the files listed; the
same files predict the same rate whether they sit in class folders or in one flat folder.

* The first sample (64 files, or one per stratum where there are more strata) is allocated to the
  strata in proportion to their file counts, at least 2 per stratum (1 where a stratum holds one
  file, or where ``max_files`` leaves too few), the strata visited in turn so that a spent budget
  still leaves every stratum measured.
* Within a stratum, files are drawn at positions of a van der Corput sequence over the stratum's
  files in path order, from a seeded offset: every prefix of the draw is spread over the
  stratum's folders in proportion to their files, and growing the sample continues the sequence.
* The expected error is two standard errors of the stratified mean of the per-image time
  that sets the prediction, relative to that mean (about a 95 % interval), with the finite
  population correction ``1 - n/N``. A stratum measured once borrows the largest relative
  variance of the strata measured at least twice.
* While that error is above :data:`TARGET_RELATIVE_ERROR`, the sample grows (doubling, each file
  to the stratum where it cuts the variance most) until ``max_files`` or the time budget.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Any, Callable

from ..decode.image import backend_for_format

__all__ = ["TARGET_RELATIVE_ERROR", "FIRST_SAMPLE", "image_format", "size_bucket", "make_strata", "allocate",
           "StratifiedSample", "stratified_mean", "decoders_by_format"]

#: The sample grows until two standard errors of the predicted rate are at most this share of it.
TARGET_RELATIVE_ERROR = 0.10
#: Files in the first sample (fewer when ``max_files`` is lower).
FIRST_SAMPLE = 64
_MIN_PER_STRATUM = 2
_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "jpe": "JPEG", "jfif": "JPEG", "png": "PNG", "webp": "WEBP",
            "tif": "TIFF", "tiff": "TIFF", "bmp": "BMP", "gif": "GIF", "pbm": "PPM", "pgm": "PPM", "ppm": "PPM",
            "jp2": "JPEG2000"}
_MAX_BUCKET = 16


def image_format(name: str) -> str:
    """The image format a file name's extension stands for (``"a/b.JPG"`` → ``"JPEG"``)."""
    ext = os.path.splitext(name)[1].lower().lstrip(".")
    return _FORMATS.get(ext, ext.upper() or "?")


def size_bucket(size: int) -> int:
    """The size bucket of a file of ``size`` bytes: ``k`` for ``4**k`` KiB ≤ size < ``4**(k+1)`` KiB
    (0 under 4 KiB)."""
    if size < 4096:
        return 0
    return min(_MAX_BUCKET, int(math.log(size / 1024, 4)))


def bucket_text(bucket: int) -> str:
    """``"16-64 KiB"`` for a :func:`size_bucket`."""
    if bucket == 0:
        return "under 4 KiB"

    def kib(k: int) -> str:
        v = 4 ** k
        return f"{v} KiB" if v < 1024 else f"{v // 1024} MiB"

    return f"{kib(bucket)}-{kib(bucket + 1)}"


def make_strata(files: list[tuple[str, int]]) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """``{(format, size_bucket): [(path, size), ...]}`` of ``(path, size)`` files, each list in path
    order (files of one folder next to each other)."""
    strata: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for path, size in files:
        strata.setdefault((image_format(path), size_bucket(size)), []).append((path, size))
    for v in strata.values():
        v.sort()
    return dict(sorted(strata.items()))


def allocate(counts: dict[Any, int], n: int) -> dict[Any, int]:
    """A sample of ``n`` files in proportion to each stratum's file count (largest remainders), at
    least ``min(2, count)`` per stratum while ``n`` allows (one in every stratum before a second
    in any, the largest strata first), never more than a stratum holds.

    Args:
        counts: files per stratum (each at least 1).
        n: the sample's size (at least 1).
    """
    total = sum(counts.values())
    n = min(n, total)
    alloc = {k: 0 for k in counts}
    left = n
    order = sorted(counts, key=lambda k: (-counts[k], str(k)))
    for level in range(1, _MIN_PER_STRATUM + 1):  # one file in every stratum first, then a second, largest first
        for k in order:
            if left > 0 and alloc[k] < min(level, counts[k]):
                alloc[k] += 1
                left -= 1
    if left <= 0:
        return alloc
    want = {k: n * counts[k] / total for k in counts}
    extra = {k: max(0.0, want[k] - alloc[k]) for k in counts}
    room = sum(extra.values())
    if room > 0:
        for k in counts:
            add = min(int(left * extra[k] / room), counts[k] - alloc[k])
            alloc[k] += add
    left = n - sum(alloc.values())
    for k in sorted(counts, key=lambda k: (-(want[k] - alloc[k]), str(k))):
        if left <= 0:
            break
        if alloc[k] < counts[k]:
            alloc[k] += 1
            left -= 1
    return alloc


def _van_der_corput(i: int) -> float:
    x, denom = 0.0, 1.0
    while i:
        denom *= 2
        i, bit = divmod(i, 2)
        x += bit / denom
    return x


class _Drawer:
    """The draw within one stratum: positions of a van der Corput sequence from a seeded offset over
    the stratum's files in path order, repeats passed over."""

    def __init__(self, files: list[tuple[str, int]], rng: random.Random):
        self.files = files
        self.offset = rng.random()
        self.i = 0
        self.taken: set[int] = set()

    def take(self, k: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        n = len(self.files)
        tries = 0
        while len(out) < k and len(self.taken) < n and tries < 8 * n + 64:
            tries += 1
            pos = int(((self.offset + _van_der_corput(self.i)) % 1.0) * n)
            self.i += 1
            if pos in self.taken:
                continue
            self.taken.add(pos)
            out.append(self.files[pos])
        for pos in range(n):  # positions that collided too often: the rest in order
            if len(out) >= k:
                break
            if pos not in self.taken:
                self.taken.add(pos)
                out.append(self.files[pos])
        return out


def stratified_mean(values: dict[Any, list[float]], counts: dict[Any, int]) -> tuple[float | None, float | None]:
    """``(mean, standard_error)`` of the per-file ``values`` of each stratum, the strata weighted by
    their file ``counts`` (a stratum without values is left out and the weights renormalised).

    The variance is ``Σ w² (1 - n/N) s² / n``; a stratum with one value borrows the largest
    relative variance ``s² / mean²`` of the strata with two or more (1.0 when none has two).
    ``(None, None)`` when no stratum has a value.
    """
    measured = {k: v for k, v in values.items() if v}
    total = sum(counts[k] for k in measured)
    if not total:
        return None, None
    rel_vars = [statistics.variance(v) / statistics.fmean(v) ** 2 for v in measured.values()
                if len(v) >= 2 and statistics.fmean(v) > 0]
    borrowed = max(rel_vars) if rel_vars else 1.0
    mean = var = 0.0
    for k, v in measured.items():
        w, n, big_n = counts[k] / total, len(v), counts[k]
        m = statistics.fmean(v)
        s2 = statistics.variance(v) if n >= 2 else borrowed * m * m
        mean += w * m
        var += w * w * max(0.0, 1 - n / big_n) * s2 / n
    return mean, math.sqrt(var)


def decoders_by_format(counts: dict[tuple[str, int], int], decoder: str) -> list[dict]:
    """``[{"format", "share", "decoder"}]``, the largest share first: the library that decodes each
    format (:func:`~shardfeed.readers.decode.image.backend_for_format`) and its share of the files."""
    total = sum(counts.values()) or 1
    by_fmt: dict[str, int] = {}
    for (fmt, _), c in counts.items():
        by_fmt[fmt] = by_fmt.get(fmt, 0) + c
    return [{"format": f, "share": c / total, "decoder": backend_for_format(decoder, f)}
            for f, c in sorted(by_fmt.items(), key=lambda kv: (-kv[1], kv[0]))]


class StratifiedSample:
    """Files measured one by one, in strata, until the expected error is small (module docstring).

    Args:
        files: ``(path, size)`` of every file listed.
        rng: the draw's random source (seeded by the caller).
        measure: measures one file, ``measure(path) -> dict`` with at least ``io_s`` (wall seconds
            of its open and reads), ``cpu_s`` (CPU seconds of those system calls), ``decode_s``
            (CPU seconds of its decode, None when it could not be decoded) and ``pixels``; None
            when the file could not be read.
        clock: ``time.monotonic`` or a test's clock.
    """

    def __init__(self, files: list[tuple[str, int]], rng: random.Random,
                 measure: Callable[[str], dict | None], clock: Callable[[], float] = time.monotonic):
        self.strata = make_strata(files)
        self.counts = {k: len(v) for k, v in self.strata.items()}
        self.drawers = {k: _Drawer(v, rng) for k, v in self.strata.items()}
        self.measure = measure
        self.clock = clock
        self.records: dict[tuple[str, int], list[dict]] = {k: [] for k in self.strata}
        self.unreadable = 0
        self.stopped_by = "target"

    @property
    def sampled(self) -> int:
        """Files measured."""
        return sum(len(v) for v in self.records.values())

    def _measure_round(self, alloc: dict, deadline: float) -> bool:
        """Measure ``alloc[k]`` more files of each stratum, the strata in turn; False when the
        deadline stopped it."""
        picks = {k: self.drawers[k].take(a) for k, a in alloc.items() if a > 0}
        depth = max((len(v) for v in picks.values()), default=0)
        for i in range(depth):
            for k, files in picks.items():
                if i >= len(files):
                    continue
                if self.sampled >= 3 and self.clock() > deadline:
                    return False
                rec = self.measure(files[i][0])
                if rec is None:
                    self.unreadable += 1
                    continue
                rec["size"] = files[i][1]
                self.records[k].append(rec)
        return True

    def _grow_alloc(self, n_more: int, key: Callable[[dict], float | None]) -> dict:
        """``n_more`` files given one at a time to the stratum whose variance term
        ``w² s² (1/n - 1/(n+1))`` they cut most (the strata's current spread)."""
        total = sum(self.counts.values())
        have = {k: len(v) for k, v in self.records.items()}
        s2: dict = {}
        for k, recs in self.records.items():
            vals = [x for x in (key(r) for r in recs) if x is not None]
            mean = statistics.fmean(vals) if vals else 0.0
            s2[k] = statistics.variance(vals) if len(vals) >= 2 else (mean * mean if vals else 1.0)
        alloc = {k: 0 for k in self.counts}
        for _ in range(n_more):
            best, gain = None, -1.0
            for k, big_n in self.counts.items():
                n = have[k] + alloc[k]
                if n >= big_n:
                    continue
                w = big_n / total
                g = w * w * s2[k] * (1 / max(n, 1) - 1 / (n + 1)) if n else float("inf")
                if g > gain:
                    best, gain = k, g
            if best is None:
                break
            alloc[best] += 1
        return alloc

    def run(self, max_files: int, deadline: float,
            judge: Callable[["StratifiedSample"], tuple[float | None, Callable[[dict], float | None]]]) -> None:
        """Measure the first sample, then grow it while the expected error is above
        :data:`TARGET_RELATIVE_ERROR`, up to ``max_files`` files or ``deadline``; ``stopped_by``
        says what stopped it (``target``, ``max_files``, ``all_files``, ``budget``).

        ``judge(self)`` gives ``(relative_error, key)``: the error of the prediction (None: not
        known yet) and the per-record figure whose variance the next files should cut."""
        first = min(max_files, max(FIRST_SAMPLE, len(self.counts)))  # every stratum at least once
        if not self._measure_round(allocate(self.counts, first), deadline):
            self.stopped_by = "budget"
            return
        total = sum(self.counts.values())
        for _ in range(64):  # doubling: bounded well before this
            err, key = judge(self)
            if err is not None and err <= TARGET_RELATIVE_ERROR:
                self.stopped_by = "target"
                return
            attempted = self.sampled + self.unreadable
            if attempted >= total:
                self.stopped_by = "all_files"
                return
            if attempted >= max_files:
                self.stopped_by = "max_files"
                return
            more = min(max(attempted, 1), max_files - attempted)
            alloc = self._grow_alloc(more, key)
            if not any(alloc.values()):
                self.stopped_by = "all_files"
                return
            if not self._measure_round(alloc, deadline):
                self.stopped_by = "budget"
                return

    def values(self, key: Callable[[dict], float | None]) -> dict:
        """``{stratum: [key(record), ...]}`` of the records where ``key`` gives a number."""
        return {k: [x for x in (key(r) for r in recs) if x is not None] for k, recs in self.records.items()}

    def mean(self, key: Callable[[dict], float | None]) -> tuple[float | None, float | None]:
        """:func:`stratified_mean` of ``key`` over the records."""
        return stratified_mean(self.values(key), self.counts)

    def weighted_median(self, key: Callable[[dict], float | None]) -> float | None:
        """The median of ``key`` over the files listed, each record standing for its stratum's
        share (``N / n`` files)."""
        pts = []
        for k, vals in self.values(key).items():
            for v in vals:
                pts.append((v, self.counts[k] / len(vals)))
        if not pts:
            return None
        pts.sort()
        half, acc = sum(w for _, w in pts) / 2, 0.0
        for v, w in pts:
            acc += w
            if acc >= half:
                return float(v)
        return float(pts[-1][0])

    def unmeasured_share(self) -> float:
        """The share of the files listed whose stratum has no record."""
        total = sum(self.counts.values()) or 1
        return sum(c for k, c in self.counts.items() if not self.records[k]) / total
