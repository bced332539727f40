"""Object-store URLs and storage options: what an ``s3://`` URL is, its parts, and the
``storage_options`` (API) or ``--storage-option KEY=VALUE`` (CLI) that configure a client.

Used by :mod:`shardfeed.readers.storage.objstore` (which names them all too) and by the command line.
Secrets never appear in a message: :func:`scrub` takes them out, and an unreadable option's text
is never shown.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import DataSourceError, UnsupportedURLError
from .redact import redact

__all__ = ["STORE_SCHEMES", "STORAGE_OPTION_KEYS", "option_hint", "use_cli_spelling", "is_store_url", "is_s3_url",
           "split_store_url", "scrub", "parse_storage_options", "looks_like_option_key", "unreadable_option_message"]

#: URL schemes recognised as object stores (only ``s3`` is read and written; the others are
#: refused with a message naming what to use).
STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
#: Every accepted storage-option key (and its other spellings) -> the option it sets.
STORAGE_OPTION_KEYS = {
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


def is_store_url(text: Any) -> bool:
    """Whether ``text`` is an object-store URL (``s3://``, ``gs://``, ``az://``, ``abfs://`` ...)."""
    if not isinstance(text, str):
        return False
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in STORE_SCHEMES


def is_s3_url(text: Any) -> bool:
    """Whether ``text`` is an ``s3://`` URL (the object-store scheme shardfeed reads and writes)."""
    return isinstance(text, str) and text.partition("://")[0].lower() == "s3" and "://" in text


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
    return [v for k, v in (options or {}).items()
            if STORAGE_OPTION_KEYS.get(k) in ("secret", "token") and isinstance(v, str)]


def scrub(text: str, options: dict | None = None) -> str:
    """``text`` with every credential (from the environment, ``options``, or the credentials a
    client of this process resolved) replaced by ``***``, and any ``user:password@`` of a URL
    removed (:func:`shardfeed.readers.storage.redact.redact`)."""
    return redact(text, _secrets(options))


#: What a storage-option key looks like (every accepted key does): an error names an unknown key
#: only when it matches, so a secret typed where a key belongs (``KEY:SECRET``, a pasted token)
#: is never shown.
_KEY_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def looks_like_option_key(text: str) -> bool:
    """Whether ``text`` can be named in a message as a storage option's key: letters, digits and
    ``_``, a letter or ``_`` first, 32 characters at most. Anything else may be a secret typed
    where the key belongs (``aws_session_token:FwoG...``) and is never echoed."""
    return bool(_KEY_LIKE.fullmatch(text))


def unreadable_option_message(text: str) -> str:
    """The message for a storage option whose text may hold a secret: the text is not shown, only
    a known key it starts with (``aws_session_token:...``, ``token ...``)."""
    lead = _KEY_LIKE.match(text.lstrip())
    if lead and lead.group() in STORAGE_OPTION_KEYS:
        return (f"storage option {lead.group()!r} is followed by something other than '='; expected "
                f"KEY=VALUE ({lead.group()}=...); its text is not shown")
    return ("an unreadable storage option (its text is not shown); expected KEY=VALUE with KEY one of: "
            f"{', '.join(sorted(set(STORAGE_OPTION_KEYS)))}")


def parse_storage_options(pairs: Any) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` strings (the CLI's ``--storage-option``) or a dict.

    ``true``/``false`` become booleans and digits integers. Unknown keys are refused. An error
    never shows a value; it names an unknown key only when the key looks like one (up to 32
    letters, digits and ``_``): other text (a ``KEY:SECRET`` typo, a pasted token) is reported as
    an unreadable storage option, its text not shown.

    Raises:
        ValueError: a malformed pair, an unknown key (names the accepted keys), or a value of the
            wrong kind (``anon``, ``max_pool_connections``).
    """
    if pairs is None:
        return {}
    items = pairs.items() if isinstance(pairs, dict) else []
    out: dict[str, Any] = {}
    if not isinstance(pairs, dict):
        parsed = []
        for p in pairs:
            k, sep, v = str(p).partition("=")
            if not sep or not k.strip():
                text = str(p).strip()
                if looks_like_option_key(text):  # a bare key, no value: safe to name
                    raise ValueError(f"--storage-option {text}: expected KEY=VALUE")
                raise ValueError(f"--storage-option: {unreadable_option_message(text)}")
            parsed.append((k.strip(), v))
        items = parsed
    for k, v in items:
        if not isinstance(k, str) or k not in STORAGE_OPTION_KEYS:
            if isinstance(k, str) and looks_like_option_key(k):
                raise ValueError(f"storage option {k!r} is not one shardfeed knows; accepted: "
                                 f"{', '.join(sorted(set(STORAGE_OPTION_KEYS)))}")
            raise ValueError(unreadable_option_message(k if isinstance(k, str) else ""))
        if isinstance(v, str):
            low = v.strip().lower()
            if STORAGE_OPTION_KEYS[k] == "anon":
                if low not in ("true", "yes", "1", "false", "no", "0"):
                    raise ValueError(f"storage option {k}=...: expected true or false (anon=true: unsigned "
                                     "requests, for a public bucket); the value given is not shown")
                v = low in ("true", "yes", "1")
            elif STORAGE_OPTION_KEYS[k] == "max_pool_connections":
                if not low.isdigit() or int(low) < 1:
                    raise ValueError(f"storage option {k}=...: expected a positive integer (connections "
                                     "per client); the value given is not shown")
                v = int(low)
        out[k] = v
    return out


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


def listed_entry(obj: dict[str, Any], prefix: str, n: int, where: str) -> tuple[str, int, int]:
    """One ListObjectsV2 ``Contents`` entry as ``(name, size in bytes, mtime in ns)``, the name
    being the key less its first ``n`` characters (the location's prefix).

    Raises:
        DataSourceError: the key is not below ``prefix`` (a server that ignores the prefix asked).
    """
    key = obj["Key"]
    if not key.startswith(prefix):
        raise DataSourceError(f"{where} holds the key {key!r}, not below {prefix!r}; check the server")
    mtime = obj.get("LastModified")
    return key[n:], int(obj["Size"]), int(mtime.timestamp() * 1e9) if mtime else 0


def sorted_listing(listing: list[tuple[str, int, int]], where: str, base: str) -> list[tuple[str, int, int]]:
    """``listing`` sorted in key order, in place (one pass for a ListObjectsV2 server, which lists
    in key order already).

    Raises:
        DataSourceError: a key listed twice (it would be read or packed twice).
    """
    listing.sort()
    twice = next((a for (a, *_), (b, *_) in zip(listing, listing[1:]) if a == b), None)
    if twice is not None:
        raise DataSourceError(f"{where} lists {base}{twice} twice; check the server")
    return listing
