"""``shardfeed index``: write a manifest and ``.sfidx`` offset files for WebDataset shards made
by other tools (webdataset's ``ShardWriter``, ``tarp``, ``tar``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import time
import urllib.parse
from pathlib import Path, PurePosixPath

from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.format.manifest import (
    INDEX_SUFFIX,
    LABELS_CLASS,
    LABELS_NONE,
    MANIFEST_NAME,
    MAX_FIELDS,
    PACK_STATE_DIR,
    TAR_BLOCK,
    Manifest,
    ShardEntry,
    created_by,
    field_member,
    field_name_problem,
    plain_file_name_problem,
)
from shardfeed.readers.format.offset_index import encode_index, is_dali_index
from shardfeed.readers.file_io import read_small_file, write_bytes_atomic
from shardfeed.readers.storage.local_manifest import unfinished_pack_error
from shardfeed.readers.storage.redact import shown_source
from shardfeed.readers.format.registry import describe

from ..write.outlock import output_lock
from ..write.ownership import refuse_unfinished_pack
from ..write.pack_state import PLAN_NAME
from ..write.staged import ReplacedTogether
from .common import (
    HashingReader,
    Progress,
    is_url,
    noop_progress,
    parts_to_sample,
    make_problem,
)

log = logging.getLogger(__name__)

__all__ = ["IndexReport", "index_shards", "expand_braces"]

#: gzip, bzip2, xz, zstd magic bytes.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")


class _Prepended:
    """A forward-only stream: ``head`` (bytes already read) followed by the rest of ``stream``."""

    def __init__(self, head: bytes, stream):
        self._head = head
        self._s = stream

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._s.read(n)
        if n is None or n < 0:
            data, self._head = self._head + self._s.read(), b""
            return data
        data, self._head = self._head[:n], self._head[n:]
        if len(data) < n:
            data += self._s.read(n - len(data))
        return data

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        """The wrapped stream's file descriptor (tar readers take the shard's size from it)."""
        return self._s.fileno()


def expand_braces(pattern: str) -> list[str]:
    """Expand WebDataset-style brace patterns: ``shard-{000000..000009}.tar``, ``{a,b}``.

    Numeric ranges keep the zero padding of their bounds; several groups expand as a product, in
    order.

    Raises:
        ValueError: an unbalanced brace or a range whose end is below its start.
    """
    start = pattern.find("{")
    if start < 0:
        if "}" in pattern:
            raise ValueError(f"pattern {pattern!r}: '}}' without '{{'")
        return [pattern]
    end = pattern.find("}", start)
    if end < 0:
        raise ValueError(f"pattern {pattern!r}: '{{' without '}}'")
    body = pattern[start + 1:end]
    head, tail = pattern[:start], pattern[end + 1:]
    m = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if m:
        a, b = m.groups()
        lo, hi = int(a), int(b)
        if hi < lo:
            raise ValueError(f"pattern {pattern!r}: range {{{a}..{b}}} runs backwards")
        width = len(a) if a.startswith("0") or b.startswith("0") else 0
        width = max(width, len(a)) if width else 0
        items = [str(i).zfill(width) for i in range(lo, hi + 1)]
    else:
        items = body.split(",")
    return [head + item + rest for item in items for rest in expand_braces(tail)]


@dataclasses.dataclass
class IndexReport:
    """What :func:`index_shards` wrote.

    Attributes:
        source: the pattern given.
        output: where the manifest and ``.sfidx`` files were written.
        num_samples: samples indexed; num_shards: shards; num_bytes: their total size.
        classes: the class names in the manifest.
        problems: ``[{"shard", "key", "problem"}]``: members that do not group into a sample
            (no image, no class, ...); those samples are left out of the counts and index.
        seconds: wall time.
    """

    source: str
    output: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    classes: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        shards = "shard" if self.num_shards == 1 else "shards"
        s = (f"indexed {self.num_samples:,} samples in {self.num_shards} {shards} ({self.num_bytes / 1e6:,.1f} MB, "
             f"{f'{len(self.classes)} classes' if self.classes else 'no labels'}); manifest and offset indexes in "
             f"{self.output} ({self.seconds:.1f} s)")
        if self.problems:
            s += f"; {len(self.problems)} sample(s) left out (members that do not form a sample)"
        return s


def _list_shards(pattern: str, storage_options: dict | None = None) -> list[str]:
    if is_url(pattern):
        from shardfeed.readers.storage.opener import open_location

        first = expand_braces(pattern)[0]
        if open_location(first[:first.rfind("/") + 1], storage_options=storage_options).listable:
            return _list_store_shards(pattern, storage_options)
        return expand_braces(pattern)
    p = Path(pattern)
    if p.is_dir():
        shards = sorted(str(x) for x in p.glob("*.tar"))
        if not shards:
            raise FileNotFoundError(f"{p}: no .tar files in this folder")
        return shards
    out = []
    for item in expand_braces(pattern):
        if any(c in item for c in "*?["):
            import glob

            out.extend(sorted(glob.glob(item)))
        else:
            out.append(item)
    if not out:
        raise FileNotFoundError(f"{pattern}: matches no file")
    missing = [x for x in out if not Path(x).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"{missing[0]}: no such shard{more}")
    return out


def _read_classes_file(path: str | os.PathLike) -> list[str]:
    names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"{path}: no class names (one per line expected)")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{path}: class name {dup!r} appears twice")
    return names


def index_shards(pattern: str | os.PathLike, *, out: str | os.PathLike | None = None,
                 classes_file: str | os.PathLike | None = None, overwrite: bool = False,
                 progress: Progress | None = None, storage_options: dict | None = None,
                 labels: bool = True) -> IndexReport:
    """Make existing WebDataset shards readable by shardfeed: write ``manifest.json`` and ``.sfidx`` files.

    Each shard is read once: its sha256 and size, and every sample (members grouped by key,
    WebDataset's rule) with the byte offset of its first header. A sample needs exactly one
    image member and a class: its ``.cls`` member (an integer), or the ``"class"`` name in its
    ``.json`` when ``classes_file`` names the classes. Groups that do not form such a sample are
    reported (by shard and key), listed in the manifest's ``skipped`` and left out of the counts
    and offset indexes. Class names come from ``classes_file`` (one per line, line ``i`` is class
    ``i``); without it, from the samples' ``.json`` ``"class"`` where present, else ``"0"``,
    ``"1"``, ...

    Args:
        pattern: a folder (its ``*.tar``), a path with globs or braces
            (``shards/train-{000000..000099}.tar``), an ``http(s)://`` URL with braces, or a prefix of
            a listable location (``s3://bucket/shards/``, with globs or braces: matched against its
            listing).
        out: where to write the manifest and the ``.sfidx`` files; default the shards' folder.
            Required for URLs (then upload them beside the shards: the manifest names the shards
            by their plain file names, beside it); for local shards it must be their own folder.
        classes_file: a text file with one class name per line.
        overwrite: replace an existing ``manifest.json`` in ``out``. When that manifest is a
            shardfeed WebDataset manifest (version 2 or later) of exactly these shards, unchanged
            (size, sha256, sample count) and ``classes_file`` is absent or names the manifest's own
            classes, only the offset indexes are rebuilt: the manifest keeps
            its version, fields, labels, options, files and other keys, and only its shard entries'
            ``index``/``index_sha256`` are updated.
        progress: ``callback(num_samples, num_bytes)``.
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`).
        labels: False (``--no-labels``): the shards are unlabelled (img2dataset's ``jpg`` + ``txt``
            + ``json``, no ``.cls``): a sample needs one image member only, the manifest says
            ``"labels": "none"`` (readers give label -1), and each other member (``txt``, ...)
            is an extra field with its count. Not with ``classes_file``.

    Returns:
        An :class:`IndexReport`.

    Raises:
        ValueError: no samples at all, shards in different folders without ``out``, local shards
            outside ``out``, a URL without ``out``, a manifest already there, compressed shards, duplicate shard names.
        IncompleteDatasetError: the folder holds a pack that did not finish (``.shardfeed-pack/``,
            no manifest): only that pack's ``--resume`` finishes it; nothing is written.
        CorruptDataError: a shard is not a readable tar (bad header, truncated), or a key's
            members are not contiguous.
        FileNotFoundError, DataSourceError: a shard cannot be read.
    """
    t0 = time.perf_counter()
    progress = progress or noop_progress
    if not labels and classes_file is not None:
        raise ValueError("--classes names the classes of labelled shards; drop it with --no-labels")
    sources = _list_shards(str(pattern), storage_options)
    url = is_url(str(pattern))
    root, names = _index_root(pattern, sources, out, url)
    with output_lock(root, "index"):  # one writer per folder: a second command fails at once, naming this one
        return _index_locked(pattern, root, names, sources, url, classes_file, overwrite, progress, t0,
                             storage_options=storage_options, labelled=labels)


def _index_locked(pattern, root: Path, names: list[str], sources: list[str], url: bool, classes_file,
                  overwrite: bool, progress: Progress, t0: float, *,
                  storage_options: dict | None = None, labelled: bool = True) -> IndexReport:
    """:func:`index_shards` once the folder's lock is held: every offset index is written beside
    the old one and all replace theirs only after every shard was read (:class:`ReplacedTogether`),
    so a failed ``--overwrite`` leaves the dataset as it was."""
    refuse_unfinished_pack(root, "`shardfeed index`")
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise ValueError(f"{root / MANIFEST_NAME}: exists already; pass --overwrite to replace it")
    classes = _read_classes_file(classes_file) if classes_file else None
    with ReplacedTogether() as indexes:
        if overwrite and not url:
            rebuilt = _rebuild_indexes(root, names, sources, classes, progress, t0, pattern, indexes)
            if rebuilt is not None:
                return rebuilt
        return _index_afresh(pattern, root, names, sources, url, classes, classes_file, overwrite, progress, t0,
                             indexes, storage_options=storage_options, labelled=labelled)


def _index_afresh(pattern, root: Path, names: list[str], sources: list[str], url: bool, classes, classes_file,
                  overwrite: bool, progress: Progress, t0: float, indexes: ReplacedTogether, *,
                  storage_options: dict | None = None, labelled: bool = True) -> IndexReport:
    """Read every shard, then put the offset indexes in place and write the manifest."""
    replaced = _version_1_indexes(root) if overwrite else []
    class_to_idx = {c: i for i, c in enumerate(classes)} if classes else None
    report = IndexReport(source=shown_source(pattern), output=str(root))
    shards: list[ShardEntry] = []
    label_names: dict[int, str | None] = {}
    field_counts: dict[str, int] | None = None if labelled else {}
    stems: set[str] = set()
    for source, name in zip(sources, names):
        stem = PurePosixPath(name).name
        stem = stem[:-4] if stem.endswith(".tar") else stem
        if stem in stems:
            raise ValueError(f"{source}: another shard has the same name {stem!r}; index them separately")
        stems.add(stem)
        # not .idx: NVIDIA DALI's wds2idx names its own index of the shard so, and it is never overwritten
        shard = _index_one_shard(source, name, root / f"{stem}{INDEX_SUFFIX}", url=url, classes=classes,
                                 class_to_idx=class_to_idx, classes_file=classes_file, report=report,
                                 label_names=label_names, progress=progress, storage_options=storage_options,
                                 field_counts=field_counts, indexes=indexes)
        shards.append(shard)
        report.num_bytes += shard.num_bytes
        log.info("%s: %d samples", source, shard.num_samples)
    n = sum(s.num_samples for s in shards)
    if n == 0:
        what = "an image and a class" if labelled else "an image"
        raise ValueError(f"{pattern}: no sample with {what} found in {len(shards)} shard(s)"
                         + (f"; first problem: {report.problems[0]['problem']}" if report.problems else "")
                         + ("; for unlabelled shards (no .cls members), pass --no-labels" if labelled else ""))
    if not labelled:
        classes, class_to_idx = [], {}
    elif classes is None:
        classes = _classes_from_labels(label_names)
        class_to_idx = {c: i for i, c in enumerate(classes)}
    skipped = [{"path": f"{p['shard']}:{p['key']}", "shard": p["shard"], "key": p["key"], "reason": p["problem"]}
               for p in report.problems]
    manifest = Manifest(format="webdataset", num_samples=n, classes=classes, class_to_idx=class_to_idx,
                        shards=shards, skipped=skipped,
                        options={"indexed_from": shown_source(pattern), "indexed_by": created_by()},
                        files={"indexed": n, "left_out": len(skipped)},
                        labels=LABELS_CLASS if labelled else LABELS_NONE,
                        fields=_manifest_fields(field_counts or {}, n))
    indexes.commit()
    manifest.write(root)
    for old in replaced:  # a version-1 dataset's own .idx files: superseded by .sfidx; DALI's are kept
        _remove_if_shardfeeds_index(old)
    if not url:  # beside local shards: wids' shardindex.json, the Hugging Face dataset card
        from ..write.consumers import write_consumer_files

        write_consumer_files(root, manifest)
    report.num_samples, report.num_shards, report.classes = n, len(shards), classes
    report.seconds = time.perf_counter() - t0
    return report


def _rebuild_indexes(root: Path, names: list[str], sources: list[str], classes: list[str] | None,
                     progress: Progress, t0: float, pattern, indexes: ReplacedTogether) -> IndexReport | None:
    """Rebuild the offset indexes of the dataset whose manifest is in ``root``, keeping that manifest.

    Applies when ``manifest.json`` is a readable shardfeed WebDataset manifest of version 2 or later
    that lists exactly the shards being indexed, and every shard still has the size, sha256 and
    sample count the manifest records, and ``classes`` (the ``--classes`` file's names; None when
    not given) are the manifest's own. Then each shard's ``.sfidx`` is written again and only the
    shard entries' ``index`` and ``index_sha256`` change in the manifest: its version, fields,
    labels, options, files and every other key keep their values.

    Returns:
        The report, or None when the manifest does not describe these shards (then the shards are
        indexed afresh, the manifest replaced).
    """
    import json

    from shardfeed.readers.format.tario import iter_members, iter_samples

    path = root / MANIFEST_NAME
    try:
        raw = read_small_file(path, what="the manifest")
        old = Manifest.from_json(raw, str(path))
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not describe(old.format).tar_shards or old.version < 2 or not isinstance(doc.get("shards"), list):
        return None
    if classes is not None and list(classes) != list(old.classes):
        return None  # other class names: the samples are labelled afresh
    by_name = {s.name: (i, s) for i, s in enumerate(old.shards)}
    if sorted(names) != sorted(by_name) or len(doc["shards"]) != len(old.shards):
        return None
    rebuilt: list[tuple[int, Path, bytes]] = []
    for source, name in zip(sources, names):
        i, entry = by_name[name]
        offsets: list[int] = []
        with open(source, "rb") as stream:
            reader = HashingReader(stream)
            head = reader.read(TAR_BLOCK)
            if head.startswith(_COMPRESSED_MAGIC):
                return None
            members = iter_members(_Prepended(head, reader), source=source)
            for _key, parts, offset in iter_samples(members, source=source):
                offsets.append(offset)
                progress(1, sum(len(v) for v in parts.values()))
            reader.drain()
        if (reader.num_bytes != entry.num_bytes or len(offsets) != entry.num_samples
                or (entry.sha256 is not None and reader.hexdigest() != entry.sha256)):
            log.info("%s: differs from the manifest's entry; indexing the shards afresh", source)
            return None
        stem = PurePosixPath(name).name
        stem = stem[:-4] if stem.endswith(".tar") else stem
        rebuilt.append((i, root / f"{stem}{INDEX_SUFFIX}", encode_index(offsets)))
    for i, idx_path, index_bytes in rebuilt:
        indexes.write(idx_path, index_bytes)
        doc["shards"][i]["index"] = idx_path.name
        doc["shards"][i]["index_sha256"] = hashlib.sha256(index_bytes).hexdigest()
    data = (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    manifest = Manifest.from_json(data, str(path))  # still a valid manifest before it replaces the old one
    indexes.commit()
    if data != raw:
        write_bytes_atomic(path, data)
    from ..write.consumers import write_consumer_files

    write_consumer_files(root, manifest)
    report = IndexReport(source=shown_source(pattern), output=str(root), num_samples=manifest.num_samples,
                         num_shards=len(manifest.shards), num_bytes=sum(s.num_bytes for s in manifest.shards),
                         classes=list(manifest.classes))
    report.seconds = time.perf_counter() - t0
    return report


def _version_1_indexes(root: Path) -> list[Path]:
    """The ``.idx`` offset indexes a version-1 manifest in ``root`` names (shardfeed's, binary)."""
    try:
        old = Manifest.from_json(read_small_file(root / MANIFEST_NAME, what="the manifest"),
                                 str(root / MANIFEST_NAME))
    except (OSError, ValueError):
        return []
    return [root / s.index for s in old.shards if s.index and s.index.endswith(".idx")]


def _remove_if_shardfeeds_index(path: Path) -> None:
    """Remove a version-1 ``.idx`` unless another tool (NVIDIA DALI's ``wds2idx``) wrote it since."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return
    if is_dali_index(head):
        log.info("%s: an NVIDIA DALI index; kept", path)
        return
    path.unlink(missing_ok=True)
    log.info("%s: version-1 offset index removed (now %s)", path, path.with_suffix(INDEX_SUFFIX).name)


def _list_store_shards(pattern: str, storage_options: dict | None = None) -> list[str]:
    """A listable location's prefix (``s3://bucket/prefix/``: every ``.tar`` under it, one listing),
    or brace / glob patterns of shard URLs matched against the listing of their prefix."""
    import fnmatch

    from shardfeed.readers.storage.opener import open_location

    out: list[str] = []
    for item in expand_braces(pattern):
        if item.endswith(".tar") and not any(c in item for c in "*?["):
            out.append(item)
            continue
        head = item if item.endswith("/") or not any(c in item for c in "*?[") else item[:item.rfind("/") + 1]
        loc = open_location(head, storage_options=storage_options)
        listing = loc.list_sizes()
        if f"{PACK_STATE_DIR}/{PLAN_NAME}" in listing and MANIFEST_NAME not in listing:
            raise unfinished_pack_error(head.rstrip("/"))  # only the pack that made it can finish it
        names = sorted(n for n in listing if n.endswith(".tar") and "/" not in n)
        urls = [loc.url(n) for n in names]
        if head != item:
            urls = [u for u in urls if fnmatch.fnmatchcase(u, item)]
        if not urls:
            raise FileNotFoundError(f"{item}: no .tar objects there")
        out.extend(urls)
    return out


def _index_root(pattern, sources: list[str], out, url: bool) -> tuple[Path, list[str]]:
    """The folder of the manifest and the shards' names relative to it (created when local)."""
    if url:
        if out is None:
            raise ValueError(f"{pattern}: shards on a web server or in a bucket need --out (a local folder for the "
                             "manifest and offset indexes, to upload beside the shards)")
        root = Path(out)
        names = [PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(s).path)).name for s in sources]
    else:
        parents = {str(Path(s).resolve().parent) for s in sources}
        if out is None:
            if len(parents) > 1:
                raise ValueError(f"{pattern}: shards lie in {len(parents)} folders; pass --out to choose where the "
                                 "manifest goes")
            root = Path(parents.pop())
        else:
            root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        names = [os.path.relpath(Path(s).resolve(), root.resolve()).replace(os.sep, "/") for s in sources]
        elsewhere = [n for n in names if plain_file_name_problem(n)]
        if elsewhere:
            raise ValueError(f"{pattern}: {elsewhere[0]} is not in {root}: a manifest names its shards by plain file "
                             "name, beside it (readers refuse paths that leave the dataset's folder); index them "
                             "without --out, or move the shards into the --out folder first")
    if len(set(names)) != len(names):
        raise ValueError(f"{pattern}: two shards share a file name; index them separately")
    root.mkdir(parents=True, exist_ok=True)
    return root, names


def _sample_problem(s, classes, classes_file) -> str | None:
    """Why an otherwise well-formed sample cannot be indexed (a class index out of range), or None."""
    if classes is not None and not 0 <= s.label < len(classes):
        return f"class index {s.label} is outside the {len(classes)} classes of {classes_file}"
    if s.label < 0:
        return f"negative class index {s.label}"
    return None


def _index_one_shard(source: str, name: str, idx_path: Path, *, url: bool, classes, class_to_idx, classes_file,
                     report: IndexReport, label_names: dict, progress: Progress,
                     storage_options: dict | None = None, field_counts: dict[str, int] | None = None,
                     indexes: ReplacedTogether) -> ShardEntry:
    """Read one shard once (sha256, size, samples), write its ``.sfidx`` and return its manifest entry.

    Samples that do not group by the one rule (:func:`~.common.parts_to_sample`) are added to
    ``report.problems``; ``label_names`` collects the class names the samples' metadata gives.
    ``field_counts``: None, labelled shards; else unlabelled ones, and it counts the samples
    holding each extra member (:func:`_extra_members`).
    """
    from shardfeed.readers.format.tario import iter_members, iter_samples

    if url:
        from shardfeed.readers.storage.opener import open_location

        base, _, name = source.rpartition("/")
        # any remote location: one opener and its fault policy
        stream, _ = open_location(base + "/", storage_options=storage_options).open(name)
    else:
        stream = open(source, "rb")
    offsets: list[int] = []
    exts: dict[str, int] = {}
    with stream:
        reader = HashingReader(stream)
        head = reader.read(TAR_BLOCK)
        if head.startswith(_COMPRESSED_MAGIC):
            raise ValueError(f"{source}: a compressed tar; offset indexes need an uncompressed shard "
                             "(decompress it first, e.g. `gunzip`)")
        members = iter_members(_Prepended(head, reader), source=source)
        for key, parts, offset in iter_samples(members, source=source):
            try:
                s = parts_to_sample(key, parts, source=source, class_to_idx=class_to_idx,
                                    labelled=field_counts is None)
            except CorruptDataError as exc:
                report.problems.append(make_problem(name, key, str(exc).split(": ", 1)[-1]))
                continue
            if field_counts is not None:
                for f in _extra_members(parts, s.ext):
                    field_counts[f] = field_counts.get(f, 0) + 1
            why = None if field_counts is not None else _sample_problem(s, classes, classes_file)
            if why:
                report.problems.append(make_problem(name, key, why))
                continue
            if isinstance(s.meta.get("class"), str):
                label_names.setdefault(s.label, s.meta["class"])
            label_names.setdefault(s.label, None)
            offsets.append(offset)
            exts[s.ext] = exts.get(s.ext, 0) + 1
            progress(1, len(s.data))
        reader.drain()
    index_bytes = encode_index(offsets)
    indexes.write(idx_path, index_bytes)  # in place once every shard was read
    return ShardEntry(name, len(offsets), reader.num_bytes, reader.hexdigest(), idx_path.name,
                      hashlib.sha256(index_bytes).hexdigest(), dict(sorted(exts.items())))


def _extra_members(parts: dict, image_ext: str) -> list[str]:
    """The member extensions of an unlabelled sample that are extra fields: not its image, its
    metadata (``json``), a label (``cls``), a ``__name__`` nor a name that is not a field name."""
    return [e for e in parts if e != image_ext and e not in ("json", "cls") and field_name_problem(e) is None
            and field_member(e) == e]


def _manifest_fields(field_counts: dict[str, int], num_samples: int) -> dict[str, dict]:
    """The manifest's ``fields`` of an unlabelled index: per member, how many samples hold it.

    Raises:
        ValueError: more than :data:`~shardfeed.readers.format.manifest.MAX_FIELDS` kinds of member.
    """
    if len(field_counts) > MAX_FIELDS:
        raise ValueError(f"{len(field_counts)} kinds of extra member (e.g. {', '.join(sorted(field_counts)[:5])}), "
                         f"more than the {MAX_FIELDS} fields a dataset may have")
    return {f: {"member": field_member(f), "count": c, "missing": num_samples - c}
            for f, c in sorted(field_counts.items())}


#: The most classes ``index`` infers from the samples' class indexes (one name per index up to the
#: largest); a larger index is far more likely a damaged or foreign ``.cls`` than a real class.
MAX_INFERRED_CLASSES = 1_000_000


def _classes_from_labels(label_names: dict[int, str | None]) -> list[str]:
    """Class names from the samples' metadata where every index has a distinct one, else ``"0"``, ``"1"``, ...

    Raises:
        ValueError: a class index of :data:`MAX_INFERRED_CLASSES` or more (names it and ``--classes``).
    """
    num = max(label_names) + 1
    if num > MAX_INFERRED_CLASSES:
        raise ValueError(f"a sample's class index is {num - 1}: more than {MAX_INFERRED_CLASSES:,} classes would be "
                         "listed; check the shards' .cls members, or name the classes with --classes FILE")
    classes = [label_names.get(i) or str(i) for i in range(num)]
    if len(set(classes)) != len(classes):
        classes = [str(i) for i in range(num)]
    return classes
