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
  (:mod:`shardfeed.readers.redact`); a 401/403/407 is a
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

import base64
import functools
import heapq
import http.client
import itertools
import logging
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable

import urllib3
import urllib3.exceptions
from urllib3.connection import HTTPConnection as _Urllib3HTTPConnection
from urllib3.connection import HTTPSConnection as _Urllib3HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .background import before_join, start_thread
from .errors import DataSourceError, ManifestError, StorageAccessError
from .format import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from .location import LocationBase, check_byte_range
from .redact import guard_client_logs, redact, register_secret
from .registry import describe

__all__ = [
    "check_remote_files", "HttpLocation", "HttpRangeStream", "DEFAULT_TIMEOUT_S", "DEFAULT_RETRIES", "MAX_REDIRECTS",
    "http_get", "DEFAULT_DEADLINE_S", "MAX_MANIFEST_BYTES", "MAX_WHOLE_READ_BYTES", "INDEX_SLACK_BYTES",
    "index_size_cap", "DECODED_CODINGS", "decode_content", "POOL_CONNECTIONS"]

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
#: Idle connections kept open to each host, per process (as many as threads reading at once: the
#: 16 HEAD checks of :meth:`HttpLocation.check_files`; more are opened when needed, and closed
#: after use).
POOL_CONNECTIONS = 16
#: Unread bytes of an answer read and dropped when its stream closes, to keep the connection
#: (a shard read to its last sample leaves the tar end-of-archive blocks, 1 to 10 KiB).
DRAIN_MAX_BYTES = 64 << 10
#: Seconds that drain may take before the connection is closed instead.
DRAIN_S = 1.0


#: Default bound of other whole-file reads (an image of a folder in a bucket).
MAX_WHOLE_READ_BYTES = 256 << 20
#: Bytes an offset index may hold beyond 8 a sample (see :func:`index_size_cap`).
INDEX_SLACK_BYTES = 64 << 10
#: Seconds one request may take in all (connect, redirects, headers and, for a whole-file read,
#: the body), whatever its per-read timeouts: a server sending a byte every few seconds ends in
#: an error instead of a hang.
DEFAULT_DEADLINE_S = 120.0
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


class _Permanent(Exception):
    """An answer that retrying will not change (4xx); ``status`` is the HTTP status (0: none)."""

    def __init__(self, exc: BaseException, status: int = 0):
        super().__init__(exc)
        self.status = status


class _Watchdog:
    """One thread per process that shuts down the socket of a request past its deadline (a
    blocked ``recv`` then returns), so a request's total time is bounded, not only each read."""

    def __init__(self):
        self._seq = itertools.count()
        self._reset()

    def _reset(self) -> None:
        """A fresh lock and no thread (at start, and in a forked child: the parent's lock may have
        been held by its watchdog thread at the fork, and that thread does not exist there)."""
        self._cv = threading.Condition()
        self._heap: list = []
        self._pid = None
        self._active = 0
        self._thread: threading.Thread | None = None
        self._stopping = False

    def arm(self, when: float, sock) -> list:
        """Shut ``sock`` down at monotonic time ``when`` unless disarmed; returns the entry
        (``entry[3]`` is True once it fired)."""
        entry = [when, next(self._seq), sock, False, True]
        with self._cv:
            if self._pid != os.getpid():  # first use, or a forked child (threads do not survive fork)
                self._pid, self._heap, self._active = os.getpid(), [], 0
                self._thread = None
            if self._thread is None or not self._thread.is_alive():  # first use, or stopped at exit
                self._stopping = False
                self._thread = start_thread(self._run, name="shardfeed-http-deadline", stop=self.stop)
            heapq.heappush(self._heap, entry)
            self._active += 1
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    def disarm(self, entry: list | None) -> None:
        if entry is None or not entry[4]:
            return
        with self._cv:
            entry[4] = False
            entry[2] = None
            self._active -= 1
            if self._stopping and not self._active:  # the stopping thread waited for this one
                self._cv.notify()
            if len(self._heap) > 1024 and len(self._heap) > 4 * self._active:  # drop disarmed entries
                self._heap = [e for e in self._heap if e[4]]
                heapq.heapify(self._heap)

    def stop(self) -> None:
        """End the thread (at exit) once no request is armed (one armed while it is stopping
        still gets its deadline); a later :meth:`arm` starts a new one."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def shut_down_all(self) -> None:
        """Shut down the socket of every request in flight now (at exit: a thread blocked
        receiving one returns at once); they count as past their deadline."""
        with self._cv:
            for entry in self._heap:
                if entry[4]:
                    self._fire(entry)
            self._cv.notify()  # a stopping thread ends once none is armed

    def _fire(self, entry: list) -> None:
        """Shut ``entry``'s socket down (the caller holds the lock)."""
        entry[3], entry[4] = True, False
        self._active -= 1
        try:
            entry[2].shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        entry[2] = None

    def _run(self) -> None:
        with self._cv:
            while not (self._stopping and not self._active):
                while self._heap and not self._heap[0][4]:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(min(delay, 3600.0))
                    continue
                self._fire(heapq.heappop(self._heap))
            if self._thread is threading.current_thread():  # ended: the next arm starts another
                self._thread = None


_WATCHDOG = _Watchdog()
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


before_join(_WATCHDOG.shut_down_all)
before_join(_abort_live_streams)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._reset)
    os.register_at_fork(after_in_child=_forget_live_streams)


class _Reply:
    """The final answer of a request: the ``urllib3`` response, its deadline guard, and its
    ``Content-Length`` (None: chunked, absent or unreadable)."""

    def __init__(self, resp, guard, url: str, started: float, deadline_s: float):
        self.resp, self.guard, self.url = resp, guard, url
        self.started, self.deadline_s = started, deadline_s
        self.length = None if resp is None else resp.length_remaining
        self.sock = None  # the socket the answer arrives on (None: not known)

    @property
    def late(self) -> bool:
        return bool(self.guard is not None and self.guard[3])

    def deadline_error(self, got: int | None = None) -> _Permanent:
        what = "" if got is None else f" ({got:,} bytes received)"
        return _Permanent(DataSourceError(
            f"{self.url}: no complete answer within {self.deadline_s:g} s{what}; the server is too slow or sends "
            "the body a trickle at a time: check the server (or raise deadline_s)"))

    def disarm(self) -> None:
        _WATCHDOG.disarm(self.guard)
        self.guard = None

    def close(self) -> None:
        self.disarm()
        _finish(self.resp)


def _finish(resp) -> None:
    """Done with ``resp``: a body read to its end has already given its connection back to the
    pool (``urllib3`` does it at the last byte). A rest of at most :data:`DRAIN_MAX_BYTES` (a
    shard's end-of-archive padding, a redirect's note) is read and dropped, within
    :data:`DRAIN_S`, so that its connection can serve the next request; otherwise the connection
    is closed (what is left of the body must never reach the next request)."""
    if resp is None:
        return
    try:
        left = resp.length_remaining
        if not resp.closed and left is not None and 0 <= left <= DRAIN_MAX_BYTES and resp.connection is not None:
            guard = _WATCHDOG.arm(time.monotonic() + DRAIN_S, resp.connection.sock)
            try:  # (a HEAD's or a read-out body's end is seen by reading it: a read of 0 bytes does not)
                _read(resp, left or 1)  # the connection goes back to the pool at the last byte
            except (OSError, http.client.HTTPException):
                pass
            finally:
                _WATCHDOG.disarm(guard)
        if not resp.closed:
            resp.close()
    finally:
        resp.release_conn()


def _plain(exc: BaseException) -> BaseException:
    """The standard library's exception under a ``urllib3`` one (``ProtocolError`` wraps the
    ``ConnectionResetError``, ``NewConnectionError`` the ``ConnectionRefusedError``, ``SSLError``
    the ``ssl.SSLCertVerificationError``, a read timeout the ``TimeoutError``), so that retries,
    messages and error classes are the same whatever the transport; an ``IncompleteRead`` keeps
    the bytes received before the cut only when they are ``bytes`` (``http.client``'s)."""
    for _ in range(4):
        if not isinstance(exc, urllib3.exceptions.HTTPError):
            break
        inner = next((a for a in exc.args if isinstance(a, BaseException)), None) or exc.__cause__
        if isinstance(exc, http.client.IncompleteRead) or inner is None:
            break
        exc = inner
    if isinstance(exc, http.client.IncompleteRead):
        partial = exc.partial if isinstance(exc.partial, (bytes, bytearray)) else b""
        return http.client.IncompleteRead(bytes(partial), exc.expected)
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return exc
    return OSError(f"{type(exc).__name__}: {exc}")


def _read(resp, n: int | None) -> bytes:
    """Up to ``n`` raw bytes of ``resp``'s body (no content decoding), urllib3's errors as the
    standard library's (:func:`_plain`)."""
    try:
        return resp.read(n, decode_content=False)
    except urllib3.exceptions.HTTPError as exc:
        raise _plain(exc) from None


def _read_within(resp, n: int | None, deadline_s: float) -> bytes:
    """:func:`_read`, ended by a ``TimeoutError`` once it has taken ``deadline_s`` seconds.

    The socket timeout bounds each wait for bytes, not a read: a server sending a byte every few
    seconds would hold ``read(n)`` for ever. Read piece by piece (``read1``) and give up when the
    pieces take longer than the request deadline (the caller retries from the same byte). Without
    ``read1`` (urllib3 1.x) or for a read to the end, :func:`_read`.
    """
    read1 = getattr(resp, "read1", None)
    if read1 is None or n is None:
        return _read(resp, n)
    started = time.monotonic()
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            piece = read1(n - got, decode_content=False)
        except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as exc:
            if parts:  # the bytes before the failure; the next read meets it (and retries) again
                break
            raise _plain(exc) if isinstance(exc, urllib3.exceptions.HTTPError) else exc from None
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
        if got < n and time.monotonic() - started > deadline_s:
            raise TimeoutError(f"{got:,} of {n:,} bytes in {deadline_s:g} s: the server sends the body a trickle at "
                               "a time")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _header(resp, name: str, default: str | None = None) -> str | None:
    return resp.headers.get(name, default)


def _basic(user: str | None, password: str | None) -> str:
    """``Basic <token>`` for percent-encoded URL credentials (RFC 7617), registered as secrets."""
    user, password = urllib.parse.unquote(user or ""), urllib.parse.unquote(password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    register_secret(password, token)
    return f"Basic {token}"


_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
               "ALL_PROXY")


@functools.lru_cache(maxsize=8)
def _proxies(env: tuple) -> dict:
    """The standard library's reading of the proxy variables (``env``: their values, the cache key)."""
    return urllib.request.getproxies_environment()


def _proxy_for(u: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The proxy for ``u`` from ``HTTP_PROXY`` / ``HTTPS_PROXY`` (``http_proxy`` ...), unless
    ``NO_PROXY`` names its host (the rules of curl and the standard library)."""
    if not (os.environ.get(f"{u.scheme}_proxy") or os.environ.get(f"{u.scheme.upper()}_PROXY")):
        return None  # the common case, checked cheaply on every request
    proxies = _proxies(tuple(os.environ.get(k) for k in _PROXY_VARS))
    proxy = proxies.get(u.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(u.hostname or "", proxies):
        return None
    p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if p.scheme != "http" or not p.hostname:
        raise _Permanent(StorageAccessError(redact(
            f"{u.scheme.upper()}_PROXY={proxy}: only http:// proxies are supported (an https:// URL goes through "
            "them with CONNECT); set it to http://HOST:PORT")))
    return p


_ARMING = threading.local()  # .when: deadline of the request this thread sends; .guard: its watchdog entry; .sock


#: sockets of this process waiting in ``connect`` (at exit they are shut down: the wait ends at once)
_CONNECTING: set = set()
_CONNECTING_LOCK = threading.Lock()
_CONNECTS_REFUSED = threading.Event()  # set at exit: a new connection fails at once


def _shut_down_connecting() -> None:
    """At exit: end every ``connect`` in progress (its thread gets an error now, not at the
    connect timeout) and refuse new ones (a retry would wait again)."""
    _CONNECTS_REFUSED.set()
    with _CONNECTING_LOCK:
        socks = list(_CONNECTING)
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _forget_connecting() -> None:
    """In a forked child: the parent's connects are not its own, and its lock may have been held."""
    global _CONNECTING, _CONNECTING_LOCK, _CONNECTS_REFUSED
    _CONNECTING, _CONNECTING_LOCK, _CONNECTS_REFUSED = set(), threading.Lock(), threading.Event()


before_join(_shut_down_connecting)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_connecting)


def _create_connection(address: tuple[str, int], timeout, source_address, socket_options) -> socket.socket:
    """``urllib3.util.connection.create_connection`` with each socket known while it connects
    (:data:`_CONNECTING`), so that the exit can end the wait; the same address families, options
    and errors (the last address's ``OSError``)."""
    from urllib3.util.connection import allowed_gai_family

    host, port = address
    if host.startswith("["):
        host = host.strip("[]")
    try:
        host.encode("idna")
    except UnicodeError:
        raise urllib3.exceptions.LocationParseError(f"'{host}', label empty or too long") from None
    err: OSError | None = None
    for af, socktype, proto, _, sa in socket.getaddrinfo(host, port, allowed_gai_family(), socket.SOCK_STREAM):
        if _CONNECTS_REFUSED.is_set():
            raise ConnectionAbortedError("the process is exiting: no new connection")
        sock = socket.socket(af, socktype, proto)
        with _CONNECTING_LOCK:
            _CONNECTING.add(sock)
        try:
            for opt in socket_options or ():
                sock.setsockopt(*opt)
            if timeout is None or isinstance(timeout, (int, float)):  # else urllib3's "default": left as is
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sa)
            return sock
        except OSError as exc:
            err = exc
            sock.close()
        finally:
            with _CONNECTING_LOCK:
                _CONNECTING.discard(sock)
    raise err if err is not None else OSError(f"getaddrinfo for {host} returned no address")


class _DeadlineConnection:
    """Arms the watchdog on the socket when the request is sent, before the answer's headers are
    read (a server trickling its headers is cut at the deadline, as one trickling its body); its
    socket is known while it connects, so that the exit ends that wait too."""

    def _new_conn(self) -> socket.socket:
        """urllib3's ``HTTPConnection._new_conn`` (the same errors), connecting through
        :func:`_create_connection`."""
        exc_mod = urllib3.exceptions
        try:
            sock = _create_connection((getattr(self, "_dns_host", self.host), self.port), self.timeout,
                                      self.source_address, self.socket_options)
        except socket.gaierror as exc:
            raise exc_mod.NameResolutionError(self.host, self, exc) from exc
        except TimeoutError as exc:
            raise exc_mod.ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})") from exc
        except OSError as exc:
            raise exc_mod.NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock

    def getresponse(self, *args, **kwargs):
        _ARMING.sock = self.sock  # the answer's socket (http.client drops it from a connection that closes after)
        when = getattr(_ARMING, "when", None)
        if when is not None and self.sock is not None:
            _ARMING.guard = _WATCHDOG.arm(when, self.sock)
        return super().getresponse(*args, **kwargs)


class _HTTPConnection(_DeadlineConnection, _Urllib3HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnection, _Urllib3HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_MANAGERS: dict = {}
_MANAGERS_LOCK = threading.Lock()


def _forget_pools() -> None:
    """In a forked child: the parent's connections are its own (their sockets are shared with
    it), and its lock may have been held at the fork; start empty."""
    global _MANAGERS, _MANAGERS_LOCK, _DIRECT
    _MANAGERS, _MANAGERS_LOCK, _DIRECT = {}, threading.Lock(), {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _manager(proxy: urllib.parse.SplitResult) -> urllib3.ProxyManager:
    """This process's pool of connections through ``proxy``: one ``urllib3.ProxyManager`` per
    proxy and TLS trust setting (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` are read when it is
    made), made again in a process of another pid."""
    key = (os.getpid(), proxy.geturl(), os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _MANAGERS_LOCK:
        manager = _MANAGERS.get(key)
        if manager is None:
            guard_client_logs()  # urllib3's debug records name each request's path: redacted as made
            if len(_MANAGERS) >= 8:  # settings changed many times (tests): drop the old pools
                for old in _MANAGERS.values():
                    old.clear()
                _MANAGERS.clear()
            headers = {}
            if proxy.username is not None:
                headers["Proxy-Authorization"] = _basic(proxy.username, proxy.password)
            host = proxy.hostname if ":" not in proxy.hostname else f"[{proxy.hostname}]"
            manager = urllib3.ProxyManager(f"http://{host}:{proxy.port or 80}", proxy_headers=headers, num_pools=32,
                                           maxsize=POOL_CONNECTIONS, block=False, retries=_NO_RETRIES,
                                           ssl_context=ssl.create_default_context())
            manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
            _MANAGERS[key] = manager
        return manager


_NO_RETRIES = urllib3.util.Retry.from_int(False, redirect=False)  # retries and redirects are shardfeed's
_DIRECT: dict = {}  # (pid, scheme, host, port, SSL_CERT_FILE, SSL_CERT_DIR) -> pool, without a proxy


def _direct_pool(u: urllib.parse.SplitResult) -> HTTPConnectionPool:
    """This process's connection pool to ``u``'s host (no proxy): one a host and TLS trust
    setting (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` are read when it is made). Looked up without
    ``PoolManager``'s URL parsing: a request to a pooled connection costs little more CPU than
    ``http.client``'s."""
    key = (os.getpid(), u.scheme, u.hostname, u.port, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    pool = _DIRECT.get(key)
    if pool is None:
        with _MANAGERS_LOCK:
            pool = _DIRECT.get(key)
            if pool is None:
                guard_client_logs()  # urllib3's debug records name each request's path: redacted as made
                if len(_DIRECT) >= 64:  # many hosts or changed settings: drop the old pools
                    for old in _DIRECT.values():
                        old.close()
                    _DIRECT.clear()
                kw = dict(maxsize=POOL_CONNECTIONS, block=False, retries=_NO_RETRIES)
                if u.scheme == "https":
                    pool = _HTTPSPool(u.hostname, u.port, ssl_context=ssl.create_default_context(), **kw)
                else:
                    pool = _HTTPPool(u.hostname, u.port, **kw)
                _DIRECT[key] = pool
    return pool


def _target(url: str) -> tuple[urllib.parse.SplitResult, dict, urllib.parse.SplitResult | None]:
    """``(url split, without user:password; authorization headers; proxy)``."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{redact(url)}: not an http(s) URL")
    auth = {"Authorization": _basic(u.username, u.password)} if u.username is not None else {}
    proxy = _proxy_for(u)
    if u.username is not None or u.password is not None:
        host = u.hostname if ":" not in u.hostname else f"[{u.hostname}]"
        u = u._replace(netloc=host if u.port is None else f"{host}:{u.port}")
    return u, auth, proxy


def _request(url: str, method: str, headers: dict, timeout_s: float, deadline_s: float = DEFAULT_DEADLINE_S,
             *, keep_deadline: bool = False) -> _Reply:
    """Send one request, following redirects; returns the final hop's :class:`_Reply`.

    The whole exchange up to the response headers must end within ``deadline_s`` seconds; with
    ``keep_deadline`` the guard stays armed for the body (the caller disarms it).

    Raises:
        _Permanent: a 4xx answer, a redirect that cannot be followed, the deadline passed.
        DataSourceError: a 5xx answer (retried by the caller).
    """
    hops: list[str] = []
    started = time.monotonic()
    origin = urllib.parse.urlsplit(url).netloc
    while True:
        reply = _request_once(url, method, headers, timeout_s, started, deadline_s, same_origin=not hops or
                              urllib.parse.urlsplit(url).netloc == origin)
        resp = reply.resp
        if resp.status not in _REDIRECTS and not 300 <= resp.status < 400:
            if not keep_deadline:
                reply.disarm()
            return reply
        location = _header(resp, "Location")
        status = f"HTTP {resp.status} {resp.reason}"
        reply.close()
        via = f" (redirected from {hops[0]})" if hops else ""
        if resp.status not in _REDIRECTS:
            raise _Permanent(DataSourceError(f"{url}: {status}{via}: not a redirect that can be followed; "
                                             "point shardfeed at the dataset's final URL"), resp.status)
        if not location:
            raise _Permanent(DataSourceError(f"{url}: {status} without a Location header{via}; point shardfeed "
                                             "at the dataset's final URL"), resp.status)
        hops.append(url)
        if len(hops) > MAX_REDIRECTS:
            raise _Permanent(DataSourceError(f"{hops[0]}: more than {MAX_REDIRECTS} redirects ({status} from "
                                             f"{url} to {location}); a redirect loop? point shardfeed at the "
                                             "dataset's final URL"), resp.status)
        new = urllib.parse.urljoin(url, location)
        log.debug("%s %s: %s to %s", method, url, status, new)
        url = new
        if resp.status == 303 and method not in ("GET", "HEAD"):
            method = "GET"


def _request_once(url: str, method: str, headers: dict, timeout_s: float, started: float, deadline_s: float,
                  *, same_origin: bool = True) -> _Reply:
    u, auth, proxy = _target(url)
    # the first host's credentials are not sent to another one a redirect names (the proxy's are
    # the manager's own)
    auth = auth if same_origin else {}
    if proxy is None:
        opener, target = _direct_pool(u).urlopen, (u.path or "/") + (f"?{u.query}" if u.query else "")
    else:  # the proxy manager sends the absolute URL (http) or opens a CONNECT tunnel (https)
        opener, target = _manager(proxy).urlopen, urllib.parse.urlunsplit((*u[:3], u.query, ""))
    left = started + deadline_s - time.monotonic()
    if left <= 0:
        raise _Reply(None, None, url, started, deadline_s).deadline_error()
    _ARMING.when, _ARMING.guard, _ARMING.sock = started + deadline_s, None, None
    try:
        resp = opener(method, target, headers={**_HEADERS, **auth, **headers}, redirect=False, retries=_NO_RETRIES,
                      preload_content=False, decode_content=False, assert_same_host=False,
                      timeout=urllib3.Timeout(connect=min(timeout_s, left), read=timeout_s))
    except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as exc:
        guard = _ARMING.guard
        _WATCHDOG.disarm(guard)
        if guard is not None and guard[3]:
            raise _Reply(None, None, url, started, deadline_s).deadline_error() from None
        raise _plain(exc) from None
    except BaseException:
        _WATCHDOG.disarm(_ARMING.guard)
        raise
    finally:
        guard, sock, _ARMING.when, _ARMING.guard, _ARMING.sock = _ARMING.guard, _ARMING.sock, None, None, None
    reply = _Reply(resp, guard, url, started, deadline_s)
    reply.sock = sock
    if resp.status >= 400:
        body = b""
        try:
            body = _read(resp, 200)
        except Exception:
            pass
        reply.close()
        msg = f"HTTP {resp.status} {resp.reason}"
        if resp.status == 404:
            raise _Permanent(FileNotFoundError(f"{url}: {msg} (file not found on the server)"), 404)
        if resp.status in (401, 403, 407):
            raise _Permanent(StorageAccessError(redact(
                f"{url}: {msg}: the server refuses access; renew or fix the credentials it expects (a pre-signed "
                "URL expires: sign it again; a token or cookie: renew it; a proxy: HTTP(S)_PROXY credentials), "
                "or check that the dataset is published at this URL")), resp.status)
        if resp.status < 500 and resp.status != 408 and resp.status != 429:
            raise _Permanent(DataSourceError(redact(f"{url}: {msg} {body[:80]!r}")), resp.status)
        raise DataSourceError(f"{url}: {msg}")
    return reply


def _with_retries(url: str, what: str, fn, retries: int):
    last = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            return fn()
        except _Permanent as exc:
            inner = exc.args[0]
            raise type(inner)(redact(str(inner))) from None
        except ssl.SSLCertVerificationError as exc:  # retrying will not make the certificate trusted
            raise StorageAccessError(
                f"{redact(url)}: the server's TLS certificate is not trusted ({exc.verify_message}); point "
                "SSL_CERT_FILE (or SSL_CERT_DIR) at the CA that signed it, or fix the server's certificate") from None
        except (OSError, http.client.HTTPException) as exc:
            last = exc
            log.debug("%s %s failed (attempt %d of %d): %r", what, url, attempt + 1, retries + 1, exc)
    reason = f"{type(last).__name__}: {last}" if str(last) else type(last).__name__
    if isinstance(last, DataSourceError):
        reason = str(last).split(": ", 1)[-1]
    # a server that cannot be reached at all is set-up, not damaged data: never skipped
    cls = StorageAccessError if isinstance(last, (ConnectionRefusedError, socket.gaierror)) else DataSourceError
    raise cls(redact(f"{url}: {what} failed after {retries + 1} attempts ({reason}); check the URL "
                     "and that the server is up")) from None


def _content_coding(resp) -> list[str]:
    """The content codings of ``resp`` in the order they were applied (``identity`` dropped)."""
    value = _header(resp, "Content-Encoding") or ""
    return [c.strip().lower() for c in value.split(",") if c.strip() and c.strip().lower() != "identity"]


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
        reply = _request(url, "GET", {}, timeout_s, deadline_s, keep_deadline=True)
        resp = reply.resp
        got = 0
        try:
            length = reply.length  # Content-Length (None: chunked, absent or unreadable)
            if length is not None and length > max_bytes:
                raise _Permanent(DataSourceError(f"{url}: {what} is {length:,} bytes (Content-Length), more than the "
                                                 f"{max_bytes:,} accepted; refused (is this the right URL?)"))
            parts = []
            while True:
                try:
                    chunk = _read(resp, 1 << 16)
                except (OSError, http.client.HTTPException):
                    if reply.late:
                        raise reply.deadline_error(got) from None
                    raise
                if not chunk:
                    break
                got += len(chunk)
                if got > max_bytes:
                    raise _Permanent(DataSourceError(f"{url}: {what} sends more than {max_bytes:,} bytes; refused "
                                                     "(is this the right URL?)"))
                parts.append(chunk)
            if reply.late:
                raise reply.deadline_error(got)
            if length is not None and got != length:
                raise http.client.IncompleteRead(b"", length - got)
            try:
                return decode_content(url, b"".join(parts), _content_coding(resp), max_bytes, what)
            except DataSourceError as exc:
                raise _Permanent(exc) from None
        finally:
            reply.close()

    return _with_retries(url, "GET", once, retries)


def _http_head_size(url: str, timeout_s: float, retries: int, deadline_s: float = DEFAULT_DEADLINE_S) -> int | None:
    """The size of ``url`` in bytes: ``HEAD``, or, when the server refuses ``HEAD`` (403, 405,
    501: a GET-only pre-signed URL) or answers it with a content coding (its length is then the
    encoded body's), a ``GET`` of byte 0 (``Range: bytes=0-0``) whose ``Content-Range`` (or
    ``Content-Length`` of an unencoded 200) gives it. None: the server does not say."""
    def head():
        reply = _request(url, "HEAD", {}, timeout_s, deadline_s)
        try:
            if _content_coding(reply.resp):  # the encoded body's length, not the file's size
                log.debug("HEAD %s answered with a content coding; asking a GET of byte 0 for the size", url)
                return ranged()
            return _size_of(reply.resp)
        finally:
            reply.close()

    def ranged():
        reply = _request(url, "GET", {"Range": "bytes=0-0"}, timeout_s, deadline_s)
        try:  # the body is not read: closing the connection drops it
            return _size_of(reply.resp)
        finally:
            reply.close()

    def once():
        try:
            return head()
        except _Permanent as exc:
            if exc.status not in _HEAD_REFUSED:
                raise
            log.debug("HEAD %s refused (HTTP %d); asking a GET of byte 0 for the size", url, exc.status)
            return ranged()

    return _with_retries(url, "HEAD", once, retries)


def _size_of(resp) -> int | None:
    if resp.status == 206:
        total = (_header(resp, "Content-Range") or "").rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    length = _header(resp, "Content-Length")
    if not _content_coding(resp):
        return int(length) if length is not None and length.strip().isdigit() else None
    return None  # an encoded body's length: not the file's size


class HttpRangeStream:
    """A read-only stream of ``url`` from byte ``start`` (to ``end``), resuming after failures.

    Attributes:
        offset: file offset of the next byte :meth:`read` returns (the stream starts at
            ``start`` when the server answers ``Range``, else at 0).
        ranged: whether the server answered the ``Range`` request.
        total_bytes: the file's size as the server reports it (None if it does not say).
    """

    def __init__(self, url: str, start: int = 0, end: int | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, deadline_s: float = DEFAULT_DEADLINE_S):
        self.url = url
        self.end = end
        self.timeout_s = timeout_s
        self.retries = retries
        self.deadline_s = deadline_s
        self._resp = None
        self._sock = None
        self._closed = False
        self._aborted = False  # set by abort(): never reopened, whatever a read in flight does
        self._reopen = False
        self.ranged = False
        self.total_bytes: int | None = None
        self._expect_end: int | None = None
        self.offset = 0
        self._pid = os.getpid()
        self._open(start)

    def _open(self, start: int) -> None:
        self.close()
        if self._aborted:  # a read that was waiting to retry when the stream was aborted
            raise DataSourceError(f"{self._where}: stream aborted while reading at byte {self.offset}")
        self._closed = False
        want_range = start > 0 or self.end is not None

        def once():
            headers = {}
            if want_range:
                headers["Range"] = f"bytes={start}-" + ("" if self.end is None else str(self.end - 1))
            reply = _request(self.url, "GET", headers, self.timeout_s, self.deadline_s)
            codings = _content_coding(reply.resp)
            if codings and not want_range:  # some servers encode whole files and send ranges as they are
                reply.close()
                log.debug("GET %s answered with Content-Encoding: %s; asking for the bytes as a range", self.url,
                          ", ".join(codings))
                reply = _request(self.url, "GET", {"Range": f"bytes={start}-"}, self.timeout_s, self.deadline_s)
                codings = _content_coding(reply.resp)
            if codings:  # the bytes of an encoded body are not the file's: never hand them out
                reply.close()
                raise _Permanent(DataSourceError(
                    f"{self._where}: the server sent {'a byte range' if reply.resp.status == 206 else 'the file'} with "
                    f"Content-Encoding: {', '.join(codings)} although shardfeed asked for identity: those are not "
                    "the file's bytes; serve shards without a content coding (nginx: no gzip for .tar; S3: upload "
                    "without Content-Encoding)"))
            return reply

        reply = _with_retries(self.url, "GET", once, self.retries)
        resp = reply.resp
        length = reply.length  # Content-Length (None: chunked, absent or unreadable)
        if resp.status == 206:
            cr = _header(resp, "Content-Range", "")
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
        if self._reopen:
            self._reopen = False
            if self._expect_end is not None and self.offset >= self._expect_end:
                return b""
            self._resume(self.offset)
        while True:
            try:
                if self._resp is None:
                    return b""
                want = n if n is not None and n >= 0 else None
                if self._expect_end is not None:
                    due = self._expect_end - self.offset
                    if due <= 0:  # the span is complete: what follows (a chunked body's end) is not needed
                        return b""
                    want = due if want is None else min(want, due)
                data = _read_within(self._resp, want, self.deadline_s)
                if not data and self._expect_end is not None and self.offset < self._expect_end:
                    raise http.client.IncompleteRead(b"", self._expect_end - self.offset)
                if self._expect_end is not None and self.offset + len(data) > self._expect_end:
                    due = self._expect_end - self.offset
                    raise DataSourceError(f"{self._where}: the server sent more than the {due} bytes it announced "
                                          f"at byte {self.offset}; its answer cannot be trusted")
                self.offset += len(data)
                return data
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, DataSourceError):
                    raise
                partial = getattr(exc, "partial", b"") if isinstance(exc, http.client.IncompleteRead) else b""
                if partial and not self._closed and (self._expect_end is None
                                                     or self.offset + len(partial) <= self._expect_end):
                    self.offset += len(partial)  # the bytes that came before the cut (a chunked body)
                    _finish(self._resp)
                    self._resp = None
                    self._reopen = True  # the next read resumes at the byte after them
                    return bytes(partial)
                if self._closed:
                    raise DataSourceError(f"{self._where}: stream closed while reading at byte {self.offset}") from None
                attempts += 1
                if attempts > self.retries:
                    raise DataSourceError(f"{self._where}: reading at byte {self.offset} failed after "
                                          f"{attempts} attempts ({type(exc).__name__}: {exc}); the server "
                                          "closed or stalled the connection") from None
                log.debug("read of %s at byte %d failed (%r); retrying", self.url, self.offset, exc)
                time.sleep(BACKOFF_S * 2 ** (attempts - 1))
                self._resume(self.offset)

    def _resume(self, resume_at: int) -> None:
        """Reopen at byte ``resume_at`` (skipping up to it when the server ignores ``Range``)."""
        self._open(resume_at)
        if self.offset < resume_at:  # server ignores Range: skip what we already have
            left = resume_at - self.offset
            while left:
                chunk = _read(self._resp, min(left, 1 << 20))
                if not chunk:
                    raise DataSourceError(f"{self._where}: body ended at byte {self.offset} while "
                                          f"resuming at {resume_at}") from None
                left -= len(chunk)
                self.offset += len(chunk)

    def abort(self) -> None:
        """Make a read of this stream blocked in another thread return now, with a
        :class:`DataSourceError` (its socket is shut down; no retry, and no later read reopens
        it); at exit. Only in the process that opened it (a forked child shares the parent's
        connection)."""
        self._closed = True
        self._aborted = True
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
        if self._resp is not None:
            try:
                _finish(self._resp)
            finally:
                self._resp = None

    def __enter__(self) -> "HttpRangeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HttpLocation(LocationBase):
    """A dataset served over HTTP(S): ``http://host/data/`` or ``http://host/data/manifest.json``.

    A :class:`~shardfeed.readers.location.Location` that is ``remote``, read-only and cannot list
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
        manifest = Manifest.from_json(raw, redact(murl))
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
