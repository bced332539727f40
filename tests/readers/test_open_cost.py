"""Opening a local WebDataset costs no call per shard: no ``stat``, no ``open`` of any shard or
offset index (each shard's size is checked with one ``fstat`` as it is opened for reading)."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

NUM_SHARDS = 1000


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    from shardfeed.convert import write_dataset

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    png = buf.getvalue()
    out = tmp_path_factory.mktemp("many") / "wds"
    write_dataset(({"image": png, "ext": "png", "label": i % 2} for i in range(NUM_SHARDS)), out, max_count=1)
    names = {p.name for p in out.iterdir() if p.suffix in (".tar", ".sfidx")}
    assert len([n for n in names if n.endswith(".tar")]) == NUM_SHARDS
    return out, names


def _count_calls(monkeypatch, names):
    hits = []

    def wrap(fn):
        def counted(path, *args, **kwargs):
            if os.path.basename(os.fspath(path)) in names:
                hits.append((fn.__name__, os.fspath(path)))
            return fn(path, *args, **kwargs)
        return counted

    for name in ("stat", "lstat", "open"):
        monkeypatch.setattr(os, name, wrap(getattr(os, name)))
    return hits


def test_opening_a_dataset_of_1000_shards_stats_no_shard(many_shards, monkeypatch):
    from shardfeed.readers import make_loader, open_dataset

    root, names = many_shards
    hits = _count_calls(monkeypatch, names)
    ds = open_dataset(root, decode=False)
    loader = make_loader(root, 4, num_workers=0, decode=False, rank=3, world_size=8)
    assert len(ds) == NUM_SHARDS and len(loader) == -(-(NUM_SHARDS // 8) // 4)
    assert hits == []
    first = next(iter(loader))  # the buffer's first window: the rank's 125 samples, one shard each
    assert len(first) == 4
    touched = {os.path.basename(path).split(".")[0] for _, path in hits}
    assert 0 < len(touched) <= NUM_SHARDS // 8  # only shards of this rank's share


def test_a_shard_of_another_size_is_named_at_its_first_read(many_shards, tmp_path):
    import shutil

    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import CorruptDataError

    root, _ = many_shards
    copy = tmp_path / "wds"
    shutil.copytree(root, copy)
    shard = copy / "shard-000000.tar"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    ds = open_dataset(copy, decode=False, shuffle=False)
    with pytest.raises(CorruptDataError, match=rf"shard-000000\.tar: {size + 512} bytes on disk but {size} in "
                                               r"manifest\.json.*shardfeed check"):
        next(iter(ds))
    assert len(list(open_dataset(copy, decode=False, shuffle=False, check_files=False))) == NUM_SHARDS


def test_a_missing_offset_index_is_named_at_its_shards_first_read(many_shards, tmp_path):
    import shutil

    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import DataSourceError

    root, _ = many_shards
    copy = tmp_path / "wds"
    shutil.copytree(root, copy)
    index = next(p for p in sorted(copy.iterdir()) if p.suffix == ".sfidx")
    index.unlink()
    ds = open_dataset(copy, decode=False, shuffle=False)
    with pytest.raises(DataSourceError, match=rf"{index.name}: offset index missing; rebuild it with `shardfeed index"):
        list(ds)
