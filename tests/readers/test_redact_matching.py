"""What :func:`shardfeed.readers.storage.redact.redact` replaces: a long secret wherever it occurs, a short
one (``test``) only as a whole token, the access key id not at all (except inside a signed
request). Right values: the strings planted here."""

from __future__ import annotations

import os
import subprocess
import sys

from shardfeed.readers.storage.redact import redact

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]
#: a 40-character secret access key, AWS's shape
KEY40 = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTEDKEY"


def test_a_long_secret_is_removed_everywhere(monkeypatch):
    assert len(KEY40) == 40
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY40)
    out = redact(f"x{KEY40}y /d/{KEY40}/m.json secret={KEY40}")
    assert KEY40 not in out and "wJalrXUtnFEMI" not in out
    assert out == "x***y /d/***/m.json secret=***"


def test_a_short_secret_is_replaced_only_as_a_whole_token(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    path = "/tmp/x/contest_data/latest_train/manifest.json"
    assert redact(path) == path
    assert redact("testing attest test_dir dir_test tests") == "testing attest test_dir dir_test tests"
    assert redact("the secret is test.") == "the secret is ***."
    assert redact("user:test /a/test/b 'test'") == "user:*** /a/***/b '***'"


def test_the_access_key_id_is_not_replaced_but_a_signature_is_masked(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPLANTEDKEYID0001")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    assert redact("access key AKIAPLANTEDKEYID0001") == "access key AKIAPLANTEDKEYID0001"
    assert "AKIAPLANTEDKEYID0001" not in redact("Credential=AKIAPLANTEDKEYID0001/20260101/us-east-1/s3/aws4_request")


def test_inspect_prints_the_path_whole_with_test_credentials(tmp_path):
    missing = tmp_path / "contest_data" / "latest_train"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    r = subprocess.run([*SHARDFEED, "inspect", str(missing)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert "contest_data/latest_train" in r.stderr and "***" not in r.stderr, r.stderr
