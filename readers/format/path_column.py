"""Relative paths of a scan, stored compactly: about 30 bytes a path instead of about 90.

A Python ``str`` costs ~49 bytes of header plus its characters, and a list slot 8 more. A
:class:`PathColumn` keeps each folder part once (``"cat/sub/"``) and, per path, a 4-byte folder
code and the file name's UTF-8 bytes in one shared buffer with a 4-byte end offset. Reading a
path builds its ``str`` on demand (a few hundred nanoseconds); a gathered copy of a bounded
number of rows (:meth:`PathColumn.take`) is a plain list of strings, fast for a shard's hot loop.
"""

from __future__ import annotations

import re
from array import array
from typing import Iterable, Iterator, Sequence, overload

__all__ = ["PathColumn", "MAX_LISTED_TAKE"]

#: a :meth:`PathColumn.take` of at most this many rows returns a list of ``str`` (fast to read);
#: a larger one stays compact
MAX_LISTED_TAKE = 65536

# file names round-trip exactly, lone surrogates (PEP 383 names) included
_ERRORS = "surrogatepass"
# what JSON escapes (json.encoder.ESCAPE) and a lone surrogate, in UTF-8 (surrogatepass) bytes
_NOT_PLAIN = re.compile(rb'[\x00-\x1f"\\]|\xed[\xa0-\xbf]')


class PathColumn(Sequence[str]):
    """A read-only-once-built sequence of relative paths (``"cat/sub/x.jpg"``), compact.

    Args:
        folders: folder parts, each ``""`` or ending in ``/``.
        folder_codes: per path, an index into ``folders`` (``array('I')``).
        names: the file names' UTF-8 bytes, one after another.
        ends: per path, the end offset of its name in ``names`` (``array('I')``, ``array('Q')``
            past 4 GiB of names).

    Built empty and filled with :meth:`folder` and :meth:`append` (or :meth:`from_paths`).
    """

    __slots__ = ("folders", "folder_codes", "names", "ends", "_folder_index")

    def __init__(self, folders: list[str] | None = None, folder_codes: array | None = None,
                 names: bytes | bytearray | None = None, ends: array | None = None) -> None:
        self.folders = [] if folders is None else list(folders)
        self.folder_codes = array("I") if folder_codes is None else folder_codes
        self.names = bytearray() if names is None else bytearray(names)
        self.ends = array("I") if ends is None else ends
        self._folder_index: dict[str, int] | None = None

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> "PathColumn":
        """The column of ``paths`` (any relative paths with ``/`` separators)."""
        col = cls()
        for rel in paths:
            d, _, name = rel.rpartition("/")
            col.append(col.folder(d + "/" if _ else ""), name)
        return col

    def folder(self, rel_dir: str) -> int:
        """The code of the folder part ``rel_dir`` (``""`` or ending in ``/``), added if new."""
        index = self._folder_index
        if index is None:
            index = self._folder_index = {d: i for i, d in enumerate(self.folders)}
        code = index.get(rel_dir)
        if code is None:
            code = index[rel_dir] = len(self.folders)
            self.folders.append(rel_dir)
        return code

    def append(self, code: int, name: str) -> None:
        """Add the path ``folders[code] + name``."""
        self.names += name.encode("utf-8", _ERRORS)
        try:
            self.ends.append(len(self.names))
        except OverflowError:  # past 4 GiB of names: 8-byte offsets from now on
            self.ends = array("Q", self.ends)
            self.ends.append(len(self.names))
        self.folder_codes.append(code)

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> "Sequence[str]": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self.ends))))
        ends = self.ends
        if i < 0:
            i += len(ends)
        start = ends[i - 1] if i > 0 else 0  # (ends[i] raises the IndexError of a bad index)
        end = ends[i]
        return self.folders[self.folder_codes[i]] + self.names[start:end].decode("utf-8", _ERRORS)

    def __iter__(self) -> Iterator[str]:
        folders, codes, names, start = self.folders, self.folder_codes, self.names, 0
        for i, end in enumerate(self.ends):
            yield folders[codes[i]] + names[start:end].decode("utf-8", _ERRORS)
            start = end

    def take(self, indices: Sequence[int]) -> "Sequence[str]":
        """The paths at ``indices``, in that order: a ``list`` of ``str`` for at most
        :data:`MAX_LISTED_TAKE` rows, else a compact :class:`PathColumn` (sharing the folder parts)."""
        ends, names, codes = self.ends, self.names, self.folder_codes
        if len(indices) <= MAX_LISTED_TAKE:  # the hot path (a shard's rows): inline, no call per row
            if len(indices) and min(indices) < 0:
                indices = [range(len(ends))[i] for i in indices]  # from the end
            self._check_rows(indices)
            folders = self.folders
            return [folders[codes[i]] + names[ends[i - 1] if i else 0:ends[i]].decode("utf-8", _ERRORS)
                    for i in indices]
        out = PathColumn(self.folders)
        for i in indices:
            start = ends[i - 1] if i > 0 else 0
            out.names += names[start:ends[i]]
            try:
                out.ends.append(len(out.names))
            except OverflowError:
                out.ends = array("Q", out.ends)
                out.ends.append(len(out.names))
            out.folder_codes.append(codes[i])
        return out

    def plain(self) -> bool:
        """Whether every path is "plain": JSON stores it as it is (no ``"``, ``\\`` or control
        character) and it holds no lone surrogate, so its UTF-8 bytes are its folder part's plus its
        name's (what :meth:`utf8_lengths` and :meth:`utf8_paths` rely on)."""
        return _NOT_PLAIN.search(self.names) is None and not any(
            _NOT_PLAIN.search(d.encode("utf-8", _ERRORS)) for d in self.folders)

    def utf8_lengths(self, rows: Sequence[int]) -> Iterator[int]:
        """The UTF-8 byte length of each path at ``rows``, without building the paths."""
        flen = [len(d.encode("utf-8", _ERRORS)) for d in self.folders]
        ends, codes = self.ends, self.folder_codes
        for i in rows:
            yield flen[codes[i]] + ends[i] - (ends[i - 1] if i else 0)

    def utf8_paths(self, rows: Sequence[int]) -> list[bytes]:
        """The UTF-8 bytes of each path at ``rows`` (``surrogatepass`` for lone surrogates), without
        building the paths as ``str``."""
        self._check_rows(rows)
        fbytes = [d.encode("utf-8", _ERRORS) for d in self.folders]
        ends, codes, names = self.ends, self.folder_codes, self.names
        return [fbytes[codes[i]] + names[ends[i - 1] if i else 0:ends[i]] for i in rows]

    def _check_rows(self, rows: Sequence[int]) -> None:
        """Raise IndexError unless every row is in ``0..len-1``."""
        if len(rows) and (min(rows) < 0 or max(rows) >= len(self.ends)):
            raise IndexError("path index out of range")

    def __reduce__(self):
        return (PathColumn, (self.folders, self.folder_codes, bytes(self.names), self.ends))

    def __eq__(self, other) -> bool:
        if isinstance(other, (PathColumn, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"PathColumn({len(self)} paths in {len(self.folders)} folders)"
