"""The offset index of a WebDataset shard (``.sfidx``): the byte offset of every sample's first tar header.

The format specification: docs/format.md. Little-endian uint64 per sample; a version-1 dataset
names its index ``.idx``, the name NVIDIA DALI's ``wds2idx`` gives its own text index.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Sequence

from ..errors import CorruptDataError
from .manifest import TAR_BLOCK

__all__ = ["is_dali_index", "encode_index", "decode_index", "read_index"]


def is_dali_index(head: bytes) -> bool:
    """Whether a file starting with ``head`` is an NVIDIA DALI WebDataset index (text: a version
    line ``v1.0``/``v1.1``/``v1.2 N``, then one line per sample), not shardfeed's binary index."""
    # shardfeed's index starts with the first sample's offset, 0: eight zero bytes
    return re.match(rb"v\d+\.\d+ \d+\s", head) is not None



def encode_index(offsets: Sequence[int]) -> bytes:
    """Encode sample offsets (bytes from the start of the shard) as little-endian uint64."""
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def decode_index(data: bytes, source: str = "<index>") -> list[int]:
    """Decode an offset index written by :func:`encode_index`.

    Raises:
        CorruptDataError: the length is not a multiple of 8 bytes, or the offsets are not strictly
            increasing multiples of the tar block (512 bytes): a damaged index, which would
            otherwise send a reader to the wrong bytes.
    """
    if is_dali_index(data[:64]):
        raise CorruptDataError(f"{source}: holds an NVIDIA DALI index (text, as DALI's wds2idx writes it), not "
                               "shardfeed's binary offset index: a version-1 dataset names its index .idx, DALI's "
                               "name; upgrade the dataset with `shardfeed index DIR --overwrite` (it writes .sfidx "
                               "beside DALI's .idx, manifest version 2), or repack")
    if len(data) % 8:
        raise CorruptDataError(f"{source}: offset index of {len(data)} bytes is not a multiple of 8")
    offsets = list(struct.unpack(f"<{len(data) // 8}Q", data))
    previous = -1
    for i, offset in enumerate(offsets):
        if offset <= previous or offset % TAR_BLOCK:
            raise CorruptDataError(f"{source}: damaged offset index (entry {i}: {offset} is not a tar block boundary "
                                   f"after {previous}); rebuild it with `shardfeed index`, then `shardfeed check`")
        previous = offset
    return offsets


def read_index(path: str | os.PathLike[str]) -> list[int]:
    """Read a local ``.sfidx`` file (``.idx`` in version-1 datasets): the byte offset of every sample's first header."""
    with open(path, "rb") as f:
        return decode_index(f.read(), str(path))
