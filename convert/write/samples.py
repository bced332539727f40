"""Reading the samples a pack stores: checked reads, re-encoding, decode checks, chunks for workers.

What every packer does with one planned sample, in whatever process runs it: read the file
checking it is the file the scan saw (:func:`read_file_checked`), re-encode it when asked
(:func:`shardfeed.convert.write.reencode.reencode_payload`), decode-check it, and on failure either raise
or (``on_error="skip"``) record it with :func:`skip_reason`. :func:`load_chunk` runs that over a
chunk of samples in a worker; it is the one task function of the packers that cut their output
after the payloads are known (LMDB, WebDataset with re-encoding).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from shardfeed.readers.errors import CorruptDataError, ShardfeedError, SourceChangedError
from shardfeed.readers.format.folder_walk import LINK_OUT_OF_SRC

from .plan import PlannedSample
from .reencode import reencode_payload
from .scan import ScannedFile

__all__ = ["read_source_bytes", "read_file_checked", "refuse_unpackable", "load_sample_payload", "payload_from_bytes",
           "skip_reason", "ChunkTask", "load_chunk", "skip_record"]


def read_source_bytes(f: ScannedFile) -> bytes:
    """Read a source file, checking it is the file the scan saw.

    Raises:
        SourceChangedError: the file vanished, or its size or mtime changed since the scan.
        OSError: it cannot be read (permissions, I/O error); the message names the file.
    """
    return read_file_checked(f.path, f.size, f.mtime_ns)


def read_file_checked(path: str, size: int, mtime_ns: int) -> bytes:
    """Read ``path``, checking that its size and mtime are still ``size`` and ``mtime_ns``.

    Four system calls (open, fstat, one read, close) in the common case.

    Raises:
        SourceChangedError: the file vanished, or its size or mtime changed since the scan.
        OSError: it cannot be read (permissions, I/O error); the message names the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SourceChangedError(f"{path}: disappeared after the scan; rerun the pack") from None
    except OSError as exc:
        raise OSError(exc.errno, f"{path}: cannot open ({exc.strerror}); fix its permissions, or pass "
                                 "--on-error skip to pack without it (then --resume)") from None
    try:
        st = os.fstat(fd)
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            raise SourceChangedError(f"{path}: changed while packing (size {size} -> {st.st_size} bytes); "
                                     "rerun the pack once the folder is stable")
        data = os.read(fd, size) if size else b""
        if len(data) < size:  # a short read: keep reading until EOF
            chunks = [data]
            remaining = size - len(data)
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, ShardfeedError):
            raise
        raise OSError(exc.errno, f"{path}: read failed ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) != size:
        raise SourceChangedError(f"{path}: shrank while packing ({size} -> {len(data)} bytes); rerun the pack")
    if not size:
        raise CorruptDataError(f"{path}: empty file (0 bytes), not an image; delete it, or pass --on-error skip")
    return data


def load_sample_payload(s: PlannedSample, options) -> tuple[bytes, str, dict]:
    """The bytes, extension and metadata to store for one planned sample.

    Reads the file (:func:`read_source_bytes`), re-encodes it when ``options.reencode`` is set
    (:func:`shardfeed.convert.write.reencode.reencode_payload`: new bytes and extension, ``orig_*`` added
    to a copy of the metadata) and, with ``decode_check``, decodes the bytes to store with the
    readers' exact rules so that a file that packs also decodes in training.

    Raises:
        SourceChangedError, OSError: as :func:`read_source_bytes`.
        shardfeed.readers.errors.CorruptDataError: the image does not decode (``decode_check``).
    """
    faults = options.faults
    if faults is not None and faults.sample_delay_s:
        time.sleep(faults.sample_delay_s)
    return payload_from_bytes(s, read_source_bytes(s.file), options)


def payload_from_bytes(s: PlannedSample, data: bytes, options) -> tuple[bytes, str, dict]:
    """:func:`load_sample_payload` after the read: re-encode and decode-check the file's ``data``.

    For a packer that reads ahead (:func:`shardfeed.convert.write.readahead.read_ahead`) in threads and
    decodes in its own thread, so that decoded pixels are held for one image at a time.

    Raises:
        shardfeed.readers.errors.CorruptDataError: the image does not decode (``decode_check``).
    """
    ext, meta = s.file.ext, s.meta
    if options.reencode is not None:
        data, ext, meta = reencode_payload(data, ext, meta, options.reencode, source=s.file.path)
    if options.decode_check:
        from shardfeed.readers.decode.image import decode_image

        decode_image(data, ext, source=s.file.path, max_decode_bytes=options.max_decode_bytes)
    return data, ext, meta


def refuse_unpackable(root: str | os.PathLike, unpackable: list[dict], on_error: str) -> None:
    """Stop a pack (``on_error="raise"``) whose scan found files with a packed extension that
    cannot be packed (``[{"path": rel, "reason": ...}]``: a broken link, a name failing the name
    policy, a symbolic link out of SRC); under ``on_error="skip"`` they are listed in the
    manifest's ``skipped``.

    Raises:
        ValueError: naming the first file (a link out of SRC first: its fix differs), its reason,
            how many more, and ``--on-error skip``.
    """
    if unpackable and on_error != "skip":
        first = next((u for u in unpackable if u["reason"].startswith(LINK_OUT_OF_SRC)), unpackable[0])
        more = f" (and {len(unpackable) - 1} more such file(s))" if len(unpackable) > 1 else ""
        raise ValueError(f"{Path(root) / first['path']}: {first['reason']}{more}; or pass --on-error skip to "
                         "pack the rest and list these in the manifest's skipped")


def skip_reason(exc: BaseException) -> str:
    """The error's message without its path prefix, and without the advice to pass
    ``--on-error skip`` (the file *was* skipped that way)."""
    msg = str(exc)
    reason = msg.split(": ", 1)[1] if ": " in msg else (msg or type(exc).__name__)
    if "--on-error skip" in reason and "; " in reason:
        reason = reason.rsplit("; ", 1)[0]
    return reason


def skip_record(s: PlannedSample, exc: BaseException) -> dict:
    """The manifest's ``skipped`` entry for a sample that failed with ``exc``."""
    return {"path": s.file.rel, "key": s.key, "reason": skip_reason(exc)}


@dataclasses.dataclass
class ChunkTask:
    """A chunk of consecutive planned samples for :func:`load_chunk` (picklable).

    Attributes:
        samples: the planned samples (a :class:`~shardfeed.convert.write.plan.SamplePlan` slice).
        options: the pack's options (``on_error``, ``reencode``, ``decode_check``, ``faults``).
        encode: None, or a module-level ``encode(sample, data, ext, meta) -> payload`` run in the
            worker (the LMDB packer encodes its records there).
        keep_partial: on a failure with ``on_error="raise"``, return the results before it with the
            error (the LMDB packer commits them first) instead of raising.
    """

    samples: Sequence[PlannedSample]
    options: Any
    encode: Callable | None = None
    keep_partial: bool = False


def load_chunk(task: ChunkTask) -> tuple[list[tuple], BaseException | None]:
    """Worker: load (and encode) a chunk of samples, in order.

    Returns:
        ``(results, error)``: ``results`` is ``[(sample_index, payload | None, skip | None), ...]``
        where ``payload`` is ``(data, ext, meta)`` or what ``task.encode`` returns and ``skip`` the
        :func:`skip_record` of a skipped sample; ``error`` is the failure that stopped the chunk
        (``keep_partial`` only), else None.

    Raises:
        SourceChangedError, OSError, CorruptDataError, ValueError: as :func:`load_sample_payload`,
            with ``on_error="raise"`` and not ``keep_partial``.
    """
    options, encode = task.options, task.encode
    out = []
    for s in task.samples:
        try:
            data, ext, meta = load_sample_payload(s, options)
        except (OSError, ValueError) as exc:
            if options.on_error != "skip":
                if task.keep_partial:
                    return out, exc
                raise
            out.append((s.index, None, skip_record(s, exc)))
            continue
        out.append((s.index, (data, ext, meta) if encode is None else encode(s, data, ext, meta), None))
    return out, None
