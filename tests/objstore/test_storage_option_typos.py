"""A storage option mistyped so that a credential lands where the key belongs (``KEY:VALUE``, a
YAML-style ``key: value`` line, a pasted token) or a wrong-kind value: refused, and the error never
shows the planted secret. Right values: the secret strings planted here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardfeed.convert.cli.storage_options import read_storage_option_file
from shardfeed.readers.storage.objstore import parse_storage_options

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]

#: a session token as AWS prints them (base64: '+', '/' and a trailing '=')
TOKEN = "FwoGZXIvYXdzEBYaDPlantedSECRETTOKEN+abc/def=="
#: the part of the token before its first '=': what a split at '=' puts in the "key"
TOKEN_HEAD = "FwoGZXIvYXdzEBYaDPlantedSECRETTOKEN"


def _message(pairs) -> str:
    with pytest.raises(ValueError) as e:
        parse_storage_options(pairs)
    return str(e.value)


@pytest.mark.parametrize("pair", [f"aws_session_token:{TOKEN}", f"token {TOKEN}", TOKEN, f"{TOKEN}=x",
                                  f"x{TOKEN}"])
def test_a_secret_typed_where_the_key_belongs_is_never_shown(pair):
    msg = _message([pair])
    assert TOKEN_HEAD not in msg and "SECRET" not in msg, msg
    assert "KEY=VALUE" in msg


def test_the_known_key_before_a_colon_is_named():
    msg = _message([f"aws_session_token:{TOKEN}"])
    assert "'aws_session_token'" in msg and "text is not shown" in msg and "SECRET" not in msg


def test_a_dict_key_holding_a_secret_is_not_shown():
    msg = _message({f"aws_session_token: {TOKEN}": "x"})
    assert "SECRET" not in msg and "aws_session_token" in msg
    assert "unreadable storage option" in _message({"FwoG/PLANTED+SECRET": "x"})
    assert "SECRET" not in _message({"FwoG/PLANTED+SECRET": "x"})


def test_a_key_like_unknown_key_is_still_named():
    assert "storage option 'colour' is not one shardfeed knows" in _message(["colour=blue"])
    assert "--storage-option anon: expected KEY=VALUE" in _message(["anon"])


@pytest.mark.parametrize("pair", ["anon=SECRET123", "max_pool_connections=SECRET123",
                                  "max_pool_connections=-SECRET123"])
def test_a_wrong_kind_value_is_not_shown(pair):
    msg = _message([pair])
    assert "SECRET123" not in msg and pair.partition("=")[0] in msg, msg


def test_a_yaml_style_line_in_the_file_is_refused_without_its_value(tmp_path):
    f = tmp_path / "s3.conf"
    f.write_text(f"region_name = us-east-1\naws_session_token: {TOKEN}\n")
    f.chmod(0o600)
    with pytest.raises(ValueError) as e:
        read_storage_option_file(f)
    msg = str(e.value)
    assert "line 2" in msg and "aws_session_token" in msg and "SECRET" not in msg and TOKEN_HEAD not in msg, msg


def test_the_cli_never_echoes_the_token(tmp_path):
    r = subprocess.run([*SHARDFEED, "inspect", "s3://bucket/x/", "--storage-option", f"aws_session_token:{TOKEN}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "SECRET" not in r.stderr + r.stdout and "aws_session_token" in r.stderr, r.stderr
    f = tmp_path / "s3.conf"
    f.write_text(f"aws_session_token: {TOKEN}\n")
    f.chmod(0o600)
    r = subprocess.run([*SHARDFEED, "inspect", "s3://bucket/x/", "--storage-option-file", str(f)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "SECRET" not in r.stderr + r.stdout and "line 1" in r.stderr, r.stderr
    r = subprocess.run([*SHARDFEED, "inspect", "s3://bucket/x/", "--storage-option", "anon=SECRET123"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "SECRET123" not in r.stderr + r.stdout and "anon" in r.stderr, r.stderr
