"""Datasets in an object store (``s3://bucket/prefix/``): ranged reads, listing and uploads, under
the HTTP fault policy of :mod:`shardfeed.readers.http_io`.

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
import re
import threading
import time
from typing import Any, BinaryIO, Iterator

from .errors import DataSourceError, ManifestError, UnsupportedURLError
from .format import MANIFEST_NAME, Manifest
from .http_io import BACKOFF_S, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, HEAD_CHECK_MAX_SHARDS, check_remote_files

__all__ = ["STORE_SCHEMES", "option_hint", "use_cli_spelling",
           "StoreLocation", "StoreRangeStream", "is_store_url", "split_store_url", "scrub",
           "parse_storage_options", "set_default_storage_options", "MULTIPART_THRESHOLD_BYTES", "store_folder_kind"]

log = logging.getLogger(__name__)

#: URL schemes recognised as object stores (only ``s3`` is read and written; the others are
#: refused with a message naming what to use).
STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
#: Uploads at least this large go up in parts of this size (S3 multipart upload).
MULTIPART_THRESHOLD_BYTES = 64 << 20
_INSTALL = "pip install 'shardfeed[s3]'"
_STORAGE_OPTION_KEYS = {
    "endpoint_url": "endpoint_url", "endpoint": "endpoint_url",
    "region_name": "region_name", "region": "region_name",
    "profile": "profile", "profile_name": "profile",
    "anon": "anon",
    "key": "key", "aws_access_key_id": "key",
    "secret": "secret", "aws_secret_access_key": "secret",
    "token": "token", "aws_session_token": "token",
    "addressing_style": "addressing_style",
    "max_pool_connections": "max_pool_connections",
}
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID")
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "503", "500", "502",
                "504"}
_EXPIRED_CODES = {"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "RequestExpired"}
_BAD_CRED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "InvalidClientTokenId",
                   "UnrecognizedClientException"}
_REGION_CODES = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}


def is_store_url(text: Any) -> bool:
    """Whether ``text`` is an object-store URL (``s3://``, ``gs://``, ``az://``, ``abfs://`` ...)."""
    if not isinstance(text, str):
        return False
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in STORE_SCHEMES


def split_store_url(url: str) -> tuple[str, str, str]:
    """``"s3://bucket/a/b"`` -> ``("s3", "bucket", "a/b")``.

    Raises:
        UnsupportedURLError: not an object-store URL, or no bucket.
    """
    scheme, sep, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not sep or scheme.lower() not in STORE_SCHEMES or not bucket:
        raise UnsupportedURLError(f"{scrub(url)}: not an object-store URL of the form s3://BUCKET/PREFIX/")
    if "@" in bucket:
        raise UnsupportedURLError(f"{scrub(url)}: credentials do not go in an s3:// URL; set AWS_ACCESS_KEY_ID / "
                                  "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (or "
                                  f"{option_hint(('key', ...), ('secret', ...))}) "
                                  "and give s3://BUCKET/PREFIX/")
    if not _BUCKET_NAME.match(bucket):
        raise UnsupportedURLError(f"{url}: {bucket!r} is not a bucket name (letters, digits, '.', '-', '_'); "
                                  "give s3://BUCKET/PREFIX/")
    return scheme.lower(), bucket, key


#: The bucket names botocore accepts (its own check, done here so the message is ours and one line).
_BUCKET_NAME = re.compile(r"^[a-zA-Z0-9.\-_]{1,255}$")


def _secrets(options: dict | None) -> list[str]:
    vals = [os.environ.get(k, "") for k in _SECRET_ENV]
    for k, v in (options or {}).items():
        if _STORAGE_OPTION_KEYS.get(k) in ("key", "secret", "token") and isinstance(v, str):
            vals.append(v)
    return [v for v in vals if len(v) >= 4]


def scrub(text: str, options: dict | None = None) -> str:
    """``text`` with every credential (from the environment or ``options``) replaced by ``***``,
    and any ``user:password@`` in a URL removed."""
    for secret in _secrets(options):
        text = text.replace(secret, "***")
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)


def parse_storage_options(pairs: Any) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` strings (the CLI's ``--storage-option``) or a dict.

    ``true``/``false`` become booleans and digits integers. Unknown keys are refused.

    Raises:
        ValueError: a malformed pair or an unknown key (names the accepted keys).
    """
    if pairs is None:
        return {}
    items = pairs.items() if isinstance(pairs, dict) else []
    out: dict[str, Any] = {}
    if not isinstance(pairs, dict):
        parsed = []
        for p in pairs:
            k, sep, v = str(p).partition("=")
            if not sep or not k:
                name = re.match(r"[\w.-]*", str(p)).group()  # the key only: a KEY:SECRET typo is never echoed
                raise ValueError(f"--storage-option {name or '...'}: expected KEY=VALUE")
            parsed.append((k.strip(), v))
        items = parsed
    for k, v in items:
        if k not in _STORAGE_OPTION_KEYS:
            raise ValueError(f"storage option {k!r} is not one shardfeed knows; accepted: "
                             f"{', '.join(sorted(set(_STORAGE_OPTION_KEYS)))}")
        if isinstance(v, str):
            low = v.strip().lower()
            if _STORAGE_OPTION_KEYS[k] == "anon":
                if low not in ("true", "yes", "1", "false", "no", "0"):
                    raise ValueError(f"storage option {k}={v!r}: expected true or false (anon=true: unsigned "
                                     "requests, for a public bucket)")
                v = low in ("true", "yes", "1")
            elif _STORAGE_OPTION_KEYS[k] == "max_pool_connections":
                if not low.isdigit() or int(low) < 1:
                    raise ValueError(f"storage option {k}={v!r}: expected a positive integer (connections "
                                     "per client)")
                v = int(low)
        out[k] = v
    return out


_DEFAULT_OPTIONS: dict[str, Any] = {}
#: how messages spell a storage option: the Python API's ``storage_options={...}`` unless the
#: command line asked for its ``--storage-option KEY=VALUE`` (:func:`use_cli_spelling`)
_SPELLING = {"cli": False}


def use_cli_spelling(cli: bool = True) -> None:
    """Make this process's error messages spell storage options as the CLI does
    (``--storage-option anon=true``) rather than as the Python API does
    (``storage_options={'anon': True}``). The ``shardfeed`` command calls it."""
    _SPELLING["cli"] = bool(cli)


def option_hint(*pairs: tuple[str, Any]) -> str:
    """``storage_options={'key': value}`` (API) or ``--storage-option key=value`` (CLI) for a message.

    Args:
        *pairs: ``(key, value)``; a value of ``...`` prints as ``...`` (a placeholder).
    """
    if _SPELLING["cli"]:
        def cli_value(v: Any) -> str:
            return "..." if v is ... else (str(v).lower() if isinstance(v, bool) else str(v))

        return " ".join(f"--storage-option {k}={cli_value(v)}" for k, v in pairs)
    inner = ", ".join(f"{k!r}: {'...' if v is ... else repr(v)}" for k, v in pairs)
    return f"storage_options={{{inner}}}"


def set_default_storage_options(options: dict | None) -> None:
    """Options used by every :class:`StoreLocation` made without ``storage_options`` in this
    process (the CLI's ``--storage-option``); explicit ``storage_options`` are merged over them.

    Raises:
        ValueError: an unknown key.
    """
    _DEFAULT_OPTIONS.clear()
    _DEFAULT_OPTIONS.update(parse_storage_options(options))


def _import_boto3():
    try:
        import boto3
        import botocore
    except ImportError:
        raise UnsupportedURLError(f"reading or writing s3:// URLs needs boto3: {_INSTALL}") from None
    return boto3, botocore


def store_folder_kind(location) -> str:
    """What an object-store prefix without a manifest holds: ``"packed"`` (shards, an index, LMDB
    or a pack's work files at the top: an unfinished pack), ``"folder"`` (``CLASS/IMAGE`` keys) or
    ``"empty"``. Lists the prefix once (the listing is kept on ``location`` for the scan)."""
    listing = location.list_objects()
    location.listing_cache = listing
    top = [rel for rel, _, _ in listing if "/" not in rel]
    if any(rel.endswith((".tar", ".idx", ".mdb")) or rel.startswith(".shardfeed-") for rel in top):
        return "packed"
    return "folder" if any("/" in rel for rel, _, _ in listing) else "empty"


class _Permanent(Exception):
    """An answer that retrying will not change."""


class StoreLocation:
    """A dataset (or an image folder) under an object-store prefix: ``s3://bucket/prefix/`` or
    ``s3://bucket/prefix/manifest.json``.

    Picklable: holds the URL and the options; each process (each ``DataLoader`` worker) makes its
    own client on first use.

    Args:
        url: the prefix URL or the manifest's URL.
        storage_options: client options (see the module docstring); None: the default chain.
        timeout_s: connect and per-read timeout, seconds (default ``http_io.DEFAULT_TIMEOUT_S``).
        retries: retries after the first attempt (default ``http_io.DEFAULT_RETRIES``).

    Raises:
        UnsupportedURLError: a ``gs://``/``az://`` URL, or boto3 is not installed (names what to
            install or use).
        ValueError: bad ``timeout_s``/``retries`` or an unknown storage option.
    """

    def __init__(self, url: str, *, storage_options: dict | None = None, timeout_s: float | None = None,
                 retries: int | None = None):
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
        merged = {**_DEFAULT_OPTIONS, **parse_storage_options(storage_options)}
        self.storage_options = {_STORAGE_OPTION_KEYS[k]: v for k, v in merged.items()}
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
                except botocore.exceptions.ProfileNotFound:
                    profile = o.get("profile") or os.environ.get("AWS_PROFILE")
                    raise DataSourceError(f"{self.base}: AWS profile {profile!r} "
                                          f"not found in ~/.aws/config; check AWS_PROFILE / "
                                          f"{option_hint(('profile', ...))}") from None
                except ValueError as exc:
                    raise DataSourceError(self._scrub(f"{self.base}: cannot make an S3 client ({exc}); check "
                                                      f"AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))}")) \
                        from None
                self._client_pid = pid
        return self._client

    def _scrub(self, text: str) -> str:
        return scrub(text, {k: v for k, v in self.storage_options.items()})

    # ---- the fault policy
    def _classify(self, exc: BaseException, url: str) -> BaseException:
        """The error to raise for ``exc``: wrapped in :class:`_Permanent` when retrying will not help."""
        _, botocore = _import_boto3()
        bexc = botocore.exceptions
        if isinstance(exc, bexc.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            what = f"HTTP {status} {code}".strip()
            if code in _RETRY_CODES or status >= 500 or status in (408, 429):
                if code == "SlowDown" or status in (429, 503):
                    return DataSourceError(f"{what}: the store is throttling requests; lower the request rate "
                                           "(fewer loader workers or pack workers) or retry later")
                return DataSourceError(what)
            if code == "NoSuchBucket":
                return _Permanent(DataSourceError(
                    f"{url}: bucket {self.bucket!r} does not exist at {self.endpoint} ({what}); check the bucket "
                    f"name, and AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))} for an S3-compatible "
                    "store"))
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return _Permanent(FileNotFoundError(f"{url}: not found in the bucket ({what})"))
            if code in _EXPIRED_CODES:
                return _Permanent(DataSourceError(
                    f"{url}: the credentials have expired ({what}); refresh them (a new session token, "
                    "`aws sso login`, or the instance role) and run again"))
            if code in _BAD_CRED_CODES:
                return _Permanent(DataSourceError(
                    f"{url}: the store rejects the credentials ({what}); check AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and that they are for this endpoint "
                    f"({self.endpoint})"))
            if code in _REGION_CODES or status == 301:
                region = err.get("Region") or exc.response.get("ResponseMetadata", {}).get(
                    "HTTPHeaders", {}).get("x-amz-bucket-region")
                hint = f"set AWS_REGION={region}" if region else "set AWS_REGION to the bucket's region"
                return _Permanent(DataSourceError(f"{url}: the bucket is in another region ({what}); {hint} "
                                                  f"(or {option_hint(('region_name', region or ...))})"))
            if status == 403 or code in ("AccessDenied", "AllAccessDisabled", "403", "Forbidden"):
                fix = f"the bucket is not public, or {option_hint(('anon', True))} is wrong for it" \
                    if self.storage_options.get("anon") \
                    else ("check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the "
                          "instance role) and the bucket policy; for a public bucket pass "
                          f"{option_hint(('anon', True))}")
                return _Permanent(DataSourceError(f"{url}: access denied ({what}); {fix}"))
            return _Permanent(DataSourceError(f"{url}: {what} {err.get('Message', '')}".rstrip()))
        if isinstance(exc, bexc.NoCredentialsError):
            return _Permanent(DataSourceError(
                f"{url}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE "
                f"(or run on an instance with a role), or pass {option_hint(('anon', True))} for a public bucket"))
        if isinstance(exc, (bexc.NoRegionError,)):
            return _Permanent(DataSourceError(f"{url}: no region set; set AWS_REGION or "
                                              f"{option_hint(('region_name', ...))}"))
        if isinstance(exc, bexc.ParamValidationError):
            detail = " ".join(str(exc).split())  # botocore's message spans lines
            return _Permanent(DataSourceError(f"{url}: invalid request ({detail})"))
        if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectTimeoutError)):
            return DataSourceError(f"cannot reach the store at {self.endpoint} ({type(exc).__name__}); check "
                                   f"AWS_ENDPOINT_URL / {option_hint(('endpoint_url', ...))} and that the server is "
                                   "up")
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
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                return fn()
            except errors as exc:
                err = self._classify(exc, url)
                if isinstance(err, _Permanent):
                    inner = err.args[0]
                    raise type(inner)(self._scrub(str(inner))) from None
                last = err
                log.debug("%s %s failed (attempt %d of %d): %s", what, url, attempt + 1, self.retries + 1,
                          self._scrub(str(err)))
        raise DataSourceError(self._scrub(f"{url}: {what} failed after {self.retries + 1} attempts ({last})")) from None

    # ---- reading
    def read_bytes(self, name: str) -> bytes:
        """GET a whole (small) dataset file: the manifest, an offset index, an image.

        Raises:
            FileNotFoundError: no such object (404). DataSourceError: other failures (names the URL).
        """
        key = self.key(name)

        def once():
            body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return body.read()
            finally:
                body.close()

        return self._call(self.url(name), "GET", once)

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
        s = StoreRangeStream(self, name, start, end)
        return s, start

    def list_objects(self, sub: str = "") -> list[tuple[str, int, int]]:
        """Every object under the prefix (and ``sub``): ``[(name relative to the prefix, size in
        bytes, mtime in ns)]`` in key order.

        One paginated listing (1000 keys a request), never one request per "directory".

        Raises:
            DataSourceError: the listing failed (a missing bucket, 403 ... named).
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
        while True:
            resp = self._call(self.base + sub, "LIST", page)
            for obj in resp.get("Contents", []):
                mtime = obj.get("LastModified")
                out.append((obj["Key"][n:], int(obj["Size"]), int(mtime.timestamp() * 1e9) if mtime else 0))
            if not resp.get("IsTruncated"):
                return out
            token[0] = resp.get("NextContinuationToken")

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

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        """Fetch and validate the manifest; with ``check_files``, compare shard sizes (HEAD).

        Raises:
            ManifestError: no manifest under the prefix, a bad one, or files missing / of the wrong size.
            DataSourceError: the store cannot be read (names the URL and the fix).
        """
        murl = self.url(self.manifest_name)
        try:
            raw = self.read_bytes(self.manifest_name)
        except FileNotFoundError:
            raise ManifestError(f"{murl}: not found; {self.base} is not a packed dataset, or its pack did not "
                                "finish (the manifest is written last): pack it with `shardfeed pack`") from None
        manifest = Manifest.from_json(raw, murl)
        if check_files and manifest.format != "lmdb":
            self.check_files(manifest)
        return manifest

    def check_files(self, manifest: Manifest, *, threads: int = 16, max_shards: int = HEAD_CHECK_MAX_SHARDS) -> None:
        """HEAD up to ``max_shards`` shards (evenly spread) and their indexes; compare sizes
        (:func:`~shardfeed.readers.http_io.check_remote_files`).

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


class StoreRangeStream:
    """A read-only stream of one object from byte ``start`` (to ``end``), resuming after failures.

    The interface of :class:`~shardfeed.readers.http_io.HttpRangeStream`: ``read``, ``close``,
    ``offset`` (the file offset of the next byte), ``total_bytes`` (the object's size), ``ranged``.

    Raises:
        FileNotFoundError: no such object. DataSourceError: the GET failed after the retries.
    """

    def __init__(self, location: StoreLocation, name: str, start: int = 0, end: int | None = None):
        self.location = location
        self.name = name
        self.url = location.url(name)
        self.end = end
        self.ranged = True
        self.total_bytes: int | None = None
        self.offset = start
        self._body = None
        self._closed = False
        self._open(start)

    def _open(self, start: int) -> None:
        self._close_body()
        self._closed = False
        self.offset = start
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
        cr = resp.get("ContentRange")
        if cr:
            span, _, total = cr.partition(" ")[2].partition("/")
            if total and total != "*":
                self.total_bytes = int(total)
            if int(span.split("-")[0]) != start:
                resp["Body"].close()
                raise DataSourceError(f"{self.url}: asked for bytes from {start}, the store sent from {span}")
        elif start == 0:
            self.total_bytes = int(resp.get("ContentLength", 0))
        self._body = resp["Body"]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (fewer only at the end); a failed read is retried from the same byte.

        Raises:
            DataSourceError: the read still fails after the retries (names the URL).
        """
        errors = self.location._retry_errors()
        attempts = 0
        while True:
            if self._body is None:
                return b""
            try:
                data = self._body.read(n if n is not None and n >= 0 else None)
                self.offset += len(data)
                return data
            except errors as exc:
                if isinstance(exc, (DataSourceError, FileNotFoundError)):
                    raise
                if self._closed:
                    raise DataSourceError(f"{self.url}: stream closed while reading at byte {self.offset}") from None
                attempts += 1
                if attempts > self.location.retries:
                    raise DataSourceError(self.location._scrub(
                        f"{self.url}: reading at byte {self.offset} failed after {attempts} attempts "
                        f"({type(exc).__name__}); the store closed or stalled the connection")) from None
                log.debug("read of %s at byte %d failed (%s); retrying", self.url, self.offset, type(exc).__name__)
                time.sleep(BACKOFF_S * 2 ** (attempts - 1))
                self._open(self.offset)

    def _close_body(self) -> None:
        if self._body is not None:
            try:
                self._body.close()
            finally:
                self._body = None

    def close(self) -> None:
        self._closed = True
        self._close_body()

    def __enter__(self) -> "StoreRangeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
