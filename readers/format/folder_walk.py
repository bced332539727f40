"""Walking a source folder, and the one rule for symbolic links below it.

The link rule (every layout of ``shardfeed pack``, and the readers' image-folder source):

* A symbolic link (to a folder or to a file) whose real target lies inside the folder given
  (``realpath`` under ``realpath(SRC)``) is followed; each real folder is walked once.
* A link whose real target lies outside it is not followed. The pack stops before writing
  anything, naming the link, its target and the fix (:func:`link_out_reason`); with
  ``--on-error skip`` the link is skipped and listed under the reason :data:`LINK_OUT_OF_SRC`.
  ``follow_external_links=True`` (``--follow-external-links``) follows such links too, for a
  git-annex or DVC store whose objects live outside SRC.
* A link to SRC itself or to a folder above it is never followed (a loop; logged).

Names that are not valid UTF-8 are shown escaped (:func:`display_name`).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterator, Sequence, overload

__all__ = ["LINK_OUT_OF_SRC", "OutsideLink", "LinkRule", "link_out_reason", "refuse_outside_links",
           "outside_link_entries", "display_name", "walk_folder", "walk_classes", "FolderListing"]

log = logging.getLogger("shardfeed.readers.format.imagefolder")

#: The reason a link out of SRC is listed under (``skipped``/``ignored`` entries, the summary's counts).
LINK_OUT_OF_SRC = "link out of SRC"


@dataclasses.dataclass(frozen=True)
class OutsideLink:
    """A symbolic link below SRC whose real target lies outside SRC (not followed).

    Attributes:
        path: the link's path (as walked: below SRC).
        target: the real path it leads to (``os.path.realpath``).
        is_dir: it leads to a folder.
    """

    path: str
    target: str
    is_dir: bool


class LinkRule:
    """Where the links below ``root`` may lead: inside ``root`` always; outside it only with
    ``follow_external``."""

    def __init__(self, root: str | os.PathLike, follow_external: bool = False) -> None:
        self.root_real = os.path.realpath(root)
        self.follow_external = bool(follow_external)
        self._prefix = self.root_real.rstrip(os.sep) + os.sep

    def outside(self, path: str) -> str | None:
        """The real target of ``path`` when it lies outside the root and is not to be followed, else None."""
        if self.follow_external:
            return None
        real = os.path.realpath(path)
        return None if real == self.root_real or real.startswith(self._prefix) else real


def link_out_reason(target: str) -> str:
    """Why a link out of SRC is not followed, naming its real ``target``, with the fix."""
    return (f"{LINK_OUT_OF_SRC} (points to {display_name(target)}): give the folder that holds both as SRC, or "
            "pass --follow-external-links (follow_external_links=True)")


def refuse_outside_links(root: str | os.PathLike, entries: list[dict]) -> None:
    """Stop a reader at the first link out of its folder among ``entries`` (``{"path": rel,
    "reason": ...}``, from :func:`outside_link_entries`; other entries are let be).

    Raises:
        ValueError: naming the link, its target and the fix (:func:`link_out_reason`).
    """
    links = [u for u in entries if u["reason"].startswith(LINK_OUT_OF_SRC)]
    if links:
        more = f" (and {len(links) - 1} more such link(s))" if len(links) > 1 else ""
        raise ValueError(f"{Path(root) / links[0]['path']}: {links[0]['reason']}{more}")


def outside_link_entries(root: str, outside: list[OutsideLink], packed: set[str] | Callable[[str], bool],
                         unpackable: list[dict], ignored: list[dict]) -> None:
    """List the links out of ``root`` a walk did not follow (``{"path": rel, "reason": ...}``,
    reason :func:`~shardfeed.readers.format.folder_walk.link_out_reason`): a link to a folder, or to a
    file that would be packed (``packed``: its extensions, lower case, or a test of its name), in
    ``unpackable`` (the pack stops naming it, or skips it under ``on_error="skip"``); a link to
    another file in ``ignored``."""
    cut = len(root.rstrip(os.sep)) + 1
    def wanted(name: str) -> bool:
        if callable(packed):
            return packed(name)
        dot = name.rfind(".")
        return dot > 0 and name[dot + 1:].lower() in packed

    for o in sorted(outside, key=lambda o: o.path):
        rel = display_name(o.path[cut:] if os.sep == "/" else o.path[cut:].replace(os.sep, "/"))
        entry = {"path": rel, "reason": link_out_reason(o.target)}
        (unpackable if o.is_dir or wanted(os.path.basename(o.path)) else ignored).append(entry)


def display_name(name: str) -> str:
    """``name`` safe to print and to store: bytes that are not valid UTF-8 and backslashes are shown
    as ``%XX`` (``b"caf\\xe9.jpg"`` → ``caf%E9.jpg``, ``a\\b`` → ``a%5Cb``), and a leading drive
    (``C:``) as ``C%3A``, so the result passes :func:`~shardfeed.readers.format.manifest.stored_path_problem`
    as a folder name; other names are returned unchanged."""
    if name.isascii() and "\\" not in name and not _DRIVE_RE.match(name):
        return name
    out = []
    for ch in name:
        if "\udc80" <= ch <= "\udcff":  # an undecodable byte kept by PEP 383
            out.append(f"%{ord(ch) - 0xDC00:02X}")
        elif ch == "\\":
            out.append("%5C")
        else:
            out.append(ch)
    text = "".join(out)
    return text[0] + "%3A" + text[2:] if _DRIVE_RE.match(text) else text


_DRIVE_RE = re.compile(r"^[A-Za-z]:")


class FolderListing(Sequence[tuple[str, list[str]]]):
    """The folders a walk listed, as ``(dirpath, sorted file names)`` read on demand.

    Each folder's names are kept as one string (joined by NUL, a character no file name holds),
    about one byte a character instead of ~60 bytes a name as a list of ``str``; a folder's list is
    built when it is read. Folders come in sorted ``dirpath`` order once :meth:`sort` ran.
    """

    __slots__ = ("_folders",)

    def __init__(self) -> None:
        self._folders: list[tuple[str, str]] = []

    def add(self, dirpath: str, names: list[str]) -> None:
        """Record a folder and its file names (any order: they are sorted here)."""
        names.sort()
        self._folders.append((dirpath, "\0".join(names)))

    def sort(self) -> None:
        """Put the folders in sorted ``dirpath`` order."""
        self._folders.sort(key=lambda t: t[0])

    def __len__(self) -> int:
        return len(self._folders)

    @overload
    def __getitem__(self, i: int) -> tuple[str, list[str]]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, list[str]]]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._folders)))]
        d, joined = self._folders[i]
        return d, (joined.split("\0") if joined else [])

    def __iter__(self) -> Iterator[tuple[str, list[str]]]:
        for d, joined in self._folders:
            yield d, (joined.split("\0") if joined else [])

    def drain(self) -> Iterator[tuple[str, list[str]]]:
        """Iterate as ``iter()`` does, letting go of each folder's names once read (the listing is
        empty afterwards): the names of a large walk need not all stay in memory at once."""
        folders = self._folders
        folders.reverse()
        while folders:
            d, joined = folders.pop()
            yield d, (joined.split("\0") if joined else [])


def walk_folder(root: str | os.PathLike, hidden_dirs: list[str],
                listed: Callable[[int], None] | None = None, *, follow_external_links: bool = False,
                outside: list[OutsideLink] | None = None) -> FolderListing:
    """Every folder below ``root`` (``root`` included) as ``(dirpath, sorted names)`` pairs
    (a :class:`FolderListing`), in sorted
    dirpath order, by the class walk's rules (:func:`walk_classes`): hidden folders pruned
    (appended to ``hidden_dirs``), symbolic links to files kept as names, symbolic links to
    folders followed by the link rule of the module docstring, each real folder walked once, a
    link to ``root`` or a folder above it never followed. Every layout pack walks its source
    with it, so every layout follows links as a class-folder pack does.

    Args:
        follow_external_links: follow links out of ``root`` too.
        outside: where the links out of ``root`` are appended (not followed); None: the first
            one is refused (:func:`refuse_outside_links`).

    Raises:
        PermissionError: a folder cannot be listed (named).
        ValueError: a link out of ``root`` without ``follow_external_links`` and with no
            ``outside`` list (names the link, its target and the fix).
    """
    found: list[OutsideLink] = [] if outside is None else outside
    walked = walk_classes(Path(root), [], hidden_dirs, listed, walk_root=True,
                          rule=LinkRule(root, follow_external_links), outside=found)[0]
    if outside is None and found:
        entries: list[dict] = []
        outside_link_entries(str(root), found, lambda name: True, entries, entries)
        refuse_outside_links(root, entries)
    return walked


def walk_classes(root: Path, class_dirs: list[str], hidden_dirs: list[str],
                 listed: Callable[[int], None] | None = None, walk_root: bool = False, *,
                 rule: LinkRule, outside: list[OutsideLink]) -> list[FolderListing]:
    """Per class folder, its ``(dirpath, sorted file names)`` pairs (a :class:`FolderListing`, the
    names kept compact until read) in sorted dirpath order
    (``listed(n)`` is called after each folder is listed, with its number of file names).

    The order within a class is that of ``sorted(os.walk(top, followlinks=True))``
    (torchvision's make_dataset), without hidden folders (appended to ``hidden_dirs``). Each real
    folder is walked once, by one path, whatever order the folders are met in:

    1. the root, every class folder and every folder reached from them without a symbolic link
       are claimed first, class folders that are folders before class folders that are links (a
       class folder that is the same folder as one claimed already is skipped with a warning);
    2. then the symbolic links to folders, in sorted path order: a link to a claimed folder (a
       loop such as ``cat/loop -> ..``, or ``cat/x -> ../dog``), or to a folder holding the root,
       is skipped with a warning; any other is walked under the class where the link lies, and
       claims what it reaches.

    So a link never moves an image to another class, nor adds it twice. ``walk_root``: no class
    folders; the root itself is walked, as the one entry of the result. A link (class folder,
    folder or file, not hidden) whose target ``rule`` puts out of bounds is appended to ``outside``
    and not followed (a broken link stays a name: the scan names it).
    """
    root_real = rule.root_real
    st = os.stat(root)
    claimed: dict[tuple[int, int], str] = {(st.st_dev, st.st_ino): str(root)}
    per_class = [FolderListing() for _ in range(1 if walk_root else len(class_dirs))]
    links: list[tuple[str, int]] = []  # heap of (link path, class code)

    def walk(top: str, code: int) -> None:
        stack = [top]
        while stack:
            d = stack.pop()
            names: list[str] = []
            try:
                with os.scandir(d) as it:
                    for e in it:
                        try:
                            if e.is_symlink():
                                if e.is_dir(follow_symlinks=True):
                                    if e.name.startswith("."):
                                        hidden_dirs.append(e.path)
                                    else:
                                        heapq.heappush(links, (e.path, code))
                                elif e.is_file() and not e.name.startswith(".") and \
                                        (target := rule.outside(e.path)) is not None:
                                    outside.append(OutsideLink(e.path, target, False))
                                else:
                                    names.append(e.name)  # a link to a file, or a broken link
                            elif e.is_dir(follow_symlinks=False):
                                if e.name.startswith("."):
                                    hidden_dirs.append(e.path)  # pruned: neither classes nor samples
                                    continue
                                sst = e.stat(follow_symlinks=False)
                                ident = (sst.st_dev, sst.st_ino)
                                if ident not in claimed:  # (a bind mount of a claimed folder is not)
                                    claimed[ident] = e.path
                                    stack.append(e.path)
                            else:
                                names.append(e.name)
                        except OSError:
                            names.append(e.name)  # stat'ed again by the caller, which names the error
            except PermissionError as exc:
                raise PermissionError(f"{display_name(d)}: cannot list folder ({exc.strerror}); fix its "
                                      "permissions") from None
            if listed is not None:
                listed(len(names))
            per_class[code].add(d, names)

    # class folders that are folders first, then those that are links (a link to a folder reached
    # without one adds nothing: ``alias -> cat/sub`` leaves cat/sub's images in cat)
    if walk_root:
        walk(str(root), 0)
    order = sorted(range(len(class_dirs)), key=lambda c: (os.path.islink(class_dirs[c]), c))
    for code in order:
        top = class_dirs[code]
        if os.path.islink(top) and (target := rule.outside(top)) is not None:
            outside.append(OutsideLink(top, target, True))
            continue
        st = os.stat(top)
        ident = (st.st_dev, st.st_ino)
        if ident in claimed:
            log.warning("%s: the same folder as %s; its images are packed once, under the class of the folder "
                        "reached without a link", display_name(top), display_name(claimed[ident]))
            continue
        claimed[ident] = top
        walk(top, code)
    while links:
        path, code = heapq.heappop(links)
        ident = _folder_link_to_walk(path, claimed, root_real, rule, outside)
        if ident is not None:
            claimed[ident] = path
            walk(path, code)
    for walked in per_class:
        walked.sort()
    return per_class


def _folder_link_to_walk(path: str, claimed: dict[tuple[int, int], str], root_real: str, rule: LinkRule,
                         outside: list[OutsideLink]) -> tuple[int, int] | None:
    """The identity of the folder the link ``path`` leads to, when it is to be walked; None for a
    broken link, a folder walked already, a folder holding the root (a loop; both logged) or a
    folder out of bounds (appended to ``outside``)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = (st.st_dev, st.st_ino)
    real = os.path.realpath(path)
    if ident in claimed:
        log.warning("%s: a link to %s, which is walked already; skipped (no image is packed twice or under "
                    "another class)", display_name(path), display_name(claimed[ident]))
        return None
    if root_real == real or root_real.startswith(real.rstrip(os.sep) + os.sep):
        log.warning("%s: a link to %s, which holds the image folder itself (a loop); skipped",
                    display_name(path), display_name(real))
        return None
    target = rule.outside(path)
    if target is not None:
        outside.append(OutsideLink(path, target, True))
        return None
    return ident
