"""Folder source: the ImageFolder baseline, with the same outputs as the packed sources.

Classes and files are found as ``torchvision.datasets.ImageFolder`` finds them (and as
``shardfeed pack`` does): sorted non-hidden sub-folders are the classes; images are found
recursively (symbolic links followed inside the folder, each real folder once; a link out of it
is refused unless ``follow_external_links``, :mod:`~shardfeed.readers.format.folder_walk`), directories in sorted path
order and names sorted within each; extensions match case-insensitively
(:data:`~shardfeed.readers.format.manifest.DEFAULT_EXTENSIONS` by default); hidden files and folders are
skipped. ``class_to_idx`` may be a dict or a packed dataset (directory or manifest path) whose
class map then gives the labels, so that the folder's labels match that dataset's.

The file list is held in numpy arrays (paths as one fixed-width bytes array, labels as int64), not
Python lists, so forked ``DataLoader`` workers do not copy it page by page through reference
counting. Map-style: :func:`~shardfeed.readers.loader.make_loader` reads it with
:class:`~shardfeed.readers.loader.EpochSampler` (the sample-range split), and iterating it
directly follows the same rule (shuffled, this rank's share); it also works with
``torch.utils.data.DistributedSampler`` (``len(ds)`` is N, the range of ``ds[i]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch.utils.data

from ..format.folder_walk import LinkRule, link_out_reason, refuse_outside_links
from ..format.manifest import UNLABELLED, format_key, key_width, normalize_ext, stored_path_problem
from ..storage.local_manifest import load_manifest
from ..format.imagefolder import has_class_folders, parse_extensions, scan_image_folder, scan_listing
from .options import ReadOptions
from .source_base import SourceBase

__all__ = ["FolderSource", "scan_folder"]


def scan_folder(
    root: str | os.PathLike, *, extensions: Iterable[str] | None = None,
    class_to_idx: Mapping[str, int] | None = None, follow_external_links: bool = False,
) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
    """Find the classes and images of an ImageFolder root (the packer's scan: the same rules).

    A folder without class folders (no non-hidden sub-folder) is a flat, unlabelled folder, as
    ``shardfeed pack`` takes it: its images, sorted by name, each with label
    :data:`~shardfeed.readers.format.manifest.UNLABELLED` (-1), and no classes.

    A symbolic link (to a folder or an image) whose target lies outside ``root`` is refused
    unless ``follow_external_links`` (the pack's rule and wording).

    Returns:
        ``(classes, class_to_idx, [(relative_path, label), ...])`` in ImageFolder order.

    Raises:
        FileNotFoundError, NotADirectoryError: ``root`` missing or a file.
        ValueError: no images, a class folder missing from ``class_to_idx``, a ``class_to_idx``
            for a flat folder, or a link out of ``root`` (naming it, its target and the fix).
    """
    if not has_class_folders(root):
        return [], {}, _flat_images(root, extensions, class_to_idx, follow_external_links)
    scan = scan_image_folder(root, extensions=extensions, class_to_idx=class_to_idx,
                             follow_external_links=follow_external_links)
    refuse_outside_links(scan.root, scan.unpackable)
    files = scan.files
    labels = [files.class_labels[c] for c in files.class_codes]
    return list(scan.classes), dict(scan.class_to_idx), list(zip(files.rels, labels))


#: Entries of a flat folder listed at most (a larger folder is refused, naming the limit).
MAX_FLAT_ENTRIES = 50_000_000


def _flat_images(root: str | os.PathLike, extensions: Iterable[str] | None,
                 class_to_idx: Mapping[str, int] | None, follow_external_links: bool) -> list[tuple[str, int]]:
    """The images directly in a flat folder: non-hidden regular files (links followed by the link
    rule) with one of the extensions whose names can be stored, sorted by name; each labelled
    ``UNLABELLED``.

    Raises:
        ValueError: a link to an image out of ``root`` without ``follow_external_links``."""
    if class_to_idx:
        raise ValueError(f"{root}: a class map is given, but the folder has no class folders (an unlabelled "
                         "dataset); sort the images into ROOT/CLASS/ folders, or read it without a class map")
    exts = set(parse_extensions(extensions))
    rule = LinkRule(root, follow_external_links)
    names = []
    with os.scandir(root) as it:
        for n, e in enumerate(it):
            if n >= MAX_FLAT_ENTRIES:
                raise ValueError(f"{root}: more than {MAX_FLAT_ENTRIES} entries; split the folder")
            dot = e.name.rfind(".")
            if (e.name.startswith(".") or dot <= 0 or e.name[dot + 1:].lower() not in exts
                    or stored_path_problem(e.name) is not None or not e.is_file()):
                continue
            target = rule.outside(e.path) if e.is_symlink() else None
            if target is not None:
                raise ValueError(f"{e.path}: {link_out_reason(target)}")
            names.append(e.name)
    if not names:
        raise ValueError(f"{root}: no images with extensions {','.join(sorted(exts))} in this folder and no class "
                         "folders; check the path, or pass --extensions")
    return [(name, UNLABELLED) for name in sorted(names)]


def _class_map_from(value) -> dict[str, int] | None:
    if value is None or isinstance(value, Mapping):
        return value
    return dict(load_manifest(value, check_files=False).class_to_idx)


class FolderSource(SourceBase, torch.utils.data.Dataset):
    """Map-style dataset over an image folder (``ROOT/CLASS/.../IMAGE``).

    Args:
        root: the image folder: a local path, or a listable
            :class:`~shardfeed.readers.storage.location.Location` (an ``s3://`` prefix: one listing, then one
            read per image).
        read: the options every source shares (:class:`~shardfeed.readers.sources.options.ReadOptions`;
            default ``ReadOptions()``).
        class_to_idx: a class map (dict) or a packed dataset (path) whose map to use.
        extensions: extensions to read (default: the packer's defaults).
        follow_external_links: read images through symbolic links whose target lies outside
            ``root`` too (a git-annex or DVC store); without it such a link is refused, naming it
            (a local folder only).

    ``ds[i]`` is ``(image uint8 [3, H, W], label int)``, a raw
    :class:`~shardfeed.readers.format.manifest.Sample` with ``decode=False`` (key: the zero-padded index
    in ImageFolder order; meta: ``{"path", "class"}``, ``{"path"}`` in a flat folder), or None
    when the sample was skipped (``on_error="skip"``). A local folder without class folders is
    read as an unlabelled dataset (label -1; see :func:`scan_folder`).
    """

    map_style = True
    #: what ``bench``/``verify`` call this kind of source (a bucket prefix of class folders too)
    source_format = "folder"

    def __init__(self, root: Any, read: ReadOptions | None = None, *,
                 class_to_idx: Mapping[str, int] | str | os.PathLike[str] | None = None,
                 extensions: Iterable[str] | None = None, follow_external_links: bool = False) -> None:
        self.store = None if isinstance(root, (str, os.PathLike)) else root  # a listable Location
        if self.store is not None:
            self.root = str(self.store)
            listing = getattr(self.store, "listing_cache", None) or self.store.list_objects()
            self.store.listing_cache = None
            scan = scan_listing(self.root, listing, extensions=extensions,
                                class_to_idx=_class_map_from(class_to_idx))
            classes, mapping = list(scan.classes), dict(scan.class_to_idx)
            files = list(zip(scan.files.rels, [scan.files.class_labels[c] for c in scan.files.class_codes]))
        else:
            self.root = Path(root)
            classes, mapping, files = scan_folder(self.root, extensions=extensions,
                                                  class_to_idx=_class_map_from(class_to_idx),
                                                  follow_external_links=follow_external_links)
        self._classes, self._class_to_idx = classes, mapping
        self._num_samples = len(files)
        self._paths = np.array([f.encode("utf-8", "surrogateescape") for f, _ in files])
        self._labels = np.array([lbl for _, lbl in files], dtype=np.int64)
        self._width = key_width(len(files))
        self._init_common(ReadOptions() if read is None else read)

    def __repr__(self) -> str:
        return f"FolderSource({str(self.root)!r}, num_samples={self._num_samples}, classes={len(self._classes)})"

    def __len__(self) -> int:
        return self._num_samples

    @property
    def labelled(self) -> bool:
        """False for a flat folder (no class folders: every label is -1)."""
        return bool(self._classes)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the file list (relative paths and labels, in ImageFolder order)."""
        import hashlib

        h = hashlib.sha256(b"shardfeed-folder\0")
        h.update(self._paths.tobytes())
        h.update(self._labels.tobytes())
        return h.hexdigest()

    def rel_path(self, i: int) -> str:
        """Path of sample ``i`` relative to the root (``/`` separators)."""
        return self._paths[i].decode("utf-8", "surrogateescape")

    def read_raw(self, i: int) -> tuple[str, bytes, str, int, dict]:
        """``(key, data, ext, label, meta)`` of sample ``i``, read from its file."""
        rel = self.rel_path(i)
        if self.store is not None:
            data = self.store.read_bytes(rel)  # one GET per image, under the store's fault policy
        else:
            with open(os.path.join(self.root, rel), "rb", buffering=0) as f:
                data = f.read()
        label = int(self._labels[i])
        ext = normalize_ext(os.path.splitext(rel)[1])
        meta = {"path": rel, "class": rel.split("/", 1)[0]} if self._classes else {"path": rel}
        return format_key(i, self._width), data, ext, label, meta

    def __getitem__(self, i: int):
        if not 0 <= i < self._num_samples:
            raise IndexError(f"sample index {i} is outside [0, {self._num_samples})")
        self._map_epoch_check()
        rel = self.rel_path(i)
        where = self.store.where(rel) if self.store is not None else os.path.join(self.root, rel)
        try:
            key, data, ext, label, meta = self.read_raw(i)
            return self.emit(key, data, ext, label, meta, where, index=i)
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and where not in str(exc):
                exc = OSError(exc.errno, f"{where}: {exc.strerror or exc}")
            self.handle_error(exc, where)
            return None
