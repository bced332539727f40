"""The HTTP(S) transport under :mod:`shardfeed.readers.storage.http_io`: one request (redirects followed,
errors mapped), its deadline, the process's connection pools and proxies, and retries of a whole
request.

Rules (see :mod:`shardfeed.readers.storage.http_io` for the reading rules built on them):

* Every socket operation has a timeout; a request past its deadline has its socket shut down by a
  watchdog thread (one a process), so a blocked ``recv`` returns.
* Connections are kept in a keep-alive pool per process and host (at most
  :data:`POOL_CONNECTIONS` idle ones). A process forked from one with a pool starts with an empty
  pool of its own.
* At exit every ``connect`` in progress ends at once, and no new connection is made.
* urllib3's errors surface as the standard library's (:func:`_plain`): retries, messages and error
  classes do not depend on the transport.
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

import urllib3
import urllib3.exceptions
from urllib3.connection import HTTPConnection as _Urllib3HTTPConnection
from urllib3.connection import HTTPSConnection as _Urllib3HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..background import before_join, start_thread
from ..errors import DataSourceError, StorageAccessError
from .ranged_stream import backoff_s
from .redact import guard_client_logs, redact, register_secret
from ..runtime import after_fork_in_child

__all__ = ["DEFAULT_TIMEOUT_S", "DEFAULT_RETRIES", "DEFAULT_DEADLINE_S", "MAX_REDIRECTS", "POOL_CONNECTIONS",
           "DRAIN_MAX_BYTES", "DRAIN_S"]

log = logging.getLogger("shardfeed.readers.storage.http_io")  # one logger for HTTP, as before the split

#: Seconds a connect or a single socket read may take before it counts as failed.
DEFAULT_TIMEOUT_S = 10.0
#: Retries after the first attempt (so 3 attempts in all).
DEFAULT_RETRIES = 2
#: Redirects followed in a row before a request fails (browsers and curl stop at 20 and 50; a
#: dataset behind a CDN or an object store's signed URLs takes one or two).
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
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
#: Seconds one request may take in all (connect, redirects, headers and, for a whole-file read,
#: the body), whatever its per-read timeouts: a server sending a byte every few seconds ends in
#: an error instead of a hang.
DEFAULT_DEADLINE_S = 120.0


class Permanent(Exception):
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


WATCHDOG = _Watchdog()

before_join(WATCHDOG.shut_down_all)

after_fork_in_child(WATCHDOG._reset)


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

    def deadline_error(self, got: int | None = None) -> Permanent:
        what = "" if got is None else f" ({got:,} bytes received)"
        return Permanent(DataSourceError(
            f"{self.url}: no complete answer within {self.deadline_s:g} s{what}; the server is too slow or sends "
            "the body a trickle at a time: check the server (or raise deadline_s)"))

    def disarm(self) -> None:
        WATCHDOG.disarm(self.guard)
        self.guard = None

    def close(self) -> None:
        self.disarm()
        finish_answer(self.resp)


def finish_answer(resp) -> None:
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
            guard = WATCHDOG.arm(time.monotonic() + DRAIN_S, resp.connection.sock)
            try:  # (a HEAD's or a read-out body's end is seen by reading it: a read of 0 bytes does not)
                read_body(resp, left or 1)  # the connection goes back to the pool at the last byte
            except (OSError, http.client.HTTPException):
                pass
            finally:
                WATCHDOG.disarm(guard)
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


def read_body(resp, n: int | None) -> bytes:
    """Up to ``n`` raw bytes of ``resp``'s body (no content decoding), urllib3's errors as the
    standard library's (:func:`_plain`)."""
    try:
        return resp.read(n, decode_content=False)
    except urllib3.exceptions.HTTPError as exc:
        raise _plain(exc) from None


def read_body_within(resp, n: int | None, deadline_s: float) -> bytes:
    """:func:`read_body`, ended by a ``TimeoutError`` once it has taken ``deadline_s`` seconds.

    The socket timeout bounds each wait for bytes, not a read: a server sending a byte every few
    seconds would hold ``read(n)`` for ever. Read piece by piece (``read1``) and give up when the
    pieces take longer than the request deadline (the caller retries from the same byte). Without
    ``read1`` (urllib3 1.x) or for a read to the end, :func:`read_body`.
    """
    read1 = getattr(resp, "read1", None)
    if read1 is None or n is None:
        return read_body(resp, n)
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


def header(resp, name: str, default: str | None = None) -> str | None:
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
        raise Permanent(StorageAccessError(redact(
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
after_fork_in_child(_forget_connecting)


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
            _ARMING.guard = WATCHDOG.arm(when, self.sock)
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


after_fork_in_child(_forget_pools)


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


def send_request(url: str, method: str, headers: dict, timeout_s: float, deadline_s: float = DEFAULT_DEADLINE_S,
             *, keep_deadline: bool = False) -> _Reply:
    """Send one request, following redirects; returns the final hop's :class:`_Reply`.

    The whole exchange up to the response headers must end within ``deadline_s`` seconds; with
    ``keep_deadline`` the guard stays armed for the body (the caller disarms it).

    Raises:
        Permanent: a 4xx answer, a redirect that cannot be followed, the deadline passed.
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
        location = header(resp, "Location")
        status = f"HTTP {resp.status} {resp.reason}"
        reply.close()
        via = f" (redirected from {hops[0]})" if hops else ""
        if resp.status not in _REDIRECTS:
            raise Permanent(DataSourceError(f"{url}: {status}{via}: not a redirect that can be followed; "
                                             "point shardfeed at the dataset's final URL"), resp.status)
        if not location:
            raise Permanent(DataSourceError(f"{url}: {status} without a Location header{via}; point shardfeed "
                                             "at the dataset's final URL"), resp.status)
        hops.append(url)
        if len(hops) > MAX_REDIRECTS:
            raise Permanent(DataSourceError(f"{hops[0]}: more than {MAX_REDIRECTS} redirects ({status} from "
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
        WATCHDOG.disarm(guard)
        if guard is not None and guard[3]:
            raise _Reply(None, None, url, started, deadline_s).deadline_error() from None
        raise _plain(exc) from None
    except BaseException:
        WATCHDOG.disarm(_ARMING.guard)
        raise
    finally:
        guard, sock, _ARMING.when, _ARMING.guard, _ARMING.sock = _ARMING.guard, _ARMING.sock, None, None, None
    reply = _Reply(resp, guard, url, started, deadline_s)
    reply.sock = sock
    if resp.status >= 400:
        body = b""
        try:
            body = read_body(resp, 200)
        except Exception:
            pass
        reply.close()
        msg = f"HTTP {resp.status} {resp.reason}"
        if resp.status == 404:
            raise Permanent(FileNotFoundError(f"{url}: {msg} (file not found on the server)"), 404)
        if resp.status in (401, 403, 407):
            raise Permanent(StorageAccessError(redact(
                f"{url}: {msg}: the server refuses access; renew or fix the credentials it expects (a pre-signed "
                "URL expires: sign it again; a token or cookie: renew it; a proxy: HTTP(S)_PROXY credentials), "
                "or check that the dataset is published at this URL")), resp.status)
        if resp.status < 500 and resp.status != 408 and resp.status != 429:
            raise Permanent(DataSourceError(redact(f"{url}: {msg} {body[:80]!r}")), resp.status)
        raise DataSourceError(f"{url}: {msg}")
    return reply


def with_retries(url: str, what: str, fn, retries: int):
    last = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s(attempt))
        try:
            return fn()
        except Permanent as exc:
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


def content_coding(resp) -> list[str]:
    """The content codings of ``resp`` in the order they were applied (``identity`` dropped)."""
    value = header(resp, "Content-Encoding") or ""
    return [c.strip().lower() for c in value.split(",") if c.strip() and c.strip().lower() != "identity"]
