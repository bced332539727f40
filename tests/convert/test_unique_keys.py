"""A streaming WebDataset write refuses two samples with one key, in or out of order, and leaves
no finished dataset; keys in order cost no set of strings."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert import write_dataset
from shardfeed.convert.writers.unique_keys import UniqueKeys


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _samples(keys):
    return [{"image": _png(i), "ext": "png", "label": 0, "key": k} for i, k in enumerate(keys)]


@pytest.mark.parametrize("keys, positions", [
    (["b", "a", "b"], "positions 0 and 2"),
    (["a", "c", "b", "d", "c"], "positions 1 and 4"),
])
def test_a_key_repeated_out_of_order_is_refused_and_no_manifest_is_written(tmp_path, keys, positions):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=f"{positions} have the same key.*keys must be unique"):
        write_dataset(_samples(keys), out, classes=["x"], max_count=2)
    assert not (out / "manifest.json").exists()


def test_a_key_repeated_at_once_is_refused_before_its_sample_is_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="sample key 'a' written twice"):
        write_dataset(_samples(["a", "a"]), out, classes=["x"], max_count=10)
    assert not (out / "manifest.json").exists()


def test_distinct_keys_out_of_order_are_written_as_given(tmp_path):
    keys = ["k3", "k1", "k2", "k0"]
    out = tmp_path / "out"
    write_dataset(_samples(keys), out, classes=["x"], max_count=10)
    with tarfile.open(next(out.glob("*.tar"))) as tar:
        written = [m.name.split(".")[0] for m in tar.getmembers() if m.name.endswith(".png")]
        pngs = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".png")]
    assert written == keys
    assert pngs == [_png(i) for i in range(len(keys))]


def test_keys_that_differ_only_after_a_long_common_prefix_are_told_apart():
    seen = UniqueKeys()
    prefix = "p" * 10_000
    for k in (prefix + "b", prefix + "a", prefix + "c"):
        seen.add(k)
    seen.check()  # no repeat: no error
    seen.add(prefix + "a")
    with pytest.raises(ValueError, match="positions 1 and 3"):
        seen.check()


def test_a_key_too_long_for_a_tar_name_is_refused_by_name_and_the_writer_goes_on(tmp_path):
    from shardfeed.convert.writers.webdataset import WebDatasetWriter
    from shardfeed.readers import open_dataset
    from shardfeed.readers.format.manifest import Sample

    w = WebDatasetWriter.create(tmp_path / "out", classes=["x"])
    w.write(Sample("k1", _png(1), "png", 0, {"path": "a.png"}))
    long_key = "k" * 96  # k….png and k….cls are 100 bytes; k….json is 101
    with pytest.raises(ValueError, match=r"\(b.png\): its member names .* use keys of at most 95 bytes"):
        w.write(Sample(long_key, _png(2), "png", 0, {"path": "b.png"}))
    w.write(Sample("k3", _png(3), "png", 0, {"path": "c.png"}))
    assert w.close().num_samples == 2
    got = [(s.key, bytes(s.data)) for s in open_dataset(tmp_path / "out", decode=False, shuffle=False)]
    assert got == [("k1", _png(1)), ("k3", _png(3))]
