"""The three sources (folder, WebDataset, LMDB) and the memory cache give the same samples.

Expectations come from the image folder itself: original bytes, labels from the sorted class
folders, pixels from an independent Pillow decode under the documented rule (RGB; greyscale
replicated; alpha composited over white with ``(c * a + 255 * (255 - a) + 127) // 255``).
"""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest
import torch

from shardfeed.readers import make_loader, open_dataset, to_device
from shardfeed.readers.errors import CorruptDataError, DataSourceError, IncompleteDatasetError, ManifestError
from shardfeed.readers.format.manifest import Sample


def pillow_rgb(data: bytes) -> np.ndarray:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    if img.mode == "RGBA":
        a = np.asarray(img, dtype=np.uint32)
        rgb, alpha = a[..., :3], a[..., 3:4]
        return ((rgb * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    return np.asarray(img.convert("RGB"))


def _items(ds):
    if isinstance(ds, torch.utils.data.IterableDataset):
        return list(ds)
    return [ds[i] for i in range(len(ds))]


def _by_path(source, **kw):
    """{path: (label, pixels HWC, raw bytes)} from a raw pass and a decoded pass in the same order."""
    raw = _items(open_dataset(source, decode=False, shuffle=False, **kw))
    dec = _items(open_dataset(source, decode=True, shuffle=False, **kw))
    assert len(raw) == len(dec)
    out = {}
    for s, (img, label) in zip(raw, dec):
        assert isinstance(s, Sample)
        assert isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.shape[0] == 3
        assert label == s.label
        out[s.meta["path"]] = (label, img.permute(1, 2, 0).numpy(), s.data)
    return out


@pytest.fixture(scope="module")
def sources(tiny_image_folder, packed_wds, packed_lmdb):
    return {"folder": (tiny_image_folder, {}), "wds": (packed_wds, {}),
            "wds-memory": (packed_wds, {"cache": "memory"}),
            "lmdb": (packed_lmdb, {}), "lmdb-memory": (packed_lmdb, {"cache": "memory"})}


def test_sources_identical_and_equal_to_pillow(sources, tiny_folder_expected):
    expected_pixels = {p: pillow_rgb(b) for p, (b, _) in tiny_folder_expected.items()}
    for name, (src, kw) in sources.items():
        got = _by_path(src, **kw)
        assert set(got) == set(tiny_folder_expected), name
        for path, (label, pixels, data) in got.items():
            exp_bytes, exp_label = tiny_folder_expected[path]
            assert label == exp_label, (name, path)
            assert data == exp_bytes, (name, path)
            assert pixels.shape == expected_pixels[path].shape, (name, path)
            assert np.array_equal(pixels, expected_pixels[path]), (name, path)


def test_raw_samples_carry_key_ext_meta(packed_wds, tiny_folder_expected):
    ds = open_dataset(packed_wds, decode=False, shuffle=False)
    keys = [s.key for s in ds]
    assert keys == sorted(keys) and len(set(keys)) == 60
    for s in ds:
        assert s.ext in ("jpg", "png")
        assert s.meta["class"] == s.meta["path"].split("/")[0]
        assert s.data == tiny_folder_expected[s.meta["path"]][0]


def test_loader_batches_and_labels(sources, tiny_folder_expected):
    expected_labels = sorted(lbl for _, lbl in tiny_folder_expected.values())
    for name, (src, kw) in sources.items():
        loader = make_loader(src, 8, num_workers=0, image_size=16, **kw)
        assert len(loader) == 8
        batches = list(loader)
        assert len(batches) == 8, name
        for x, y in batches:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, 16, 16) and y.dtype == torch.int64
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == expected_labels, name


def test_epochs_reshuffle_and_set_epoch(packed_wds):
    loader = make_loader(packed_wds, 60, num_workers=0, decode=False, shuffle_buffer=10)
    e0 = [s.key for s in next(iter(loader))]
    e1 = [s.key for s in next(iter(loader))]
    assert sorted(e0) == sorted(e1) and e0 != e1
    loader.set_epoch(0)
    assert [s.key for s in next(iter(loader))] == e0


def test_folder_takes_packed_class_map(tiny_image_folder, packed_wds, tmp_path):
    # a folder with only two of the classes gets the packed dataset's labels
    import shutil

    part = tmp_path / "part"
    shutil.copytree(tiny_image_folder / "eel", part / "eel")
    ds = open_dataset(part, decode=False, class_to_idx=packed_wds)
    assert {ds[i].label for i in range(len(ds))} == {2}
    assert open_dataset(part, decode=False)[0].label == 0


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_batch_counts_same_for_any_num_workers(packed_wds, packed_root):
    srcs = [packed_wds] + ([packed_root / "lmdb"] if (packed_root / "lmdb").exists() else [])
    for src in srcs:
        counts = {}
        for nw in (0, 1, 4):
            loader = make_loader(src, 7, num_workers=nw, decode=False, persistent_workers=False)
            batches = list(loader)
            counts[nw] = (len(loader), len(batches), sum(len(b) for b in batches),
                          len({s.key for b in batches for s in b}))
        assert counts[0] == counts[1] == counts[4] == (9, 9, 60, 60), (src, counts)


def test_refusals(packed_wds, tmp_path):
    import shutil

    # no manifest but shards and the pack's state: an interrupted pack
    d = tmp_path / "incomplete"
    shutil.copytree(packed_wds, d)
    (d / "manifest.json").unlink()
    (d / ".shardfeed-pack").mkdir()
    with pytest.raises(IncompleteDatasetError, match="resume"):
        open_dataset(d)
    # shards alone (another tool's, or the manifest lost): `shardfeed index`, which --resume is not
    (d / ".shardfeed-pack").rmdir()
    with pytest.raises(ManifestError, match=rf"no manifest.json .*`shardfeed index {d}`") as err:
        open_dataset(d)
    assert "--resume" not in str(err.value)
    # unknown format / version
    for change, pattern in [({"format": "parquet"}, "format 'parquet'"), ({"version": 99}, "version 99")]:
        d = tmp_path / f"bad-{len(change)}-{pattern[:3]}"
        shutil.copytree(packed_wds, d)
        m = json.loads((d / "manifest.json").read_text())
        m.update(change)
        (d / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(ManifestError, match=pattern):
            open_dataset(d)
    # a missing shard and a truncated one
    d = tmp_path / "missing"
    shutil.copytree(packed_wds, d)
    (d / "shard-000001.tar").unlink()
    ds = open_dataset(d, decode=False)  # opening stats no shard: each is checked as it is opened for reading
    with pytest.raises(DataSourceError, match=r"shard-000001\.tar: listed in manifest\.json but missing"):
        list(ds)
    d = tmp_path / "truncated"
    shutil.copytree(packed_wds, d)
    with open(d / "shard-000002.tar", "r+b") as f:
        f.truncate(1024)
    with pytest.raises(CorruptDataError, match=r"shard-000002\.tar: 1024 bytes on disk"):
        list(open_dataset(d, decode=False))
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "nope")


def _corrupt_copy(packed_wds, tmp_path):
    """A copy whose shard 0 has the image bytes of its second sample garbled (same size)."""
    import shutil

    from shardfeed.readers.format.offset_index import read_index

    d = tmp_path / "corrupt"
    shutil.copytree(packed_wds, d)
    off = read_index(d / "shard-000000.sfidx")[1]
    raw = bytearray((d / "shard-000000.tar").read_bytes())
    name = raw[off:off + 100].split(b"\0")[0].decode()
    size = int(raw[off + 124:off + 135], 8)
    raw[off + 512:off + 512 + size] = b"\x00" * size
    (d / "shard-000000.tar").write_bytes(bytes(raw))
    return d, name.split(".")[0]


def test_on_error(packed_wds, tmp_path, caplog):
    d, key = _corrupt_copy(packed_wds, tmp_path)
    with pytest.raises(CorruptDataError, match=rf"shard-000000\.tar key {key}"):
        list(open_dataset(d, shuffle=False))
    caplog.set_level(logging.WARNING, logger="shardfeed.readers")
    ds = open_dataset(d, shuffle=False, on_error="skip")
    assert len(list(ds)) == 59
    msgs = [r.getMessage() for r in caplog.records]
    assert any(key in m and "skipping" in m for m in msgs)
    assert any("1 samples skipped in epoch 0" in m for m in msgs)


def test_memory_cache_refuses_when_it_does_not_fit(packed_wds):
    from shardfeed.readers.sources.memory_cache import MemoryCachedSource

    src = open_dataset(packed_wds)
    with pytest.raises(MemoryError, match="cache='memory' needs about"):
        MemoryCachedSource.from_source(src, available_bytes=1000)


def test_to_device_cpu():
    x = torch.tensor([[[[0, 255]], [[51, 102]], [[255, 0]]]], dtype=torch.uint8)  # [1, 3, 1, 2]
    y = torch.tensor([3])
    xf, yf = to_device((x, y), "cpu")
    assert xf.dtype == torch.float32 and torch.allclose(xf, x.float() / 255) and yf.tolist() == [3]
    mean, std = (0.5, 0.2, 0.1), (0.5, 0.5, 0.25)
    xn, _ = to_device((x, y), "cpu", mean=mean, std=std, dtype=torch.float64, channels_last=True)
    ref = (x.double() / 255 - torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        std, dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.allclose(xn, ref)
    assert xn.is_contiguous(memory_format=torch.channels_last)


def test_shards_from_other_tools_without_index(tiny_folder_expected, tmp_path):
    """PAX tar shards written by tarfile, no .idx: read whole and by ranges (skipping samples)."""
    import hashlib
    import tarfile

    from shardfeed.readers.format.manifest import Manifest, ShardEntry

    items = sorted(tiny_folder_expected.items())
    classes = sorted({p.split("/")[0] for p, _ in items})
    shards = []
    for si in range(2):
        name = f"other-{si}.tar"
        with tarfile.open(tmp_path / name, "w", format=tarfile.PAX_FORMAT) as t:
            for i, (path, (data, label)) in enumerate(items[si * 30:(si + 1) * 30]):
                key = f"sub/sample{si * 30 + i:05d}"
                ext = path.rsplit(".", 1)[1]
                for e, payload in ((ext, data), ("cls", str(label).encode()),
                                   ("json", json.dumps({"path": path, "class": path.split("/")[0]}).encode())):
                    ti = tarfile.TarInfo(f"{key}.{e}")
                    ti.size = len(payload)
                    t.addfile(ti, io.BytesIO(payload))
        raw = (tmp_path / name).read_bytes()
        shards.append(ShardEntry(name, 30, len(raw), hashlib.sha256(raw).hexdigest()))
    Manifest("webdataset", 60, classes, {c: i for i, c in enumerate(classes)}, shards).write(tmp_path)
    whole = {s.meta["path"]: (s.data, s.label) for s in open_dataset(tmp_path, decode=False, shuffle=False)}
    assert whole == tiny_folder_expected
    parts = [list(open_dataset(tmp_path, decode=False, rank=r, world_size=4)) for r in range(4)]
    assert [len(p) for p in parts] == [15] * 4
    assert sorted(s.meta["path"] for p in parts for s in p) == sorted(tiny_folder_expected)


def test_shuffle_buffer_is_accepted_by_every_source(tiny_image_folder, packed_wds, packed_lmdb):
    """verify/bench pass the same options to both datasets: map-style sources ignore the buffer."""
    from shardfeed.readers import open_dataset

    for src in (tiny_image_folder, packed_wds, packed_lmdb):
        ds = open_dataset(src, decode=False, shuffle_buffer=16)
        items = [ds[i] for i in range(len(ds))] if getattr(ds, "map_style", False) else list(ds)
        assert len(items) == 60
