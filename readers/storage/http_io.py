"""Reading a dataset over HTTP(S): ranged GETs, a fallback for servers that ignore ``Range``,
bounded timeouts and retries. The transport is ``urllib3`` (its connection pools and proxies);
ranges, retries, redirects, deadlines, content codings and exact bodies are shardfeed's own.

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
* Connections are kept open and reused (a keep-alive pool per process, at most
  :data:`POOL_CONNECTIONS` to each host): a stream read to its end gives its connection back, one
  closed early or failed closes it. A process forked from one with a pool (a DataLoader worker)
  starts with an empty pool of its own.
* HTTPS uses Python's default TLS context: the system's CAs, or the bundle named by the
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` environment variables (e.g. for a private CA).
* ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` are honoured as curl does (an ``http://``
  proxy, through ``urllib3.ProxyManager``; HTTPS goes through it with ``CONNECT``;
  ``user:password@`` of the proxy URL is sent as ``Proxy-Authorization``). ``user:password@``
  in a dataset URL is sent as HTTP Basic authentication, to that host only. Neither appears in a message or a log record
  (:mod:`shardfeed.readers.storage.redact`); a 401/403/407 is a
  :class:`~shardfeed.readers.errors.StorageAccessError`, never skipped.
* Sizes and time are bounded whatever the server says: a whole-file read (:func:`http_get`) is
  refused above its cap (:data:`MAX_MANIFEST_BYTES` for the manifest, :func:`index_size_cap`
  for an offset index) and each request ends within ``deadline_s`` (default
  :data:`DEFAULT_DEADLINE_S`; a watchdog thread shuts the socket of a request past it), on top
  of the per-read ``timeout_s``. ``gzip``/``deflate`` content codings are decoded for whole
  files and refused for a shard's bytes (``Accept-Encoding: identity`` is asked for). A shard
  whose whole-file answer is encoded is asked for again as a range (``bytes=0-``), which some
  servers send as it is. A server refusing ``HEAD`` (403/405/501), or answering it with a content
  coding, is asked for ``bytes=0-0`` to learn a size.
* A body without ``Content-Length`` (chunked, or closed by the server) is read exactly: a
  ``206`` is complete only at the end its ``Content-Range`` names; a cut one resumes there.
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import threading
import urllib.parse
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable

from ..background import before_join
from ..errors import DataSourceError, ManifestError
from ..file_io import read_at_most
from ..format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from .http_transport import (DEFAULT_DEADLINE_S, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, DRAIN_MAX_BYTES, DRAIN_S,
                             MAX_REDIRECTS, POOL_CONNECTIONS, Permanent, content_coding, finish_answer, header,
                             read_body, read_body_within, send_request, with_retries)
from .http_transport import WATCHDOG as _WATCHDOG  # noqa: F401  (the process's deadline watchdog, named here too)
from .location import LocationBase, check_byte_range
from .ranged_stream import ResumableRangeStream
from .redact import guard_client_logs, redact
from ..format.registry import describe
from ..runtime import after_fork_in_child
from .manifest_cache import parse_manifest

__all__ = [
    "check_remote_files", "HttpLocation", "HttpRangeStream", "DEFAULT_TIMEOUT_S", "DEFAULT_RETRIES", "MAX_REDIRECTS",
    "http_get", "DEFAULT_DEADLINE_S", "MAX_MANIFEST_BYTES", "MAX_WHOLE_READ_BYTES", "INDEX_SLACK_BYTES",
    "index_size_cap", "DECODED_CODINGS", "decode_content", "POOL_CONNECTIONS", "DRAIN_MAX_BYTES", "DRAIN_S"]

log = logging.getLogger(__name__)

#: Shards whose size ``open_dataset`` checks with HEAD requests when it opens a URL (the rest are
#: checked as they are read).
HEAD_CHECK_MAX_SHARDS = 32
#: Default bound of other whole-file reads (an image of a folder in a bucket).
MAX_WHOLE_READ_BYTES = 256 << 20
#: Bytes an offset index may hold beyond 8 a sample (see :func:`index_size_cap`).
INDEX_SLACK_BYTES = 64 << 10
#: Content codings decoded in whole-file reads (``Content-Encoding``).
DECODED_CODINGS = ("gzip", "x-gzip", "deflate")
_HEAD_REFUSED = (403, 405, 501)  # a HEAD refused (GET-only pre-signed URLs, servers without HEAD)


def index_size_cap(num_samples: int, shard_bytes: int | None = None) -> int:
    """The largest ``.sfidx`` accepted for a shard of ``num_samples`` samples: 8 bytes a sample
    plus :data:`INDEX_SLACK_BYTES`. The manifest's count is itself untrusted, so with
    ``shard_bytes`` it is bounded by the samples such a shard can hold (each starts with a
    512-byte tar header), and never above :data:`MAX_WHOLE_READ_BYTES`."""
    n = max(int(num_samples), 0)
    if shard_bytes is not None:
        n = min(n, max(int(shard_bytes), 0) // 512)
    return min(8 * n + INDEX_SLACK_BYTES, MAX_WHOLE_READ_BYTES)



#: the open :class:`HttpRangeStream` objects: at exit, reads still blocked on them are cut
_LIVE_STREAMS: weakref.WeakSet = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _abort_live_streams() -> None:
    with _LIVE_LOCK:
        streams = list(_LIVE_STREAMS)
    for stream in streams:
        stream.abort()


def _forget_live_streams() -> None:
    """In a forked child: the parent's streams are not this process's to cut, and the lock may
    have been held by one of its threads at the fork."""
    global _LIVE_STREAMS, _LIVE_LOCK
    _LIVE_STREAMS, _LIVE_LOCK = weakref.WeakSet(), threading.Lock()



before_join(_abort_live_streams)

after_fork_in_child(_forget_live_streams)


def decode_content(url: str, data: bytes, codings: list[str], max_bytes: int, what: str = "the file") -> bytes:
    """``data`` with its content codings (``Content-Encoding``, in the order applied) undone:
    gzip, deflate (zlib or raw). At most ``max_bytes`` of output (a small compressed body may
    expand a thousandfold).

    Raises:
        DataSourceError: another coding, a damaged or cut body, or more than ``max_bytes``
            decoded (names the URL).
    """
    for coding in reversed(codings):
        if coding not in DECODED_CODINGS:
            raise DataSourceError(
                f"{url}: the server sent the body with Content-Encoding: {coding}, which shardfeed does not decode "
                f"(it decodes {', '.join(DECODED_CODINGS)}); serve the file without that encoding")
        out = bytearray()
        rest = data
        while rest:
            if coding == "deflate" and not out and rest[:1] != b"\x78":
                d = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send it
            else:
                d = zlib.decompressobj(zlib.MAX_WBITS | (16 if coding != "deflate" else 0))
            try:
                out += d.decompress(rest, max_bytes + 1 - len(out))
            except zlib.error as exc:
                raise DataSourceError(f"{url}: the {coding}-encoded body cannot be decoded ({exc}); the server "
                                      "sent damaged data") from None
            if len(out) > max_bytes:
                raise DataSourceError(f"{url}: {what} decodes to more than {max_bytes:,} bytes "
                                      f"(Content-Encoding: {coding}); refused")
            if not d.eof:
                raise DataSourceError(f"{url}: the {coding}-encoded body is cut short")
            rest = d.unused_data if coding != "deflate" else b""
        data = bytes(out)
    return data


def http_get(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES,
             max_bytes: int = MAX_WHOLE_READ_BYTES, deadline_s: float = DEFAULT_DEADLINE_S,
             what: str = "the file") -> bytes:
    """GET a whole (small) file: the manifest, an offset index.

    The body is read exactly: with ``Content-Length``, chunked or closed by the server; a
    ``gzip``/``deflate`` ``Content-Encoding`` is decoded.

    Args:
        max_bytes: the largest body accepted (after decoding); larger is refused at once when
            ``Content-Length`` says so, else as soon as that many bytes arrived.
        deadline_s: seconds the whole request (each attempt) may take.
        what: the file's role, for messages (``"the manifest"``).

    Raises:
        FileNotFoundError: HTTP 404.
        StorageAccessError: HTTP 401/403, an untrusted certificate, a server that cannot be reached.
        DataSourceError: other errors, after the retries; a body over ``max_bytes``, past the
            deadline or in an unknown coding (names the URL).
    """
    def once():
        reply = send_request(url, "GET", {}, timeout_s, deadline_s, keep_deadline=True)
        resp = reply.resp
        got = 0
        try:
            length = reply.length  # Content-Length (None: chunked, absent or unreadable)
            if length is not None and length > max_bytes:
                raise Permanent(DataSourceError(f"{url}: {what} is {length:,} bytes (Content-Length), more than the "
                                                 f"{max_bytes:,} accepted; refused (is this the right URL?)"))

            def read(n: int) -> bytes:
                nonlocal got
                try:
                    chunk = read_body(resp, n)
                except (OSError, http.client.HTTPException):
                    if reply.late:
                        raise reply.deadline_error(got) from None
                    raise
                got += len(chunk)
                return chunk

            body = read_at_most(read, max_bytes, chunk_bytes=1 << 16)
            if body is None:
                raise Permanent(DataSourceError(f"{url}: {what} sends more than {max_bytes:,} bytes; refused "
                                                 "(is this the right URL?)"))
            if reply.late:
                raise reply.deadline_error(got)
            if length is not None and got != length:
                raise http.client.IncompleteRead(b"", length - got)
            try:
                return decode_content(url, body, content_coding(resp), max_bytes, what)
            except DataSourceError as exc:
                raise Permanent(exc) from None
        finally:
            reply.close()

    return with_retries(url, "GET", once, retries)


def _http_head_size(url: str, timeout_s: float, retries: int, deadline_s: float = DEFAULT_DEADLINE_S) -> int | None:
    """The size of ``url`` in bytes: ``HEAD``, or, when the server refuses ``HEAD`` (403, 405,
    501: a GET-only pre-signed URL) or answers it with a content coding (its length is then the
    encoded body's), a ``GET`` of byte 0 (``Range: bytes=0-0``) whose ``Content-Range`` (or
    ``Content-Length`` of an unencoded 200) gives it. None: the server does not say."""
    def head():
        reply = send_request(url, "HEAD", {}, timeout_s, deadline_s)
        try:
            if content_coding(reply.resp):  # the encoded body's length, not the file's size
                log.debug("HEAD %s answered with a content coding; asking a GET of byte 0 for the size", url)
                return ranged()
            return _size_of(reply.resp)
        finally:
            reply.close()

    def ranged():
        reply = send_request(url, "GET", {"Range": "bytes=0-0"}, timeout_s, deadline_s)
        try:  # the body is not read: closing the connection drops it
            return _size_of(reply.resp)
        finally:
            reply.close()

    def once():
        try:
            return head()
        except Permanent as exc:
            if exc.status not in _HEAD_REFUSED:
                raise
            log.debug("HEAD %s refused (HTTP %d); asking a GET of byte 0 for the size", url, exc.status)
            return ranged()

    return with_retries(url, "HEAD", once, retries)


def _size_of(resp) -> int | None:
    if resp.status == 206:
        total = (header(resp, "Content-Range") or "").rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    length = header(resp, "Content-Length")
    if not content_coding(resp):
        return int(length) if length is not None and length.strip().isdigit() else None
    return None  # an encoded body's length: not the file's size


class HttpRangeStream(ResumableRangeStream):
    """A read-only stream of ``url`` from byte ``start`` (to ``end``), resuming after failures
    (the rules of :class:`~shardfeed.readers.storage.ranged_stream.ResumableRangeStream`).

    Attributes:
        offset: file offset of the next byte :meth:`read` returns (the stream starts at
            ``start`` when the server answers ``Range``, else at 0).
        ranged: whether the server answered the ``Range`` request.
        total_bytes: the file's size as the server reports it (None if it does not say).

    Raises:
        FileNotFoundError: HTTP 404. StorageAccessError: HTTP 401/403, an untrusted certificate.
        DataSourceError: the GET or a read still fails after the retries (names the URL).
    """

    _transient = (OSError, http.client.HTTPException)
    _read_answer = staticmethod(read_body_within)  # (answer, want, deadline_s)
    _log = log

    def __init__(self, url: str, start: int = 0, end: int | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, deadline_s: float = DEFAULT_DEADLINE_S):
        self.url = url
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self._init_stream(end, retries)
        self._read_arg = deadline_s
        self._sock = None
        self._pid = os.getpid()
        self._open(start)

    def _open(self, start: int) -> None:
        self.close()
        self._closed = False
        want_range = start > 0 or self.end is not None

        def once():
            headers = {}
            if want_range:
                headers["Range"] = f"bytes={start}-" + ("" if self.end is None else str(self.end - 1))
            reply = send_request(self.url, "GET", headers, self.timeout_s, self.deadline_s)
            codings = content_coding(reply.resp)
            if codings and not want_range:  # some servers encode whole files and send ranges as they are
                reply.close()
                log.debug("GET %s answered with Content-Encoding: %s; asking for the bytes as a range", self.url,
                          ", ".join(codings))
                reply = send_request(self.url, "GET", {"Range": f"bytes={start}-"}, self.timeout_s, self.deadline_s)
                codings = content_coding(reply.resp)
            if codings:  # the bytes of an encoded body are not the file's: never hand them out
                reply.close()
                raise Permanent(DataSourceError(
                    f"{self._where}: the server sent {'a byte range' if reply.resp.status == 206 else 'the file'} with "
                    f"Content-Encoding: {', '.join(codings)} although shardfeed asked for identity: those are not "
                    "the file's bytes; serve shards without a content coding (nginx: no gzip for .tar; S3: upload "
                    "without Content-Encoding)"))
            return reply

        reply = with_retries(self.url, "GET", once, self.retries)
        resp = reply.resp
        length = reply.length  # Content-Length (None: chunked, absent or unreadable)
        if resp.status == 206:
            cr = header(resp, "Content-Range", "")
            try:
                span, _, total = cr.partition(" ")[2].partition("/")
                first_text, _, last_text = span.partition("-")
                first, last = int(first_text), int(last_text)
                self.total_bytes = int(total) if total and total != "*" else self.total_bytes
            except ValueError:
                reply.close()
                raise DataSourceError(f"{self._where}: unreadable Content-Range {cr!r} in a 206 answer") from None
            if first != start or last < first or (self.end is not None and last >= self.end):
                reply.close()
                asked = f"{start}-{'' if self.end is None else self.end - 1}"
                raise DataSourceError(f"{self._where}: asked for bytes {asked}, the server sent {span}")
            self.ranged = True
            self.offset = start
            self._expect_end = last + 1  # the span, whether the body has a length, is chunked or closed
        else:
            self.ranged = False
            self.offset = 0
            if length is not None:
                self.total_bytes = length
            self._expect_end = length
        self._resp, self._sock = resp, reply.sock
        with _LIVE_LOCK:
            _LIVE_STREAMS.add(self)

    @property
    def _where(self) -> str:
        """The URL for messages: no ``user:password@``."""
        return redact(self.url)

    def _skip_some(self, n: int) -> bytes:
        return read_body(self._resp, n)

    def _cut(self, missing: int) -> BaseException:
        return http.client.IncompleteRead(b"", missing)

    def _partial(self, exc: BaseException) -> bytes:
        return getattr(exc, "partial", b"") if isinstance(exc, http.client.IncompleteRead) else b""

    def _read_error(self, attempts: int, exc: BaseException) -> DataSourceError:
        return DataSourceError(f"{self._where}: reading at byte {self.offset} failed after {attempts} attempts "
                               f"({type(exc).__name__}: {exc}); the server closed or stalled the connection")

    def _drop(self) -> None:
        try:
            finish_answer(self._resp)
        finally:
            self._resp = None

    def _cut_now(self) -> None:
        """Shut the socket down, only in the process that opened the stream (a forked child
        shares the parent's connection)."""
        if self._pid != os.getpid():
            return
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True  # a read failing because of this close is not retried
        with _LIVE_LOCK:
            _LIVE_STREAMS.discard(self)
        super().close()



class HttpLocation(LocationBase):
    """A dataset served over HTTP(S): ``http://host/data/`` or ``http://host/data/manifest.json``.

    A :class:`~shardfeed.readers.storage.location.Location` that is ``remote``, read-only and cannot list
    (HTTP has no listing): open it by its manifest. Picklable (holds only the URL and the options).

    A ``user:password@`` in the URL is sent as HTTP Basic authentication (to that host only, not
    to another one a redirect names) and never appears in a message or a log record.

    Args:
        url: the directory URL or the manifest URL.
        timeout_s: per-operation socket timeout, seconds.
        retries: retries after the first attempt.
        deadline_s: seconds one request may take in all (the whole manifest or index; a shard
            stream's answer up to its first byte, and each read of its body); default
            :data:`DEFAULT_DEADLINE_S`.
    """

    remote = True
    listable = False
    writable = False

    def __init__(self, url: str, *, timeout_s: float | None = None, retries: int | None = None,
                 deadline_s: float | None = None):
        self.timeout_s = float(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        self.retries = int(DEFAULT_RETRIES if retries is None else retries)
        self.deadline_s = float(DEFAULT_DEADLINE_S if deadline_s is None else deadline_s)
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError(f"timeout_s must be > 0 and retries >= 0, got {timeout_s}, {retries}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
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
        return redact(self.base)

    def url(self, name: str) -> str:
        """The URL of the dataset file ``name``."""
        return self.base + urllib.parse.quote(name)

    def where(self, name: str) -> str:
        """Name of the file for messages (its URL, without a ``user:password@``)."""
        return redact(self.url(name))

    def read_bytes(self, name: str, *, max_bytes: int = MAX_WHOLE_READ_BYTES, what: str = "the file") -> bytes:
        """GET a whole dataset file (manifest, index) of at most ``max_bytes`` bytes (see :func:`http_get`)."""
        return http_get(self.url(name), timeout_s=self.timeout_s, retries=self.retries, max_bytes=max_bytes,
                        deadline_s=self.deadline_s, what=what)

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        """Open ``name`` for reading bytes ``[start, end)``.

        Returns:
            ``(stream, stream_offset)``: the offset of the stream's first byte (``start``, or 0
            when the server ignored ``Range``).
        """
        check_byte_range(self.where(name), start, end)
        s = HttpRangeStream(self.url(name), start, end, timeout_s=self.timeout_s, retries=self.retries,
                            deadline_s=self.deadline_s)
        return s, s.offset

    def head_size(self, name: str) -> int:
        """The size of ``name`` in bytes (HEAD, or a one-byte ranged GET where HEAD is refused).

        Raises:
            FileNotFoundError: no such file. DataSourceError: the server does not tell the size,
                or cannot be reached.
        """
        size = _http_head_size(self.url(name), self.timeout_s, self.retries, self.deadline_s)
        if size is None:
            raise DataSourceError(f"{self.where(name)}: the server does not tell the file's size")
        return int(size)

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """Fetch and validate the manifest; with ``check_files``, check shard sizes (HEAD; see
        :meth:`check_files`).

        Raises:
            ManifestError: no manifest at the URL, a bad one, or files missing / of the wrong size.
            DataSourceError: the server cannot be reached (names the URL).
        """
        murl = self.url(self.manifest_name)
        try:
            raw = http_get(murl, timeout_s=self.timeout_s, retries=self.retries, max_bytes=MAX_MANIFEST_BYTES,
                           deadline_s=self.deadline_s, what="the manifest")
        except FileNotFoundError:
            raise ManifestError(f"{redact(murl)}: not found; {self} is not a packed dataset, or its pack did not "
                                "finish (the manifest is written last): pack it with `shardfeed pack`") from None
        manifest = parse_manifest(raw, redact(murl))
        if check_files and describe(manifest.format).exact_sizes:
            self.check_files(manifest)
        return manifest

    def check_files(self, manifest: Manifest, *, threads: int = 16, max_shards: int = HEAD_CHECK_MAX_SHARDS) -> None:
        """HEAD the shards (and their indexes) and compare their sizes with the manifest.

        See :func:`check_remote_files` (at most ``max_shards`` shards, evenly spread).

        Raises:
            ManifestError: a file is missing or has another size (names the URL).
        """
        check_remote_files(manifest, lambda name: _http_head_size(self.url(name), self.timeout_s, self.retries,
                                                                  self.deadline_s),
                           self.where, "on the server", threads=threads, max_shards=max_shards)


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
            raise ManifestError(f"{url(entry.name)}: listed in {MANIFEST_NAME} but missing {place}; restore it (to "
                                "read the other shards meanwhile, open the dataset with check_files=False and "
                                "on_error=\"skip\")") from None
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
