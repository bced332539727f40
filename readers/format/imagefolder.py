"""Scan an image folder laid out as torchvision's ``ImageFolder`` (one sub-folder per class).

Rules (docs/format.md, "Samples and keys"):

* Classes are the sorted names of the root's sub-folders (symlinked folders included);
  ``class_to_idx`` follows that order, exactly as ``torchvision.datasets.ImageFolder.find_classes``.
  Class names that are numbers therefore sort as strings (``"10" < "9"``), as in torchvision.
* Images are found recursively below each class folder, in the order of
  ``torchvision.datasets.folder.make_dataset``: directories in sorted path order, file names
  sorted within each directory. Symlinked folders are followed, but each real folder is walked
  once, by one path, decided by its identity (device, inode) and not by the walk's order: a folder
  that the walk reaches without a link (the root, a class folder or a folder inside one) is never
  walked again through a link, so a link such as ``cat/loop -> ..`` or ``cat/x -> ../dog`` adds
  nothing and no image changes class; a folder outside those reached by several links is walked
  by the link whose path sorts first; a link to the root or a folder above it is not followed.
* Extensions are matched case-insensitively (``.JPG`` = ``.jpg``); each file is listed once.
* Hidden files and folders (names starting with ``.``: ``.DS_Store``, ``._x.jpg``,
  ``.ipynb_checkpoints/``) are neither classes nor samples; they are counted as ignored.
* Files with other extensions are counted and listed as ignored, not packed.
* A file with a packed extension that cannot be packed (a broken symbolic link, a file that
  cannot be stat'ed, a path that fails the one name policy,
  :func:`~shardfeed.readers.format.manifest.stored_path_problem`: not valid UTF-8, a backslash...) is
  listed in :attr:`ScanResult.unpackable` with its reason; the packer stops naming it, or lists
  it as skipped under ``on_error="skip"``. Such names are shown escaped (``caf%E9.jpg``, see
  :func:`display_name`); a class folder so named keeps its index under its escaped name.
* An empty class folder keeps its index (as ``ImageFolder(..., allow_empty=True)``) and is named
  in a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import stat as stat_mod
from array import array
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, overload

from shardfeed.readers.format.folder_walk import (LINK_OUT_OF_SRC, LinkRule, OutsideLink, display_name,
                                           outside_link_entries, walk_classes, walk_folder)
from shardfeed.readers.format.manifest import DEFAULT_EXTENSIONS, normalize_ext, stored_path_problem
from shardfeed.readers.format.path_column import PathColumn

__all__ = ["ScannedFile", "ScannedFiles", "new_scanned_file", "ScanResult", "scan_image_folder", "find_classes",
           "parse_extensions", "scan_listing", "display_name", "is_utf8_name", "resolve_class_map", "walk_folder",
           "unstatable_reason", "outside_link_entries", "LINK_OUT_OF_SRC"]

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


_new_object = object.__new__
_set_attr = object.__setattr__


def new_scanned_file(path: str, rel: str, class_name: str, label: int, ext: str, size: int,
                     mtime_ns: int) -> ScannedFile:
    """``ScannedFile(...)`` at half the cost (a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``; this sets the instance dict at once). Same object, same equality."""
    f = _new_object(ScannedFile)
    _set_attr(f, "__dict__", {"path": path, "rel": rel, "class_name": class_name, "label": label, "ext": ext,
                              "size": size, "mtime_ns": mtime_ns})
    return f


class ScannedFiles(Sequence[ScannedFile]):
    """The scanned images as compact columns; a read-only sequence of :class:`ScannedFile`.

    A million-file folder would take ~1 KB per file as Python objects; columns (the relative
    paths as a :class:`~shardfeed.readers.format.path_column.PathColumn` or a list of strings, sizes and
    mtimes as ``array('q')``, class and extension as small codes) take ~50 bytes with a
    ``PathColumn``, so the pack's memory barely grows with the dataset. Indexing
    builds a :class:`ScannedFile` on demand; slicing gives another compact :class:`ScannedFiles`
    (it pickles compactly, for worker processes). The hot paths read the columns directly:
    :meth:`path_of`, :attr:`rels`, :attr:`sizes`, :attr:`mtimes_ns`, :meth:`label_of`,
    :meth:`ext_of`, :meth:`class_name_of`.

    Args:
        root: the source folder (absolute); ``path = root + os.sep + rel``.
        rels: paths relative to ``root`` with ``/`` separators (a list of ``str``, or a compact
            :class:`~shardfeed.readers.format.path_column.PathColumn`, as the scan makes).
        sizes: sizes in bytes.
        mtimes_ns: modification times (ns).
        class_codes: per file, an index into ``class_names``/``class_labels``.
        class_names: class folder names.
        class_labels: the class index of each entry of ``class_names``.
        ext_codes: per file, an index into ``exts``.
        exts: canonical extensions.
    """

    __slots__ = ("root", "rels", "sizes", "mtimes_ns", "class_codes", "class_names", "class_labels",
                 "ext_codes", "exts", "path_prefix")

    def __init__(self, root: str, rels: Sequence[str], sizes: array, mtimes_ns: array, class_codes: array,
                 class_names: Sequence[str], class_labels: Sequence[int], ext_codes: array, exts: Sequence[str]):
        self.root = root
        self.rels = rels
        self.sizes = sizes
        self.mtimes_ns = mtimes_ns
        self.class_codes = class_codes
        self.class_names = tuple(class_names)
        self.class_labels = tuple(class_labels)
        self.ext_codes = ext_codes
        self.exts = tuple(exts)
        #: ``root`` + separator: ``path_prefix + rel`` is the path where ``os.sep`` is ``/``
        self.path_prefix = root.rstrip(os.sep) + os.sep

    @classmethod
    def from_files(cls, root: str, files: Iterable[ScannedFile]) -> "ScannedFiles":
        """Build the columns from :class:`ScannedFile` objects (e.g. a filtered list)."""
        rels, sizes, mtimes, codes, ecodes = [], array("q"), array("q"), array("i"), array("H")
        class_index: dict[tuple[str, int], int] = {}
        ext_index: dict[str, int] = {}
        for f in files:
            rels.append(f.rel)
            sizes.append(f.size)
            mtimes.append(f.mtime_ns)
            codes.append(class_index.setdefault((f.class_name, f.label), len(class_index)))
            ecodes.append(ext_index.setdefault(f.ext, len(ext_index)))
        names = [c for c, _ in class_index]
        labels = [lab for _, lab in class_index]
        return cls(root, rels, sizes, mtimes, codes, names, labels, ecodes, list(ext_index))

    def path_of(self, i: int) -> str:
        """Absolute path of file ``i``."""
        rel = self.rels[i]
        return self.path_prefix + (rel if os.sep == "/" else rel.replace("/", os.sep))

    def label_of(self, i: int) -> int:
        """Class index of file ``i``."""
        return self.class_labels[self.class_codes[i]]

    def class_name_of(self, i: int) -> str:
        """Class folder name of file ``i``."""
        return self.class_names[self.class_codes[i]]

    def ext_of(self, i: int) -> str:
        """Canonical extension of file ``i``."""
        return self.exts[self.ext_codes[i]]

    def __len__(self) -> int:
        return len(self.rels)

    @overload
    def __getitem__(self, i: int) -> ScannedFile: ...

    @overload
    def __getitem__(self, i: slice) -> "ScannedFiles": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self.rels))))
        code = self.class_codes[i]
        return new_scanned_file(self.path_of(i), self.rels[i], self.class_names[code], self.class_labels[code],
                                self.exts[self.ext_codes[i]], self.sizes[i], self.mtimes_ns[i])

    def __iter__(self) -> Iterator[ScannedFile]:
        for i in range(len(self.rels)):
            yield self[i]

    def take(self, indices: Sequence[int]) -> "ScannedFiles":
        """The files at ``indices`` (in that order), as compact columns."""
        if isinstance(indices, range) and indices.step == 1:
            a, b = indices.start, indices.stop
            return ScannedFiles(self.root, self.rels[a:b], self.sizes[a:b], self.mtimes_ns[a:b],
                                self.class_codes[a:b], self.class_names, self.class_labels, self.ext_codes[a:b],
                                self.exts)
        rels, sizes, mtimes, codes, ecodes = self.rels, self.sizes, self.mtimes_ns, self.class_codes, self.ext_codes
        compact = isinstance(rels, PathColumn)  # gathers its paths itself (a list of str for a shard's rows)
        if len(indices) >= 2:
            # a C-level gather per column and chunk (operator.itemgetter): ~6x faster than a Python
            # loop over the indices (20,000 files: 9 ms instead of 50); chunks bound the temporary
            # tuples (65,536 entries, ~2.5 MB)
            out = ([], array("q"), array("q"), array("i"), array("H"))
            pairs = list(zip(out, (rels, sizes, mtimes, codes, ecodes)))[1 if compact else 0:]
            for a in range(0, len(indices), 65536):
                chunk = indices[a:a + 65536]
                get = operator.itemgetter(*chunk) if len(chunk) >= 2 else (lambda col, i=chunk[0]: (col[i],))
                for dst, col in pairs:
                    dst.extend(get(col))
            return ScannedFiles(self.root, rels.take(indices) if compact else out[0], out[1], out[2], out[3],
                                self.class_names, self.class_labels, out[4], self.exts)
        # arrays filled from generators: no temporary list of int objects (peak memory)
        return ScannedFiles(self.root, rels.take(indices) if compact else [rels[i] for i in indices],
                            array("q", (sizes[i] for i in indices)),
                            array("q", (mtimes[i] for i in indices)), array("i", (codes[i] for i in indices)),
                            self.class_names, self.class_labels, array("H", (ecodes[i] for i in indices)),
                            self.exts)

    def __reduce__(self):
        return (ScannedFiles, (self.root, self.rels, self.sizes, self.mtimes_ns, self.class_codes, self.class_names,
                               self.class_labels, self.ext_codes, self.exts))

    def __eq__(self, other) -> bool:
        if isinstance(other, ScannedFiles):
            return len(self) == len(other) and list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ScannedFiles({len(self)} files below {self.root!r})"


@dataclasses.dataclass
class ScanResult:
    """What :func:`scan_image_folder` found.

    Attributes:
        root: the source folder (absolute).
        classes: class names in class-index order.
        class_to_idx: name → class index.
        files: the images, in ImageFolder order (class by class), as compact columns
            (:class:`ScannedFiles`, a sequence of :class:`ScannedFile`).
        ignored: ``[{"path": rel, "reason": ...}]`` for hidden files and other extensions.
        empty_classes: class names with no image.
        extensions: the canonical extensions that were matched.
        unpackable: ``[{"path": rel, "reason": ...}]`` for files with a packed extension that
            cannot be packed (broken symbolic link, cannot stat, a path failing the name policy;
            paths shown by :func:`display_name`). They are not in ``files`` nor in ``ignored``.
        source: where the images come from, as a packed manifest records it (``options.source``):
            the bucket prefix URL (no credentials) of a folder mirrored from a bucket; None:
            ``root``. See :attr:`recorded_source`.
    """

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    files: ScannedFiles
    ignored: list[dict]
    empty_classes: list[str]
    extensions: tuple[str, ...]
    unpackable: list[dict] = dataclasses.field(default_factory=list)
    source: str | None = None

    @property
    def recorded_source(self) -> str:
        """The source a manifest records: :attr:`source`, else :attr:`root`."""
        return self.root if self.source is None else self.source

    @property
    def num_found(self) -> int:
        """Every file seen below the class folders (images + unpackable + ignored)."""
        return len(self.files) + len(self.unpackable) + len(self.ignored)

    @property
    def num_bytes(self) -> int:
        """Total size of the images, bytes."""
        files = self.files
        return sum(files.sizes) if isinstance(files, ScannedFiles) else sum(f.size for f in files)


def parse_extensions(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """Parse ``"jpg,png,webp"`` (any case; a leading dot is dropped: ``".PNG"``) into lower-case
    extensions.

    Raises:
        ValueError: empty list, or an entry with a dot inside or a path separator.
    """
    if text is None:
        return DEFAULT_EXTENSIONS
    items = text.split(",") if isinstance(text, str) else list(text)
    exts = []
    for item in items:
        item = item.strip().lower()
        if item.startswith("."):
            item = item[1:]
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


def is_utf8_name(name: str) -> bool:
    """Whether a name from the file system is valid UTF-8 (Python keeps undecodable bytes of file
    names as lone surrogates, PEP 383, which cannot be written to a tar header or JSON)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True




def has_class_folders(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds a non-hidden sub-folder (the class-folder layout); without one it is a
    flat, unlabelled folder of images. True where ``root`` is no folder (the scan names the problem)."""
    try:
        with os.scandir(root) as it:
            return any(not _is_hidden(e.name) and e.is_dir() for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return True


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


def resolve_class_map(folder_classes: list[str], class_to_idx: dict[str, int] | None,
                      where: object) -> tuple[list[str], dict[str, int]]:
    """The classes and class map of a scan: the folders' own (sorted, as torchvision's ImageFolder)
    or a given ``class_to_idx`` (e.g. train's for val), which must cover every class folder.

    Args:
        folder_classes: Class folder names found, sorted.
        class_to_idx: A given map, or None.
        where: The folder or URL scanned, for messages.

    Returns:
        ``(classes in index order, class_to_idx)``.

    Raises:
        ValueError: a class folder is missing from ``class_to_idx``.
    """
    if class_to_idx is None:
        return list(folder_classes), {c: i for i, c in enumerate(folder_classes)}
    unknown = [c for c in folder_classes if c not in class_to_idx]
    if unknown:
        raise ValueError(f"{where}: class folder(s) {unknown[:5]} are not in the given class map "
                         f"({len(class_to_idx)} classes); pack with the right --classes-from, or add them")
    mapping = dict(class_to_idx)
    return [c for c, _ in sorted(mapping.items(), key=lambda kv: kv[1])], mapping


def scan_image_folder(
    root: str | os.PathLike,
    *,
    extensions: Iterable[str] | str | None = None,
    class_to_idx: Mapping[str, int] | None = None,
    progress: Callable[[str, int], None] | None = None,
    follow_external_links: bool = False,
) -> ScanResult:
    """Scan ``root`` as torchvision's ImageFolder would, recording size and mtime of each image.

    Args:
        root: the image folder (``ROOT/CLASS/.../IMAGE``).
        extensions: extensions to pack (no dots, case-insensitive); default
            :data:`~shardfeed.readers.format.manifest.DEFAULT_EXTENSIONS`.
        class_to_idx: a fixed class map (e.g. the training split's, ``--classes-from``); every class
            folder must be in it. Classes of the map with no folder keep their index.
        progress: ``callback(phase, num_files)`` for a progress bar (a million files on NFS take
            minutes): ``("listed", n)`` after each folder is listed (``n`` names found in it),
            then ``("checked", n)`` as the listed files are checked and stat'ed (every folder,
            and every 4096 files of a large one). Called from this thread.
        follow_external_links: follow symbolic links whose target lies outside ``root`` too;
            without it they are not followed and are listed (:func:`outside_link_entries`).

    Returns:
        A :class:`ScanResult`.

    Raises:
        FileNotFoundError, NotADirectoryError: ``root`` is missing or a file.
        ValueError: no class folders, no images, or a class folder missing from ``class_to_idx``.
    """
    root_path = Path(root).absolute()
    exts = parse_extensions(extensions)
    raw_classes = find_classes(root_path)
    folder_classes = [display_name(c) for c in raw_classes]  # the names stored (escaped if not UTF-8)
    classes, mapping = resolve_class_map(folder_classes, class_to_idx, root_path)

    ignored, hidden_dirs = _top_level_entries(root_path, exts)
    unpackable: list[dict] = []
    empty: list[str] = []
    # The hot loop (one pass per file): relative paths by slicing (no os.path.relpath), the
    # extension by one dict lookup, results appended to compact columns (no object per file).
    canonical = list(dict.fromkeys(normalize_ext(e) for e in exts))
    ext_code = {e: canonical.index(normalize_ext(e)) for e in exts}
    root_str = str(root_path)
    prefix_len = len(root_str.rstrip(os.sep)) + 1
    rels = PathColumn()  # ~30 bytes a path (a list of str: ~90)
    add_path = rels.append
    sizes, mtimes, codes, ecodes = array("q"), array("q"), array("i"), array("H")
    stat, s_isreg = os.stat, stat_mod.S_ISREG
    slash = os.sep == "/"
    outside: list[OutsideLink] = []
    walks = walk_classes(root_path, [str(root_path / c) for c in raw_classes], hidden_dirs,
                         listed=(lambda n: progress("listed", n)) if progress is not None else None,
                         rule=LinkRule(root_path, follow_external_links), outside=outside)
    for code, class_name in enumerate(folder_classes):
        before = len(rels)
        for dirpath, names in walks[code].drain():  # each folder's names let go once read
            rel_dir = dirpath[prefix_len:] if slash else dirpath[prefix_len:].replace(os.sep, "/")
            rel_dir += "/"
            dir_ok = stored_path_problem(rel_dir + "_") is None  # the one name policy, once per folder
            dir_prefix = dirpath + os.sep
            dir_code = rels.folder(rel_dir)  # the folder part stored once
            for name in (names if progress is None else _reported(names, progress)):
                if name[0] == ".":
                    ignored.append({"path": display_name(rel_dir + name), "reason": "hidden file"})
                    continue
                dot = name.rfind(".")
                ec = ext_code.get(name[dot + 1:].lower()) if dot > 0 else None
                if ec is None:
                    ignored.append({"path": display_name(rel_dir + name), "reason": "extension not packed"})
                    continue
                if not (dir_ok and name.isascii() and "\\" not in name):
                    problem = stored_path_problem(rel_dir + name)
                    if problem is not None:  # what pack accepts, every tool (unpack) writes back
                        unpackable.append({"path": display_name(rel_dir + name), "reason": problem})
                        continue
                try:
                    st = stat(dir_prefix + name)
                except OSError as exc:
                    unpackable.append({"path": rel_dir + name, "reason": unstatable_reason(dir_prefix + name, exc)})
                    continue
                if not s_isreg(st.st_mode):
                    ignored.append({"path": rel_dir + name, "reason": "not a regular file"})
                    continue
                add_path(dir_code, name)
                sizes.append(st.st_size)
                mtimes.append(st.st_mtime_ns)
                codes.append(code)
                ecodes.append(ec)
        if len(rels) == before:
            empty.append(class_name)
    files = ScannedFiles(root_str, rels, sizes, mtimes, codes, folder_classes,
                         [mapping[c] for c in folder_classes], ecodes, canonical)
    outside_link_entries(root_str, outside, set(exts), unpackable, ignored)
    ignored += _hidden_folder_files(hidden_dirs, root_path)
    _warn_about_scan(root_path, ignored, unpackable, empty)
    if not files and not unpackable:
        raise ValueError(f"{root_path}: no images with extensions {','.join(exts)} below its {len(folder_classes)} "
                         "class folder(s); check the path, or pass --extensions")
    return ScanResult(str(root_path), classes, mapping, files, ignored, empty, exts, unpackable)


def unstatable_reason(path: str, exc: OSError) -> str:
    """Why the file at ``path`` cannot be packed, when ``os.stat`` failed with ``exc``: a broken
    symbolic link (naming its target), or a file that cannot be stat'ed; with the fix."""
    if os.path.islink(path):
        try:
            target = display_name(os.readlink(path))
        except OSError:
            target = "?"
        return f"broken symbolic link (points to {target}): restore its target or remove the link"
    return f"cannot stat ({exc.strerror}): fix its permissions or remove it"


def _top_level_entries(root_path: Path, exts) -> tuple[list[dict], list[str]]:
    """What lies directly in ``root_path`` besides the class folders: ``(ignored, hidden_dirs)``,
    the ignored entries (files, broken links: ``{"path", "reason"}``) and the hidden folders' paths."""
    ignored: list[dict] = []
    hidden_dirs: list[str] = []
    with os.scandir(root_path) as it:
        for e in it:
            if e.name.startswith(".") and e.is_dir():
                hidden_dirs.append(e.path)
            elif not e.is_dir():
                if e.is_symlink() and not os.path.exists(e.path):
                    log.warning("%s: broken symbolic link (points to %s); not a class folder", display_name(e.path),
                                display_name(os.readlink(e.path)))
                    ignored.append({"path": display_name(e.name), "reason": "broken symbolic link"})
                else:
                    dot = e.name.rfind(".")
                    image = dot > 0 and e.name[dot + 1:].lower() in exts
                    ignored.append({"path": display_name(e.name),
                                    "reason": "image not in a class folder" if image else "not in a class folder"})
    return ignored, hidden_dirs


def _hidden_folder_files(hidden_dirs: list[str], root_path: Path) -> list[dict]:
    """An ignored entry (``{"path", "reason"}``, paths relative to ``root_path``) for every file
    below the hidden top-level folders, in sorted order."""
    ignored = []
    for d in sorted(hidden_dirs):
        for dirpath, _, names in os.walk(d):
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(dirpath, name), root_path).replace(os.sep, "/")
                ignored.append({"path": display_name(rel), "reason": "in a hidden folder"})
    return ignored


def _warn_about_scan(root_path: Path, ignored: list[dict], unpackable: list[dict], empty: list[str]) -> None:
    """Log what a scan left out that a user likely wants to know: images beside the class folders,
    images that cannot be packed, empty class folders."""
    beside = [i["path"] for i in ignored if i["reason"] == "image not in a class folder"]
    if beside:
        log.warning("%d image(s) lie beside the class folders of %s, not inside one (e.g. %s): not packed; move "
                    "each into its class folder", len(beside), root_path, ", ".join(beside[:3]))
    if unpackable:
        log.warning("%d file(s) with an image extension cannot be packed, e.g. %s: %s", len(unpackable),
                    unpackable[0]["path"], unpackable[0]["reason"])
    if empty:
        log.warning("%d empty class folder(s) keep their class index but hold no image: %s",
                    len(empty), ", ".join(empty[:10]) + (" ..." if len(empty) > 10 else ""))


def scan_listing(root: str, listing: Iterable[tuple[str, int, int]], *, extensions: Iterable[str] | str | None = None,
                 class_to_idx: Mapping[str, int] | None = None) -> ScanResult:
    """:func:`scan_image_folder` over an object-store listing: the same rules, the same order.

    An object store has no folders: ``CLASS/.../IMAGE`` keys under the prefix make the classes
    (the first path component) and the images; directories are the key prefixes, visited in
    sorted order with file names sorted within each, as on disk. Hidden components (``.x``),
    other extensions and keys directly under the prefix are ignored and listed, as on disk.

    Args:
        root: the prefix URL (``s3://bucket/prefix/``), kept as the files' root.
        listing: ``(key relative to the prefix, size bytes, mtime ns)`` for every object (one
            paginated listing: :meth:`~shardfeed.readers.storage.objstore.StoreLocation.list_objects`).
        extensions, class_to_idx: as :func:`scan_image_folder`.

    Raises:
        ValueError: no class folders, no images, or a class missing from ``class_to_idx``.
    """
    exts = parse_extensions(extensions)
    ignored: list[dict] = []
    by_dir: dict[str, dict[str, list[tuple[str, int, int]]]] = {}
    hidden_classes = set()
    for rel, size, mtime in listing:
        if not rel or rel.endswith("/"):
            continue  # a "folder" marker object
        parts = rel.split("/")
        if len(parts) == 1:
            ignored.append({"path": rel, "reason": "not in a class folder"})
            continue
        if any(_is_hidden(p) for p in parts[:-1]):
            if _is_hidden(parts[0]):
                hidden_classes.add(parts[0])
            ignored.append({"path": rel, "reason": "in a hidden folder"})
            continue
        d, name = rel.rpartition("/")[::2]
        by_dir.setdefault(parts[0], {}).setdefault(d, []).append((name, size, mtime))
    folder_classes = sorted(by_dir)
    if not folder_classes:
        raise ValueError(f"{root}: no class folders found; expected the ImageFolder layout PREFIX/CLASS_NAME/IMAGE "
                         "(one key prefix per class)")
    classes, mapping = resolve_class_map(folder_classes, class_to_idx, root)
    canonical = list(dict.fromkeys(normalize_ext(e) for e in exts))
    ext_code = {e: canonical.index(normalize_ext(e)) for e in exts}
    rels = PathColumn()
    sizes, mtimes, codes, ecodes = array("q"), array("q"), array("i"), array("H")
    empty: list[str] = []
    unpackable: list[dict] = []
    for code, class_name in enumerate(folder_classes):
        before = len(rels)
        dirs = by_dir[class_name]
        for d in sorted(dirs):
            for name, size, mtime in sorted(dirs[d]):
                rel = d + "/" + name
                if name[0] == ".":
                    ignored.append({"path": rel, "reason": "hidden file"})
                    continue
                dot = name.rfind(".")
                ec = ext_code.get(name[dot + 1:].lower()) if dot > 0 else None
                if ec is None:
                    ignored.append({"path": rel, "reason": "extension not packed"})
                    continue
                problem = stored_path_problem(rel)  # the one name policy, as on disk
                if problem is not None:
                    unpackable.append({"path": display_name(rel), "reason": problem})
                    continue
                rels.append(rels.folder(d + "/"), name)
                sizes.append(size)
                mtimes.append(mtime)
                codes.append(code)
                ecodes.append(ec)
        if len(rels) == before:
            empty.append(class_name)
    files = ScannedFiles(root, rels, sizes, mtimes, codes, folder_classes,
                         [mapping[c] for c in folder_classes], ecodes, canonical)
    if empty:
        log.warning("%d empty class folder(s) keep their class index but hold no image: %s",
                    len(empty), ", ".join(empty[:10]) + (" ..." if len(empty) > 10 else ""))
    if not files and not unpackable:
        raise ValueError(f"{root}: no images with extensions {','.join(exts)} below its {len(folder_classes)} "
                         "class folder(s); check the URL, or pass --extensions")
    return ScanResult(root, classes, mapping, files, ignored, empty, exts, unpackable)


def _reported(names: list[str], progress: Callable[[str, int], None], step: int = 4096) -> Iterator[str]:
    """``names``, calling ``progress("checked", n)`` after every ``step`` of them and at the end."""
    for a in range(0, len(names), step):
        part = names[a:a + step]
        yield from part
        progress("checked", len(part))
