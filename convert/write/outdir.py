"""A local OUT before a pack or convert writes to it: checked (never SRC or inside it, never a
file, its contents by the ownership rule of :mod:`shardfeed.convert.write.ownership`), then created,
or cleared of what the previous dataset's records name."""

from __future__ import annotations

import shutil
from pathlib import Path

from shardfeed.readers.format.manifest import DEFAULT_PREFIX, MANIFEST_NAME

from .outlock import check_not_busy
from .pack_state import STATE_DIR, remove_shard_temp_files, remove_state_folder
from .ownership import decide, local_entries, survey

__all__ = ["prepare_output", "remove_recorded", "check_out_outside_src"]


def prepare_output(src: Path, out: Path, *, resume: bool, overwrite: bool, check_only: bool = False,
                   api: bool | None = None) -> str:
    """Check OUT before anything is written, then create it, or clear it for ``overwrite``.

    What is shardfeed's in OUT is what the previous dataset's own records name
    (:mod:`shardfeed.convert.write.ownership`): ``overwrite`` deletes those only, and refuses, naming
    them, anything else. With ``check_only`` nothing is created or removed (the CLI checks before
    scanning, and then first that no other command holds OUT's lock).

    Args:
        src, out: the source and output folders.
        resume, overwrite: the pack's flags.
        check_only: check only.
        api: messages spell the flags as ``PackOptions`` fields; False: as CLI flags; None: as
            :func:`shardfeed.convert.write.ownership.cli_flags` says.

    A ``"resume"`` first removes the temporary files the stopped pack left for its own shards
    (:func:`~shardfeed.convert.write.pack_state.remove_shard_temp_files`), nothing else.

    Returns:
        ``"start"``, ``"resume"``, ``"overwrite"`` or ``"finished"`` (``resume`` on a finished
        dataset; :func:`pack` compares it with this run), as
        :func:`shardfeed.convert.write.ownership.decide`.

    Raises:
        ValueError: OUT equals SRC or lies inside it; OUT is not empty (without ``resume`` or
            ``overwrite``); OUT holds files shardfeed did not write (with ``overwrite``, or
            ``resume`` without a pack to resume).
        NotADirectoryError: OUT is a file.
        shardfeed.convert.write.outlock.OutputBusyError: (``check_only``) another command is writing OUT.
    """
    check_out_outside_src(src, out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder for the output")
    if check_only:
        check_not_busy(out)  # a running pack's files are not "an unfinished pack" to the second one
    entries, read = local_entries(out)
    contents = survey(str(out), entries, read)
    action = decide(contents, resume=resume, overwrite=overwrite, api=api)
    if check_only:
        return action
    if action in ("start", "overwrite"):
        remove_recorded(out, contents)
    if action == "resume":  # a kill -9 leaves the temporary files of the shard and index being written
        options = contents.plan.get("options") if isinstance(contents.plan.get("options"), dict) else {}
        prefix = options.get("prefix") if isinstance(options.get("prefix"), str) else DEFAULT_PREFIX
        remove_shard_temp_files(out, prefix)
    out.mkdir(parents=True, exist_ok=True)
    return action


def check_out_outside_src(src: Path, out: Path) -> None:
    """Refuse an OUT that is SRC itself or lies inside it (it would be scanned as a class).

    Raises:
        ValueError: naming OUT and the fix.
    """
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r:
        raise ValueError(f"{out}: OUT is the source folder itself; choose another output folder")
    if src_r in out_r.parents:
        raise ValueError(f"{out}: OUT lies inside the source folder {src} (it would be scanned as a class); "
                         "choose an output folder outside it")


def remove_recorded(out: Path, contents, keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Delete what the previous dataset's records name (``contents.ours`` of
    :func:`~shardfeed.convert.write.ownership.survey`), less the names in ``keep``: the manifest first
    (the dataset stops being finished before its shards go), the state folder last; links are
    removed, not followed. Returns the names removed, in that order."""
    order = sorted((n for n in contents.ours if n not in keep), key=lambda n: (n != MANIFEST_NAME, n == STATE_DIR, n))
    for name in order:
        p = out / name
        if name == STATE_DIR:
            remove_state_folder(out, warn=False)  # its own files; what else is there stays (named at the end)
        elif contents.entries.get(name) == "dir" and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    return order
