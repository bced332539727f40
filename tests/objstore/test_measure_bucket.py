"""`bench`/`verify` name the kind of source they measured: an image folder in a bucket is a folder."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main as cli_main

COMMON = ["--image-size", "16", "--warmup", "0", "--threads", "1", "--device", "cpu", "--model", "tiny",
          "--num-workers", "0"]


def _run(args: list):
    return CliRunner().invoke(cli_main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.network
@pytest.mark.multiprocess
def test_an_image_folder_in_a_bucket_is_labelled_folder(s3_packed, tmp_path):
    _, folder_url = s3_packed
    out = tmp_path / "bench.json"
    r = _run(["bench", folder_url, *COMMON, "--batch-size", "4", "--batches", "1", "--json", out])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["config"]["source_format"] == "folder"
    assert f"folder: {folder_url}" in r.output
