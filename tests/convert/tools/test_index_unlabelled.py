"""Unlabelled shards through the tools: ``index --no-labels`` on img2dataset's layout (jpg + txt +
json, no .cls), and ``inspect`` of an unlabelled dataset."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.tools.index import index_shards
from shardfeed.readers import open_dataset
from shardfeed.readers.storage.local_manifest import load_manifest


def _img(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(5, 6, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _img2dataset_shards(d: Path) -> dict[str, tuple[bytes, bytes | None]]:
    """Two shards as img2dataset writes them; returns ``{key: (jpg bytes, txt bytes or None)}``."""
    d.mkdir(parents=True)
    planted = {}
    for s in range(2):
        with tarfile.open(d / f"{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(3):
                key = f"{s:05d}{i:04d}"
                jpg, txt = _img(10 * s + i), (f"caption {s}/{i}".encode() if i != 1 else None)
                members = {"jpg": jpg, "json": json.dumps({"key": key, "caption": "x"}).encode()}
                if txt is not None:
                    members["txt"] = txt
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                planted[key] = (jpg, txt)
    return planted


def test_index_no_labels_reads_img2dataset_shards_with_their_captions(tmp_path):
    d = tmp_path / "laion"
    planted = _img2dataset_shards(d)
    with pytest.raises(ValueError, match=r"no sample with an image and a class .*pass --no-labels"):
        index_shards(d)
    report = index_shards(d, labels=False)
    assert report.num_samples == 6 and not report.problems
    m = load_manifest(d)
    assert m.labels == "none" and m.classes == []
    assert m.fields == {"txt": {"member": "txt", "count": 4, "missing": 2}}
    got = {}
    for s, fields in open_dataset(d, decode=False, shuffle=False, fields=("txt",)):
        got[s.key] = (s.data, fields["txt"], s.label)
    assert got == {k: (jpg, None if txt is None else txt.decode(), -1) for k, (jpg, txt) in planted.items()}


def test_index_cli_no_labels_and_inspect_of_an_unlabelled_dataset(tmp_path):
    from shardfeed.convert.cli import main
    from shardfeed.convert.tools.inspect import format_inspect_report, inspect_dataset

    d = tmp_path / "laion"
    _img2dataset_shards(d)
    r = CliRunner().invoke(main, ["index", str(d), "--no-labels"])
    assert r.exit_code == 0, r.output
    assert "indexed 6 samples in 2 shards" in r.output and "no labels" in r.output
    text = format_inspect_report(inspect_dataset(d, count_classes_from_data=True))
    assert "samples: 6 (no labels)" in text and "labels: none" in text
    assert "warning" not in text and "add up to" not in text
    r = CliRunner().invoke(main, ["index", str(d), "--no-labels", "--classes", __file__, "--overwrite"])
    assert r.exit_code != 0 and "drop it with --no-labels" in r.output


def test_inspect_of_a_written_unlabelled_dataset_counts_no_classes(tmp_path):
    from shardfeed.convert import write_dataset
    from shardfeed.convert.tools.inspect import format_inspect_report, inspect_dataset

    write_dataset([{"image": _img(i), "ext": "jpg", "txt": f"c{i}"} for i in range(4)], tmp_path / "u")
    text = format_inspect_report(inspect_dataset(tmp_path / "u", count_classes_from_data=True))
    assert "samples: 4 (no labels)" in text
    assert "add up to" not in text and "classes (counts" not in text
