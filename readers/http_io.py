"""Reading a dataset over HTTP(S): ranged GETs, a fallback for servers that ignore ``Range``,
bounded timeouts and retries. Standard library only (``http.client``).

Rules:

* A ranged read sends ``Range: bytes=START-END``. A ``206`` answer is checked (its
  ``Content-Range`` must start at ``START``); a ``200`` answer (the server ignored ``Range``, as
  Python's ``http.server`` does) is read from byte 0 and the bytes before ``START`` are skipped.
* Every socket operation has a timeout (``timeout_s``, default :data:`DEFAULT_TIMEOUT_S`): a
  server that stalls ends in an error instead of a hang.
* Connection errors, ``5xx`` answers, stalled reads and bodies cut short are retried
  ``retries`` times (default :data:`DEFAULT_RETRIES`) with a short back-off, resuming at the byte
  where the failure happened; ``4xx`` answers and untrusted TLS certificates are not retried.
  The final error is a :class:`~shardfeed.readers.errors.DataSourceError` naming the URL
  (``FileNotFoundError`` for a 404), raised within about ``(retries + 1) * timeout_s`` seconds
  plus the back-off.
* Redirects (``301``, ``302``, ``303``, ``307``, ``308``) are followed for every request (manifest,
  HEAD, ranged GETs), at most :data:`MAX_REDIRECTS` in a row, keeping the method and the ``Range``
  header (the hop is made again on a retry: a temporary redirect may move). Any other ``3xx``, a
  redirect without ``Location``, or too many hops fails at once naming the URL and the status.
* HTTPS uses Python's default TLS context: the system's CAs, or the bundle named by the
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` environment variables (e.g. for a private CA).
"""

from __future__ import annotations

import http.client
import logging
import ssl
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable

from .errors import DataSourceError, ManifestError, StorageAccessError
from .format import MANIFEST_NAME, Manifest
from .redact import guard_client_logs, redact

__all__ = [
    "check_remote_files", "HttpLocation", "HttpRangeStream", "DEFAULT_TIMEOUT_S", "DEFAULT_RETRIES", "MAX_REDIRECTS",
    "http_get"]

log = logging.getLogger(__name__)

#: Seconds a connect or a single socket read may take before it counts as failed.
DEFAULT_TIMEOUT_S = 10.0
#: Retries after the first attempt (so 3 attempts in all).
DEFAULT_RETRIES = 2
#: Shards whose size ``open_dataset`` checks with HEAD requests when it opens a URL (the rest are
#: checked as they are read).
HEAD_CHECK_MAX_SHARDS = 32
#: Redirects followed in a row before a request fails (browsers and curl stop at 20 and 50; a
#: dataset behind a CDN or an object store's signed URLs takes one or two).
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
#: First back-off between attempts, seconds (doubles each time).
BACKOFF_S = 0.2
_HEADERS = {"User-Agent": "shardfeed", "Accept-Encoding": "identity"}


class _Permanent(Exception):
    """An answer that retrying will not change (4xx)."""


def _connect(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url}: not an http(s) URL")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=timeout_s)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return conn, path


def _request(url: str, method: str, headers: dict, timeout_s: float):
    """Send one request, following redirects; returns ``(connection, response)`` of the final hop.

    Raises:
        _Permanent: a 4xx answer, a redirect that cannot be followed (names the URL and status).
        DataSourceError: a 5xx answer (retried by the caller).
    """
    hops: list[str] = []
    while True:
        conn, resp = _request_once(url, method, headers, timeout_s)
        if resp.status not in _REDIRECTS and not 300 <= resp.status < 400:
            return conn, resp
        location = resp.getheader("Location")
        status = f"HTTP {resp.status} {resp.reason}"
        conn.close()
        via = f" (redirected from {hops[0]})" if hops else ""
        if resp.status not in _REDIRECTS:
            raise _Permanent(DataSourceError(f"{url}: {status}{via}: not a redirect that can be followed; "
                                             "point shardfeed at the dataset's final URL"))
        if not location:
            raise _Permanent(DataSourceError(f"{url}: {status} without a Location header{via}; point shardfeed "
                                             "at the dataset's final URL"))
        hops.append(url)
        if len(hops) > MAX_REDIRECTS:
            raise _Permanent(DataSourceError(f"{hops[0]}: more than {MAX_REDIRECTS} redirects ({status} from "
                                             f"{url} to {location}); a redirect loop? point shardfeed at the "
                                             "dataset's final URL"))
        new = urllib.parse.urljoin(url, location)
        log.debug("%s %s: %s to %s", method, url, status, new)
        url = new
        if resp.status == 303 and method not in ("GET", "HEAD"):
            method = "GET"


def _request_once(url: str, method: str, headers: dict, timeout_s: float):
    conn, path = _connect(url, timeout_s)
    try:
        conn.request(method, path, headers={**_HEADERS, **headers})
        resp = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    if resp.status >= 400:
        body = b""
        try:
            body = resp.read(200)
        except Exception:
            pass
        conn.close()
        msg = f"HTTP {resp.status} {resp.reason}"
        if resp.status == 404:
            raise _Permanent(FileNotFoundError(f"{url}: {msg} (file not found on the server)"))
        if resp.status in (401, 403, 407):
            raise _Permanent(StorageAccessError(redact(
                f"{url}: {msg}: the server refuses access; renew or fix the credentials it expects (a pre-signed "
                "URL expires: sign it again; a token or cookie: renew it; a proxy: HTTP(S)_PROXY credentials), "
                "or check that the dataset is published at this URL")))
        if resp.status < 500 and resp.status != 408 and resp.status != 429:
            raise _Permanent(DataSourceError(redact(f"{url}: {msg} {body[:80]!r}")))
        raise DataSourceError(f"{url}: {msg}")
    return conn, resp


def _with_retries(url: str, what: str, fn, retries: int):
    last = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            return fn()
        except _Permanent as exc:
            raise exc.args[0] from None
        except ssl.SSLCertVerificationError as exc:  # retrying will not make the certificate trusted
            raise DataSourceError(f"{url}: the server's TLS certificate is not trusted ({exc.verify_message}); "
                                  "point SSL_CERT_FILE (or SSL_CERT_DIR) at the CA that signed it, or fix the "
                                  "server's certificate") from None
        except (OSError, http.client.HTTPException) as exc:
            last = exc
            log.debug("%s %s failed (attempt %d of %d): %r", what, url, attempt + 1, retries + 1, exc)
    reason = f"{type(last).__name__}: {last}" if str(last) else type(last).__name__
    if isinstance(last, DataSourceError):
        reason = str(last).split(": ", 1)[-1]
    raise DataSourceError(f"{url}: {what} failed after {retries + 1} attempts ({reason}); check the URL "
                          "and that the server is up") from None


def http_get(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES) -> bytes:
    """GET a whole (small) file: the manifest, an offset index.

    Raises:
        FileNotFoundError: HTTP 404.
        DataSourceError: other errors, after the retries (names the URL).
    """
    def once():
        conn, resp = _request(url, "GET", {}, timeout_s)
        try:
            length = resp.getheader("Content-Length")
            data = resp.read()
            if length is not None and len(data) != int(length):
                raise http.client.IncompleteRead(data, int(length) - len(data))
            return data
        finally:
            conn.close()

    return _with_retries(url, "GET", once, retries)


def _http_head_size(url: str, timeout_s: float, retries: int) -> int | None:
    def once():
        conn, resp = _request(url, "HEAD", {}, timeout_s)
        try:
            resp.read()
            length = resp.getheader("Content-Length")
            return int(length) if length is not None and length.isdigit() else None
        finally:
            conn.close()

    return _with_retries(url, "HEAD", once, retries)


class HttpRangeStream:
    """A read-only stream of ``url`` from byte ``start`` (to ``end``), resuming after failures.

    Attributes:
        offset: file offset of the next byte :meth:`read` returns (the stream starts at
            ``start`` when the server answers ``Range``, else at 0).
        ranged: whether the server answered the ``Range`` request.
        total_bytes: the file's size as the server reports it (None if it does not say).
    """

    def __init__(self, url: str, start: int = 0, end: int | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES):
        self.url = url
        self.end = end
        self.timeout_s = timeout_s
        self.retries = retries
        self._conn = self._resp = None
        self._closed = False
        self.ranged = False
        self.total_bytes: int | None = None
        self._expect_end: int | None = None
        self.offset = 0
        self._open(start)

    def _open(self, start: int) -> None:
        self.close()
        self._closed = False
        want_range = start > 0 or self.end is not None

        def once():
            headers = {}
            if want_range:
                headers["Range"] = f"bytes={start}-" + ("" if self.end is None else str(self.end - 1))
            conn, resp = _request(self.url, "GET", headers, self.timeout_s)
            return conn, resp

        conn, resp = _with_retries(self.url, "GET", once, self.retries)
        length = resp.getheader("Content-Length")
        length = int(length) if length is not None and length.isdigit() else None
        if resp.status == 206:
            cr = resp.getheader("Content-Range", "")
            try:
                span, _, total = cr.partition(" ")[2].partition("/")
                first = int(span.split("-")[0])
                self.total_bytes = int(total) if total and total != "*" else self.total_bytes
            except ValueError:
                conn.close()
                raise DataSourceError(f"{self.url}: unreadable Content-Range {cr!r} in a 206 answer") from None
            if first != start:
                conn.close()
                raise DataSourceError(f"{self.url}: asked for bytes from {start}, server sent from {first}")
            self.ranged = True
            self.offset = start
        else:
            self.ranged = False
            self.offset = 0
            if length is not None:
                self.total_bytes = length
        self._expect_end = self.offset + length if length is not None else None
        self._conn, self._resp = conn, resp

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (fewer only at the end); failures are retried from the same byte.

        Raises:
            DataSourceError: the read still fails after the retries (names the URL).
        """
        if n == 0:  # an empty read is no sign of a cut body
            return b""
        attempts = 0
        while True:
            try:
                if self._resp is None:
                    return b""
                data = self._resp.read(n if n is not None and n >= 0 else None)
                if not data and self._expect_end is not None and self.offset < self._expect_end:
                    raise http.client.IncompleteRead(b"", self._expect_end - self.offset)
                self.offset += len(data)
                return data
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, DataSourceError):
                    raise
                if self._closed:
                    raise DataSourceError(f"{self.url}: stream closed while reading at byte {self.offset}") from None
                attempts += 1
                if attempts > self.retries:
                    raise DataSourceError(f"{self.url}: reading at byte {self.offset} failed after "
                                          f"{attempts} attempts ({type(exc).__name__}: {exc}); the server "
                                          "closed or stalled the connection") from None
                log.debug("read of %s at byte %d failed (%r); retrying", self.url, self.offset, exc)
                time.sleep(BACKOFF_S * 2 ** (attempts - 1))
                resume_at = self.offset
                self._open(resume_at)
                if self.offset < resume_at:  # server ignores Range: skip what we already have
                    left = resume_at - self.offset
                    while left:
                        chunk = self._resp.read(min(left, 1 << 20))
                        if not chunk:
                            raise DataSourceError(f"{self.url}: body ended at byte {self.offset} while "
                                                  f"resuming at {resume_at}") from None
                        left -= len(chunk)
                        self.offset += len(chunk)

    def close(self) -> None:
        self._closed = True  # a read failing because of this close is not retried
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = self._resp = None

    def __enter__(self) -> "HttpRangeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HttpLocation:
    """A dataset served over HTTP(S): ``http://host/data/`` or ``http://host/data/manifest.json``.

    Picklable (holds only the URL and the options).

    Args:
        url: the directory URL or the manifest URL.
        timeout_s: per-operation socket timeout, seconds.
        retries: retries after the first attempt.
    """

    def __init__(self, url: str, *, timeout_s: float | None = None, retries: int | None = None):
        self.timeout_s = float(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        self.retries = int(DEFAULT_RETRIES if retries is None else retries)
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError(f"timeout_s must be > 0 and retries >= 0, got {timeout_s}, {retries}")
        guard_client_logs()
        u = urllib.parse.urlsplit(url)
        path = u.path
        if path.endswith(".json"):
            path = path.rsplit("/", 1)[0] + "/"
            self.manifest_name = u.path.rsplit("/", 1)[1]
        else:
            self.manifest_name = MANIFEST_NAME
            if not path.endswith("/"):
                path += "/"
        self.base = urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", ""))

    def __str__(self) -> str:
        return self.base

    def url(self, name: str) -> str:
        """The URL of the dataset file ``name``."""
        return self.base + urllib.parse.quote(name)

    def where(self, name: str) -> str:
        """Name of the file for messages (its URL)."""
        return self.url(name)

    def read_bytes(self, name: str) -> bytes:
        """GET a whole dataset file (manifest, index)."""
        return http_get(self.url(name), timeout_s=self.timeout_s, retries=self.retries)

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        """Open ``name`` for reading bytes ``[start, end)``.

        Returns:
            ``(stream, stream_offset)``: the offset of the stream's first byte (``start``, or 0
            when the server ignored ``Range``).
        """
        s = HttpRangeStream(self.url(name), start, end, timeout_s=self.timeout_s, retries=self.retries)
        return s, s.offset

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """Fetch and validate the manifest; with ``check_files``, check shard sizes (HEAD; see
        :meth:`check_files`).

        Raises:
            ManifestError: no manifest at the URL, a bad one, or files missing / of the wrong size.
            DataSourceError: the server cannot be reached (names the URL).
        """
        murl = self.url(self.manifest_name)
        try:
            raw = http_get(murl, timeout_s=self.timeout_s, retries=self.retries)
        except FileNotFoundError:
            raise ManifestError(f"{murl}: not found; {self.base} is not a packed dataset, or its pack did not "
                                "finish (the manifest is written last): pack it with `shardfeed pack`") from None
        manifest = Manifest.from_json(raw, murl)
        if check_files and manifest.format != "lmdb":
            self.check_files(manifest)
        return manifest

    def check_files(self, manifest: Manifest, *, threads: int = 16, max_shards: int = HEAD_CHECK_MAX_SHARDS) -> None:
        """HEAD the shards (and their indexes) and compare their sizes with the manifest.

        See :func:`check_remote_files` (at most ``max_shards`` shards, evenly spread).

        Raises:
            ManifestError: a file is missing or has another size (names the URL).
        """
        check_remote_files(manifest, lambda name: _http_head_size(self.url(name), self.timeout_s, self.retries),
                           self.url, "on the server", threads=threads, max_shards=max_shards)


def check_remote_files(manifest: Manifest, head_size: Callable[[str], int | None], url: Callable[[str], str],
                       place: str, *, threads: int = 16, max_shards: int = HEAD_CHECK_MAX_SHARDS) -> None:
    """Check a remote dataset's shards and indexes against its manifest: present, of the right size.

    At most ``max_shards`` shards are checked, evenly spread and including the first and the last:
    every rank opens the dataset, and 2 HEAD requests for each of 10,000 shards at each start would
    cost seconds and load the server. The others are checked when they are read (each ranged
    read's total size must equal the manifest's). Used by the HTTP and the object-store locations.

    Args:
        manifest: The dataset's manifest.
        head_size: ``name -> size in bytes`` (None: unknown), raising FileNotFoundError when the
            file is missing.
        url: ``name -> URL``, for messages.
        place: Where the files are, for messages (``"on the server"``, ``"in the bucket"``).
        threads: HEAD requests in flight.
        max_shards: Shards checked at most.

    Raises:
        ManifestError: a file is missing or has another size (names the URL and the fix).
    """
    def check(entry):
        try:
            size = head_size(entry.name)
        except FileNotFoundError:
            raise ManifestError(f"{url(entry.name)}: listed in {MANIFEST_NAME} but missing {place}") from None
        if size is not None and size != entry.num_bytes:
            raise ManifestError(f"{url(entry.name)}: {size} bytes {place} but {entry.num_bytes} in "
                                f"{MANIFEST_NAME}; the file was changed or truncated: run `shardfeed check` and "
                                "repack")
        if entry.index:
            try:
                head_size(entry.index)
            except FileNotFoundError:
                raise ManifestError(f"{url(entry.index)}: offset index missing {place}; rebuild it with "
                                    "`shardfeed index`") from None

    shards = manifest.shards
    if not shards:
        return
    if len(shards) > max_shards >= 2:
        step = (len(shards) - 1) / (max_shards - 1)
        shards = [shards[round(i * step)] for i in range(max_shards)]
    with ThreadPoolExecutor(min(threads, len(shards))) as pool:
        for f in [pool.submit(check, e) for e in shards]:
            f.result()
