"""One opener for file, HTTP and object-store paths (docs/architecture.md; webdataset's ``gopen`` plays this
part there): which kind of place a path names, and the location object that reads it.

The class is chosen by the URL scheme from one table, here (:func:`register_location` adds a
scheme, :func:`unregister_location` removes it):

* a local path, or ``file:///abs/path`` → :class:`~shardfeed.readers.storage.location.LocalLocation`;
* ``http://`` / ``https://`` → :class:`~shardfeed.readers.storage.http_io.HttpLocation`;
* ``s3://bucket/prefix/`` → :class:`~shardfeed.readers.storage.objstore.StoreLocation` (the ``s3`` extra);
* a scheme registered with ``register_location`` → what its factory returns;
* anything else of the form ``scheme://`` (``gs://``, ``az://``, ``hdfs://``, ``ftp://`` ...) is
  refused by :func:`check_supported` with :class:`~shardfeed.readers.errors.UnsupportedURLError`
  naming the URL and what to install or use, instead of being taken for a local folder named
  ``gs:``.

Every location has one interface (:class:`~shardfeed.readers.storage.location.Location`: ``where``,
``read_bytes``, ``open(name, start, end) -> (stream, stream_offset)``, ``load_manifest``, listing
and writing where its capabilities say so); the remote ones share one fault policy (bounded
timeouts, bounded retries with back-off that resume at the failed byte, 4xx answers as immediate
errors).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

from ..errors import UnsupportedURLError

__all__ = ["url_scheme", "is_http_url", "is_remote", "check_supported", "open_location", "load_manifest", "local_path",
           "register_location", "unregister_location", "location_schemes", "location_factory", "LocationFactory"]

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
            :func:`location_schemes`).
        hint: what to use instead (appended to the message).

    Raises:
        UnsupportedURLError: names the URL, what is accepted and what to install or use.
    """
    scheme = url_scheme(text)
    if allow is None:
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
    """The :class:`~shardfeed.readers.storage.location.Location` of ``source``, made by the factory its
    scheme is registered with (:func:`register_location`).

    Args:
        source: a local path, ``file://``, ``http(s)://``, ``s3://`` or registered ``scheme://``
            URL (a folder or a manifest).
        storage_options: storage client options (for ``s3://``: see :mod:`shardfeed.readers.storage.objstore`),
            passed to the factory.
        timeout_s, retries: the remote fault policy (None: http_io's defaults).

    Raises:
        UnsupportedURLError: a scheme not registered, or the storage's client is not installed.
    """
    check_supported(source, what="shardfeed")
    scheme = url_scheme(source)
    factory = location_factory(scheme)
    return factory(source if scheme is None else str(source), storage_options=storage_options,
                   timeout_s=timeout_s, retries=retries)


# ---------------------------------------------------------------------------------------------
# the table: scheme -> factory

#: ``factory(source, *, storage_options=None, timeout_s=None, retries=None) -> Location``
LocationFactory = Callable[..., Any]

_TABLE: dict[str, LocationFactory] = {}
_TABLE_LOCK = threading.Lock()


def _local(source, **_unused):
    from .location import LocalLocation

    return LocalLocation(local_path(source))


def _http(source, *, storage_options=None, timeout_s=None, retries=None):
    from .http_io import HttpLocation

    return HttpLocation(str(source), timeout_s=timeout_s, retries=retries)


def _s3(source, *, storage_options=None, timeout_s=None, retries=None):
    from .objstore import StoreLocation

    return StoreLocation(str(source), storage_options=storage_options, timeout_s=timeout_s, retries=retries)


def register_location(scheme: str, factory: LocationFactory, *, replace: bool = False) -> None:
    """Make ``scheme://`` URLs open as the location ``factory`` returns.

    Every reader and tool opens sources through :func:`open_location`,
    so after this call ``open_dataset("scheme://...")``, ``pack(src, "scheme://...")`` (when the
    location is ``writable``), ``check``, ``stage``, ``inspect`` and ``convert`` accept the scheme.

    Args:
        scheme: the URL scheme, letters, digits, ``+``, ``-``, ``.`` (case-insensitive).
        factory: ``factory(url, *, storage_options=None, timeout_s=None, retries=None)``, returning
            an object with the :class:`~shardfeed.readers.storage.location.Location` interface
            (subclassing :class:`~shardfeed.readers.storage.location.LocationBase` gives the defaults).
            ``DataLoader`` workers receive the location pickled: with ``num_workers > 0`` it must
            pickle (and reach its storage from another process).
        replace: allow replacing a registered scheme (the built-in ``http``, ``https`` and ``s3``
            included). ``file`` cannot be replaced: local paths and ``file://`` URLs are always
            read as local files (:class:`~shardfeed.readers.storage.location.LocalLocation`).

    Raises:
        ValueError: a malformed scheme, ``file``, or a scheme registered already (without
            ``replace``).
        TypeError: ``factory`` is not callable.
    """
    if not isinstance(scheme, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise ValueError(f"register_location: {scheme!r} is not a URL scheme (letters, digits, '+', '-', '.')")
    if not callable(factory):
        raise TypeError(f"register_location({scheme!r}, ...): the factory must be callable, got {factory!r}")
    key = scheme.lower()
    if key in _FIXED and key in _TABLE:
        raise ValueError(_fixed_message("register_location", key))
    with _TABLE_LOCK:
        if key in _TABLE and not replace:
            raise ValueError(f"register_location: {key}:// is registered already; pass replace=True to replace it")
        _TABLE[key] = factory


def unregister_location(scheme: str) -> None:
    """Forget ``scheme://`` (its URLs are refused again by :func:`check_supported`).

    Raises:
        KeyError: the scheme is not registered.
        ValueError: ``file``: local paths are always read as local files.
    """
    if str(scheme).lower() in _FIXED:
        raise ValueError(_fixed_message("unregister_location", str(scheme).lower()))
    with _TABLE_LOCK:
        del _TABLE[str(scheme).lower()]


#: Schemes that cannot be replaced or unregistered: local paths are read as local files, always.
_FIXED = frozenset({"file"})


def _fixed_message(call: str, key: str) -> str:
    return (f"{call}: {key}:// cannot be replaced or unregistered: local paths and file:// URLs are always read as "
            "local files (LocalLocation); register your storage under a scheme of its own (myfs://...)")


def location_schemes() -> tuple[str, ...]:
    """The registered schemes, in registration order (``file``, ``http``, ``https``, ``s3`` built in)."""
    with _TABLE_LOCK:
        return tuple(_TABLE)


def location_factory(scheme: str | None) -> LocationFactory:
    """The factory of ``scheme`` (None: a local path).

    Raises:
        UnsupportedURLError: the scheme is not registered.
    """
    with _TABLE_LOCK:
        factory = _TABLE.get("file" if scheme is None else scheme.lower())
    if factory is None:
        raise UnsupportedURLError(f"{scheme}:// is not a registered storage (registered: "
                                  f"{', '.join(s + '://' for s in location_schemes())})")
    return factory


for _scheme, _factory in (("file", _local), ("http", _http), ("https", _http), ("s3", _s3)):
    register_location(_scheme, _factory)


def load_manifest(source: str | os.PathLike, *, check_files: bool = True, storage_options: dict | None = None,
                  timeout_s: float | None = None, retries: int | None = None):
    """Load and validate the manifest of a dataset wherever it is stored.

    ``shardfeed.readers.load_manifest`` is this function: a local path goes to
    :func:`shardfeed.readers.storage.local_manifest.load_manifest`, a URL (``http(s)://``, ``s3://`` or a scheme
    added with :func:`register_location`) to its location's ``load_manifest``.

    Args:
        source: the dataset directory or its ``manifest.json``: a local path, ``file://`` or any
            registered scheme's URL.
        check_files: also check that the listed files exist with the listed sizes (local: every
            file; remote: a bounded sample of the shards,
            :func:`~shardfeed.readers.storage.http_io.check_remote_files`).
        storage_options, timeout_s, retries: as :func:`open_location`.

    Returns:
        The validated :class:`~shardfeed.readers.format.manifest.Manifest`.

    Raises:
        FileNotFoundError: a local ``source`` that does not exist.
        IncompleteDatasetError: shards but no manifest (an interrupted pack).
        ManifestError: a bad manifest, or files missing / of the wrong size.
        UnsupportedURLError: a scheme that is not registered.
        DataSourceError: a remote manifest could not be fetched (names the URL, no credentials).
    """
    from .local_manifest import load_manifest as load_local_manifest

    if is_remote(source):
        return open_location(source, storage_options=storage_options, timeout_s=timeout_s,
                             retries=retries).load_manifest(check_files=check_files)
    return load_local_manifest(local_path(source), check_files=check_files)
