"""One rule groups a sample's tar members, so the training reader and the tools agree.

Before, the reader (``source_base.parts_to_raw``) and the tools (``inspect.parts_to_sample``) had
two rules: on the shard below the reader read an upper-case ``.PNG`` as ``"PNG"`` and the tools as
``"png"``; the reader read a ``.pbm`` image and a ``--extensions heic`` image the tools called "no
image member"; and the reader silently took the first of two images the tools refused. The
expected values come from the members written here with ``tarfile``, not from the code.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from shardfeed.convert.tools.check import check_dataset
from shardfeed.convert.tools.common import iter_raw_samples, parts_to_sample
from shardfeed.convert.tools.convert import convert_dataset
from shardfeed.convert.tools.index import index_shards
from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.sources.source_base import parts_to_raw


def _image(fmt: str, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (6, 5), color=1 if mode == "1" else (200, 10, 30)).save(buf, fmt)
    return buf.getvalue()


JPG, PNG, PBM = _image("JPEG"), _image("PNG"), _image("PPM", mode="1")
HEIC = b"not decoded here: an extension packed with --extensions heic"

#: key -> (members in tar order, the expected (data, ext, label) or None when the sample is refused)
SAMPLES = {
    "a": ([("jpg", JPG), ("cls", b"0")], (JPG, "jpg", 0)),
    "b": ([("PNG", PNG), ("cls", b"1")], (PNG, "png", 1)),      # upper-case extension
    "c": ([("pbm", PBM), ("cls", b" 2\n")], (PBM, "pbm", 2)),   # an image format outside the pack defaults
    "d": ([("heic", HEIC), ("cls", b"1")], (HEIC, "heic", 1)),  # the one member that is not a side member
    "e": ([("jpg", JPG), ("png", PNG), ("cls", b"0")], None),   # two images: refused, never a silent pick
}


def _parts(key: str) -> dict:
    return dict(SAMPLES[key][0])


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> Path:
    """The shard above (written with tarfile) made readable by ``shardfeed index``."""
    root = tmp_path_factory.mktemp("grouping")
    shards = root / "shards"
    shards.mkdir()
    with tarfile.open(shards / "other-0.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, (members, _) in SAMPLES.items():
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    report = index_shards(str(shards))  # the manifest beside the shards it names
    assert [p["key"] for p in report.problems] == ["e"]
    return shards


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_reader_rule_and_tool_rule_give_one_answer(key):
    want = SAMPLES[key][1]
    if want is None:
        with pytest.raises(CorruptDataError, match="2 image members"):
            parts_to_raw(key, _parts(key), {}, "shard.tar")
        with pytest.raises(CorruptDataError, match="2 image members"):
            parts_to_sample(key, _parts(key), source="shard.tar")
        return
    data, ext, label, meta = parts_to_raw(key, _parts(key), {}, "shard.tar")
    assert (data, ext, label, meta) == (*want, None)
    s = parts_to_sample(key, _parts(key), source="shard.tar")
    assert (s.data, s.ext, s.label, s.meta) == (*want, {})


def test_reader_check_and_convert_agree_on_the_shard(indexed, tmp_path):
    want = [(k, *v[1]) for k, v in SAMPLES.items() if v[1] is not None]
    ds = open_dataset(str(indexed), decode=False, shuffle=False)
    assert [(s.key, s.data, s.ext, s.label) for s in ds] == want
    assert [(s.key, s.data, s.ext, s.label) for _, s in iter_raw_samples(indexed)] == want
    report = check_dataset(indexed)
    assert report.ok, report.problems
    assert report.num_samples_found == len(want)
    out = tmp_path / "lmdb"
    convert_dataset(str(indexed), out, format="lmdb")
    lmdb = open_dataset(str(out), decode=False, shuffle=False)
    assert sorted((s.key, s.data, s.ext, s.label) for s in lmdb) == want
