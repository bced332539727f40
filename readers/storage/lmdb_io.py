"""Opening a shardfeed LMDB database for reading (shared by every LMDB reader).

A shardfeed LMDB dataset is ``ROOT/data.mdb`` (+ ``lock.mdb`` where it was written) with one
record per sample (key = the sample key, UTF-8 digits; value =
:func:`shardfeed.readers.format.manifest.encode_record`) and the manifest under
:data:`~shardfeed.readers.format.manifest.LMDB_MANIFEST_KEY`. Keys starting with ``__shardfeed_`` or
``!shardfeed_`` are reserved (a finished database holds only the manifest key; an unfinished one
may also hold ``!shardfeed_pack_state``); every other key is a sample.

Readers open the database **read-only and without a lock** (``lock=False``): nothing is written
next to ``data.mdb``, so it opens on a read-only directory or mount, and by any number of
processes. The price: LMDB's reader table is not used, so a reader assumes that **no process
writes the database while it is open** (a finished shardfeed database is never written again).
Open one environment per process, after the ``fork`` (in the ``DataLoader`` worker), never share
one across processes.

``readahead`` is chosen by measurement (``scripts/measure_lmdb_readahead.py``: cold page cache,
records read in shuffled order as a map-style ``Dataset`` reads them; 2-core VM, ext4 on virtio,
``read_ahead_kb`` 8192). With ``readahead=False`` LMDB asks for random access (``MADV_RANDOM``):
each page fault reads one 4 KiB page, so a 100 KB record costs ~25 synchronous reads. With it on,
a fault reads around the page, which pays off while the file stays in the page cache and is pure
read amplification when it does not:

=====================================  ==================  ==================
cold, shuffled reads                   readahead on        readahead off
=====================================  ==================  ==================
sample DB 38 MB, all 3,000 records     23,300 rec/s        4,100 rec/s
photos DB 47 MB, all 30 records        141 rec/s           27 rec/s
2.2 GB DB (110 KB records), 25 %       1,350 rec/s         417 rec/s
2.2 GB DB, 5 % (1,000 records)         413 rec/s,          515 rec/s,
                                       2,128 MB read       113 MB read
=====================================  ==================  ==================

So the default (``readahead=None``) is *auto*: on when ``data.mdb`` is at most
:data:`READAHEAD_MAX_RAM_FRACTION` of physical memory (over an epoch the file ends up cached, and
read-around fetches it in large sequential reads), off for larger files (read-around pages are
evicted before they are used: 19x the bytes read in the 5 % case, and worse the bigger the file).

On slow storage the map is not the way records are read ahead: every fault is one synchronous
request, and py-lmdb touches all of a value's pages when it returns it.
:class:`~shardfeed.readers.storage.lmdb_readahead.ValueReader` reads the same file without the map (its
B-tree pages, then each record's range by one ``os.pread``), on its own descriptor, so the
``readahead`` setting here does not apply to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CorruptDataError, IncompleteDatasetError, ManifestError
from ..format.manifest import LMDB_DATA_NAME, LMDB_MANIFEST_KEY, MANIFEST_NAME, RESERVED_KEY_PREFIXES, Manifest

__all__ = ["open_lmdb_readonly", "process_env", "close_environments", "read_lmdb_manifest", "choose_readahead",
           "READAHEAD_MAX_RAM_FRACTION", "MAX_READERS", "RESERVED_KEY_PREFIXES", "is_reserved_key"]

#: Automatic ``readahead`` is on for databases up to this share of physical memory (see above).
READAHEAD_MAX_RAM_FRACTION = 0.5
#: ``max_readers`` passed to LMDB. Without a lock file the reader table is not used, so this is no
#: limit on processes; it only sizes the table when a caller opens with a lock.
MAX_READERS = 1024


def is_reserved_key(key: bytes) -> bool:
    """True for shardfeed's bookkeeping keys (the manifest), False for sample keys."""
    return bytes(key).startswith(RESERVED_KEY_PREFIXES)


def choose_readahead(num_bytes: int) -> bool:
    """The automatic ``readahead`` for a ``data.mdb`` of ``num_bytes`` bytes (see the module docstring).

    Returns:
        True when the file is at most :data:`READAHEAD_MAX_RAM_FRACTION` of physical memory.
    """
    try:
        ram_bytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return True
    return num_bytes <= READAHEAD_MAX_RAM_FRACTION * ram_bytes


def open_lmdb_readonly(path: str | os.PathLike, *, readahead: bool | None = None):
    """Open a shardfeed LMDB dataset read-only, without a lock file.

    Works on a read-only directory or mount: no ``lock.mdb`` is created or needed. Assumes no
    concurrent writer (see the module docstring). Open it in the process that reads (after
    ``fork``).

    Args:
        path: the dataset folder (holding ``data.mdb``), or the ``data.mdb`` file itself.
        readahead: kernel read-around on page faults; None (default): :func:`choose_readahead` by the
            file's size (on up to half the RAM, off above).

    Returns:
        An ``lmdb.Environment`` (``readonly=True, lock=False, subdir=True``).

    Raises:
        FileNotFoundError: the folder or its ``data.mdb`` does not exist.
        CorruptDataError: ``data.mdb`` is not an LMDB database (or of an incompatible LMDB version).
        OSError: it cannot be opened otherwise (permissions); the message names the file.
    """
    import lmdb

    root = Path(path)
    if root.name == LMDB_DATA_NAME and root.is_file():
        root = root.parent
    data = root / LMDB_DATA_NAME
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory")
    if not data.is_file():
        raise FileNotFoundError(f"{data}: no LMDB database here (pack one with `shardfeed pack SRC {root} "
                                "--format lmdb`)")
    if readahead is None:
        readahead = choose_readahead(data.stat().st_size)
    try:
        return lmdb.open(str(root), subdir=True, readonly=True, lock=False, readahead=bool(readahead),
                         max_readers=MAX_READERS, max_dbs=0, create=False, meminit=False)
    except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError, lmdb.PageNotFoundError) as exc:
        raise CorruptDataError(f"{data}: not a readable LMDB database ({exc}); run `shardfeed check {root}` "
                               "or repack it") from None
    except lmdb.Error as exc:
        raise OSError(f"{data}: cannot open the LMDB database read-only ({exc})") from None


#: One environment per (process, database), see :func:`process_env`.
_ENVS: dict[str, tuple[int, object, tuple[int, int] | None]] = {}


def process_env(root: str | os.PathLike, readahead: bool | None = None):
    """This process's read-only environment of the database in folder ``root`` (opened without a
    lock on first use, then shared: py-lmdb refuses to open the same files twice in a process, so
    the readers, ``check``, ``inspect`` and ``unpack`` all borrow this one; do not close it).

    An environment inherited through ``fork`` is closed in the child first (it was opened
    read-only without a lock, so closing it only unmaps the child's copy) and opened anew; so is
    one whose ``data.mdb`` was replaced on disk. ``readahead``: see :func:`open_lmdb_readonly`
    (None: automatic); the first opener in a process decides.

    Raises:
        OSError, IncompleteDatasetError, ManifestError: as :func:`open_lmdb_readonly`.
    """
    folder = Path(root)
    if folder.name == LMDB_DATA_NAME and folder.is_file():
        folder = folder.parent
    key = os.path.realpath(folder)
    pid = os.getpid()
    try:
        st = os.stat(os.path.join(key, LMDB_DATA_NAME))
        identity = (st.st_dev, st.st_ino)
    except OSError:
        identity = None  # open_lmdb_readonly names the problem
    entry = _ENVS.get(key)
    if entry is not None:
        owner, env, opened = entry
        if owner == pid and opened == identity:
            return env
        # another process's (after fork), or a database replaced on disk (repacked to the same
        # path): a stale environment would serve the old records
        try:
            env.close()
        except Exception:  # pragma: no cover - nothing more to release
            pass
        del _ENVS[key]
    env = open_lmdb_readonly(folder, readahead=readahead)
    _ENVS[key] = (pid, env, identity)
    return env


def close_environments(roots) -> int:
    """Close this process's cached environments of the databases in ``roots`` (folders).

    Used before evicting their files from the page cache (mapped pages cannot be evicted). A
    dataset object still alive on them cannot read afterwards: open it again. Returns how many
    were closed.
    """
    wanted = {os.path.realpath(r) for r in roots}
    closed = 0
    for key in [k for k in _ENVS if k in wanted]:
        env = _ENVS.pop(key)[1]
        try:
            env.close()
        except Exception:  # pragma: no cover - nothing more to release
            pass
        closed += 1
    return closed


def read_lmdb_manifest(env) -> Manifest:
    """The manifest stored inside an LMDB dataset (under ``__shardfeed_manifest__``).

    The copy equals ``manifest.json`` (an LMDB manifest has no file hashes), so the database alone
    describes itself.

    Args:
        env: an environment from :func:`open_lmdb_readonly`.

    Returns:
        The :class:`~shardfeed.readers.format.manifest.Manifest` (``format == "lmdb"``).

    Raises:
        IncompleteDatasetError: no manifest key: the pack that wrote the database did not finish.
        ManifestError: the stored manifest is malformed, of another version, or not an LMDB one.
    """
    root = Path(env.path())
    with env.begin(buffers=False) as txn:
        raw = txn.get(LMDB_MANIFEST_KEY)
    if raw is None:
        raise IncompleteDatasetError(
            f"{root / LMDB_DATA_NAME}: no {LMDB_MANIFEST_KEY.decode()} record; the pack that wrote it did not "
            f"finish. Finish it with `shardfeed pack SRC {root} --format lmdb --resume`, or rebuild it")
    manifest = Manifest.from_json(bytes(raw), f"{root / LMDB_DATA_NAME} ({LMDB_MANIFEST_KEY.decode()})")
    if manifest.format != "lmdb":
        raise ManifestError(f"{root / LMDB_DATA_NAME}: its stored manifest describes a {manifest.format!r} "
                            f"dataset, not an LMDB one; rebuild it (see {MANIFEST_NAME})")
    return manifest
