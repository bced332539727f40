"""One opener for file, HTTP and object-store paths (docs/architecture.md; webdataset's ``gopen`` plays this
part there): which kind of place a path names, and the location object that reads it.

* a local path, or ``file:///abs/path`` → the local :class:`pathlib.Path`;
* ``http://`` / ``https://`` → :class:`~shardfeed.readers.http_io.HttpLocation`;
* ``s3://bucket/prefix/`` → :class:`~shardfeed.readers.objstore.StoreLocation` (the ``s3`` extra);
* anything else of the form ``scheme://`` (``gs://``, ``az://``, ``hdfs://``, ``ftp://`` ...) is
  refused by :func:`check_supported` with :class:`~shardfeed.readers.errors.UnsupportedURLError`
  naming the URL and what to install or use, instead of being taken for a local folder named
  ``gs:``.

Remote locations share one interface (``url``/``where``, ``read_bytes``, ``open(name, start,
end) -> (stream, stream_offset)``, ``load_manifest``) and one fault policy (bounded timeouts,
bounded retries with back-off that resume at the failed byte, 4xx answers as immediate errors).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .errors import UnsupportedURLError

__all__ = ["url_scheme", "is_http_url", "is_remote", "check_supported", "open_location", "local_path"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(text: Any) -> str | None:
    """The lower-case scheme of ``text`` when it has the form ``scheme://...``, else None."""
    if not isinstance(text, str):
        return None
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def is_http_url(text: Any) -> bool:
    """Whether ``text`` is an ``http://`` or ``https://`` URL."""
    return url_scheme(text) in ("http", "https")


def is_remote(text: Any) -> bool:
    """Whether ``text`` names an HTTP(S) or object-store location (any ``scheme://`` but ``file``)."""
    scheme = url_scheme(text)
    return scheme is not None and scheme != "file"


def check_supported(text: Any, *, what: str = "this command", allow: tuple[str, ...] = ("file", "http", "https", "s3"),
                    hint: str = "") -> None:
    """Refuse a ``scheme://`` path that ``what`` cannot handle.

    Args:
        text: the path or URL (anything but a ``str`` passes).
        what: the command or function, for the message.
        allow: the schemes accepted.
        hint: what to use instead (appended to the message).

    Raises:
        UnsupportedURLError: names the URL, what is accepted and what to install or use.
    """
    scheme = url_scheme(text)
    if scheme is None or scheme in allow:
        return
    from .objstore import STORE_SCHEMES

    if scheme in STORE_SCHEMES and scheme != "s3":
        msg = (f"{text}: {scheme}:// is not supported; shardfeed reaches object stores through the S3 API: use "
               "s3://BUCKET/PREFIX with AWS_ENDPOINT_URL set to the store's S3-compatible endpoint (GCS: "
               "https://storage.googleapis.com with HMAC keys)")
    elif scheme == "s3":
        msg = f"{text}: {what} does not read or write object stores"
    elif scheme in ("http", "https"):
        msg = f"{text}: {what} does not work over HTTP"
    else:
        msg = f"{text}: {scheme}:// URLs are not supported (accepted: local paths, " + \
            ", ".join(f"{s}://" for s in allow if s != "file") + ")"
    raise UnsupportedURLError(msg + (f"; {hint}" if hint else ""))


def local_path(text: str | os.PathLike) -> Path:
    """The local path of ``text`` (``file:///x`` → ``/x``).

    Raises:
        UnsupportedURLError: ``text`` is a remote URL.
    """
    if isinstance(text, str):
        scheme = url_scheme(text)
        if scheme == "file":
            return Path(text[len("file://"):])
        if scheme is not None:
            raise UnsupportedURLError(f"{text}: expected a local path, not a URL")
    return Path(text)


def open_location(source: str | os.PathLike, *, storage_options: dict | None = None, timeout_s: float | None = None,
                  retries: int | None = None):
    """The location object for ``source``: a local ``Path``, an ``HttpLocation`` or a
    ``StoreLocation``.

    Args:
        source: a local path, ``file://``, ``http(s)://`` or ``s3://`` URL (a folder or a manifest).
        storage_options: object-store client options (see :mod:`shardfeed.readers.objstore`).
        timeout_s, retries: the remote fault policy (None: http_io's defaults).

    Raises:
        UnsupportedURLError: another scheme, or the object-store client is not installed.
    """
    check_supported(source, what="shardfeed")
    scheme = url_scheme(source)
    if scheme in ("http", "https"):
        from .http_io import HttpLocation

        return HttpLocation(str(source), timeout_s=timeout_s, retries=retries)
    if scheme == "s3":
        from .objstore import StoreLocation

        return StoreLocation(str(source), storage_options=storage_options, timeout_s=timeout_s, retries=retries)
    return local_path(source)
