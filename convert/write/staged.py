"""Files rewritten together: every new file is written beside the one it replaces, and all are put
in place only once every one was written. A tool that fails part-way (a bad shard, no sample, a
full disk, Ctrl-C) leaves the old files as they were, and no temporary file behind."""

from __future__ import annotations

import os
from pathlib import Path

from shardfeed.readers.file_io import write_temp_beside

__all__ = ["ReplacedTogether"]


class ReplacedTogether:
    """A set of files replaced together: :meth:`write` each, then :meth:`commit` renames them all.

    Use it as a context manager: leaving the block without :meth:`commit` (an exception) removes
    the new files written so far, so the old ones stay in place and intact::

        with ReplacedTogether() as files:
            for path, data in new_contents:
                files.write(path, data)
            check_everything()
            files.commit()
    """

    def __init__(self) -> None:
        self._staged: list[tuple[str, Path]] = []

    def write(self, path: str | os.PathLike, data: bytes) -> None:
        """Write ``data`` (bytes) beside ``path`` (``.NAME.XXXXXXXX.tmp``), to replace it at :meth:`commit`.

        Raises:
            OSError: the file could not be written (nothing of it is left).
        """
        self._staged.append((write_temp_beside(path, data), Path(path)))

    def commit(self) -> None:
        """Rename every new file over the one it replaces (in the order written)."""
        while self._staged:
            tmp, path = self._staged[0]
            os.replace(tmp, path)
            self._staged.pop(0)

    def discard(self) -> None:
        """Remove the new files not yet in place."""
        for tmp, _ in self._staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._staged.clear()

    def __enter__(self) -> "ReplacedTogether":
        return self

    def __exit__(self, *exc) -> None:
        self.discard()
