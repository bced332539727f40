"""Manifest version 2: shardfeed's offset index is ``.sfidx`` (``.idx`` is
NVIDIA DALI's name), the manifest records the image extensions present, and version-1 datasets
(``.idx`` indexes, no extensions) are still read. Right values come from the source folder."""

from __future__ import annotations

import json
import shutil

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.format.manifest import FORMAT_VERSION
from shardfeed.readers.format.offset_index import read_index


def _as_version_1(packed, d):
    """A version-1 copy of a packed dataset: as shardfeed 0.1 wrote it (``.idx``, no extensions)."""
    shutil.copytree(packed, d)
    m = json.loads((d / "manifest.json").read_text())
    m["version"] = 1
    m.pop("extensions", None)
    for s in m["shards"]:
        s.pop("extensions", None)
        (d / s["index"]).rename(d / s["index"].replace(".sfidx", ".idx"))
        s["index"] = s["index"].replace(".sfidx", ".idx")
    (d / "manifest.json").write_text(json.dumps(m))
    return m


def _raw(source, **kw):
    return sorted((s.meta["path"], s.data, s.label) for s in open_dataset(source, decode=False, shuffle=False, **kw))


def test_version_2_names_its_index_sfidx_and_records_the_extensions(packed_wds, tiny_folder_expected):
    m = json.loads((packed_wds / "manifest.json").read_text())
    # FORMAT_VERSION is 3 (extra fields, unlabelled datasets); a dataset using neither is written as 2
    assert m["version"] == 2 and FORMAT_VERSION == 3
    assert [s["index"] for s in m["shards"]] == [s["name"][:-4] + ".sfidx" for s in m["shards"]]
    assert not list(packed_wds.glob("*.idx"))  # DALI's name stays free
    # the extensions and their counts, from the source files' names
    want: dict[str, int] = {}
    for p in tiny_folder_expected:
        ext = {"jpeg": "jpg", "tiff": "tif"}.get(p.rsplit(".", 1)[1].lower(), p.rsplit(".", 1)[1].lower())
        want[ext] = want.get(ext, 0) + 1
    assert m["extensions"] == dict(sorted(want.items())) and len(want) >= 2
    assert sum(sum(s["extensions"].values()) for s in m["shards"]) == len(tiny_folder_expected)


def test_version_1_dataset_is_still_read(packed_wds, tiny_folder_expected, tmp_path):
    d = tmp_path / "v1"
    _as_version_1(packed_wds, d)
    want = sorted((p, data, label) for p, (data, label) in tiny_folder_expected.items())
    assert _raw(d) == want
    parts = [_raw(d, rank=r, world_size=3) for r in range(3)]  # ranges inside shards: the .idx offsets
    assert sorted(x for p in parts for x in p) == want
    from shardfeed.convert.tools.check import check_dataset

    assert check_dataset(d).ok


def test_version_1_index_overwritten_by_dali_is_named(packed_wds, tmp_path):
    """DALI's wds2idx writes ``shard-000000.idx``: in a version-1 dataset that replaced shardfeed's
    index. The error says so and how to fix it."""
    d = tmp_path / "v1"
    m = _as_version_1(packed_wds, d)
    first = m["shards"][0]
    n = first["num_samples"]
    offsets = read_index(packed_wds / first["index"].replace(".idx", ".sfidx"))
    # DALI's text index format (version line, then per sample: ext offset size name ...)
    lines = [f"v1.2 {n}"] + [f"jpg {o + 512} 10 {i:09d}.jpg" for i, o in enumerate(offsets)]
    (d / first["index"]).write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDataError, match=r"shard-000000\.idx: holds an NVIDIA DALI index "
                                               r".*`shardfeed index DIR --overwrite`"):
        _raw(d, rank=1, world_size=7)


def test_shardfeed_index_upgrades_a_version_1_dataset_and_keeps_dalis_index(packed_wds, tiny_folder_expected,
                                                                           tmp_path):
    from shardfeed.convert.tools.index import index_shards

    d = tmp_path / "v1"
    m = _as_version_1(packed_wds, d)
    dali = d / m["shards"][1]["index"]  # DALI's wds2idx wrote over this one
    dali.write_text("v1.2 1\njpg 512 10 000000000.jpg\n")
    index_shards(str(d / "*.tar"), overwrite=True)
    new = json.loads((d / "manifest.json").read_text())
    assert new["version"] == 2 < FORMAT_VERSION and all(s["index"].endswith(".sfidx") for s in new["shards"])
    assert sorted(p.name for p in d.glob("*.idx")) == [dali.name]  # shardfeed's old ones gone, DALI's kept
    assert dali.read_text() == "v1.2 1\njpg 512 10 000000000.jpg\n"
    want = sorted((p, data, label) for p, (data, label) in tiny_folder_expected.items())
    assert _raw(d, rank=0, world_size=1) == want
