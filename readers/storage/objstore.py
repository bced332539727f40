"""Datasets in an object store (``s3://bucket/prefix/``): ranged reads, listing and uploads, under
the HTTP fault policy of :mod:`shardfeed.readers.storage.http_io`.

Client: ``boto3`` (the optional extra ``pip install 'shardfeed[s3]'``), imported only here and
only when an ``s3://`` URL is opened. Chosen by measurement against one S3-API server on loopback
(``scripts/measure_s3_clients.py``; see the README's "Object stores"): 8 MiB ranged GETs as fast
as obstore's and s3fs's (the server bounds them), the AWS SDK's own credential chain, and precise
error codes. ``gs://`` and ``az://`` URLs are refused with a message naming what to use (GCS and
many other stores speak the S3 API: ``s3://`` with ``AWS_ENDPOINT_URL``).

Credentials and endpoints are boto3's default chain, as AWS users expect: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and ``~/.aws/config``, SSO,
container and instance roles; ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for an
S3-compatible store; ``AWS_REGION`` / ``AWS_DEFAULT_REGION``. ``storage_options`` (API) and
``--storage-option KEY=VALUE`` (CLI) override them: ``endpoint_url``, ``region_name``, ``profile``,
``anon`` (unsigned requests, for public buckets), ``key``/``secret``/``token`` (or their
``aws_access_key_id``/``aws_secret_access_key``/``aws_session_token`` spellings),
``addressing_style`` (``path``/``virtual``). Secrets never appear in messages, logs or reprs:
every message built here is passed through :func:`scrub`.

Fault policy (the same as HTTP): every connect and socket read has a timeout (``timeout_s``);
connection errors, ``5xx`` answers (``503 SlowDown`` included), throttling codes and stalled or
cut reads are retried ``retries`` times with doubling back-off, a stream resuming at the byte where
it failed; ``403``, ``404``, a missing bucket, rejected or expired credentials and a wrong region
are immediate errors naming the URL and the fix.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import BinaryIO, Iterator

from ..errors import DataSourceError, ManifestError, StorageAccessError, UnsupportedURLError
from ..file_io import read_at_most
from ..format.manifest import MANIFEST_NAME, PACK_STATE_DIR, Manifest
from .local_manifest import unfinished_pack_error
from .location import LocationBase, check_byte_range
from .ranged_stream import ResumableRangeStream, backoff_s
from .http_io import (DEFAULT_DEADLINE_S, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, HEAD_CHECK_MAX_SHARDS,
                      MAX_MANIFEST_BYTES, MAX_WHOLE_READ_BYTES, check_remote_files, decode_content)
from .redact import guard_client_logs, register_secret
from ..format.registry import describe
from .manifest_cache import parse_manifest
from .store_urls import (STORAGE_OPTION_KEYS, STORE_SCHEMES, is_s3_url, is_store_url, listed_entry,
                         looks_like_option_key, option_hint, parse_storage_options, scrub, sorted_listing,
                         split_store_url, unreadable_option_message,
                         use_cli_spelling)

__all__ = ["STORE_SCHEMES", "option_hint", "use_cli_spelling",
           "StoreLocation", "StoreRangeStream", "is_store_url", "is_s3_url", "split_store_url", "scrub",
           "parse_storage_options", "looks_like_option_key", "unreadable_option_message", "MULTIPART_THRESHOLD_BYTES",
           "MAX_LIST_KEYS", "MAX_LIST_PAGES"]

log = logging.getLogger(__name__)

#: Keys one listing returns at most (ImageNet-21k's 14 million images fit; about 150 bytes of
#: memory a key).
MAX_LIST_KEYS = 20_000_000
#: Listing requests (pages of up to 1000 keys) one listing makes at most.
MAX_LIST_PAGES = 100_000
#: Uploads at least this large go up in parts of this size (S3 multipart upload).
MULTIPART_THRESHOLD_BYTES = 64 << 20
_INSTALL = "pip install 'shardfeed[s3]'"
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                "RequestTimeout", "InternalError", "ServiceUnavailable", "503", "500", "502",
                "504"}
_EXPIRED_CODES = {"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "RequestExpired"}
_BAD_CRED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "InvalidClientTokenId",
                   "UnrecognizedClientException"}
_CLOCK_CODES = {"RequestTimeTooSkewed", "RequestInTheFuture"}
#: botocore errors of the set-up (credentials, region, endpoint, profile, signing): retrying
#: cannot fix them. Matched by class name, so names a botocore version lacks do no harm.
_CONFIG_ERRORS = {"PartialCredentialsError", "NoCredentialsError", "NoRegionError", "InvalidRegionError",
                  "ProfileNotFound", "ConfigNotFound", "ConfigParseError", "InvalidConfigError",
                  "UnknownCredentialError",
                  "CredentialRetrievalError", "NoAuthTokenError", "SSOError", "SSOTokenLoadError",
                  "UnauthorizedSSOTokenError", "TokenRetrievalError", "UnknownSignatureVersionError",
                  "UnsupportedSignatureVersionError", "InvalidS3AddressingStyleError",
                  "InvalidEndpointDiscoveryConfigurationError",
                  "InvalidEndpointConfigurationError", "EndpointVariantError", "UnknownEndpointError",
                  "EndpointResolutionError", "InvalidHostLabelError", "UnsupportedS3ArnError",
                  "ParamValidationError", "InvalidExpressionError", "UnknownClientMethodError"}
_REGION_CODES = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}


def _import_boto3():
    try:
        import boto3
        import botocore
    except ImportError:
        raise UnsupportedURLError(f"reading or writing s3:// URLs needs boto3: {_INSTALL}") from None
    guard_client_logs()  # botocore's DEBUG records carry the access key id and the session token
    return boto3, botocore


class _Permanent(Exception):
    """An answer that retrying will not change."""


class _Unreachable(DataSourceError):
    """The endpoint cannot be reached (retried; the final error is a StorageAccessError)."""


class StoreLocation(LocationBase):
    """A dataset (or an image folder) under an object-store prefix: ``s3://bucket/prefix/`` or
    ``s3://bucket/prefix/manifest.json``.

    A :class:`~shardfeed.readers.storage.location.Location` that is ``remote``, ``listable`` and
    ``writable``. Only the options given (``storage_options``) and boto3's default chain configure
    the client: nothing is taken from other locations or from earlier calls.

    Picklable: holds the URL and the options; each process (each ``DataLoader`` worker) makes its
    own client on first use.

    Args:
        url: the prefix URL or the manifest's URL.
        storage_options: client options (see the module docstring); None: boto3's default chain.
        timeout_s: connect and per-read timeout, seconds (default ``http_io.DEFAULT_TIMEOUT_S``).
        retries: retries after the first attempt (default ``http_io.DEFAULT_RETRIES``).
        deadline_s: seconds one whole-object read (manifest, index) may take in all (default
            ``http_io.DEFAULT_DEADLINE_S``).

    Raises:
        UnsupportedURLError: a ``gs://``/``az://`` URL, or boto3 is not installed (names what to
            install or use).
        ValueError: bad ``timeout_s``/``retries`` or an unknown storage option.
    """

    remote = True
    listable = True
    writable = True

    def __init__(self, url: str, *, storage_options: dict | None = None, timeout_s: float | None = None,
                 retries: int | None = None, deadline_s: float | None = None):
        scheme, bucket, key = split_store_url(str(url))
        if scheme != "s3":
            raise UnsupportedURLError(
                f"{url}: {scheme}:// is not supported; shardfeed reads object stores through the S3 API: use "
                f"s3://{bucket}/{key} with AWS_ENDPOINT_URL (or {option_hint(('endpoint_url', ...))}) set to the "
                "store's S3-compatible endpoint (GCS: https://storage.googleapis.com with HMAC keys), or stage "
                "the data to a local disk first")
        self.timeout_s = float(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        self.retries = int(DEFAULT_RETRIES if retries is None else retries)
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError(f"timeout_s must be > 0 and retries >= 0, got {timeout_s}, {retries}")
        self.deadline_s = float(DEFAULT_DEADLINE_S if deadline_s is None else deadline_s)
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.storage_options = {STORAGE_OPTION_KEYS[k]: v for k, v in parse_storage_options(storage_options).items()}
        register_secret(*(self.storage_options.get(k) for k in ("secret", "token")))  # the key id is no secret
        _import_boto3()
        self.bucket = bucket
        if key.endswith(".json"):
            self.prefix, _, self.manifest_name = key.rpartition("/")
        else:
            self.prefix, self.manifest_name = key.rstrip("/"), MANIFEST_NAME
        if self.prefix:
            self.prefix += "/"
        self.base = f"s3://{bucket}/{self.prefix}"
        self._client = None
        self._client_pid = None
        self._lock = threading.Lock()
        self.listing_cache: list | None = None  # a listing made to decide what the prefix holds

    # ---- identity and pickling
    def __str__(self) -> str:
        return self.base

    def __repr__(self) -> str:
        return f"StoreLocation({self.base!r})"

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_client"] = state["_client_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def url(self, name: str) -> str:
        """The URL of the dataset file ``name``."""
        return self.base + name

    def where(self, name: str) -> str:
        """Name of the file for messages (its URL)."""
        return self.url(name)

    def key(self, name: str) -> str:
        """The object key of the dataset file ``name``."""
        return self.prefix + name

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to (for messages)."""
        return str(self.storage_options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                   or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3")

    # ---- client
    def client(self):
        """This process's boto3 S3 client (made on first use; thread-safe)."""
        pid = os.getpid()
        if self._client is not None and self._client_pid == pid:
            return self._client
        with self._lock:
            if self._client is None or self._client_pid != pid:
                boto3, botocore = _import_boto3()
                from botocore.config import Config

                o = self.storage_options
                cfg = dict(connect_timeout=self.timeout_s, read_timeout=self.timeout_s,
                           retries={"total_max_attempts": 1},  # retried here, resuming mid-stream
                           max_pool_connections=int(o.get("max_pool_connections", 32)))
                if o.get("anon"):
                    cfg["signature_version"] = botocore.UNSIGNED
                if o.get("addressing_style"):
                    cfg["s3"] = {"addressing_style": o["addressing_style"]}
                try:
                    session = boto3.session.Session(profile_name=o.get("profile"))
                    self._client = session.client(
                        "s3", config=Config(**cfg), endpoint_url=o.get("endpoint_url"),
                        region_name=o.get("region_name"), aws_access_key_id=o.get("key"),
                        aws_secret_access_key=o.get("secret"), aws_session_token=o.get("token"))
                except botocore.exceptions.BotoCoreError as exc:  # a profile, credentials, a region ...
                    raise self._config_error(exc, self.base) from None
                except ValueError as exc:  # botocore's check of the endpoint URL and the region name
                    raise self._config_error(exc, self.base) from None
                self._register_resolved_credentials(session)
                self._client_pid = pid
        return self._client

    def _register_resolved_credentials(self, session) -> None:
        """Add the credentials the client will sign with (from a profile, SSO, a role ...) to the
        values every message and log record is scrubbed of."""
        o = self.storage_options
        register_secret(o.get("secret"), o.get("token"))
        if o.get("anon"):
            return
        try:
            creds = session.get_credentials()
            frozen = creds.get_frozen_credentials() if creds is not None else None
        except Exception:  # resolving failed: the request will say why; nothing to register
            return
        if frozen is not None:
            register_secret(frozen.secret_key, frozen.token)

    def _scrub(self, text: str) -> str:
        return scrub(text, {k: v for k, v in self.storage_options.items()})

    # ---- the fault policy
    def _config_error(self, exc: BaseException, url: str) -> StorageAccessError:
        """The error for a set-up fault (credentials, region, endpoint, profile): what to set."""
        name = type(exc).__name__
        detail = " ".join(str(exc).split())  # botocore's messages may span lines
        if name == "PartialCredentialsError":
            missing = getattr(exc, "kwargs", {}).get("cred_var") or "a part"
            return StorageAccessError(
                f"{url}: incomplete AWS credentials ({missing} missing, {detail}); set both AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials), or "
                f"{option_hint(('key', ...), ('secret', ...))}, or AWS_PROFILE")
        if name == "NoCredentialsError":
            return StorageAccessError(
                f"{url}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE "
                f"(or run on an instance with a role), or pass {option_hint(('anon', True))} for a public bucket")
        if name == "ProfileNotFound":
            profile = self.storage_options.get("profile") or os.environ.get("AWS_PROFILE")
            return StorageAccessError(f"{url}: AWS profile {profile!r} not found in ~/.aws/config; check AWS_PROFILE "
                                      f"/ {option_hint(('profile', ...))}")
        if name in ("NoRegionError", "InvalidRegionError") or "region" in detail.lower():
            return StorageAccessError(f"{url}: no usable region ({detail}); set AWS_REGION (or AWS_DEFAULT_REGION, "
                                      f"or {option_hint(('region_name', ...))}) to the bucket's region")
        if name == "ParamValidationError":
            return StorageAccessError(f"{url}: invalid request ({detail})")
        if "endpoint" in detail.lower() or "url" in detail.lower() or "Endpoint" in name:
            return StorageAccessError(f"{url}: unusable endpoint {self.endpoint!r} ({detail}); set AWS_ENDPOINT_URL "
                                      f"/ {option_hint(('endpoint_url', ...))} to the store's URL "
                                      "(http(s)://HOST[:PORT])")
        return StorageAccessError(f"{url}: the S3 client cannot be set up ({name}: {detail}); check the AWS "
                                  "configuration (AWS_PROFILE, ~/.aws/config, AWS_REGION, AWS_ENDPOINT_URL)")

    def _classify(self, exc: BaseException, url: str) -> BaseException:
        """The error to raise for ``exc``: wrapped in :class:`_Permanent` when retrying will not help."""
        _, botocore = _import_boto3()
        bexc = botocore.exceptions
        if isinstance(exc, StorageAccessError):  # made by client(): the set-up is wrong
            return _Permanent(exc)
        if isinstance(exc, bexc.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            what = f"HTTP {status} {code}".strip()
            if code in _EXPIRED_CODES:
                return _Permanent(StorageAccessError(
                    f"{url}: the credentials have expired ({what}); renew them (a new AWS_SESSION_TOKEN, "
                    "`aws sso login`, or the instance role) and run again"))
            if code in _CLOCK_CODES:
                return _Permanent(StorageAccessError(
                    f"{url}: the store refuses the request's time ({what}): this machine's clock is more than 15 "
                    "minutes off; set the clock (NTP: `timedatectl set-ntp true`) and run again"))
            if code in _BAD_CRED_CODES:
                return _Permanent(StorageAccessError(
                    f"{url}: the store rejects the credentials ({what}); check or renew AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or AWS_PROFILE, and that they are for this "
                    f"endpoint ({self.endpoint})"))
            if code in _RETRY_CODES or status >= 500 or status in (408, 429):
                if code == "SlowDown" or status in (429, 503):
                    return DataSourceError(f"{what}: the store is throttling requests; lower the request rate "
                                           "(fewer loader workers or pack workers) or retry later")
                return DataSourceError(what)
            if code == "NoSuchBucket":
                return _Permanent(StorageAccessError(
                    f"{url}: bucket {self.bucket!r} does not exist at {self.endpoint} ({what}); check the bucket "
                    f"name, and AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))} for an S3-compatible "
                    "store"))
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return _Permanent(FileNotFoundError(f"{url}: not found in the bucket ({what})"))
            if code in _REGION_CODES or status == 301:
                region = err.get("Region") or exc.response.get("ResponseMetadata", {}).get(
                    "HTTPHeaders", {}).get("x-amz-bucket-region")
                hint = f"set AWS_REGION={region}" if region else "set AWS_REGION to the bucket's region"
                return _Permanent(StorageAccessError(f"{url}: the bucket is in another region ({what}); {hint} "
                                                     f"(or {option_hint(('region_name', region or ...))})"))
            if status in (401, 403) or code in ("AccessDenied", "AllAccessDisabled", "403", "401", "Forbidden"):
                fix = "the bucket is not public, or anon=true is wrong for it" if self.storage_options.get("anon") \
                    else ("check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "
                          "AWS_PROFILE or the instance role; renew expired ones) and the bucket policy; for a public "
                          f"bucket pass {option_hint(('anon', True))}")
                return _Permanent(StorageAccessError(f"{url}: access denied ({what}); {fix}"))
            return _Permanent(DataSourceError(f"{url}: {what} {err.get('Message', '')}".rstrip()))
        if any(t.__name__ in _CONFIG_ERRORS for t in type(exc).__mro__):
            return _Permanent(self._config_error(exc, url))
        if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectTimeoutError)):
            return _Unreachable(f"cannot reach the store at {self.endpoint} ({type(exc).__name__}); check "
                                f"AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))} and that the server is up")
        if isinstance(exc, bexc.ReadTimeoutError):
            return DataSourceError(f"the store at {self.endpoint} did not answer within {self.timeout_s:g} s "
                                   "(stalled); check that the server is up")
        return DataSourceError(f"{type(exc).__name__}: {exc}")

    def _retry_errors(self) -> tuple:
        _, botocore = _import_boto3()
        return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError)

    def _call(self, url: str, what: str, fn):
        """``fn()`` under the fault policy: bounded retries with back-off, permanent errors at once."""
        errors = self._retry_errors()
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(backoff_s(attempt))
            try:
                return fn()
            except _Permanent as exc:  # fn's own verdict (a body too large, past the deadline)
                inner = exc.args[0]
                raise type(inner)(self._scrub(str(inner))) from None
            except errors as exc:
                err = self._classify(exc, url)
                if isinstance(err, _Permanent):
                    inner = err.args[0]
                    raise type(inner)(self._scrub(str(inner))) from None
                last = err
                log.debug("%s %s failed (attempt %d of %d): %s", what, url, attempt + 1, self.retries + 1,
                          self._scrub(str(err)))
        cls = StorageAccessError if isinstance(last, _Unreachable) else DataSourceError  # never skipped
        raise cls(self._scrub(f"{url}: {what} failed after {self.retries + 1} attempts ({last})")) from None

    # ---- reading
    def read_bytes(self, name: str, *, max_bytes: int = MAX_WHOLE_READ_BYTES, what: str = "the file") -> bytes:
        """GET a whole (small) dataset file: the manifest, an offset index, an image.

        At most ``max_bytes`` bytes (after undoing a ``gzip``/``deflate`` ``Content-Encoding``),
        refused at once when the object's size says so; each attempt ends within
        :attr:`deadline_s` seconds (plus one socket timeout) however slowly the body arrives.

        Raises:
            FileNotFoundError: no such object (404). DataSourceError: other failures, a body over
                ``max_bytes`` or past the deadline (names the URL).
        """
        key = self.key(name)
        url = self.url(name)

        def once():
            started = time.monotonic()
            resp = self.client().get_object(Bucket=self.bucket, Key=key)
            body = resp["Body"]
            try:
                length = resp.get("ContentLength")
                if length is not None and int(length) > max_bytes:
                    raise _Permanent(DataSourceError(f"{url}: {what} is {int(length):,} bytes, more than the "
                                                     f"{max_bytes:,} accepted; refused (is this the right object?)"))
                read = getattr(getattr(body, "_raw_stream", None), "read1", None) or body.read
                got = 0  # bytes received; read1 is one socket read, so the deadline below holds

                def timed_read(n: int) -> bytes:
                    nonlocal got
                    if time.monotonic() - started > self.deadline_s:
                        raise _Permanent(DataSourceError(
                            f"{url}: no complete answer within {self.deadline_s:g} s ({got:,} bytes received); the "
                            "store is too slow or sends the body a trickle at a time: check the server"))
                    chunk = read(n)
                    got += len(chunk)
                    return chunk

                data = read_at_most(timed_read, max_bytes, chunk_bytes=1 << 16)
                if data is None:
                    raise _Permanent(DataSourceError(f"{url}: {what} sends more than {max_bytes:,} bytes; "
                                                     "refused (is this the right object?)"))
                if length is not None and got != int(length):
                    raise DataSourceError(f"{url}: the body ended after {got:,} of {int(length):,} bytes")
                codings = [c.strip().lower() for c in str(resp.get("ContentEncoding") or "").split(",")
                           if c.strip() and c.strip().lower() not in ("identity", "aws-chunked")]
                try:
                    return decode_content(url, data, codings, max_bytes, what)
                except DataSourceError as exc:
                    raise _Permanent(exc) from None
            finally:
                body.close()

        return self._call(url, "GET", once)

    def head_size(self, name: str) -> int:
        """The size of ``name`` in bytes (HEAD).

        Raises:
            FileNotFoundError: no such object. DataSourceError: other failures.
        """
        key = self.key(name)
        return int(self._call(self.url(name), "HEAD",
                              lambda: self.client().head_object(Bucket=self.bucket, Key=key)["ContentLength"]))

    def head(self, name: str) -> dict[str, str]:
        """The user metadata of ``name`` (``x-amz-meta-*``: e.g. ``sha256`` set by uploads).

        Raises:
            FileNotFoundError: no such object. DataSourceError: other failures.
        """
        key = self.key(name)
        return dict(self._call(self.url(name), "HEAD",
                               lambda: self.client().head_object(Bucket=self.bucket, Key=key)).get("Metadata", {}))

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        """Open ``name`` for reading bytes ``[start, end)`` (one ranged GET, resumed on failure).

        Returns:
            ``(stream, start)``.
        """
        check_byte_range(self.where(name), start, end)
        s = StoreRangeStream(self, name, start, end)
        return s, start

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        """Every object under the prefix (and ``sub``): ``[(name relative to the prefix, size in
        bytes, mtime in ns)]`` in key order.

        One paginated listing (1000 keys a request), never one request per "directory", bounded
        by :data:`MAX_LIST_PAGES` requests and :data:`MAX_LIST_KEYS` keys.

        Raises:
            DataSourceError: the listing failed (a missing bucket, 403 ... named), or the server
                misbehaves: it repeats a continuation token, says "truncated" without one,
                passes a bound, lists a key twice or a key outside the prefix (names the endpoint).
        """
        out: list[tuple[str, int, int]] = []
        prefix = self.prefix + sub
        token: list[str | None] = [None]

        def page():
            kw = dict(Bucket=self.bucket, Prefix=prefix, MaxKeys=1000)
            if token[0]:
                kw["ContinuationToken"] = token[0]
            return self.client().list_objects_v2(**kw)

        n = len(self.prefix)
        seen: set[str] = set()
        where = f"{self.base}{sub}: the listing from {self.endpoint}"
        for pages in range(1, MAX_LIST_PAGES + 1):
            resp = self._call(self.base + sub, "LIST", page)
            out.extend(listed_entry(obj, prefix, n, where) for obj in resp.get("Contents", []))
            if len(out) > MAX_LIST_KEYS:
                raise DataSourceError(f"{where} passed {MAX_LIST_KEYS:,} keys after {pages:,} pages; list a narrower "
                                      "prefix (or pack the folder into shards, which lists only the shards)")
            if not resp.get("IsTruncated"):
                return sorted_listing(out, where, self.base)
            token[0] = resp.get("NextContinuationToken")
            if not token[0]:
                raise DataSourceError(f"{where} says it is truncated after {pages:,} pages ({len(out):,} keys) but "
                                      "gives no continuation token: the server does not speak ListObjectsV2 "
                                      f"correctly; check AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))}")
            if token[0] in seen:
                raise DataSourceError(f"{where} repeats a continuation token after {pages:,} pages ({len(out):,} "
                                      "keys): the server would list the same page forever; check the server (or "
                                      f"AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))})")
            seen.add(token[0])
        raise DataSourceError(f"{where} is still truncated after {MAX_LIST_PAGES:,} pages ({len(out):,} keys); list "
                              "a narrower prefix, or check the server")

    def list_sizes(self, sub: str = "") -> dict[str, int]:
        """``{name relative to the prefix: size in bytes}`` of every object under the prefix
        (one paginated listing; see :meth:`list_objects`)."""
        return {name: size for name, size, _ in self.list_objects(sub)}

    def exists(self) -> bool:
        """Whether anything is stored under the prefix."""
        key = self.prefix

        def once():
            return self.client().list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)

        return bool(self._call(self.base, "LIST", once).get("KeyCount", 0))

    def _has(self, name: str) -> bool:
        """Whether the object ``name`` exists (HEAD; False on any failure to tell)."""
        try:
            self.head(name)
            return True
        except (FileNotFoundError, DataSourceError):
            return False

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """Fetch and validate the manifest; with ``check_files``, compare shard sizes (HEAD).

        Raises:
            IncompleteDatasetError: no manifest, and the prefix holds an unfinished pack's state
                (``.shardfeed-pack/``): its pack did not finish (``--resume`` finishes it).
            ManifestError: no manifest under the prefix, a bad one, or files missing / of the wrong size.
            DataSourceError: the store cannot be read (names the URL and the fix).
        """
        murl = self.url(self.manifest_name)
        try:
            raw = self.read_bytes(self.manifest_name, max_bytes=MAX_MANIFEST_BYTES, what="the manifest")
        except FileNotFoundError:
            if self.manifest_name == MANIFEST_NAME and self._has(f"{PACK_STATE_DIR}/plan.json"):
                raise unfinished_pack_error(self.base) from None  # the rule of a local folder
            raise ManifestError(f"{murl}: not found; {self.base} is not a packed dataset, or its pack did not "
                                "finish (the manifest is written last): pack it with `shardfeed pack`") from None
        manifest = parse_manifest(raw, murl)
        if check_files and describe(manifest.format).exact_sizes:
            self.check_files(manifest)
        return manifest

    def check_files(self, manifest: Manifest, *, threads: int = 16, max_shards: int = HEAD_CHECK_MAX_SHARDS) -> None:
        """HEAD up to ``max_shards`` shards (evenly spread) and their indexes; compare sizes
        (:func:`~shardfeed.readers.storage.http_io.check_remote_files`).

        Raises:
            ManifestError: a file is missing or has another size (names the URL).
        """
        check_remote_files(manifest, self.head_size, self.url, "in the bucket", threads=threads,
                           max_shards=max_shards)

    # ---- writing
    def put_bytes(self, name: str, data: bytes) -> None:
        """Upload ``data`` as ``name`` (one PUT; retried under the fault policy).

        Raises:
            DataSourceError: the upload failed after the retries (names the URL).
        """
        key = self.key(name)
        self._call(self.url(name), "PUT", lambda: self.client().put_object(Bucket=self.bucket, Key=key, Body=data))

    def put_file(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        """Upload the local file ``path`` whole as ``name``: one PUT, or a multipart upload in
        :data:`MULTIPART_THRESHOLD_BYTES` parts for a large file (an object appears only complete).

        Args:
            name: the object's name under the prefix.
            path: the local file.
            sha256: its hex digest, stored as the object's ``sha256`` metadata (``--resume`` checks it).

        Raises:
            DataSourceError: the upload failed after the retries (names the URL).
        """
        size = os.path.getsize(path)
        key = self.key(name)
        extra = {"Metadata": {"sha256": sha256}} if sha256 else {}
        if size < MULTIPART_THRESHOLD_BYTES:
            def once():
                with open(path, "rb") as f:
                    self.client().put_object(Bucket=self.bucket, Key=key, Body=f, **extra)
            self._call(self.url(name), "PUT", once)
            return
        from boto3.s3.transfer import TransferConfig

        cfg = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD_BYTES,
                             multipart_chunksize=MULTIPART_THRESHOLD_BYTES, max_concurrency=4, use_threads=True)
        self._call(self.url(name), "multipart upload",
                   lambda: self.client().upload_file(str(path), self.bucket, key, ExtraArgs=extra or None, Config=cfg))

    def delete(self, name: str) -> None:
        """Delete ``name`` (no error when it does not exist)."""
        key = self.key(name)
        self._call(self.url(name), "DELETE", lambda: self.client().delete_object(Bucket=self.bucket, Key=key))

    def iter_read(self, name: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of ``name`` in chunks of up to ``chunk_bytes`` (one GET, resumed on failure)."""
        stream, _ = self.open(name)
        with stream:
            while True:
                chunk = stream.read(chunk_bytes)
                if not chunk:
                    return
                yield chunk


class StoreRangeStream(ResumableRangeStream):
    """A read-only stream of one object from byte ``start`` (to ``end``), resuming after failures
    (the rules of :class:`~shardfeed.readers.storage.ranged_stream.ResumableRangeStream`).

    The interface of :class:`~shardfeed.readers.storage.http_io.HttpRangeStream`: ``read``, ``close``,
    ``offset`` (the file offset of the next byte), ``total_bytes`` (the object's size), ``ranged``.

    Raises:
        FileNotFoundError: no such object. DataSourceError: the GET failed after the retries.
    """

    _fatal = (DataSourceError, FileNotFoundError)
    _log = log

    def __init__(self, location: StoreLocation, name: str, start: int = 0, end: int | None = None):
        self.location = location
        self.name = name
        self.url = location.url(name)
        self._init_stream(end, location.retries)
        self.ranged = True
        self.offset = start
        self._transient = location._retry_errors()
        self._open(start)

    @property
    def _where(self) -> str:
        return self.url

    def _open(self, start: int) -> None:
        if self._resp is not None:
            self._drop()
        self._closed = False
        self.offset = start
        self._expect_end = None
        if self.end is not None and start >= self.end:
            return
        loc, key = self.location, self.location.key(self.name)
        rng = None
        if start > 0 or self.end is not None:
            rng = f"bytes={start}-" + ("" if self.end is None else str(self.end - 1))

        def once():
            kw = dict(Bucket=loc.bucket, Key=key)
            if rng:
                kw["Range"] = rng
            return loc.client().get_object(**kw)

        try:
            resp = loc._call(self.url, "GET", once)
        except DataSourceError as exc:
            if "InvalidRange" in str(exc) and self.end is None:  # start at or past the end: nothing left
                return
            raise
        codings = [c.strip() for c in str(resp.get("ContentEncoding") or "").split(",")
                   if c.strip() and c.strip().lower() not in ("identity", "aws-chunked")]
        if codings:  # the stored bytes are encoded: a range of them is not the file's bytes
            resp["Body"].close()
            raise DataSourceError(f"{self.url}: the object is stored with Content-Encoding: {', '.join(codings)}, so "
                                  "its bytes are not the shard's; upload shards without Content-Encoding")
        cr = resp.get("ContentRange")
        if cr:
            span, _, total = cr.partition(" ")[2].partition("/")
            if total and total != "*":
                self.total_bytes = int(total)
            first, _, last = span.partition("-")
            if int(first) != start:
                resp["Body"].close()
                raise DataSourceError(f"{self.url}: asked for bytes from {start}, the store sent from {span}")
            if last.strip().isdigit():
                self._expect_end = int(last) + 1
        elif start == 0:
            self.total_bytes = int(resp.get("ContentLength", 0))
            self._expect_end = self.total_bytes
        self._resp = resp["Body"]

    @staticmethod
    def _read_answer(body, want: int | None, arg) -> bytes:
        return body.read(want)

    def _log_reason(self, exc: BaseException) -> str:
        return type(exc).__name__

    def _read_error(self, attempts: int, exc: BaseException) -> DataSourceError:
        return DataSourceError(self.location._scrub(
            f"{self.url}: reading at byte {self.offset} failed after {attempts} attempts "
            f"({type(exc).__name__}); the store closed or stalled the connection"))

    def _drop(self) -> None:
        try:
            self._resp.close()
        finally:
            self._resp = None
