"""A node's processes parse and validate a large manifest once.

:func:`parse_manifest` is how every location turns the bytes of ``manifest.json`` into a
:class:`~shardfeed.readers.format.manifest.Manifest`. A manifest of at least
:data:`MIN_SHARED_MANIFEST_BYTES` is parsed and validated by the first process that opens it; that
process writes the result in a compact form (:mod:`shardfeed.readers.format.manifest_table`) as
``<sha256 of the manifest bytes>.sfman`` in a per-user cache folder (:func:`manifest_cache_dir`,
mode 0700, never inside the dataset's folder). Every later process on the machine maps that file
read-only and reads each shard's entry from it as it is asked for.

* The file is named by the digest of the manifest's bytes: a changed manifest is another file.
* It is written under an exclusive lock (the shard cache's bounded lock), to a temporary file
  renamed into place: concurrent first opens build it once. A lock not granted within
  :data:`MANIFEST_LOCK_TIMEOUT_S` is not waited for further: that process parses the JSON itself.
* It is checked before use (sizes, its own digest, the manifest's digest, every offset); a
  truncated or damaged file is ignored and rebuilt, never trusted.
* At most :data:`MAX_CACHED_MANIFESTS` files are kept; the least recently written go first.
* ``SHARDFEED_MANIFEST_CACHE`` names another folder, or ``off`` turns the cache off.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import re
import stat
from pathlib import Path

from ..errors import DataSourceError
from ..file_io import write_bytes_atomic
from ..format.manifest import MAX_MANIFEST_BYTES, Manifest
from ..format.manifest_table import MANIFEST_TABLE_SUFFIX, decode_manifest_table, encode_manifest_table

__all__ = ["MIN_SHARED_MANIFEST_BYTES", "MANIFEST_LOCK_TIMEOUT_S", "MAX_CACHED_MANIFESTS", "manifest_cache_dir",
           "parse_manifest"]

log = logging.getLogger(__name__)

#: Manifests smaller than this are parsed in each process (parsing ~1 MB of JSON takes about as
#: long as looking the compact form up).
MIN_SHARED_MANIFEST_BYTES = 1 << 20
#: Seconds a process waits for another to build the compact form before parsing the JSON itself.
MANIFEST_LOCK_TIMEOUT_S = 120.0
#: Compact forms kept in the cache folder.
MAX_CACHED_MANIFESTS = 32
#: The largest compact form read (its shard table is smaller than the JSON it came from, plus slack).
MAX_TABLE_BYTES = 2 * MAX_MANIFEST_BYTES
_ENV = "SHARDFEED_MANIFEST_CACHE"
_CACHE_NAME = re.compile(r"[0-9a-f]{64}" + re.escape(MANIFEST_TABLE_SUFFIX))


def manifest_cache_dir() -> Path | None:
    """The folder of the compact forms: ``$SHARDFEED_MANIFEST_CACHE`` (``off``, ``0`` or empty:
    None, no cache), else ``$XDG_CACHE_HOME/shardfeed/manifests`` (``~/.cache`` when unset)."""
    env = os.environ.get(_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "no", "false") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardfeed" / "manifests"


def _usable(folder: Path) -> bool:
    """Create ``folder`` (mode 0700) and tell whether it is a folder of this user that no one
    else may write to (anything else: the cache is not used)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(folder, follow_symlinks=False)
    except OSError as exc:
        log.debug("%s: manifest cache not usable (%s)", folder, exc)
        return False
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
    if not ok:
        log.warning("%s: not a folder of this user closed to others; the manifest cache is not used "
                    "(remove it, or set %s to another folder)", folder, _ENV)
    return ok


def _load(path: Path, digest: bytes) -> Manifest | None:
    """The manifest held in the compact form at ``path``, mapped read-only; None when there is
    none, or it is not a regular file of this user, too large, truncated or damaged."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or not 0 < st.st_size <= MAX_TABLE_BYTES:
            return None
        buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        return decode_manifest_table(buf, digest)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        log.info("%s: damaged parsed-manifest cache file (%s); rebuilding it", path, exc)
        return None


def _evict(folder: Path, keep: Path) -> None:
    """Remove the least recently written compact forms beyond :data:`MAX_CACHED_MANIFESTS` (a
    process that maps one keeps reading it). Only the files this cache names (``<sha256>.sfman``
    and its ``.lock``) are removed: the folder may be one the user named, holding other files."""
    try:
        with os.scandir(folder) as it:
            found = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for _, e in zip(range(10_000), it)
                     if _CACHE_NAME.fullmatch(e.name) and e.path != str(keep)]
    except OSError:
        return
    found.sort()
    for _, old in found[:max(0, len(found) - MAX_CACHED_MANIFESTS + 1)]:
        for p in (old, old[:-len(MANIFEST_TABLE_SUFFIX)] + ".lock"):
            try:
                os.unlink(p)
            except OSError:
                pass


def _build(raw: bytes, source: str, digest: bytes, path: Path) -> Manifest:
    """Parse and validate ``raw``, write its compact form at ``path``, and return the mapped form
    (the parsed one when it cannot be written)."""
    manifest = Manifest.from_json(raw, source)
    try:
        write_bytes_atomic(path, encode_manifest_table(manifest, digest))
    except (OSError, ValueError) as exc:
        log.info("%s: parsed manifest not cached (%s)", path, exc)
        return manifest
    _evict(path.parent, path)
    return _load(path, digest) or manifest


def parse_manifest(raw: bytes, source: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Manifest:
    """Parse and validate the bytes of a ``manifest.json`` (:meth:`Manifest.from_json`), once per
    machine for a manifest of at least :data:`MIN_SHARED_MANIFEST_BYTES`.

    Args:
        raw: the manifest's bytes.
        source: its path or URL, named in errors.
        cache_dir: the folder of the compact forms (default :func:`manifest_cache_dir`).

    Returns:
        The manifest; for a large one its ``shards`` is a read-only
        :class:`~shardfeed.readers.format.manifest_table.ShardTable` (equal to the parsed list).

    Raises:
        ManifestError: as :meth:`Manifest.from_json` (a bad manifest is never cached).
    """
    folder = Path(cache_dir) if cache_dir is not None else manifest_cache_dir()
    if len(raw) < MIN_SHARED_MANIFEST_BYTES or folder is None or not _usable(folder):
        return Manifest.from_json(raw, source)
    digest = hashlib.sha256(raw).digest()
    path = folder / f"{digest.hex()}{MANIFEST_TABLE_SUFFIX}"
    found = _load(path, digest)
    if found is not None:
        return found
    from .shard_cache import lock_file

    try:
        fd = lock_file(folder / f"{digest.hex()}.lock", fcntl.LOCK_EX, MANIFEST_LOCK_TIMEOUT_S,
                       lambda: f"{path}: another process holds its lock")
    except (OSError, DataSourceError) as exc:
        log.info("%s: parsing the manifest without its cache (%s)", source, exc)
        return Manifest.from_json(raw, source)
    try:
        found = _load(path, digest)  # built by the process that held the lock
        return found if found is not None else _build(raw, source, digest, path)
    finally:
        os.close(fd)
