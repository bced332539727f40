"""No output lands on an input: the one check every command runs on its output paths before any work.

An output path of a command (a ``--json``, ``--html`` or ``--plot`` report, the folder ``unpack``
or ``stage`` writes) may not be a file the command reads, nor a path inside a folder it reads
(SRC, the dataset it reads) or inside the dataset it writes (OUT). Paths are compared as real
paths: an input's links are resolved, and an output's folders (a report replaces a link at its own
name, never writes through it). Remote locations (``http://``, ``s3://`` ...) have no local path,
so nothing local can land on them.
"""

from __future__ import annotations

import os

__all__ = ["local_extent", "refuse_outputs_on_inputs"]

#: Characters that make an argument a shard pattern (``dir/train-{000..009}.tar``, ``dir/*.tar``).
_PATTERN_CHARS = "{*?["


def local_extent(arg: str | os.PathLike | None) -> tuple[str, bool] | None:
    """What a local path argument covers on disk: ``(real path, is_folder)``, or None for a URL.

    A folder covers everything inside it; ``manifest.json`` stands for its dataset's folder; a
    shard pattern covers the folder before its first pattern character; any other file covers
    itself. A path that does not exist yet is taken as a folder (a SRC or OUT to be created).

    Args:
        arg: the path as given (``file://`` and ``~`` accepted), or a URL.

    Returns:
        ``(os.path.realpath(...), True)`` for a folder, ``(..., False)`` for a single file; None
        for a remote URL or an empty argument.
    """
    if arg is None:
        return None
    text = os.fspath(arg)
    if not text or text == "-":
        return None
    from shardfeed.readers.storage.opener import url_scheme

    scheme = url_scheme(text)
    if scheme == "file":
        text = text[len("file://"):]
    elif scheme is not None:
        return None
    text = os.path.expanduser(text)
    real = os.path.realpath(text)
    cut = min((i for i in (text.find(c) for c in _PATTERN_CHARS) if i >= 0), default=-1)
    if not os.path.exists(real) and cut >= 0:
        return os.path.realpath(os.path.dirname(text[:cut]) or "."), True
    if os.path.isdir(real):
        return real, True
    if os.path.basename(real) == "manifest.json" and os.path.isfile(real):
        return os.path.dirname(real), True
    return real, not os.path.exists(real)


def _output_path(out) -> str:
    """The real path a file output replaces: its folder resolved, its own name kept."""
    text = os.path.expanduser(os.fspath(out))
    text = text[len("file://"):] if text.startswith("file://") else text
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(text))), os.path.basename(text))


def _inside(path: str, extent: tuple[str, bool]) -> bool:
    root, is_folder = extent
    if path == root:
        return True
    return is_folder and path.startswith(root.rstrip(os.sep) + os.sep)


def refuse_outputs_on_inputs(outputs: dict[str, object], inputs: dict[str, object],
                             written: dict[str, object] | None = None) -> None:
    """Refuse output paths that land on what the command reads or writes, before any work.

    Args:
        outputs: what the command writes, by the name a message gives it (``"--json"``, ``"OUT"``):
            report files and output folders. None, ``""`` and ``"-"`` (stdout) are skipped.
        inputs: what the command reads, by name (``"SRC"``, ``"--labels"``): folders, datasets
            (a folder or its ``manifest.json``), shard patterns, files. URLs and None are skipped.
        written: the folders the command writes a dataset into (``"OUT"``): an output in
            ``outputs`` may not lie inside one of these either (the folder itself is allowed).

    Raises:
        ValueError: an output is an input file, lies inside an input folder or inside a written
            dataset, or two outputs name the same path; the message names both paths and the fix.
    """
    seen: dict[str, str] = {}
    for out_name, out in outputs.items():
        ext = local_extent(out)
        if ext is None:
            continue
        real = ext[0] if out_name in (written or {}) else _output_path(out)  # a folder is written through
        if real in seen:
            raise ValueError(f"{seen[real]} and {out_name} name the same file ({out}): one would overwrite the "
                             "other; give each its own path")
        seen[real] = out_name
        for in_name, src in inputs.items():
            in_ext = local_extent(src)
            if in_ext is None:
                continue
            if _inside(real, in_ext):
                what = "is" if real == in_ext[0] or not in_ext[1] else "lies inside"
                raise ValueError(f"{out}: {out_name} {what} {in_name} ({src}), which this command reads; writing "
                                 f"there would replace or add to its files: choose a path outside it")
        for in_name, folder in (written or {}).items():
            w_ext = local_extent(folder)
            if w_ext is None or in_name == out_name:
                continue
            if _inside(real, w_ext):
                raise ValueError(f"{out}: {out_name} lies inside {in_name} ({folder}), the dataset this command "
                                 f"writes; a file there is not the dataset's: choose a path outside it")
