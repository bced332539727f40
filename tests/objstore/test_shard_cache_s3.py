"""The shard cache over ``s3://`` (moto's S3-API server on 127.0.0.1): once an epoch has put every
shard in ``cache_dir``, the next epoch reads nothing from the bucket (proved by deleting the
shards from the bucket in between)."""

from __future__ import annotations

import hashlib
import tarfile

import pytest

from shardfeed.readers import open_dataset

from .conftest import _upload_dir

pytestmark = pytest.mark.network


def _tar_images(root) -> list[str]:
    out = []
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as t:
            out += [hashlib.sha256(t.extractfile(m).read()).hexdigest() for m in t.getmembers()
                    if m.name.rsplit(".", 1)[-1] in ("jpg", "png")]
    return out


def test_second_epoch_reads_nothing_from_the_bucket(s3_client, s3_bucket, packed_wds, tmp_path):
    bucket = s3_bucket("shard-cache")
    _upload_dir(s3_client, bucket, "wds/", packed_wds)
    ds = open_dataset(f"s3://{bucket}/wds/", decode=False, shuffle=False, cache_dir=tmp_path / "cache",
                      cache_limit="10MB")
    expected = _tar_images(packed_wds)
    assert [hashlib.sha256(s.data).hexdigest() for s in ds] == expected
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="wds/")["Contents"]
    for obj in listed:
        if obj["Key"].endswith((".tar", ".sfidx")):
            s3_client.delete_object(Bucket=bucket, Key=obj["Key"])
    assert [hashlib.sha256(s.data).hexdigest() for s in ds] == expected


def test_an_image_folder_in_a_bucket_ignores_the_cache(s3_packed, tiny_image_folder, tmp_path):
    _, folder_url = s3_packed
    cache = tmp_path / "cache"
    ds = open_dataset(folder_url, decode=False, shuffle=False, cache_dir=cache)
    assert len(list(ds)) == sum(1 for p in tiny_image_folder.rglob("*") if p.is_file())
    assert not cache.exists()
