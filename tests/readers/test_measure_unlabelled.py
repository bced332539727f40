"""``bench`` and ``verify`` on a flat folder (images, no class folders) and on the unlabelled pack
``shardfeed pack`` makes of it; the readers read such a folder as an unlabelled dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main as cli_main

NUM_IMAGES = 12
SMALL = ["--batch-size", "4", "--image-size", "16", "--warmup", "1", "--batches", "2", "--num-workers", "0",
         "--threads", "1", "--device", "cpu", "--model", "tiny"]


@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("flat") / "images"
    root.mkdir()
    rng = np.random.default_rng(3)
    files = {}
    for i in range(NUM_IMAGES):
        p = root / f"photo_{i:02d}.{'png' if i % 3 == 0 else 'jpg'}"
        Image.fromarray(rng.integers(0, 256, size=(20, 24, 3), dtype=np.uint8)).save(p)
        files[p.name] = p.read_bytes()
    (root / "notes.txt").write_text("not an image")
    (root / ".hidden.jpg").write_bytes(files["photo_01.jpg"])
    return {"folder": root, "files": files}


def _run(args: list) -> object:
    return CliRunner().invoke(cli_main, [str(a) for a in args], catch_exceptions=False)


def test_a_flat_folder_reads_as_an_unlabelled_dataset(flat):
    from shardfeed.readers import open_dataset

    ds = open_dataset(flat["folder"], decode=False, shuffle=False)
    samples = [ds.read_raw(i) for i in range(len(ds))]
    # every image of the folder (not the text file, not the hidden one), sorted by name, label -1
    assert [meta["path"] for *_, meta in samples] == sorted(flat["files"])
    assert all(data == flat["files"][meta["path"]] for _, data, _, _, meta in samples)
    assert {label for _, _, _, label, _ in samples} == {-1}
    assert ds.labelled is False


def test_a_class_map_for_a_flat_folder_is_refused_naming_the_fix(flat):
    from shardfeed.readers import open_dataset

    with pytest.raises(ValueError, match="no class folders"):
        open_dataset(flat["folder"], class_to_idx={"a": 0})


@pytest.mark.multiprocess
def test_bench_and_verify_take_a_flat_folder_and_its_unlabelled_pack(flat, tmp_path):
    packed = tmp_path / "packed"
    r = _run(["pack", flat["folder"], packed, "--format", "wds"])
    assert r.exit_code == 0, r.output
    for source in (flat["folder"], packed):
        out = tmp_path / f"bench-{Path(source).name}.json"
        r = _run(["bench", source, *SMALL, "--json", out])
        assert r.exit_code == 0, r.output
        run = json.loads(out.read_text())
        assert run["num_samples"] == 2 * 4 and run["config"]["num_dataset_samples"] == NUM_IMAGES
    out = tmp_path / "verify.json"
    r = _run(["verify", flat["folder"], packed, *SMALL, "--repeats", "1", "--deep", "--json", out])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert rep["check"]["num_samples"] == rep["check"]["num_compared"] == NUM_IMAGES
