"""What in an output location is shardfeed's, and what ``pack`` does with it (one rule for a
local folder and an object-store prefix).

A file is shardfeed's only when the previous dataset's own records name it, never by the look of
its name:

* a finished dataset's ``manifest.json`` (any readable version) names its shards and offset indexes
  (``.sfidx``; ``.idx`` in version 1) or its LMDB ``data.mdb`` (with ``lock.mdb``); beside a
  WebDataset manifest, ``shardindex.json`` and ``README.md`` are ours when their content says so
  (:func:`shardfeed.convert.write.consumers.is_ours`), and so is the path index ``.shardfeed-paths``
  when it starts with its magic (:mod:`shardfeed.convert.write.path_index`);
* an unfinished pack's state folder ``.shardfeed-pack/`` is ours (in a local folder, the files a
  pack writes in it: :func:`~shardfeed.convert.write.pack_state.remove_state_folder` leaves anything
  else there, and the folder with it), and its ``plan.json`` names the
  shards the pack writes (``{prefix}-NNNNNN.tar`` / ``.sfidx`` of its options) or its
  ``data.mdb``/``lock.mdb``; under an object-store prefix the pack writes only
  ``.shardfeed-pack/plan.json`` there, so that key alone is ours: any other key under
  ``.shardfeed-pack/`` is the user's;
* a hidden temporary file of one of those names (``.NAME.tmp``, ``.NAME.XXXX.tmp``: what the
  writers and :func:`~shardfeed.readers.file_io.write_bytes_atomic` leave after ``kill -9``).

Anything else (``family-photos.tar``, a folder ``backup.tar/``, a link, a key one prefix deeper)
is the user's: ``--overwrite`` refuses, naming it, and deletes nothing. A manifest that does not
parse as shardfeed's names nothing and is itself not ours.

:func:`survey` reads a location (entries and a bounded reader, :func:`local_entries` /
:func:`store_entries`); :func:`decide` turns it and the flags into what ``pack`` does.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator, Mapping

from shardfeed.readers.errors import ManifestError
from shardfeed.readers.format.manifest import DEFAULT_PREFIX, LMDB_DATA_NAME, MANIFEST_NAME, Manifest
from shardfeed.readers.format.registry import describe

from .consumers import CARD_MARKER, CARD_NAME, WIDS_INDEX_NAME
from .outlock import LOCK_NAME
from .path_index import PATHS_NAME, is_path_index
from .pack_state import PLAN_NAME, STATE_DIR

__all__ = ["OutContents", "survey", "decide", "local_entries", "store_entries", "flag", "cli_flags",
           "refuse_unfinished_pack", "MAX_RECORD_BYTES", "LMDB_LOCK_NAME", "STORE_STATE_KEY"]

#: Records (manifest, plan, consumer files) larger than this are not read and name nothing.
MAX_RECORD_BYTES = 256 << 20
#: The one key a pack writes under an object-store prefix's ``.shardfeed-pack/``: its plan.
STORE_STATE_KEY = f"{STATE_DIR}/{PLAN_NAME}"
#: LMDB's lock file beside ``data.mdb``.
LMDB_LOCK_NAME = "lock.mdb"
_LMDB_COMPACT_TMP = f".{LMDB_DATA_NAME}.compact.tmp"


_CLI_FLAGS: contextvars.ContextVar[bool] = contextvars.ContextVar("shardfeed_cli_flags", default=False)


@contextlib.contextmanager
def cli_flags() -> Iterator[None]:
    """Inside this block, messages name options by their CLI flags (``--overwrite``); the CLI's
    commands run in it. Outside, they are named as ``PackOptions`` fields."""
    token = _CLI_FLAGS.set(True)
    try:
        yield
    finally:
        _CLI_FLAGS.reset(token)


def flag(name: str, api: bool | None = None) -> str:
    """The spelling of option ``name`` (``"overwrite"``) for the caller: ``--overwrite`` on the
    command line, ``PackOptions(overwrite=True)`` through the API (None: as :func:`cli_flags` says)."""
    if api is None:
        api = not _CLI_FLAGS.get()
    return f"PackOptions({name}=True)" if api else f"--{name.replace('_', '-')}"


@dataclasses.dataclass
class OutContents:
    """What an output location holds.

    Attributes:
        where: the location, for messages (a path or ``s3://bucket/prefix/``).
        entries: ``{name: kind}`` of what it holds (kind ``"file"``, ``"dir"``, ``"link"`` or
            ``"other"``; in a bucket every key is a ``"file"``, and ``.shardfeed-pack/plan.json``
            counts as the one ``"dir"``).
        ours: the entries the records name (``--overwrite`` deletes these only).
        foreign: the other entries, sorted.
        manifest: the finished dataset's manifest, when ``manifest.json`` is shardfeed's.
        plan: the unfinished pack's ``plan.json`` (a dict), when the state folder has one.
        in_the_way: foreign entries at a name the records name (a link, a folder): a pack
            never writes through them.
    """

    where: str
    entries: dict[str, str]
    ours: list[str]
    foreign: list[str]
    manifest: Manifest | None = None
    plan: dict | None = None
    in_the_way: list[str] = dataclasses.field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing there (the lock file of the command holding it aside)."""
        return not self.entries

    @property
    def finished(self) -> bool:
        """A finished dataset: its ``manifest.json`` is shardfeed's."""
        return self.manifest is not None

    @property
    def unfinished(self) -> bool:
        """A pack's state with its plan, and no finished manifest: ``--resume`` continues it."""
        return self.manifest is None and self.plan is not None

    @property
    def interrupted_start(self) -> bool:
        """Only a state folder without a plan (and its temporary files): a pack stopped before
        writing anything; starting again loses nothing."""
        return (self.manifest is None and self.plan is None and self.entries.get(STATE_DIR) == "dir"
                and not self.foreign)

    def named_foreign(self, most: int = 5) -> str:
        """``"a.txt, b/ ..."``: the foreign entries, a few of them (folders end in ``/``)."""
        names = [n + ("/" if self.entries[n] == "dir" else "") for n in self.foreign[:most]]
        return ", ".join(names) + (f" and {len(self.foreign) - most} more" if len(self.foreign) > most else "")


def _tmp_of(name: str) -> str | None:
    """The name ``.NAME.tmp`` / ``.NAME.XXXX.tmp`` is a temporary file of, else None."""
    if not (name.startswith(".") and name.endswith(".tmp")) or "/" in name:
        return None
    return name[1:-4]


def survey(where: str, entries: Mapping[str, str], read: Callable[[str], bytes | None]) -> OutContents:
    """Sort the entries of an output location into shardfeed's (named by its records) and the rest.

    Args:
        where: the location, for messages.
        entries: ``{name: kind}`` (:func:`local_entries`, :func:`store_entries`); the lock file
            of the command holding the location must not be among them.
        read: ``read(name) -> bytes | None``: a file's content (``.shardfeed-pack/plan.json``
            included), None when missing, not a plain file, or larger than
            :data:`MAX_RECORD_BYTES`.

    Returns:
        An :class:`OutContents`.
    """
    entries = dict(entries)
    named: set[str] = set()
    patterns: list[re.Pattern] = []
    manifest = plan = None
    if entries.get(MANIFEST_NAME) == "file":
        raw = read(MANIFEST_NAME)
        if raw is not None:
            try:
                manifest = Manifest.from_json(raw, f"{where}/{MANIFEST_NAME}")
            except (ManifestError, ValueError, TypeError, KeyError, AttributeError):
                manifest = None  # not shardfeed's manifest: it names nothing, and is not ours
    if manifest is not None:
        named.add(MANIFEST_NAME)
        for s in manifest.shards:
            named.update(n for n in (s.name, s.index) if n)
        if describe(manifest.format).files:
            named.update(describe(manifest.format).files)
        else:
            for name in (WIDS_INDEX_NAME, CARD_NAME, PATHS_NAME):
                if entries.get(name) == "file" and _consumer_is_ours(name, read(name)):
                    named.add(name)
    if entries.get(STATE_DIR) == "dir":
        named.add(STATE_DIR)
        raw = read(f"{STATE_DIR}/{PLAN_NAME}")
        try:
            plan = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            plan = None
        if not isinstance(plan, dict):
            plan = None
        if plan is not None:
            options = plan.get("options") if isinstance(plan.get("options"), dict) else {}
            if describe(options.get("format")).files:
                named.update(describe(options.get("format")).files)
            else:
                prefix = options.get("prefix") if isinstance(options.get("prefix"), str) else DEFAULT_PREFIX
                patterns.append(re.compile(rf"{re.escape(prefix)}-[0-9]{{6,}}\.(tar|sfidx)"))
    has_records = manifest is not None or STATE_DIR in named

    def is_named(name: str) -> bool:
        return name in named or any(p.fullmatch(name) for p in patterns)

    ours, foreign, in_the_way = [], [], []
    for name, kind in entries.items():
        if name == LOCK_NAME:
            continue
        if name == STATE_DIR:
            mine = kind == "dir"
        elif name == _LMDB_COMPACT_TMP:
            mine = kind == "dir" and LMDB_DATA_NAME in named
        elif kind != "file":
            mine = False  # a link, a folder (backup.tar/, thesis.tmp/) or a device is never ours
        elif is_named(name):
            mine = True
        else:
            base = _tmp_of(name)
            mine = has_records and base is not None and any(
                is_named(b) or b in (MANIFEST_NAME, WIDS_INDEX_NAME, CARD_NAME)
                for b in {base, base.rsplit(".", 1)[0]})
        (ours if mine else foreign).append(name)
        if not mine and name != STATE_DIR:
            base = _tmp_of(name)
            if is_named(name) or (base is not None and (is_named(base) or is_named(base.rsplit(".", 1)[0]))):
                in_the_way.append(name)  # a link or folder where the pack writes one of its files
    return OutContents(where=where, entries=entries, ours=sorted(ours), foreign=sorted(foreign),
                       manifest=manifest, plan=plan, in_the_way=sorted(in_the_way))


def _consumer_is_ours(name: str, head: bytes | None) -> bool:
    if head is None:
        return False
    if name == CARD_NAME:
        return CARD_MARKER.encode() in head[:1 << 16]
    if name == PATHS_NAME:
        return is_path_index(head)
    try:
        data = json.loads(head)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and str(data.get("created_by", "")).startswith("shardfeed")


def local_entries(out: Path) -> tuple[dict[str, str], Callable[[str], bytes | None]]:
    """The entries of the folder ``out`` (without the lock file) and a reader that never follows a link."""
    entries: dict[str, str] = {}
    if out.is_dir():
        for p in out.iterdir():
            if p.name == LOCK_NAME:
                continue
            try:
                mode = p.lstat().st_mode
            except FileNotFoundError:
                continue
            entries[p.name] = ("link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode)
                               else "file" if stat.S_ISREG(mode) else "other")

    def read(name: str) -> bytes | None:
        path = out / name
        if "/" in name and os.path.islink(out / name.split("/", 1)[0]):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)

    return entries, read


def store_entries(loc, listing: Mapping[str, int]) -> tuple[dict[str, str], Callable[[str], bytes | None]]:
    """The entries of an object-store prefix from its listing (``{key: size}``) and a bounded reader.

    The pack's state object ``.shardfeed-pack/plan.json`` (:data:`STORE_STATE_KEY`, the only key
    a pack writes under ``.shardfeed-pack/``) stands for the state folder (one ``"dir"``); every
    other key, one under ``.shardfeed-pack/`` included, is an entry of its own (so a key the
    records do not name is foreign).
    """
    entries: dict[str, str] = {}
    for key in listing:
        if key == STORE_STATE_KEY:
            entries[STATE_DIR] = "dir"
        else:
            entries[key] = "file"

    def read(name: str) -> bytes | None:
        size = listing.get(name)
        if size is None or size > MAX_RECORD_BYTES:
            return None
        try:
            return loc.read_bytes(name)
        except FileNotFoundError:
            return None

    return entries, read


def decide(contents: OutContents, *, resume: bool, overwrite: bool, api: bool | None = None) -> str:
    """What ``pack`` does with an output location, or the refusal naming the fix.

    Args:
        contents: :func:`survey`'s answer.
        resume, overwrite: the pack's flags.
        api: spell the flags as ``PackOptions`` fields (API) rather than CLI flags (None: as
            :func:`cli_flags` says).

    Returns:
        ``"start"`` (empty, or an interrupted start: clear ``contents.ours`` first),
        ``"resume"`` (an unfinished pack), ``"finished"`` (``resume`` on a finished dataset: the
        caller compares it with this run), or ``"overwrite"`` (delete ``contents.ours``, then start).

    Raises:
        ValueError: the location holds what this run may not touch (names the entries and the fix).
    """
    where = contents.where
    ow, rs = flag("overwrite", api), flag("resume", api)
    elsewhere = "move them away or choose another output location"
    if contents.empty or contents.interrupted_start:
        return "start"
    if contents.foreign:
        what = f"{len(contents.foreign)} entr{'y' if len(contents.foreign) == 1 else 'ies'} shardfeed did not " \
               f"write ({contents.named_foreign()})"
        if overwrite:
            raise ValueError(f"{where}: holds {what}; refusing to delete them with {ow}, which deletes only the "
                             f"files the previous dataset's records name: {elsewhere}")
        if resume and contents.unfinished and not contents.in_the_way:
            return "resume"  # the pack writes only the names of its own plan
        if resume and contents.in_the_way:
            raise ValueError(f"{where}: holds {', '.join(contents.in_the_way[:5])} where the pack writes its own "
                             "files, and not as a plain file (a link or a folder): shardfeed never writes through "
                             "them; remove them, or choose another output location")
        if resume and contents.finished:
            return "finished"
        if resume:
            raise ValueError(f"{where}: not an interrupted shardfeed pack (no {STATE_DIR}/{PLAN_NAME}): it holds "
                             f"{what}; {elsewhere}")
        raise ValueError(f"{where}: output location is not empty: it holds {what}, which {ow} would not delete; "
                         f"{elsewhere}")
    if overwrite:
        return "overwrite"
    if contents.unfinished and contents.plan.get("command") == "convert":
        raise ValueError(f"{where}: holds an unfinished `shardfeed convert` (stopped before its manifest; a convert "
                         f"is not resumed): run it again with {ow}")
    if resume:
        if contents.unfinished:
            return "resume"
        return "finished"
    if contents.unfinished:
        raise ValueError(f"{where}: holds an unfinished pack ({STATE_DIR}/, kept when a pack stops): {rs} finishes "
                         "it with the same source and options; after changing either (a file fixed or removed, "
                         f"--on-error), start again with {ow}")
    raise ValueError(f"{where}: output location is not empty (it holds a dataset shardfeed packed); use {ow} to "
                     f"replace it, {rs} to finish an interrupted pack, or choose an empty one")


def refuse_unfinished_pack(out: str | Path, command: str) -> None:
    """Only the command that made a pack can finish it: refuse another command (``index``) on a
    local folder that holds a pack's state (``.shardfeed-pack/``) and no finished manifest.

    The shards there may be only some of the pack's (a stopped pack, ``write_dataset`` or
    ``convert``), so no other command may describe them as a dataset; the message names the state
    found and the command that finishes it.

    Args:
        out: the folder.
        command: the command refused, for the message (``"shardfeed index"``).

    Raises:
        shardfeed.readers.errors.IncompleteDatasetError: the folder holds such a state.
    """
    from shardfeed.readers.errors import IncompleteDatasetError
    from shardfeed.readers.storage.local_manifest import describe_unfinished

    out = Path(out)
    if not os.path.lexists(out / STATE_DIR):
        return
    contents = survey(str(out), *local_entries(out))
    if contents.finished:
        return  # the manifest, written last, says the pack finished (its state folder was kept)
    found, fix = describe_unfinished(out)
    raise IncompleteDatasetError(f"{out}: holds {found} and no {MANIFEST_NAME}; only the command that made a pack "
                                 f"can finish it, so {command} does not describe its shards as a dataset: {fix}")

