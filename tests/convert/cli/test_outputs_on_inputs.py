"""No output path of a command lands on what it reads or on the dataset it writes: a report over a
source image or over the manifest, a report inside OUT, an unpack or stage target inside the
dataset read. Each is refused before any work, the input left byte for byte as it was."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main
from shardfeed.convert.write.overlap import local_extent, refuse_outputs_on_inputs


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def src(tiny_image_folder, tmp_path):
    return shutil.copytree(tiny_image_folder, tmp_path / "src")


@pytest.fixture
def ds(packed_wds, tmp_path):
    return shutil.copytree(packed_wds, tmp_path / "ds")


def _refused(args, named: str):
    """A report path is a usage error (status 2); an output folder (unpack's, stage's) one error line (1)."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == (1 if args[0] in ("unpack", "stage") else 2), r.output
    assert named in r.output and "choose a path outside it" in r.output, r.output
    return r


def test_pack_report_over_a_source_image_is_refused(src, tmp_path):
    before = _snapshot(src)
    image = src / "cat" / "img_001.png"
    _refused(["pack", src, tmp_path / "out", "--json", image], str(image))
    assert _snapshot(src) == before
    assert not (tmp_path / "out").exists()


def test_pack_report_inside_out_is_refused(src, tmp_path):
    (tmp_path / "out").mkdir()
    _refused(["pack", src, tmp_path / "out", "--json", tmp_path / "out" / "r.json"], "the dataset this command writes")
    assert not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("args", [["check", "DS", "--json", "DS/manifest.json"],
                                  ["inspect", "DS", "--json", "DS/manifest.json"],
                                  ["bench", "DS", "--html", "DS/manifest.json"],
                                  ["bench", "DS/manifest.json", "--json", "DS/new.json"],
                                  ["tune", "DS", "--plot", "DS/manifest.json"],
                                  ["verify", "OTHER", "DS", "--json", "DS/shard-000000.tar"],
                                  ["doctor", "DS", "--json", "DS/report.json"],
                                  ["index", "DS", "--overwrite", "--json", "DS/manifest.json"],
                                  ["unpack", "DS", "DS/restored"],
                                  ["stage", "DS", "DS/copy"],
                                  ["convert", "DS", "OTHER/lmdb", "--format", "lmdb", "--json", "DS/c.json"]])
def test_output_on_the_dataset_read_is_refused(ds, tmp_path, args):
    before = _snapshot(ds)
    argv = [a.replace("DS", str(ds)).replace("OTHER", str(tmp_path)) for a in args]
    _refused(argv, "which this command reads")
    assert _snapshot(ds) == before
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_output_through_a_linked_folder_is_refused(ds, tmp_path):
    before = _snapshot(ds)
    (tmp_path / "link").symlink_to(ds)
    _refused(["check", ds, "--json", tmp_path / "link" / "manifest.json"], "which this command reads")
    _refused(["check", tmp_path / "link", "--json", ds / "manifest.json"], "which this command reads")
    assert _snapshot(ds) == before


def test_report_over_the_labels_file_or_storage_option_file_is_refused(src, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("cat/img_000.jpg,cat\n")
    _refused(["pack", src, tmp_path / "out", "--labels", labels, "--json", labels], "--labels")
    assert labels.read_text() == "cat/img_000.jpg,cat\n"
    opts = tmp_path / "opts.txt"
    opts.write_text("anon=true\n")
    os.chmod(opts, 0o600)
    _refused(["inspect", src, "--storage-option-file", opts, "--json", opts], "--storage-option-file")
    assert opts.read_text() == "anon=true\n"


def test_reports_beside_the_dataset_and_on_stdout_still_work(ds, tmp_path):
    r = CliRunner().invoke(main, ["check", str(ds), "--json", str(tmp_path / "check.json")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "check.json").is_file()
    r = CliRunner().invoke(main, ["check", str(ds), "--json", "-"])
    assert r.exit_code == 0, r.output


def test_remote_inputs_have_no_local_extent(tmp_path):
    assert local_extent("https://host/ds/manifest.json") is None
    assert local_extent("s3://bucket/ds") is None
    refuse_outputs_on_inputs({"--json": str(tmp_path / "r.json")}, {"SRC": "http://host" + str(tmp_path)})


def test_a_shard_pattern_covers_its_folder(tmp_path):
    assert local_extent(str(tmp_path / "train-{000..009}.tar")) == (os.path.realpath(tmp_path), True)
    with pytest.raises(ValueError, match="lies inside PATTERN"):
        refuse_outputs_on_inputs({"--json": str(tmp_path / "x.json")}, {"PATTERN": str(tmp_path / "*.tar")})
