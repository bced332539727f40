"""The scan of the layout packs (labels files, sidecars, unlabelled folders): images and their
sidecar files below SRC.

Rules (the one naming rule of every layout):

* Folders are walked by :func:`~shardfeed.readers.format.folder_walk.walk_folder`, the class-folder
  walk: symbolic links to folders and to files are followed when their target lies inside SRC,
  each real folder is walked once, a link to SRC or a folder above it is never followed; hidden
  names (``.x``) are skipped and listed. A link out of SRC (to a folder, an image or a sidecar
  file) is listed in :attr:`Found.unpackable` (reason ``link out of SRC``) unless
  ``follow_external_links`` (a git-annex or DVC store); a link out of SRC to another file is
  listed as ignored.
* An image is a file whose extension is packed (``--extensions``), whatever its stem:
  ``img.v2.jpg`` beside ``img.jpg``, ``f.0001.png`` and ``f.0002.png`` are images.
* A file is a sidecar of image X only when its name is X's stem plus ``.`` plus one of the
  requested sidecar suffixes (``x.txt``, ``x.mask.png`` beside ``x.jpg`` with
  ``--sidecars txt,mask.png``; suffixes match in any case). Such a file is never an image.
  A file ending in a requested suffix with no image of its stem is an image if its extension
  is packed, else it is listed as ignored.
* Two sidecar files of one image for one suffix (``a.TXT`` and ``a.txt``: the suffixes differ
  only in case) are an error naming both: neither is dropped silently.
* A file with a packed extension that cannot be packed (a broken link, a file that cannot be
  stat'ed, a path failing :func:`~shardfeed.readers.format.manifest.stored_path_problem`) is listed in
  :attr:`Found.unpackable` with its reason, as a class-folder pack lists it.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from shardfeed.readers.format.manifest import normalize_ext, stored_path_problem
from shardfeed.readers.format.folder_walk import OutsideLink, walk_folder
from shardfeed.readers.format.imagefolder import display_name, outside_link_entries, unstatable_reason

__all__ = ["Found", "scan_layout_folder", "may_be_read"]


@dataclasses.dataclass
class Found:
    """What :func:`scan_layout_folder` found below SRC.

    Attributes:
        images: ``(rel, canonical ext, size bytes, mtime ns)`` per image, sorted by ``rel``.
        sidecars: image rel -> {sidecar suffix: sidecar rel}.
        ignored: ``[{"path": rel, "reason": ...}]``: hidden names, other extensions, sidecar
            files without an image, files that are not regular files.
        side_stats: sidecar rel -> ``(size bytes, mtime ns)`` at the scan (checked again when read).
        unpackable: ``[{"path": rel, "reason": ...}]``: files with a packed extension that cannot
            be packed (broken link, cannot stat, a name failing the name policy).
    """

    images: list[tuple[str, str, int, int]]
    sidecars: dict[str, dict[str, str]]
    ignored: list[dict]
    side_stats: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    unpackable: list[dict] = dataclasses.field(default_factory=list)


def scan_layout_folder(root: Path, exts: tuple[str, ...], sidecars: tuple[str, ...], max_files: int, *,
                       follow_external_links: bool = False) -> Found:
    """Images below ``root`` and each one's sidecar files, by the rules of the module docstring.

    Args:
        root: SRC, absolute.
        exts: the packed extensions (lower case, no dot).
        sidecars: the requested sidecar suffixes (lower case, no leading dot).
        max_files: most names listed below ``root``.
        follow_external_links: follow symbolic links whose target lies outside ``root`` too.

    Raises:
        ValueError: more than ``max_files`` names; two sidecar files of one image for one suffix
            (named); two images of one stem that both have sidecar files (named).
        PermissionError: a folder cannot be listed.
    """
    root_str = str(root)
    hidden_dirs: list[str] = []
    seen = [0]

    def listed(n: int) -> None:
        seen[0] += n
        if seen[0] > max_files:
            raise ValueError(f"{root}: more than {max_files} entries; pack a smaller folder")

    outside: list[OutsideLink] = []
    walked = walk_folder(root, hidden_dirs, listed, follow_external_links=follow_external_links, outside=outside)
    found = Found([], {}, [{"path": _rel(root_str, d), "reason": "hidden folder"} for d in sorted(hidden_dirs)])
    ext_set = {e.lower() for e in exts}
    outside_link_entries(root_str, outside, lambda name: _ext(name) in ext_set or any(
        _ends_with(name, f) for f in sidecars), found.unpackable, found.ignored)
    side_files: dict[str, dict[str, list[str]]] = {}  # image stem rel -> {suffix: [sidecar rels]}
    for dirpath, names in walked:
        rel_dir = _rel(root_str, dirpath)
        rel_dir = rel_dir + "/" if rel_dir else ""
        _scan_one_folder(dirpath, rel_dir, names, {e.lower() for e in exts}, sidecars, found, side_files)
    found.images.sort(key=lambda t: t[0])
    _attach_sidecars(root, found, side_files)
    return found


def _rel(root_str: str, path: str) -> str:
    rel = path[len(root_str.rstrip(os.sep)) + 1:] if path != root_str else ""
    return rel if os.sep == "/" else rel.replace(os.sep, "/")


def _scan_one_folder(dirpath: str, rel_dir: str, names: list[str], ext_set: set[str], sidecars: tuple[str, ...],
                     found: Found, side_files: dict[str, dict[str, list[str]]]) -> None:
    """Sort the files of one folder into images, sidecar files and ignored files (``found``)."""
    files: list[tuple[str, int, int]] = []  # (name, size, mtime ns) of the regular files
    for name in names:
        rel = rel_dir + name
        if name.startswith("."):
            found.ignored.append({"path": display_name(rel), "reason": "hidden file"})
            continue
        try:
            st = os.stat(os.path.join(dirpath, name))
        except OSError as exc:
            if _ext(name) in ext_set:
                found.unpackable.append({"path": display_name(rel), "reason": unstatable_reason(
                    os.path.join(dirpath, name), exc)})
            else:
                found.ignored.append({"path": display_name(rel), "reason": unstatable_reason(
                    os.path.join(dirpath, name), exc)})
            continue
        if not stat.S_ISREG(st.st_mode):
            found.ignored.append({"path": display_name(rel), "reason": "not a regular file"})
            continue
        files.append((name, st.st_size, st.st_mtime_ns))
    by_len = sorted(sidecars, key=len, reverse=True)  # "en.txt" before "txt"
    stems: set[str] = set()  # stems of this folder's images
    # images first, shorter names first: whether x.mask.png is a sidecar depends on x.* only
    for name, size, mtime in sorted((f for f in files if _ext(f[0]) in ext_set), key=lambda f: (len(f[0]), f[0])):
        suffix = _sidecar_suffix(name, by_len, stems)
        if suffix is not None:
            _add_side(side_files, found, rel_dir, name, suffix, size, mtime)
            continue
        rel = rel_dir + name
        problem = stored_path_problem(rel)
        if problem is not None:  # the one name policy, as a class-folder pack applies it
            found.unpackable.append({"path": display_name(rel), "reason": problem})
            continue
        stems.add(name[:name.rfind(".")])
        found.images.append((rel, normalize_ext(_ext(name)), size, mtime))
    for name, size, mtime in files:
        if _ext(name) in ext_set:
            continue
        suffix = _sidecar_suffix(name, by_len, stems)
        if suffix is not None:
            _add_side(side_files, found, rel_dir, name, suffix, size, mtime)
        elif any(_ends_with(name, f) for f in by_len):
            found.ignored.append({"path": display_name(rel_dir + name),
                                  "reason": "sidecar file without an image of the same stem"})
        else:
            found.ignored.append({"path": display_name(rel_dir + name), "reason": "extension not packed"})


def may_be_read(name: str, exts: tuple[str, ...], sidecars: tuple[str, ...]) -> bool:
    """Whether :func:`scan_layout_folder` may read the file ``name`` (a file name, not hidden):
    its extension is packed (an image, or a sidecar file that is an image file), or it ends in a
    requested sidecar suffix. Every other file is only listed as ignored."""
    return _ext(name) in {e.lower() for e in exts} or any(_ends_with(name, f) for f in sidecars)


def _ext(name: str) -> str:
    dot = name.rfind(".")
    return name[dot + 1:].lower() if dot > 0 else ""


def _ends_with(name: str, suffix: str) -> bool:
    return len(name) > len(suffix) + 1 and name.lower().endswith("." + suffix)


def _sidecar_suffix(name: str, by_len: list[str], stems: set[str]) -> str | None:
    """The requested suffix that makes ``name`` a sidecar file of an image of ``stems``, or None."""
    return next((f for f in by_len if _ends_with(name, f) and name[:-len(f) - 1] in stems), None)


def _add_side(side_files: dict[str, dict[str, list[str]]], found: Found, rel_dir: str, name: str, suffix: str,
              size: int, mtime: int) -> None:
    rel = rel_dir + name
    side_files.setdefault(rel_dir + name[:-len(suffix) - 1], {}).setdefault(suffix, []).append(rel)
    found.side_stats[rel] = (size, mtime)


def _attach_sidecars(root: Path, found: Found, side_files: dict[str, dict[str, list[str]]]) -> None:
    """``found.sidecars``: each image's sidecar files, by image rel.

    Raises:
        ValueError: two sidecar files of one image for one suffix; two images of one stem with
            sidecar files.
    """
    for stem, by_suffix in side_files.items():
        for suffix, rels in by_suffix.items():
            if len(rels) > 1:
                a, b = sorted(rels)[:2]
                raise ValueError(f"{root / a} and {root / b}: both are the {suffix!r} sidecar file of "
                                 f"{stem}.* (their suffixes differ only in case); one would be lost: rename or "
                                 "remove one")
    owner: dict[str, str] = {}
    for rel, *_ in found.images:
        stem = rel[:rel.rfind(".")]
        if stem in side_files:
            if stem in owner:
                raise ValueError(f"{root / owner[stem]} and {root / rel}: two images share the stem {stem!r}; their "
                                 "sidecar files would be ambiguous: rename one")
            owner[stem] = rel
            found.sidecars[rel] = {suffix: rels[0] for suffix, rels in side_files[stem].items()}
