"""Scan an image folder laid out as torchvision's ``ImageFolder`` (one sub-folder per class).

Rules (DESIGN.md, "Sample and key conventions"):

* Classes are the sorted names of the root's sub-folders (symlinked folders included);
  ``class_to_idx`` follows that order, exactly as ``torchvision.datasets.ImageFolder.find_classes``.
  Class names that are numbers therefore sort as strings (``"10" < "9"``), as in torchvision.
* Images are found recursively below each class folder, in the order of
  ``torchvision.datasets.folder.make_dataset``: directories in sorted path order, file names
  sorted within each directory; symlinked folders are followed, each real folder once (no loops).
* Extensions are matched case-insensitively (``.JPG`` = ``.jpg``); each file is listed once.
* Hidden files and folders (names starting with ``.``: ``.DS_Store``, ``._x.jpg``,
  ``.ipynb_checkpoints/``) are neither classes nor samples; they are counted as ignored.
* Files with other extensions are counted and listed as ignored, not packed.
* An empty class folder keeps its index (as ``ImageFolder(..., allow_empty=True)``) and is named
  in a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat as stat_mod
from pathlib import Path
from typing import Iterable, Mapping

from shardfeed.readers.format import DEFAULT_EXTENSIONS, normalize_ext

__all__ = ["ScannedFile", "ScanResult", "scan_image_folder", "find_classes", "parse_extensions"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScannedFile:
    """One image file found by the scan.

    Attributes:
        path: absolute path to read the bytes from.
        rel: path relative to the source root, ``/`` separators (stored as ``meta["path"]``).
        class_name: its class folder's name.
        label: class index.
        ext: canonical extension (``jpg`` for ``.JPEG``).
        size: size in bytes at scan time.
        mtime_ns: modification time at scan time (ns), rechecked when packing.
    """

    path: str
    rel: str
    class_name: str
    label: int
    ext: str
    size: int
    mtime_ns: int


@dataclasses.dataclass
class ScanResult:
    """What :func:`scan_image_folder` found.

    Attributes:
        root: the source folder (absolute).
        classes: class names in class-index order.
        class_to_idx: name → class index.
        files: the images, in ImageFolder order (class by class).
        ignored: ``[{"path": rel, "reason": ...}]`` for hidden files and other extensions.
        empty_classes: class names with no image.
        extensions: the canonical extensions that were matched.
    """

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    files: list[ScannedFile]
    ignored: list[dict]
    empty_classes: list[str]
    extensions: tuple[str, ...]

    @property
    def num_found(self) -> int:
        """Every regular file seen below the class folders (images + ignored)."""
        return len(self.files) + len(self.ignored)

    @property
    def num_bytes(self) -> int:
        """Total size of the images, bytes."""
        return sum(f.size for f in self.files)


def parse_extensions(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """Parse ``"jpg,png,webp"`` (no dots, any case) into lower-case extensions.

    Raises:
        ValueError: empty list or an entry with a dot or a path separator.
    """
    if text is None:
        return DEFAULT_EXTENSIONS
    items = text.split(",") if isinstance(text, str) else list(text)
    exts = []
    for item in items:
        item = item.strip().lower()
        if not item:
            continue
        if "." in item or "/" in item:
            raise ValueError(f"extension {item!r}: give extensions without dots, comma-separated, e.g. jpg,png,webp")
        exts.append(item)
    if not exts:
        raise ValueError("no extensions given: use e.g. --extensions jpg,png")
    return tuple(dict.fromkeys(exts))


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def find_classes(root: str | os.PathLike) -> list[str]:
    """Class names of an ImageFolder root: its sorted, non-hidden sub-folders (links followed).

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is a file.
        ValueError: no class folder.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory")
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: is a file, not an image folder (expected ROOT/CLASS/IMAGE files)")
    with os.scandir(root) as it:
        classes = sorted(e.name for e in it if not _is_hidden(e.name) and e.is_dir(follow_symlinks=True))
    if not classes:
        raise ValueError(f"{root}: no class folders found; expected the ImageFolder layout ROOT/CLASS_NAME/IMAGE "
                         "(one sub-folder per class)")
    return classes


def scan_image_folder(
    root: str | os.PathLike,
    *,
    extensions: Iterable[str] | str | None = None,
    class_to_idx: Mapping[str, int] | None = None,
) -> ScanResult:
    """Scan ``root`` as torchvision's ImageFolder would, recording size and mtime of each image.

    Args:
        root: the image folder (``ROOT/CLASS/.../IMAGE``).
        extensions: extensions to pack (no dots, case-insensitive); default
            :data:`~shardfeed.readers.format.DEFAULT_EXTENSIONS`.
        class_to_idx: a fixed class map (e.g. the training split's, ``--classes-from``); every class
            folder must be in it. Classes of the map with no folder keep their index.

    Returns:
        A :class:`ScanResult`.

    Raises:
        FileNotFoundError, NotADirectoryError: ``root`` is missing or a file.
        ValueError: no class folders, no images, or a class folder missing from ``class_to_idx``.
    """
    root_path = Path(root).absolute()
    exts = parse_extensions(extensions)
    suffixes = tuple("." + e for e in exts)
    folder_classes = find_classes(root_path)
    if class_to_idx is not None:
        unknown = [c for c in folder_classes if c not in class_to_idx]
        if unknown:
            raise ValueError(f"{root_path}: class folder(s) {unknown[:5]} are not in the given class map "
                             f"({len(class_to_idx)} classes); pack with the right --classes-from, or add them")
        mapping = dict(class_to_idx)
        classes = [c for c, _ in sorted(mapping.items(), key=lambda kv: kv[1])]
    else:
        classes = folder_classes
        mapping = {c: i for i, c in enumerate(classes)}

    files: list[ScannedFile] = []
    ignored: list[dict] = []
    empty: list[str] = []
    hidden_dirs: list[str] = []
    with os.scandir(root_path) as it:
        for e in it:
            if e.name.startswith(".") and e.is_dir():
                hidden_dirs.append(e.path)
            elif not e.is_dir():
                ignored.append({"path": e.name, "reason": "not in a class folder"})
    for class_name in folder_classes:
        label = mapping[class_name]
        before = len(files)
        for dirpath, names in _walk_sorted(root_path / class_name, hidden_dirs):
            for name in names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root_path).replace(os.sep, "/")
                if _is_hidden(name):
                    ignored.append({"path": rel, "reason": "hidden file"})
                    continue
                if not name.lower().endswith(suffixes):
                    ignored.append({"path": rel, "reason": "extension not packed"})
                    continue
                try:
                    st = os.stat(full)
                except OSError as exc:
                    ignored.append({"path": rel, "reason": f"cannot stat: {exc.strerror}"})
                    continue
                if not stat_mod.S_ISREG(st.st_mode):
                    ignored.append({"path": rel, "reason": "not a regular file"})
                    continue
                ext = normalize_ext(os.path.splitext(name)[1])
                files.append(ScannedFile(full, rel, class_name, label, ext, st.st_size, st.st_mtime_ns))
        if len(files) == before:
            empty.append(class_name)
    for d in sorted(hidden_dirs):
        for dirpath, _, names in os.walk(d):
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(dirpath, name), root_path).replace(os.sep, "/")
                ignored.append({"path": rel, "reason": "in a hidden folder"})
    if empty:
        log.warning("%d empty class folder(s) keep their class index but hold no image: %s",
                    len(empty), ", ".join(empty[:10]) + (" ..." if len(empty) > 10 else ""))
    if not files:
        raise ValueError(f"{root_path}: no images with extensions {','.join(exts)} below its {len(folder_classes)} "
                         "class folder(s); check the path, or pass --extensions")
    return ScanResult(str(root_path), classes, mapping, files, ignored, empty, exts)


def _walk_sorted(top: Path, hidden_dirs: list[str]):
    """Return ``[(dirpath, sorted file names)]`` below ``top`` in sorted dirpath order.

    Same order as ``sorted(os.walk(top, followlinks=True))`` (torchvision's make_dataset), without
    hidden folders (appended to ``hidden_dirs``), and visiting each real directory once so
    symlink loops terminate.
    """
    seen: set[tuple[int, int]] = set()
    out: list[tuple[str, list[str]]] = []
    stack = [str(top)]
    while stack:
        d = stack.pop()
        try:
            st = os.stat(d)
        except OSError:
            continue
        ident = (st.st_dev, st.st_ino)
        if ident in seen:
            log.warning("%s: already visited through another path (symlink loop?); skipped", d)
            continue
        seen.add(ident)
        names: list[str] = []
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        is_dir = e.is_dir(follow_symlinks=True)
                    except OSError:
                        is_dir = False
                    if is_dir:
                        if _is_hidden(e.name):
                            hidden_dirs.append(e.path)  # pruned: neither classes nor samples
                        else:
                            stack.append(e.path)
                    else:
                        names.append(e.name)
        except PermissionError as exc:
            raise PermissionError(f"{d}: cannot list folder ({exc.strerror}); fix its permissions") from None
        out.append((d, sorted(names)))
    out.sort(key=lambda t: t[0])
    return out
