"""Opening a shardfeed LMDB database for reading (shared by every LMDB reader).

A shardfeed LMDB dataset is ``ROOT/data.mdb`` (+ ``lock.mdb`` where it was written) with one
record per sample (key = the sample key, UTF-8 digits; value =
:func:`shardfeed.readers.format.encode_record`) and the manifest under
:data:`~shardfeed.readers.format.LMDB_MANIFEST_KEY`. Keys starting with ``__shardfeed_`` or
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
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CorruptDataError, IncompleteDatasetError, ManifestError
from .format import LMDB_DATA_NAME, LMDB_MANIFEST_KEY, MANIFEST_NAME, Manifest

__all__ = ["open_lmdb_readonly", "read_lmdb_manifest", "choose_readahead", "READAHEAD_MAX_RAM_FRACTION",
           "MAX_READERS", "RESERVED_KEY_PREFIXES", "is_reserved_key"]

#: Automatic ``readahead`` is on for databases up to this share of physical memory (see above).
READAHEAD_MAX_RAM_FRACTION = 0.5
#: ``max_readers`` passed to LMDB. Without a lock file the reader table is not used, so this is no
#: limit on processes; it only sizes the table when a caller opens with a lock.
MAX_READERS = 1024
#: Key prefixes that are not samples.
RESERVED_KEY_PREFIXES = (b"__shardfeed_", b"!shardfeed_")


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


def read_lmdb_manifest(env) -> Manifest:
    """The manifest stored inside an LMDB dataset (under ``__shardfeed_manifest__``).

    The copy equals ``manifest.json`` (an LMDB manifest has no file hashes), so the database alone
    describes itself.

    Args:
        env: an environment from :func:`open_lmdb_readonly`.

    Returns:
        The :class:`~shardfeed.readers.format.Manifest` (``format == "lmdb"``).

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
