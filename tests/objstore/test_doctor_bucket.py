"""``shardfeed doctor`` on a bucket (moto's S3 server on 127.0.0.1): an image folder (class
folders, no manifest) is probed as a folder, a packed dataset through its manifest, both with the
endpoint given only by ``--storage-option``. Expected figures come from the uploaded files."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main as cli_main

from .conftest import SECRET

pytestmark = pytest.mark.network


def _doctor(url: str, endpoint: str, out, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # the option alone says where the bucket is
    r = CliRunner().invoke(cli_main, ["doctor", url, "--storage-option", f"endpoint_url={endpoint}",
                                      "--num-workers", "1", "--max-files", "5", "--json", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert SECRET not in r.output and " at None" not in r.output
    return r, json.loads(out.read_text())


def test_doctor_probes_an_image_folder_in_a_bucket_as_a_folder(s3_endpoint, s3_packed, tiny_image_folder, tmp_path,
                                                                monkeypatch):
    _, folder_url = s3_packed
    sizes = [p.stat().st_size for p in tiny_image_folder.rglob("*") if p.is_file()]
    r, d = _doctor(folder_url, s3_endpoint, tmp_path / "d.json", monkeypatch)
    assert d["kind"] == "folder" and d["path"] == folder_url
    assert d["storage"]["fs_type"] == "s3" and d["storage"]["fs_class"] == "network"
    assert d["storage"]["mount_point"] is None and d["storage"]["open_latency_ms"]["p50"] > 0
    assert d["files"]["count"] == len(sizes) == 60 and d["files"]["count_complete"] is True
    assert d["files"]["sampled"] == 5 and d["files"]["estimated_total_bytes"] == sum(sizes)
    assert d["files"]["median_bytes"] == statistics.median(sizes)
    assert d["decode"]["sampled"] == 5 and d["predicted"]["folder_images_per_s"] > 0
    assert f"{folder_url} (folder)" in r.output and "storage: s3 (network);" in r.output


def test_doctor_reads_a_packed_dataset_in_a_bucket_with_the_endpoint_option(s3_endpoint, s3_packed, packed_wds,
                                                                             tmp_path, monkeypatch):
    from shardfeed.readers.storage.local_manifest import load_manifest

    wds_url, _ = s3_packed
    manifest = load_manifest(packed_wds / "manifest.json", check_files=False)
    _, d = _doctor(wds_url, s3_endpoint, tmp_path / "d.json", monkeypatch)
    assert d["kind"] == "url" and d["storage"]["fs_type"] == "s3"
    assert d["files"]["count"] == manifest.num_samples == 60
    assert d["files"]["estimated_total_bytes"] == sum(s.num_bytes for s in manifest.shards)
    assert d["decode"]["sampled"] > 0


def test_doctor_on_an_empty_bucket_prefix_says_it_is_not_a_dataset(s3_endpoint, s3_packed, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    r = CliRunner().invoke(cli_main, ["doctor", "s3://data/nothing-here/", "--storage-option",
                                      f"endpoint_url={s3_endpoint}"])
    assert r.exit_code != 0 and "Traceback" not in r.output and "manifest.json" in r.output
