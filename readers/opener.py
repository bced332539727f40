"""One opener for file, HTTP and object-store paths (docs/architecture.md; webdataset's ``gopen`` plays this
part there): which kind of place a path names, and the location object that reads it.

The class is chosen by the URL scheme from one table (:mod:`shardfeed.readers.location`,
:func:`~shardfeed.readers.location.register_location`):

* a local path, or ``file:///abs/path`` → :class:`~shardfeed.readers.location.LocalLocation`;
* ``http://`` / ``https://`` → :class:`~shardfeed.readers.http_io.HttpLocation`;
* ``s3://bucket/prefix/`` → :class:`~shardfeed.readers.objstore.StoreLocation` (the ``s3`` extra);
* a scheme registered with ``register_location`` → what its factory returns;
* anything else of the form ``scheme://`` (``gs://``, ``az://``, ``hdfs://``, ``ftp://`` ...) is
  refused by :func:`check_supported` with :class:`~shardfeed.readers.errors.UnsupportedURLError`
  naming the URL and what to install or use, instead of being taken for a local folder named
  ``gs:``.

Every location has one interface (:class:`~shardfeed.readers.location.Location`: ``where``,
``read_bytes``, ``open(name, start, end) -> (stream, stream_offset)``, ``load_manifest``, listing
and writing where its capabilities say so); the remote ones share one fault policy (bounded
timeouts, bounded retries with back-off that resume at the failed byte, 4xx answers as immediate
errors).
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


def check_supported(text: Any, *, what: str = "this command", allow: tuple[str, ...] | None = None,
                    hint: str = "") -> None:
    """Refuse a ``scheme://`` path that ``what`` cannot handle.

    Args:
        text: the path or URL (anything but a ``str`` passes).
        what: the command or function, for the message.
        allow: the schemes accepted (None: every registered one,
            :func:`~shardfeed.readers.location.location_schemes`).
        hint: what to use instead (appended to the message).

    Raises:
        UnsupportedURLError: names the URL, what is accepted and what to install or use.
    """
    scheme = url_scheme(text)
    if allow is None:
        from .location import location_schemes

        allow = location_schemes()
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
    """The :class:`~shardfeed.readers.location.Location` of ``source``, made by the factory its
    scheme is registered with (:func:`~shardfeed.readers.location.register_location`).

    Args:
        source: a local path, ``file://``, ``http(s)://``, ``s3://`` or registered ``scheme://``
            URL (a folder or a manifest).
        storage_options: storage client options (for ``s3://``: see :mod:`shardfeed.readers.objstore`),
            passed to the factory.
        timeout_s, retries: the remote fault policy (None: http_io's defaults).

    Raises:
        UnsupportedURLError: a scheme not registered, or the storage's client is not installed.
    """
    from .location import location_factory

    check_supported(source, what="shardfeed")
    scheme = url_scheme(source)
    factory = location_factory(scheme)
    return factory(source if scheme is None else str(source), storage_options=storage_options,
                   timeout_s=timeout_s, retries=retries)
