"""The measuring commands (bench, verify, tune, doctor) and watch against a real HTTP server on
127.0.0.1 that requires Basic authentication, with the credentials in the URL: the password
appears in no report (text or JSON), progress line or DEBUG log record, and the source is still
named (``http://***@host/...``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from .test_http_faults import PASSWORD, serve  # noqa: F401  (the Basic-auth server fixture)

pytestmark = pytest.mark.network

_FAST = ["--model", "none", "--batches", "3", "--warmup", "1", "--image-size", "32", "--batch-size", "8"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "-vv", *args], capture_output=True,
                          text=True, timeout=240)


@pytest.fixture
def secret_url(serve):  # noqa: F811
    base, srv = serve(password=PASSWORD)
    return base.replace("http://", f"http://reader:{PASSWORD}@") + "/wds/", base, srv


@pytest.mark.parametrize("command", ["bench", "verify", "tune", "doctor"])
def test_measuring_commands_never_show_the_password_of_a_url(command, secret_url, tiny_image_folder, tmp_path):
    url, base, srv = secret_url
    out = tmp_path / "report.json"
    args = {"bench": ["bench", url, *_FAST],
            "verify": ["verify", str(tiny_image_folder), url, *_FAST, "--repeats", "1"],
            "tune": ["tune", url, *_FAST, "--budget-s", "20", "--max-num-workers", "0"],
            "doctor": ["doctor", url, "--num-workers", "1", "--max-files", "4"]}[command]
    r = _cli(*args, "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    written = out.read_text()
    assert PASSWORD not in r.stdout and PASSWORD not in r.stderr and PASSWORD not in written
    shown = base.replace("http://", "http://***@") + "/wds/"
    assert shown in r.stdout and shown in written  # the source is named, without its password
    assert "DEBUG" in r.stderr  # -vv: shardfeed's debug records were on
    assert any(path.endswith(".tar") and auth for _, path, _, auth in srv.log)  # the shards were read, with auth
    if command == "doctor":
        doc = json.loads(written)
        assert doc["path"] == shown and doc["storage"]["fs_type"] == "http" and doc["storage"]["mount_point"] is None
        assert " at None" not in r.stdout
        assert f"{shown} ..." in r.stderr  # the progress line names it too


def test_convert_index_and_verify_never_write_the_password_of_a_url(secret_url, packed_root, tmp_path):
    url, base, srv = secret_url
    shards = sorted(p.name for p in (packed_root / "wds").glob("*.tar"))
    assert len(shards) >= 2
    pattern = url + "{" + ",".join(shards) + "}"
    runs = {
        "convert": _cli("convert", url, str(tmp_path / "lmdb"), "--format", "lmdb", "--json", str(tmp_path / "c.json")),
        "index": _cli("index", pattern, "--out", str(tmp_path / "idx"), "--json", str(tmp_path / "i.json")),
        "verify": _cli("verify", url, url, *_FAST, "--repeats", "1"),
    }
    for name, r in runs.items():
        assert r.returncode == 0, name + r.stdout + r.stderr
        assert PASSWORD not in r.stdout + r.stderr, name
    shown = base.replace("http://", "http://***@") + "/wds"
    assert f"same dataset ({shown})" in runs["verify"].stderr
    written = [tmp_path / "c.json", tmp_path / "i.json", tmp_path / "idx" / "manifest.json",
               tmp_path / "lmdb" / "manifest.json", tmp_path / "lmdb" / "data.mdb"]
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), path
    assert json.loads((tmp_path / "lmdb" / "manifest.json").read_text())["options"]["converted_from"].startswith(shown)
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text())["options"]["indexed_from"].startswith(shown)


def test_watch_never_shows_the_password_of_a_loaders_url():
    from shardfeed.readers.measure.watch import watch

    url = f"http://reader:{PASSWORD}@127.0.0.1:9/wds/"

    class _Dataset:
        root = url

    class _SlowLoader:  # waits on "storage" in the main process: the pack advice names the data
        dataset, num_workers, batch_size = _Dataset(), 0, 4

        def __iter__(self):
            for _ in range(6):
                time.sleep(0.03)
                yield list(range(4))

    with watch(_SlowLoader(), warmup=1, sample_gpu=False) as w:
        for _ in w:
            time.sleep(0.001)
    rep = w.report()
    text = rep.summary() + json.dumps(rep.to_json())
    assert PASSWORD not in text
    assert "http://***@127.0.0.1:9/wds/" in text
