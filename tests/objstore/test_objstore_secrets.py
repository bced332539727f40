"""No verbosity, handler or API path prints a credential: the CLI at -q, default, -v and -vv, and
a program logging at DEBUG (botocore's own records included), against moto's S3 server on
127.0.0.1 with a recognisable access key id, secret key and session token."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import ACCESS_KEY, SECRET

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]
TOKEN = "SfSessionTOKEN-4b1d0e-DoNotPrint-" + "Q" * 40
OPTION_TOKEN = "SfOptionTOKEN-77aa02-DoNotPrint"
OPTION_KEY = "AKIASHARDFEEDOPTION7"


def _assert_clean(text: str, *secrets: str) -> None:
    for s in (ACCESS_KEY, SECRET, TOKEN, *secrets):
        assert s not in text, f"{s[:12]}... printed:\n{text[-3000:]}"


@pytest.mark.parametrize("verbosity", [["-q"], [], ["-v"], ["-vv"]])
def test_cli_prints_no_credential_at_any_verbosity(verbosity, s3_packed):
    url, _ = s3_packed
    env = {**os.environ, "AWS_SESSION_TOKEN": TOKEN}
    r = subprocess.run([*SHARDFEED, *verbosity, "inspect", url], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "shard-000000.tar" in r.stdout + r.stderr
    _assert_clean(r.stdout + r.stderr)
    # the same through --storage-option key=/secret=/token= (moto accepts any key)
    r = subprocess.run([*SHARDFEED, *verbosity, "inspect", url, "--storage-option", f"token={OPTION_TOKEN}",
                        "--storage-option", f"key={OPTION_KEY}", "--storage-option", f"secret={SECRET}x"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    _assert_clean(r.stdout + r.stderr, OPTION_TOKEN, OPTION_KEY, SECRET + "x")


@pytest.mark.parametrize("botocore_debug", [False, True])
def test_api_debug_logging_prints_no_credential(botocore_debug, s3_packed, tiny_folder_expected):
    """``logging.basicConfig(level=DEBUG)``, and a program that turns botocore's own DEBUG records
    on: the samples are read, botocore's request records (when on) appear, no credential does."""
    url, _ = s3_packed
    code = textwrap.dedent(f"""
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
        from shardfeed.readers import open_dataset
        ds = open_dataset({url!r}, decode=False, shuffle=False, storage_options={{"token": {OPTION_TOKEN!r}}})
        if {botocore_debug!r}:
            logging.getLogger("botocore").setLevel(logging.DEBUG)
        print(len(list(ds)))
        logging.getLogger("shardfeed.test").debug("a token in our own record: %s", {OPTION_TOKEN!r})
    """)
    env = {**os.environ, "AWS_SESSION_TOKEN": TOKEN}
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(len(tiny_folder_expected))]
    if botocore_debug:
        assert "CanonicalRequest" in r.stderr or "Sending http request" in r.stderr  # the records that carried them
        assert "x-amz-security-token" in r.stderr.lower()
    assert "a token in our own record: ***" in r.stderr
    _assert_clean(r.stdout + r.stderr, OPTION_TOKEN)


def test_redact_masks_signed_request_parts_of_unknown_credentials():
    """Credentials resolved later (a refreshed role token) are masked by where they stand."""
    from shardfeed.readers.storage.redact import redact

    text = ("Authorization: AWS4-HMAC-SHA256 Credential=AKIAUNKNOWN123/20260101/us-east-1/s3/aws4_request, "
            "x-amz-security-token:UnknownTok3n\n'X-Amz-Security-Token': b'UnknownTok3n' "
            "https://h/k?X-Amz-Credential=AKIAUNKNOWN123%2F2026&X-Amz-Security-Token=UnknownTok3n&X-Amz-Signature=ab12 "
            "http://user:pa55word@host/x Authorization: Basic dXNlcjpwYTU1d29yZA==")
    out = redact(text)
    for s in ("AKIAUNKNOWN123", "UnknownTok3n", "pa55word", "dXNlcjpwYTU1d29yZA", "ab12"):
        assert s not in out, out
    assert "Credential=***/20260101/us-east-1/s3/aws4_request" in out
