"""``pack`` to a remote, writable location (an object-store prefix ``s3://bucket/prefix/``, or
any :class:`~shardfeed.readers.storage.location.Location` registered as ``writable``): the same bytes as
a local pack, uploaded so that a reader never sees a half-written dataset.

The location comes from the one opener (:func:`~shardfeed.readers.storage.opener.open_location`), and
only its interface is used: ``list_sizes``, ``read_bytes``, ``put_bytes``, ``put_file`` (with the
file's sha256), ``head`` (that sha256) and ``delete``.

How:

1. OUT is checked first, by one listing of the prefix, with the rule of a local OUT
   (:mod:`shardfeed.convert.write.ownership`): empty, or (``--resume``) an unfinished pack of ours (or
   this very finished dataset: nothing to do), or (``--overwrite``) a dataset of ours, whose
   objects (those its manifest or plan name) are deleted; anything else is refused, naming it.
2. The dataset is packed by :func:`shardfeed.convert.write.pack.pack_local` into a local staging folder
   (``$SHARDFEED_STAGING_DIR`` or the system temp dir, one folder per OUT URL, so a killed pack
   resumes there); the pack is deterministic, so the shards are those of a local pack.
3. Each shard and its offset index are uploaded whole as soon as the build finishes them (one
   PUT, or a multipart upload for shards of at least
   :data:`~shardfeed.readers.storage.objstore.MULTIPART_THRESHOLD_BYTES`; an object appears only
   complete), a few at a time, each with its sha256 as object metadata, and their local copies
   are removed (the staging folder holds the shards in flight, not the dataset);
   ``manifest.json`` goes last, then the staging folder is removed.
4. ``--resume`` lists the prefix and skips every shard or index whose size and recorded sha256
   equal the manifest's (after ``kill -9``, only what is missing is uploaded again).

LMDB is refused for a bucket (LMDB maps a local file): pack to a local folder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from shardfeed.readers.errors import UnsupportedURLError
from shardfeed.readers.format.manifest import MANIFEST_NAME
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.format.registry import describe
from .consumers import CARD_NAME, META_SAMPLE_SHARDS, WIDS_INDEX_NAME
from .path_index import PATHS_NAME
from .context import PackContext
from .pack_state import PLAN_NAME, STATE_DIR
from .tarwriter import create_new_file

__all__ = ["pack_to_store", "convert_to_store", "staging_dir", "mirror_store_folder", "mirror_layout_folder",
           "UPLOAD_THREADS",
           "DOWNLOAD_THREADS"]

log = logging.getLogger(__name__)

#: Shards uploaded at once (each a PUT, or a multipart upload of 4 parts at a time).
UPLOAD_THREADS = 4
#: Source images downloaded at once when SRC is a folder in a bucket (one GET each).
DOWNLOAD_THREADS = 16
_STATE_KEY = f"{STATE_DIR}/{PLAN_NAME}"


def staging_dir(url: str, kind: str = "staging") -> Path:
    """The local folder where a pack to (or from) ``url`` is staged (stable across runs: resume).

    Its name is predictable (in the shared temp dir), so it must be this user's own: it is
    created 0700, and one that is a link, another user's, or open to others is refused.

    Raises:
        OSError: the folder is a link, not this user's, or readable or writable by others (named,
            with the fix: remove it or set ``SHARDFEED_STAGING_DIR``).
    """
    base = os.environ.get("SHARDFEED_STAGING_DIR") or tempfile.gettempdir()
    path = Path(base) / f"shardfeed-{kind}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"
    _check_own_dir(path)
    return path


def _check_own_dir(path: Path) -> None:
    """Refuse a staging folder that another user could have planted or can write into."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder (a link or a file)"
    elif hasattr(os, "getuid") and st.st_uid != os.getuid():
        problem = f"belongs to another user (uid {st.st_uid})"
    elif stat.S_IMODE(st.st_mode) & 0o022:
        problem = "is writable by other users"
    if problem:
        raise OSError(f"{path}: the staging folder {problem}; shardfeed never stages into a folder others control: "
                      "remove it, or set SHARDFEED_STAGING_DIR to a folder of your own")


def _open(url: str, storage_options: dict | None, *, writable: bool = False, listable: bool = False):
    """The location of ``url`` (the one opener), refused when it cannot do what the pack needs.

    Raises:
        UnsupportedURLError: the location is read-only (``writable``) or cannot list (``listable``).
    """
    from shardfeed.readers.storage.opener import open_location

    loc = open_location(url, storage_options=storage_options)
    if writable and not loc.writable:
        raise UnsupportedURLError(f"{loc}: cannot be written to (a read-only location); write to a local folder "
                                  "or an object-store prefix (s3://BUCKET/PREFIX)")
    if listable and not loc.listable:
        raise UnsupportedURLError(f"{loc}: cannot list its files, so an image folder there cannot be packed; "
                                  "give a local folder or an object-store prefix (s3://BUCKET/PREFIX)")
    return loc


def _make_own_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_own_dir(path)


def mirror_store_folder(src_url: str, *, extensions=None, class_to_idx=None, storage_options: dict | None = None,
                        on_error: str = "raise",
                        progress: Callable[[int, int], Callable[[int, int], None]] | None = None):
    """Copy the image folder at ``src_url`` (``s3://bucket/prefix/``) to a local folder for packing.

    One paginated listing finds the classes and images by the on-disk scan rules
    (:func:`~shardfeed.readers.format.imagefolder.scan_listing`); only the images the scan keeps are
    downloaded, :data:`DOWNLOAD_THREADS` at a time (one GET each), each with its object's
    modification time. A file already there with the object's size and mtime is kept (a resumed
    pack does not download it again).

    The returned scan is the listing's, rooted at the mirror: pack it as it is (``pack(...,
    scan=scan)``), so the pack accounts for the bucket's objects as a local pack does for the
    files of the same tree: ``found`` counts every object below the prefix, the objects that are
    not images (other extensions, hidden, outside the class folders) are ``ignored``, and images
    whose key breaks the name policy are ``unpackable`` (skipped under ``on_error="skip"``).

    Args:
        src_url: the image folder's prefix URL.
        extensions, class_to_idx: as :func:`~shardfeed.readers.format.imagefolder.scan_listing`.
        storage_options: object-store client options.
        on_error: ``"raise"``: an image whose key breaks the name policy stops it before anything
            is downloaded, naming the object; ``"skip"``: it is left out (the scan lists it).
        progress: for a progress bar: ``progress(num_files, num_bytes)`` is called once the
            listing is scanned, with the images to fetch, and returns ``callback(files, bytes)``,
            called (from this thread) as each is downloaded or found there already.

    Returns:
        ``(local_folder, scan)``: the mirror (``$SHARDFEED_STAGING_DIR`` or the temp dir) and the
        scan of the listing, rooted there, whose ``source`` is the prefix URL (no credentials:
        what the packed manifest records as ``options.source``).

    Raises:
        ValueError: no class folders or images under the prefix (the scan's errors); an image
            whose key breaks the name policy (``on_error="raise"``).
        DataSourceError: the listing or a download failed after the retries (names the URL).
    """
    import dataclasses

    from shardfeed.readers.format.imagefolder import ScannedFiles, scan_listing

    loc = _open(src_url, storage_options, listable=True)
    scan = scan_listing(str(loc), loc.list_objects(), extensions=extensions, class_to_idx=class_to_idx)
    if scan.unpackable and on_error != "skip":
        first = scan.unpackable[0]
        more = f" (and {len(scan.unpackable) - 1} more such object(s))" if len(scan.unpackable) > 1 else ""
        raise ValueError(f"{loc.where(first['path'])}: {first['reason']}{more}; or pass "
                         "--on-error skip to pack the rest and list these in the manifest's skipped")
    dest = staging_dir(str(loc), "mirror")
    files = scan.files
    # every class folder exists locally, empty ones included (they keep their index)
    _make_own_dir(dest)
    for c in scan.classes:
        if c in files.class_names or class_to_idx is None:
            (dest / c).mkdir(parents=True, exist_ok=True)

    _mirror_objects(loc, dest, _Objects(len(files), lambda i: (files.rels[i], files.sizes[i], files.mtimes_ns[i])),
                    progress=progress)
    local = ScannedFiles(str(dest), files.rels, files.sizes, files.mtimes_ns, files.class_codes, files.class_names,
                         files.class_labels, files.ext_codes, files.exts)
    # the manifest records the bucket's URL (str(loc): no credentials), not the mirror's path
    return dest, dataclasses.replace(scan, root=str(dest), files=local, source=str(loc))


def mirror_layout_folder(src_url: str, *, extensions=None, sidecars: tuple[str, ...] = (), max_files: int,
                         storage_options: dict | None = None,
                         progress: Callable[[int, int], Callable[[int, int], None]] | None = None) -> tuple[Path, str]:
    """Copy the folder at ``src_url`` (``s3://bucket/prefix/``) to a local folder for a layout
    pack (a labels file, sidecar files, no labels).

    One paginated listing; only the objects the layout scan may read are downloaded
    (:func:`~shardfeed.convert.write.layout_scan.may_be_read`: a packed extension or a requested
    sidecar suffix, outside hidden folders), :data:`DOWNLOAD_THREADS` at a time, as
    :func:`mirror_store_folder` does. Every other object is mirrored as an empty file of its name
    (never read), so the layout scan of the mirror counts found and ignored files as it does for a
    local folder of the same tree. A file already there with the object's size and mtime is kept.

    Args:
        src_url: the folder's prefix URL.
        extensions: the packed extensions (None: the defaults).
        sidecars: the requested sidecar suffixes (lower case, no leading dot).
        max_files: most objects below the prefix (the layout scan's bound).
        storage_options: object-store client options.
        progress: as :func:`mirror_store_folder`.

    Returns:
        ``(local_folder, url)``: the mirror (``$SHARDFEED_STAGING_DIR`` or the temp dir) and the
        prefix URL without credentials (what the packed manifest records as ``options.source``).

    Raises:
        ValueError: more than ``max_files`` objects; an object whose name cannot be a local path
            (an empty, ``.`` or ``..`` part), or that is also the folder of another object (named).
        DataSourceError: the listing or a download failed after the retries (names the URL).
    """
    from .layout_scan import may_be_read
    from .scan import parse_extensions

    loc = _open(src_url, storage_options, listable=True)
    exts = parse_extensions(extensions)
    listing = [(rel, size, mtime) for rel, size, mtime in loc.list_objects() if rel and not rel.endswith("/")]
    if len(listing) > max_files:
        raise ValueError(f"{loc}: more than {max_files} objects; pack a smaller folder")
    folders = {"/".join(parts[:i]) for parts in (rel.split("/") for rel, *_ in listing) for i in range(1, len(parts))}
    read, placeholders = [], []
    for rel, size, mtime in listing:
        parts = rel.split("/")
        if any(p in ("", ".", "..") or "\0" in p for p in parts) or rel in folders:
            why = "is also the folder of other objects" if rel in folders else "has an empty, '.' or '..' part"
            raise ValueError(f"{loc.where(rel)}: the object's name {why}, so it cannot be a file of the local "
                             "mirror; rename it, or pack a prefix without it")
        if not any(p.startswith(".") for p in parts) and may_be_read(parts[-1], exts, sidecars):
            read.append((rel, size, mtime))
        else:
            placeholders.append((rel, mtime))
    dest = staging_dir(str(loc), "mirror")
    _make_own_dir(dest)
    _mirror_objects(loc, dest, read, placeholders=placeholders, progress=progress)
    return dest, str(loc)


class _Objects:
    """A read-only sequence of ``(name, size, mtime ns)`` computed per index (no list of tuples:
    a mirror of millions of images keeps the scan's compact columns only)."""

    def __init__(self, n: int, item: Callable[[int], tuple[str, int, int]]):
        self.n, self.item = n, item

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return map(self.item, range(self.n))


def _mirror_objects(loc, dest: Path, objects, *,
                    placeholders: list[tuple[str, int]] = (),
                    progress: Callable[[int, int], Callable[[int, int], None]] | None = None) -> None:
    """Download ``objects`` (a sized iterable of ``(name below the prefix, size bytes, mtime ns)``) into ``dest``,
    :data:`DOWNLOAD_THREADS` at a time (one GET each, at most the object store's whole-read
    bound), each with its object's modification time; a file already there with the object's size
    and mtime is kept. ``placeholders`` (``(name, mtime ns)``) are written as empty files: objects a
    scan lists (ignored) but never reads. Files of an earlier mirror that neither names are removed.
    Each file is written to a temporary file in a folder beside ``dest`` (any name in ``dest`` may
    be an object's), then renamed into place.

    Raises:
        ValueError: a part of an object's name is longer than the local disk's longest file name
            (named, before anything is downloaded).
        DataSourceError: a download failed after the retries (names the URL).
    """
    name_max = _name_max(dest)
    for rel in itertools.chain((rel for rel, *_ in objects), (rel for rel, _ in placeholders)):
        if len(rel) > name_max // 4 and any(len(os.fsencode(p)) > name_max for p in rel.split("/")):
            raise ValueError(f"{loc.where(rel)}: a part of the object's name is longer than {name_max} bytes, the "
                             "longest file name of the local disk, so it cannot be a file of the local mirror; "
                             "rename it, or pack a prefix without it")
    part = dest.with_name(f"{dest.name}.part")
    _make_own_dir(part)
    tmp_names = itertools.count()

    def write(path: Path, data: bytes, mtime: int) -> None:
        _write_mirrored(path, data, mtime, part / f"{next(tmp_names)}.tmp")

    try:
        _download(loc, dest, objects, placeholders, write, progress)
    finally:
        shutil.rmtree(part, ignore_errors=True)


def _download(loc, dest: Path, objects, placeholders, write: Callable[[Path, bytes, int], None], progress) -> None:
    """The downloads of :func:`_mirror_objects`, each file written by ``write(path, data, mtime)``."""

    def fetch(item: tuple[str, int, int]) -> int:
        rel, size, mtime = item
        path = dest / rel
        try:
            st = path.stat()
            if st.st_size == size and st.st_mtime_ns == mtime:
                return size
        except FileNotFoundError:
            pass
        data = loc.read_bytes(rel)
        write(path, data, mtime)
        return len(data)

    keep = {rel for rel, *_ in objects} | {rel for rel, _ in placeholders}
    if dest.is_dir():  # objects deleted since an earlier mirror must not be packed
        for p in dest.rglob("*"):
            if (p.is_file() or p.is_symlink()) and p.relative_to(dest).as_posix() not in keep:
                p.unlink()
    for rel, mtime in placeholders:
        if not (dest / rel).is_file():
            write(dest / rel, b"", mtime)
    fetched = progress(len(objects), sum(size for _, size, _ in objects)) if progress is not None else None
    with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
        for nbytes in pool.map(fetch, objects):
            if fetched is not None:
                fetched(1, nbytes)


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) of the disk of ``folder`` (255 when it cannot tell)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _write_mirrored(path: Path, data: bytes, mtime: int, tmp: Path) -> None:
    """``data`` written to ``path`` through the temporary file ``tmp`` (atomically, never through a
    link) with the modification time ``mtime``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(create_new_file(tmp), "wb") as f:  # never through a link
        f.write(data)
    os.utime(tmp, ns=(mtime, mtime))
    os.replace(tmp, path)


def _check_out(loc, options, *, scan=None, t0: float = 0.0, finished: Callable | None = None):
    """Check OUT by one listing, with the rule of a local OUT (:mod:`shardfeed.convert.write.ownership`:
    shardfeed's are the objects the previous dataset's manifest or plan name, directly under the
    prefix, and the plan ``.shardfeed-pack/plan.json``; any other key under ``.shardfeed-pack/`` is
    the user's); delete ours for ``overwrite`` (the manifest first).

    Returns:
        ``(listing, report)``: the listing to resume against (``{}`` after a delete), and the
        report of a ``resume`` on this very finished dataset (nothing to do), else None; that
        report is ``finished(manifest, where, t0)`` when given, else the class-folder one.
    """
    from .ownership import decide, store_entries, survey

    listing = loc.list_sizes()
    entries, read = store_entries(loc, listing)
    contents = survey(str(loc), entries, read)
    action = decide(contents, resume=options.resume, overwrite=options.overwrite)
    if action == "finished":
        if finished is not None:
            return listing, finished(contents.manifest, str(loc), t0)
        from .report import finished_report

        return listing, finished_report(contents.manifest, str(loc), scan, options, t0)
    if action in ("start", "overwrite") and contents.ours:
        ours = set(contents.ours)
        # under the state prefix only the plan is ours: any other key there was refused as foreign
        keys = [k for k in listing if k in ours or (STATE_DIR in ours and k == _STATE_KEY)]
        if MANIFEST_NAME in ours:
            loc.delete(MANIFEST_NAME)  # first: the dataset stops being "finished" before its shards go
        for key in keys:
            if key != MANIFEST_NAME:
                loc.delete(key)
        return {}, None
    return listing, None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


def pack_to_store(src, out_url: str, options, build: Callable, *, context: PackContext, scan=None,
                  finished: Callable | None = None):
    """Pack the image folder ``src`` into the object-store prefix ``out_url``.

    Args:
        src: the image folder (local path).
        out_url: a writable location: ``s3://bucket/prefix/``, or a registered ``scheme://`` URL.
        options: :class:`~shardfeed.convert.write.pack.PackOptions` (``format`` must be ``wds``).
        build: the local build, ``build(src, stage, options, scan=, context=) -> PackReport``
            (:func:`shardfeed.convert.write.pack.pack_local`), given a copy of ``context`` whose
            ``on_shard_end(entry, index)`` it calls as each shard is complete: its upload starts
            then.
        context: the pack's :class:`~shardfeed.convert.write.context.PackContext`: its executor and
            progress sinks go to the local build, its ``storage_options`` (object-store client
            options) to the uploads, its ``faults`` may slow the uploads (tests).
        scan: a scan of ``src`` done already.
        finished: ``finished(manifest, where, t0) -> PackReport``: the report (or the refusal) of
            ``resume`` on a finished dataset at ``out_url``, for a build that is not a class-folder
            pack (a layout plan); None: the class-folder rule, on ``scan`` (``src`` is scanned
            when no ``scan`` is given).

    Returns:
        The :class:`~shardfeed.convert.write.pack.PackReport`, with ``output`` = ``out_url`` and
        ``extra["uploaded"]`` / ``extra["upload_skipped"]`` (files uploaded / already there).

    Raises:
        UnsupportedURLError: LMDB to a bucket, a location that is not writable, or no client installed.
        ValueError: OUT not empty (without ``resume``/``overwrite``) and what ``pack`` raises.
        DataSourceError: an upload failed after the retries (complete objects stay for ``resume``).
    """
    t0 = time.perf_counter()
    storage_options = context.storage_options
    fmt = str(options.format).lower()
    if not describe(fmt).remote_writable:
        raise UnsupportedURLError(f"{out_url}: an LMDB dataset is written to a local disk only (LMDB maps its file "
                                  "into memory); pack with --format wds to write to a bucket, or pack to a local "
                                  "folder")
    loc = _open(out_url, storage_options, writable=True)
    if scan is None and finished is None:
        from .scan import scan_image_folder

        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx,
                                 follow_external_links=options.follow_external_links)
    from .outlock import check_not_busy

    check_not_busy(staging_dir(str(loc)))  # another pack to this prefix from this host: named before the prefix
    listing, done = _check_out(loc, options, scan=scan, t0=t0, finished=finished)
    if done is not None:
        return done
    stage = staging_dir(str(loc))
    local_resume = options.resume and bool(listing) and (stage / STATE_DIR).is_dir()
    if stage.exists() and not local_resume:
        shutil.rmtree(stage)
    _make_own_dir(stage)
    import dataclasses

    local_opts = dataclasses.replace(options, resume=local_resume, overwrite=False)
    # marks the prefix before any shard; its options name the shards this pack writes (what is ours)
    loc.put_bytes(_STATE_KEY, json.dumps({"pack": "unfinished", "options": options.fingerprint_fields()}).encode())
    delay_s = context.faults.upload_delay_s if context.faults is not None else 0.0
    uploader = _Uploader(loc, stage, listing, delay_s)
    try:
        report = build(src, stage, local_opts, scan=scan, context=context.replace(on_shard_end=uploader.shard_done))
    except BaseException:
        uploader.abandon()  # uploads in flight finish (whole objects); queued ones are dropped
        raise
    manifest = load_manifest(stage, check_files=False)
    for entry in manifest.shards:  # anything the background uploads did not reach yet
        uploader.upload(entry.name, entry.num_bytes, entry.sha256, entry.index, entry.index_sha256)
    uploader.drain()
    # wids' shard index, the Hugging Face card and the path index, when written
    for name in (WIDS_INDEX_NAME, CARD_NAME, PATHS_NAME):
        if (stage / name).exists():
            loc.put_bytes(name, (stage / name).read_bytes())
    loc.put_bytes(MANIFEST_NAME, (stage / MANIFEST_NAME).read_bytes())  # last: the dataset is finished
    loc.delete(_STATE_KEY)
    shutil.rmtree(stage, ignore_errors=True)
    report.output = str(loc)
    report.seconds = time.perf_counter() - t0  # the local build and the uploads
    report.extra.update(uploaded=uploader.num_uploaded, upload_skipped=uploader.num_skipped)
    return report


def convert_to_store(out_url: str, build: Callable[[Path], object], *, fmt: str, prefix: str,
                     overwrite: bool = False, storage_options: dict | None = None):
    """Write a converted dataset to the object-store prefix ``out_url`` as :func:`pack_to_store`
    writes a pack: OUT checked by one listing with the rule of a local OUT
    (:mod:`shardfeed.convert.write.ownership`; ``overwrite`` deletes only what the previous dataset's
    records name), a record of the convert in progress under the prefix, the dataset built in a
    local staging folder by ``build(stage)``, each shard and index uploaded whole with its sha256,
    the manifest last, the staging folder removed.

    Args:
        out_url: a writable location: ``s3://bucket/prefix/``, or a registered ``scheme://`` URL.
        build: ``build(stage_folder) -> report`` writes the dataset there (with its manifest).
        fmt, prefix: the output's canonical format (sharded formats only) and shard prefix.
        overwrite: replace a shardfeed dataset under the prefix.
        storage_options: object-store client options.

    Returns:
        ``(report, url)``: what ``build`` returned, and the prefix's normalized URL.

    Raises:
        UnsupportedURLError: a format that is written to a local disk only (LMDB).
        ValueError: the prefix is not empty (without ``overwrite``), or holds objects shardfeed
            did not write.
        DataSourceError: an upload failed after the retries (the manifest is not uploaded: the
            prefix never looks finished).
    """
    import types

    from .outlock import check_not_busy

    if not describe(fmt).remote_writable:
        raise UnsupportedURLError(f"{out_url}: an LMDB dataset is written to a local disk only (LMDB maps its file "
                                  "into memory); convert with --format wds to write to a bucket, or to a local folder")
    loc = _open(out_url, storage_options, writable=True)
    stage = staging_dir(str(loc))
    check_not_busy(stage)
    _check_out(loc, types.SimpleNamespace(resume=False, overwrite=overwrite))
    if stage.exists():
        shutil.rmtree(stage)
    _make_own_dir(stage)
    loc.put_bytes(_STATE_KEY, json.dumps({"command": "convert", "options": {"format": fmt, "prefix": prefix}}).encode())
    report = build(stage)
    manifest = load_manifest(stage, check_files=False)
    uploader = _Uploader(loc, stage, {}, 0.0)
    for entry in manifest.shards:
        uploader.upload(entry.name, entry.num_bytes, entry.sha256, entry.index, entry.index_sha256)
    uploader.drain()
    for name in (WIDS_INDEX_NAME, CARD_NAME):
        if (stage / name).exists():
            loc.put_bytes(name, (stage / name).read_bytes())
    loc.put_bytes(MANIFEST_NAME, (stage / MANIFEST_NAME).read_bytes())  # last: the dataset is finished
    loc.delete(_STATE_KEY)
    shutil.rmtree(stage, ignore_errors=True)
    return report, str(loc)


class _Uploader:
    """Uploads each shard and its index as soon as the local build finishes it (the build's
    ``on_shard_end`` hands it over: :meth:`shard_done`), :data:`UPLOAD_THREADS` at a time, and
    removes the local copies once uploaded, so the staging folder holds only the shards in flight.
    A file the listing shows with the same size and sha256 metadata is not uploaded again (resume)."""

    def __init__(self, loc, stage: Path, listing: dict[str, int], delay_s: float):
        import threading

        self.loc, self.stage, self.listing, self.delay_s = loc, stage, listing, delay_s
        self.pool = ThreadPoolExecutor(UPLOAD_THREADS)
        self.futures: list = []
        self.seen: set[str] = set()
        self.num_uploaded = self.num_skipped = 0
        self.keep_local: set[str] = set()
        self._lock = threading.Lock()

    def shard_done(self, entry, index: int) -> None:
        """The build's ``on_shard_end(entry, index)``: queue the upload of the shard and its index.

        The first :data:`~shardfeed.convert.write.consumers.META_SAMPLE_SHARDS` shards keep their local
        copy until the staging folder goes: the build's consumer files (the dataset card) read
        their first samples once every shard is written, and must find them whatever the uploads'
        timing."""
        if index < META_SAMPLE_SHARDS:
            with self._lock:
                self.keep_local.add(entry.name)
        self.upload(entry.name, entry.num_bytes, entry.sha256, entry.index, entry.index_sha256)

    def upload(self, name: str, num_bytes: int, sha256: str | None, index: str | None,
               index_sha256: str | None) -> None:
        with self._lock:
            if name in self.seen:
                return
            self.seen.add(name)
            self.futures.append(self.pool.submit(self._upload_shard, name, num_bytes, sha256, index, index_sha256))

    def _upload_one(self, name: str, sha256: str | None) -> None:
        path = self.stage / name
        size = path.stat().st_size
        if sha256 and self.listing.get(name) == size and _remote_sha256(self.loc, name) == sha256:
            with self._lock:
                self.num_skipped += 1
            return
        if self.delay_s:
            time.sleep(self.delay_s)
        self.loc.put_file(name, path, sha256=sha256 or _sha256_file(path))
        with self._lock:
            self.num_uploaded += 1

    def _upload_shard(self, name, num_bytes, sha256, index, index_sha256) -> None:
        if index:
            self._upload_one(index, index_sha256)
        self._upload_one(name, sha256)
        # uploaded: the local copies go (a resumed local build rebuilds them, and they are then skipped)
        with self._lock:
            if name in self.keep_local:
                return
        for n in (name, index):
            if n:
                (self.stage / n).unlink(missing_ok=True)

    def abandon(self) -> None:
        """Drop the queued uploads (the build failed); the ones in flight complete."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    def drain(self) -> None:
        """Wait for every upload; the first failure is raised (complete objects stay for resume)."""
        try:
            for f in list(self.futures):
                f.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _remote_sha256(loc, name: str) -> str | None:
    try:
        return loc.head(name).get("sha256")
    except FileNotFoundError:
        return None
