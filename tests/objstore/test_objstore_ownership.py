"""A dataset in a bucket follows the rule of a local OUT: ``pack --overwrite`` rebuilds
shardfeed's own previous dataset in place (manifest version 2: shards, ``.sfidx``,
``shardindex.json``, ``README.md``) and refuses, naming them, objects no record names;
``--resume`` on the same finished dataset is done; an unfinished pack reads as an incomplete
dataset, as on disk (and ``index`` refuses it). Right values: a local pack of the same folder, the
objects planted here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]


def _cli(*args, **kw):
    return subprocess.run([*SHARDFEED, *map(str, args)], capture_output=True, text=True, **kw)


def _download(client, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


@pytest.mark.slow
def test_overwrite_rebuilds_a_bucket_dataset_and_refuses_foreign_objects(tiny_image_folder, s3_client, s3_bucket,
                                                                         tmp_path):
    bucket = s3_bucket("own-overwrite")
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
    local = tmp_path / "local"
    assert _cli("pack", tiny_image_folder, local, "--max-count", 16, "-j", 1).returncode == 0
    expected = {p.name: p.read_bytes() for p in local.iterdir()}
    url = f"s3://{bucket}/ds/"
    r = _cli("pack", tiny_image_folder, url, "--max-count", 4, "-j", 1, env=env)  # more shards than the rebuild
    assert r.returncode == 0, r.stderr
    assert {"README.md", "shardindex.json", "shard-000000.sfidx"} <= set(_download(s3_client, bucket, "ds/"))
    r = _cli("pack", tiny_image_folder, url, "--max-count", 16, "-j", 1, "--overwrite", env=env)
    assert r.returncode == 0, r.stderr
    assert _download(s3_client, bucket, "ds/") == expected  # old shards gone, the new ones byte-identical
    # the same command with --resume: complete, nothing uploaded
    r = _cli("pack", tiny_image_folder, url, "--max-count", 16, "-j", 1, "--resume", env=env)
    assert r.returncode == 0, r.stderr
    assert "already holds this finished dataset" in r.stdout
    # another command with --resume: nothing to resume, and --overwrite is the fix that works
    r = _cli("pack", tiny_image_folder, url, "--max-count", 8, "-j", 1, "--resume", env=env)
    assert r.returncode == 1 and "--overwrite" in r.stderr and "max_count" in r.stderr, r.stderr
    # objects no record names: refused, named, nothing deleted
    s3_client.put_object(Bucket=bucket, Key="ds/family-photos.tar", Body=b"holiday")
    s3_client.put_object(Bucket=bucket, Key="ds/notes/todo.txt", Body=b"mine")
    r = _cli("pack", tiny_image_folder, url, "--max-count", 4, "-j", 1, "--overwrite", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "family-photos.tar" in r.stderr and "notes/todo.txt" in r.stderr, r.stderr
    assert _download(s3_client, bucket, "ds/") == {**expected, "family-photos.tar": b"holiday",
                                                   "notes/todo.txt": b"mine"}


def test_an_unfinished_pack_reads_as_incomplete_in_a_bucket_as_on_disk(tiny_image_folder, s3_bucket, tmp_path):
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import IncompleteDatasetError

    src = tmp_path / "src"
    shutil.copytree(tiny_image_folder, src)
    (src / "dog" / "zz_empty.jpg").write_bytes(b"")  # stops the pack after its first shards
    bucket = s3_bucket("own-unfinished")
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
    for out in (tmp_path / "local", f"s3://{bucket}/u/"):
        r = _cli("pack", src, out, "--max-count", 4, "-j", 1, "--no-shuffle", env=env)
        assert r.returncode == 1 and "zz_empty.jpg" in r.stderr
        with pytest.raises(IncompleteDatasetError, match="did not finish.*--resume"):
            open_dataset(str(out))
        r = _cli("inspect", out, env=env)
        assert r.returncode != 0 and "did not finish" in r.stderr and "--resume" in r.stderr, r.stderr
        # only the pack that made it can finish it: index writes no manifest over its shards
        r = _cli("index", out, "--out", tmp_path / "ix", env=env) if isinstance(out, str) else _cli("index", out)
        assert r.returncode == 1 and "--resume" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "ix" / "manifest.json").exists() and not (tmp_path / "local" / "manifest.json").exists()


def test_a_second_pack_to_the_same_prefix_is_told_it_is_busy(tiny_image_folder, s3_client, s3_bucket, tmp_path,
                                                             monkeypatch):
    from shardfeed.convert.write.outlock import output_lock
    from shardfeed.convert.write.store_pack import staging_dir

    bucket = s3_bucket("own-busy")
    url = f"s3://{bucket}/b/"
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path)}
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path))
    stage = staging_dir(url)
    # what the first pack has put in the prefix so far: its marker and a shard
    first = {".shardfeed-pack/plan.json": b'{"pack": "unfinished"}', "shard-000000.tar": b"\0" * 1024}
    for key, body in first.items():
        s3_client.put_object(Bucket=bucket, Key="b/" + key, Body=body)
    with output_lock(stage, "pack"):  # what the first pack holds while it builds and uploads
        for flags in ([], ["--overwrite"], ["--resume"]):
            r = _cli("pack", tiny_image_folder, url, *flags, env=env)
            assert r.returncode == 1, r.stderr
            assert f"another shardfeed command is writing this folder: PID {os.getpid()}" in r.stderr, r.stderr
    assert _download(s3_client, bucket, "b/") == first  # the first pack's objects untouched


def test_store_survey_counts_only_the_plan_under_the_state_prefix_as_ours():
    from shardfeed.convert.write.ownership import decide, store_entries, survey

    plan = b'{"pack": "unfinished", "options": {"format": "wds", "prefix": "shard"}}'
    objects = {".shardfeed-pack/plan.json": plan, ".shardfeed-pack/mine.txt": b"mine",
               ".shardfeed-pack/sub/deep-user-file.bin": b"\0" * 10, "shard-000000.tar": b"\0" * 1024}

    class Listed:
        def read_bytes(self, name):
            return objects[name]

    entries, read = store_entries(Listed(), {k: len(v) for k, v in objects.items()})
    contents = survey("s3://b/p/", entries, read)
    assert contents.ours == [".shardfeed-pack", "shard-000000.tar"]
    assert contents.foreign == [".shardfeed-pack/mine.txt", ".shardfeed-pack/sub/deep-user-file.bin"]
    with pytest.raises(ValueError, match=r"mine\.txt.*deep-user-file\.bin"):
        decide(contents, resume=False, overwrite=True)


@pytest.mark.slow
def test_overwrite_keeps_user_files_under_the_state_prefix(tiny_image_folder, s3_client, s3_bucket, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_image_folder, src)
    (src / "dog" / "zz_empty.jpg").write_bytes(b"")  # stops the pack after its first shards: its plan stays
    bucket = s3_bucket("own-state-prefix")
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
    url = f"s3://{bucket}/p/"
    r = _cli("pack", src, url, "--max-count", 4, "-j", 1, "--no-shuffle", env=env)
    assert r.returncode == 1 and "zz_empty.jpg" in r.stderr, r.stderr
    assert ".shardfeed-pack/plan.json" in _download(s3_client, bucket, "p/")
    user = {".shardfeed-pack/mine.txt": b"my notes", ".shardfeed-pack/sub/deep-user-file.bin": b"\x00\x01deep"}
    for key, body in user.items():
        s3_client.put_object(Bucket=bucket, Key="p/" + key, Body=body)
    before = _download(s3_client, bucket, "p/")
    r = _cli("pack", tiny_image_folder, url, "--max-count", 16, "-j", 1, "--overwrite", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert ".shardfeed-pack/mine.txt" in r.stderr and ".shardfeed-pack/sub/deep-user-file.bin" in r.stderr, r.stderr
    assert _download(s3_client, bucket, "p/") == before  # nothing deleted
    for key, body in user.items():
        assert before[key] == body
    # with the user's objects moved away, --overwrite replaces the unfinished pack, its plan included
    for key in user:
        s3_client.delete_object(Bucket=bucket, Key="p/" + key)
    local = tmp_path / "local"
    assert _cli("pack", tiny_image_folder, local, "--max-count", 16, "-j", 1).returncode == 0
    r = _cli("pack", tiny_image_folder, url, "--max-count", 16, "-j", 1, "--overwrite", env=env)
    assert r.returncode == 0, r.stderr
    assert _download(s3_client, bucket, "p/") == {p.name: p.read_bytes() for p in local.iterdir()}
