"""Keeping credentials out of every message and log record shardfeed and its HTTP clients emit.

Two layers, both applied wherever text leaves the process:

* :func:`redact` replaces every *known* secret (the secret key and session token of the
  environment, the ``secret``/``token`` storage options, the secret key and token an S3 client
  resolved, a ``user:password@`` of a URL; see :func:`register_secret`) with ``***``, and masks the places
  a signed request carries one whatever its value: ``Credential=AKIA.../`` and
  ``X-Amz-Credential=`` (the access key id), ``X-Amz-Security-Token`` (header or query: the
  session token), ``Authorization: Basic/Bearer``, ``X-Amz-Signature=``, ``user:password@``.
* :func:`guard_client_logs` installs a log-record factory that passes every record of the
  ``botocore``, ``boto3``, ``s3transfer``, ``urllib3`` and ``shardfeed`` loggers through
  :func:`redact` *when the record is made* (message, arguments and traceback), so no handler,
  level or formatter an application configures can print a secret; and it lowers botocore's,
  boto3's and s3transfer's loggers to ``WARNING`` unless the application set their level itself
  (their ``DEBUG`` records dump every request's headers and signature inputs; shardfeed's own
  ``DEBUG`` records say what is retried and why). ``-vv`` and ``logging.basicConfig(level=DEBUG)``
  therefore show shardfeed's debug lines without the clients' request dumps; a program that sets
  ``logging.getLogger("botocore").setLevel(logging.DEBUG)`` gets those dumps, redacted.

What counts as a match:

* The access key id (``AWS_ACCESS_KEY_ID``, the ``key`` storage option) is not a secret: it names
  the key, as a user name does, and is not replaced where it appears as itself (it is still
  masked inside a signed request's ``Credential=``).
* A secret of :data:`_WHOLE_TOKEN_BELOW` (8) characters or more is replaced wherever it occurs,
  inside words included.
* A shorter one (``test``, ``minio``, ``secret``: the values of local test stores) is replaced only
  as a whole token, where no letter, digit or ``_`` touches it on either side: with the secret
  ``test``, ``password test`` becomes ``password ***`` but ``/data/contest_data/latest`` stays.
* Values under :data:`_MIN_SECRET` (4) characters are not replaced (``"1"`` would mangle every
  message).
"""

from __future__ import annotations

import logging
import os
import re
import threading

__all__ = ["redact", "shown_source", "register_secret", "guard_client_logs", "SECRET_ENV", "CLIENT_LOGGERS"]

#: Environment variables whose values are credentials (the access key id is not one: it names the key).
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
#: Loggers whose records are redacted as they are made.
CLIENT_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3", "shardfeed")
#: Loggers lowered to WARNING unless the application chose their level (request dumps at DEBUG).
_QUIETED = ("botocore", "boto3", "s3transfer")
#: Values shorter than this are not replaced (``"1"`` would mangle every message).
_MIN_SECRET = 4
#: Secrets shorter than this many characters are replaced only as whole tokens (see the module docstring).
_WHOLE_TOKEN_BELOW = 8

_known: set[str] = set()
_lock = threading.Lock()
_PATTERNS = [
    # SigV4 Authorization header and presigned query: the access key id before the scope
    (re.compile(r"(?i)((?:X-Amz-)?Credential=)[^/\s,'\"&]+"), r"\1***"),
    # the session token: a header (``x-amz-security-token:V``, ``'X-Amz-Security-Token': b'V'``) or a query
    (re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,&]+"), r"\1***"),
    (re.compile(r"(?i)((?:X-Amz-Signature|Signature|AWSAccessKeyId)=)[^&\s'\"]+"), r"\1***"),
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*b?['\"]?\s*(?:basic|bearer)\s+)[^'\"\s,]+"), r"\1***"),
    (re.compile(r"(?i)((?:aws_secret_access_key|aws_session_token|aws_security_token)\s*[=:]\s*)\S+"), r"\1***"),
    # user:password@ (or a token@) of a URL
    (re.compile(r"(\w+://)[^/@\s]+@"), r"\1***@"),
]


#: Words every pattern but ``user:password@`` needs (lower case): a cheap test before the regexes.
_TRIGGERS = ("credential", "security-token", "signature", "awsaccesskeyid", "authorization", "aws_se")


def register_secret(*values) -> None:
    """Add credentials to the values :func:`redact` replaces (None, non-strings and values under
    4 characters are ignored)."""
    with _lock:
        for v in values:
            if isinstance(v, str) and len(v) >= _MIN_SECRET:
                _known.add(v)


def _secrets() -> list[str]:
    vals = set(_known)
    vals.update(v for v in (os.environ.get(k, "") for k in SECRET_ENV) if len(v) >= _MIN_SECRET)
    return sorted(vals, key=len, reverse=True)  # a secret that contains another goes first


def redact(text: str, extra=()) -> str:
    """``text`` with every known credential (and ``extra`` values) replaced by ``***`` and the
    credential-bearing parts of signed requests and URLs masked.

    A secret of 8 characters or more is replaced wherever it occurs; a shorter one only as a whole
    token (no letter, digit or ``_`` next to it); see the module docstring.
    """
    if not isinstance(text, str):
        text = str(text)
    for secret in sorted({*_secrets(), *(e for e in extra if isinstance(e, str) and len(e) >= _MIN_SECRET)},
                         key=len, reverse=True):
        if secret in text:
            if len(secret) >= _WHOLE_TOKEN_BELOW:
                text = text.replace(secret, "***")
            else:  # a short value, often a word: only where it stands alone
                text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", "***", text)
    low = text.lower()
    if "@" in low or any(t in low for t in _TRIGGERS):  # most messages hold none: skip the patterns
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
    return text


def shown_source(source) -> str:
    """How reports, progress lines and log records name a dataset ``source`` (a path, a URL or a
    path-like object): its text through :func:`redact`, so ``http://user:password@host/data``
    reads ``http://***@host/data`` and no known credential appears.

    Args:
        source: a path, URL or any object (``str()`` of it is taken; None gives ``"None"``).
    """
    return redact(os.fspath(source) if isinstance(source, os.PathLike) else str(source))


_installed = False


def _is_guarded(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in CLIENT_LOGGERS)


def guard_client_logs() -> None:
    """Redact the records of the HTTP and S3 clients' loggers (and shardfeed's) as they are made,
    and lower botocore/boto3/s3transfer to WARNING unless their level was set (idempotent; see
    the module docstring)."""
    global _installed
    if _installed:  # called on every client use: cheap after the first time
        return
    with _lock:
        if _installed:
            return
        for name in _QUIETED:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.WARNING)
        _installed = True
        previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if _is_guarded(record.name):
            try:
                record.msg = redact(record.getMessage())
                record.args = None
                if record.exc_info and not record.exc_text:
                    record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
                if record.stack_info:
                    record.stack_info = redact(record.stack_info)
            except Exception:  # a record that cannot be formatted is left to logging's own error path
                pass
        return record

    logging.setLogRecordFactory(factory)
