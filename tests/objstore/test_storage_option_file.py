"""``--storage-option-file PATH``: object-store options (credentials included) from a file that
``ps`` does not show, readable by its owner only; against moto's S3 server with no AWS_* in the
environment, so the file alone names the endpoint and the credentials. The secret never lands in
the lock file, the manifest, the report or the output. Right values: a local pack of the same
folder, the secret the tests set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ACCESS_KEY, SECRET

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]
HOOKED = Path(__file__).resolve().parents[1] / "hooked_cli.py"


def _bare_env(tmp_path) -> dict:
    """The environment without any AWS setting: only the file can say where and who."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), SHARDFEED_STAGING_DIR=str(tmp_path / "staging"))
    return env


def _options_file(path: Path, endpoint: str, form: str, mode: int = 0o600) -> Path:
    opts = {"endpoint_url": endpoint, "region_name": "us-east-1", "key": ACCESS_KEY, "secret": SECRET}
    if form == "json":
        path.write_text(json.dumps(opts))
    else:
        path.write_text("# shardfeed storage options\n\n" + "".join(f"{k} = {v}\n" for k, v in opts.items()))
    path.chmod(mode)
    return path


def _download(client, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("form", ["key-value", "json"])
def test_pack_and_read_with_a_storage_option_file(form, tiny_image_folder, s3_endpoint, s3_client, s3_bucket,
                                                  tmp_path):
    bucket = s3_bucket(f"optfile-{form}")
    env = _bare_env(tmp_path)
    (tmp_path / "staging").mkdir()
    opts = _options_file(tmp_path / "s3.conf", s3_endpoint, form)
    local = tmp_path / "local"
    assert subprocess.run([*SHARDFEED, "pack", str(tiny_image_folder), str(local), "--max-count", "16"],
                          capture_output=True).returncode == 0
    url = f"s3://{bucket}/ds/"
    # without the file nothing says where the store is nor who we are
    r = subprocess.run([*SHARDFEED, "inspect", url], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    proc = subprocess.Popen([sys.executable, "-P", str(HOOKED), json.dumps({"upload_delay_s": 0.1}), "pack",
                             str(tiny_image_folder), url, "--max-count", "16", "-j", "1", "--storage-option-file",
                             str(opts), "--json", str(tmp_path / "report.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    locks = []
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        for lock in (tmp_path / "staging").glob("shardfeed-staging-*/.shardfeed.lock"):
            try:
                locks.append(lock.read_text())
            except FileNotFoundError:
                pass
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert locks and all(SECRET not in text for text in locks)
    got = _download(s3_client, bucket, "ds/")
    assert got == {p.name: p.read_bytes() for p in local.iterdir()}
    report = (tmp_path / "report.json").read_text()
    for text in (report, got["manifest.json"].decode(), out, err):
        assert SECRET not in text and ACCESS_KEY not in text
    r = subprocess.run([*SHARDFEED, "inspect", url, "--storage-option-file", str(opts), "--json", "-"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_samples"] == 60 and SECRET not in r.stdout + r.stderr


def test_a_storage_option_file_others_can_read_is_refused(s3_endpoint, tmp_path):
    opts = _options_file(tmp_path / "s3.conf", s3_endpoint, "key-value", mode=0o644)
    r = subprocess.run([*SHARDFEED, "inspect", "s3://any/ds/", "--storage-option-file", str(opts)],
                       capture_output=True, text=True, env=_bare_env(tmp_path))
    assert r.returncode == 2 and f"chmod 600 {opts}" in r.stderr and SECRET not in r.stderr, r.stderr
    (tmp_path / "bad.conf").write_text(f"endpoint_url {SECRET}\n")  # no '=': named by line, value not echoed
    (tmp_path / "bad.conf").chmod(0o600)
    r = subprocess.run([*SHARDFEED, "inspect", "s3://any/ds/", "--storage-option-file", str(tmp_path / "bad.conf")],
                       capture_output=True, text=True, env=_bare_env(tmp_path))
    assert r.returncode == 2 and "line 1: expected KEY=VALUE" in r.stderr and SECRET not in r.stderr


def test_a_secret_on_the_command_line_is_warned_about_never_echoed(s3_packed, tmp_path):
    wds_url, _ = s3_packed
    r = subprocess.run([*SHARDFEED, "inspect", wds_url, "--storage-option", f"secret={SECRET}",
                        "--storage-option", f"key={ACCESS_KEY}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "visible to every local user" in r.stderr and "--storage-option-file" in r.stderr
    assert SECRET not in r.stderr + r.stdout


def test_a_fifo_given_as_the_storage_option_file_is_refused_without_waiting(tmp_path):
    from shardfeed.convert.cli.storage_options import read_storage_option_file

    fifo = tmp_path / "s3.conf"
    os.mkfifo(fifo, 0o600)
    script = ("import sys\nfrom shardfeed.convert.cli.storage_options import read_storage_option_file\n"
              "try:\n    read_storage_option_file(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n")
    # In a child process with a deadline: a blocking open of a FIFO would hang the test run itself.
    r = subprocess.run([sys.executable, "-P", "-c", script, str(fifo)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"{fifo}: not a plain file" in r.stdout, (r.stdout, r.stderr)
    link = tmp_path / "zero.conf"
    link.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a plain file"):
        read_storage_option_file(link)


def test_a_deeply_nested_json_storage_option_file_is_a_clear_error_not_a_traceback(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"endpoint_url": ' + "[" * 100_000 + "]" * 100_000 + "}")
    deep.chmod(0o600)
    r = subprocess.run([*SHARDFEED, "inspect", "s3://any/ds/", "--storage-option-file", str(deep)],
                       capture_output=True, text=True, env=_bare_env(tmp_path), timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr, r.stderr
    assert f"{deep}: JSON nested too deeply" in r.stderr, r.stderr


def test_a_nested_value_in_a_json_storage_option_file_is_refused_by_name(tmp_path):
    from shardfeed.convert.cli.storage_options import read_storage_option_file

    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"endpoint_url": "http://127.0.0.1:9", "config": {"retries": 3}}))
    nested.chmod(0o600)
    with pytest.raises(ValueError, match=r"option config is not a plain value"):
        read_storage_option_file(nested)
