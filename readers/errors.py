"""The small family of exceptions shardfeed raises.

Every library error is a precise exception; the CLI turns any :class:`ShardfeedError` (and
``ValueError``/``FileNotFoundError``) into a one-line message and a non-zero exit status.
Each subclass also derives from the built-in exception a caller would naturally catch, so
``except ValueError`` still works for a bad argument.
"""

from __future__ import annotations

__all__ = [
    "ShardfeedError",
    "ManifestError",
    "IncompleteDatasetError",
    "CorruptDataError",
    "ImageTooLargeError",
    "SourceChangedError",
    "DataSourceError",
    "StorageAccessError",
    "DatasetChangedError",
    "ResumeStateError",
    "UnsupportedURLError",
    "ON_ERROR",
    "check_on_error",
]

#: Accepted values of ``on_error`` (what a reader or packer does with a sample it cannot read or
#: decode): ``"raise"`` the error, or ``"skip"`` the sample (and list it).
ON_ERROR = ("raise", "skip")


def check_on_error(on_error: str) -> str:
    """The one check of an ``on_error`` value, where it enters (a packer's options, a source, a
    decoder); returns it.

    Raises:
        ValueError: not one of :data:`ON_ERROR`.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    return on_error


class ShardfeedError(Exception):
    """Base class of every error shardfeed raises on purpose."""


class ManifestError(ShardfeedError, ValueError):
    """A manifest is missing, unreadable, of another format/version, or disagrees with the files."""


class IncompleteDatasetError(ManifestError):
    """A packed dataset has no finished manifest (a pack was interrupted): resume or rebuild it."""


class CorruptDataError(ShardfeedError, ValueError):
    """Stored bytes are damaged: a truncated tar member, a bad header, a checksum mismatch."""


class ImageTooLargeError(ShardfeedError, ValueError):
    """An image's header declares more pixels than ``max_pixels`` allows, or a decode that would
    allocate more than ``max_decode_bytes``; nothing was decoded. Under ``on_error="skip"`` the
    sample is skipped like a damaged one."""


class SourceChangedError(ShardfeedError, OSError):
    """A source file changed size or mtime (or vanished) between the scan and the pack."""


class DataSourceError(ShardfeedError, OSError):
    """Reading a shard failed (network error, HTTP status, stalled stream) after bounded retries."""


class StorageAccessError(DataSourceError):
    """The server or store refuses access, is misconfigured or cannot be reached: rejected,
    expired or missing credentials, a clock too far off, HTTP 401/403, a wrong region, bucket or
    endpoint. Retrying or skipping cannot help, so it is raised at once, and also under
    ``on_error="skip"`` (which is for damaged *data*); the message names the URL and what to set
    or renew."""


class DatasetChangedError(DataSourceError):
    """A dataset was replaced while it was read: a shard opened now has another size or
    modification time than when the dataset was opened (a ``pack --overwrite`` of the same
    folder). A reader reads one version of a dataset, so it stops, also under
    ``on_error="skip"`` (the rest would mix two versions); the message names the shard and what
    changed. Open the dataset again once the new version is complete."""


class ResumeStateError(ShardfeedError, ValueError):
    """A loader state cannot be restored here: another dataset, format version or reading rule."""


class UnsupportedURLError(ShardfeedError, ValueError):
    """A URL this command or reader cannot handle (an unknown scheme, an object store without its
    client installed, LMDB in a bucket); the message names the URL and what to install or use."""
