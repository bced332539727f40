"""shardfeed doctor on packed datasets and bad input (the emulated-mount cases are in
tests/readers/test_watch_fuse.py); expectations from the fixtures' own files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main
from shardfeed.readers.measure.doctor import doctor, fs_class, predict_images_per_s


@pytest.mark.parametrize("fixture", ["packed_wds", "packed_lmdb"])
def test_doctor_on_a_packed_dataset_reads_its_shards_and_decodes_samples(fixture, request, tiny_folder_expected):
    root = request.getfixturevalue(fixture)
    rep = doctor(root, num_workers=2, max_files=8, budget_s=20)
    assert rep.kind == ("webdataset" if fixture == "packed_wds" else "lmdb")
    assert rep.files["count"] == len(tiny_folder_expected)
    assert rep.decode["sampled"] > 0
    assert rep.predicted["packed_images_per_s"] > 0
    assert not any(a.startswith("pack:") for a in rep.advice)


def test_the_model_divides_the_per_image_cost_over_the_workers_and_caps_at_the_cores():
    p = predict_images_per_s(num_workers=4, cpus=2, t_decode_s=0.001, t_open_s=0.002, t_first_read_s=0.002,
                             median_bytes=10_000, read_bytes_per_s=10e6)
    assert p["folder_images_per_s"] == pytest.approx(4 / (0.002 + 0.002 + 0.001))
    assert p["packed_images_per_s"] == pytest.approx(2 / 0.001)  # 4 / (0.001 + 0.001) capped by 2 cores
    assert p["local_images_per_s"] == pytest.approx(2000)


def test_fs_classes():
    assert [fs_class(t) for t in ("ext4", "nfs4", "fuse.sshfs", "overlay", "tmpfs", "cifs", None)] == \
        ["local", "nfs", "fuse", "overlay", "tmpfs", "network", "unknown"]


def test_doctor_cli_json_and_bad_input(tiny_image_folder, tmp_path):
    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["-q", "doctor", str(tiny_image_folder), "--num-workers", "1", "--max-files", "5",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["files"]["count"] == 60 and d["files"]["sampled"] == 5 and d["num_workers"] == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(main, ["doctor", str(empty)])
    assert r.exit_code != 0 and "no image file found" in r.output
    r = CliRunner().invoke(main, ["doctor", "ftp://127.0.0.1:9/data"])
    assert r.exit_code != 0 and "Traceback" not in r.output


@pytest.mark.network
def test_doctor_on_a_url_reads_the_shards_over_http(simple_http_server, packed_wds, tiny_folder_expected):
    from shardfeed.readers.storage.local_manifest import load_manifest

    url = f"{simple_http_server}/wds"
    rep = doctor(url, num_workers=2, max_files=4, budget_s=20)
    assert rep.kind == "url" and rep.storage["fs_type"] == "http" and rep.storage["fs_class"] == "network"
    assert rep.files["count"] == len(tiny_folder_expected)
    manifest = load_manifest(packed_wds / "manifest.json", check_files=False)
    assert rep.files["estimated_total_bytes"] == sum(s.num_bytes for s in manifest.shards)
    assert rep.decode["sampled"] > 0 and rep.predicted["packed_images_per_s"] > 0
    assert rep.storage["open_latency_ms"]["p50"] > 0


def test_the_folders_system_call_cpu_counts_against_the_cores():
    base = dict(num_workers=2, cpus=2, t_decode_s=0.001, t_open_s=0.0, t_first_read_s=0.0, median_bytes=1000,
                read_bytes_per_s=1e9)
    quick = predict_images_per_s(**base)
    costly = predict_images_per_s(**base, t_file_cpu_s=0.001)
    assert costly["folder_images_per_s"] == pytest.approx(2 / 0.002)  # decode + one file's system calls
    # packed: one shard's stream, no open per image: 1000 bytes at 1 GB/s + the decode, per worker
    assert costly["packed_images_per_s"] == quick["packed_images_per_s"] == pytest.approx(2 / (1e-6 + 0.001))
