"""A storage added with ``register_location`` (docs/architecture.md, "A storage backend"): an
in-memory ``mem://`` location over a dict of bytes is packed to, read, staged and checked through
the public API, with no change to shardfeed, and gives the bytes and pixels of the planted files."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.readers.errors import ManifestError, UnsupportedURLError
from shardfeed.readers.format.manifest import MANIFEST_NAME, Manifest
from shardfeed.readers.storage.location import Location, LocationBase
from shardfeed.readers.storage.opener import check_supported, location_schemes, register_location, unregister_location

CLASSES = ("ant", "bee", "cow")


class MemStore:
    """``{"bucket/key": (bytes, metadata)}`` behind a lock (uploads run on several threads)."""

    def __init__(self):
        self.objects: dict[str, tuple[bytes, dict]] = {}
        self.lock = threading.Lock()


class MemLocation(LocationBase):
    """``mem://bucket/prefix/`` (or ``.../manifest.json``) over a :class:`MemStore`."""

    remote = True
    listable = True
    writable = True

    def __init__(self, url: str, store: MemStore):
        rest = url[len("mem://"):]
        if rest.endswith(".json"):
            rest, _, self.manifest_name = rest.rpartition("/")
        else:
            self.manifest_name = MANIFEST_NAME
        self.prefix = rest.strip("/") + "/"
        self.store = store

    def __str__(self) -> str:
        return "mem://" + self.prefix

    def url(self, name: str) -> str:
        return "mem://" + self.prefix + name

    where = url

    def _get(self, name: str) -> tuple[bytes, dict]:
        with self.store.lock:
            try:
                return self.store.objects[self.prefix + name]
            except KeyError:
                raise FileNotFoundError(f"{self.url(name)}: not found") from None

    def read_bytes(self, name: str, *, max_bytes: int = 1 << 30, what: str = "the file") -> bytes:
        data = self._get(name)[0]
        if len(data) > max_bytes:
            raise ValueError(f"{self.url(name)}: {what} is larger than {max_bytes} bytes")
        return data

    def open(self, name: str, start: int = 0, end: int | None = None):
        data = self._get(name)[0]
        return io.BytesIO(data[start:end]), start

    def head_size(self, name: str) -> int:
        return len(self._get(name)[0])

    def list_objects(self, sub: str = ""):
        base = self.prefix + sub
        with self.store.lock:
            items = sorted(self.store.objects.items())
        return [(k[len(self.prefix):], len(v[0]), 0) for k, v in items if k.startswith(base)]

    def load_manifest(self, *, check_files: bool = True) -> Manifest:
        try:
            raw = self.read_bytes(self.manifest_name)
        except FileNotFoundError:
            raise ManifestError(f"{self.url(self.manifest_name)}: not found") from None
        manifest = Manifest.from_json(raw, self.url(self.manifest_name))
        if check_files:
            sizes = self.list_sizes()
            for s in manifest.shards:
                if sizes.get(s.name) != s.num_bytes:
                    raise ManifestError(f"{self.url(s.name)}: missing or of another size")
        return manifest

    def put_bytes(self, name: str, data: bytes) -> None:
        with self.store.lock:
            self.store.objects[self.prefix + name] = (bytes(data), {})

    def put_file(self, name: str, path, *, sha256: str | None = None) -> None:
        data = Path(path).read_bytes()
        with self.store.lock:
            self.store.objects[self.prefix + name] = (data, {"sha256": sha256} if sha256 else {})

    def delete(self, name: str) -> None:
        with self.store.lock:
            self.store.objects.pop(self.prefix + name, None)

    def head(self, name: str) -> dict:
        return dict(self._get(name)[1])


@pytest.fixture
def mem_store():
    store = MemStore()
    register_location("mem", lambda url, **_options: MemLocation(str(url), store))
    try:
        yield store
    finally:
        unregister_location("mem")


@pytest.fixture
def planted(tmp_path) -> tuple[Path, dict[str, tuple[np.ndarray, int]]]:
    """An image folder of lossless PNGs (8 x 6 px, random pixels): ``(root, {rel: (CHW pixels, label)})``."""
    rng = np.random.default_rng(2024)
    root = tmp_path / "images"
    expected = {}
    for label, cls in enumerate(CLASSES):  # class indexes: the sorted folder names
        (root / cls).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.png")
            expected[f"{cls}/{i}.png"] = (pixels.transpose(2, 0, 1).copy(), label)
    return root, expected


def test_a_registered_scheme_is_accepted_and_unregistering_refuses_it_again(mem_store):
    assert "mem" in location_schemes()
    check_supported("mem://bucket/x")  # accepted: the allow list is the table
    from shardfeed.readers.storage.opener import open_location

    loc = open_location("mem://bucket/x/")
    assert isinstance(loc, Location) and loc.writable and loc.listable
    unregister_location("mem")
    try:
        with pytest.raises(UnsupportedURLError, match=r"mem:// URLs are not supported"):
            check_supported("mem://bucket/x")
    finally:
        register_location("mem", lambda url, **_o: MemLocation(str(url), mem_store))


def test_http_says_it_cannot_list():
    from shardfeed.readers.storage.opener import open_location

    loc = open_location("http://127.0.0.1:9/data/")
    assert not loc.listable and not loc.writable and loc.remote
    with pytest.raises(UnsupportedURLError, match="cannot list"):
        loc.list_sizes()


def test_pack_read_stage_and_check_through_a_registered_location(mem_store, planted, tmp_path):
    from shardfeed.convert import PackOptions, check_dataset, pack, stage
    from shardfeed.readers import make_loader, open_dataset

    src, expected = planted
    opts = PackOptions(format="wds", max_count=4, workers=1)
    report = pack(src, "mem://bucket/train", opts)
    assert report.output == "mem://bucket/train/"
    local = tmp_path / "local"
    pack(src, local, opts)

    # the uploaded shards and offset indexes are the bytes of a local pack of the same folder
    local_manifest = Manifest.from_json((local / MANIFEST_NAME).read_bytes(), "local")
    names = [n for s in local_manifest.shards for n in (s.name, s.index) if n]
    assert len(local_manifest.shards) == 4  # 15 images, 4 a shard
    for name in names:
        assert mem_store.objects[f"bucket/train/{name}"][0] == (local / name).read_bytes(), name
    for s in local_manifest.shards:  # each uploaded with its sha256, computed here from the local file
        assert mem_store.objects[f"bucket/train/{s.name}"][1]["sha256"] == \
            hashlib.sha256((local / s.name).read_bytes()).hexdigest()
    assert f"bucket/train/{MANIFEST_NAME}" in mem_store.objects
    assert not any(".shardfeed-pack" in k for k in mem_store.objects)  # the pack's record is gone

    # read back: exactly the planted images' pixels and labels
    want = sorted((label, pixels.tobytes()) for pixels, label in expected.values())
    ds = open_dataset("mem://bucket/train")
    assert sorted((int(label), np.asarray(img).tobytes()) for img, label in ds) == want
    got = []
    for images, labels in make_loader("mem://bucket/train", 3, num_workers=0, shuffle=False):
        for img, label in zip(images, labels):
            got.append((int(label), np.asarray(img).tobytes()))
    assert sorted(got) == want

    # stage to a local folder: the files of the local pack, the manifest as uploaded
    staged = tmp_path / "staged"
    st = stage("mem://bucket/train", staged)
    assert st.ok, st.problems
    for name in names:
        assert (staged / name).read_bytes() == (local / name).read_bytes(), name
    assert (staged / MANIFEST_NAME).read_bytes() == mem_store.objects[f"bucket/train/{MANIFEST_NAME}"][0]

    # check: passes, then names the shard whose byte was flipped
    ok = check_dataset("mem://bucket/train")
    assert ok.ok, ok.problems
    victim = local_manifest.shards[2].name
    key = f"bucket/train/{victim}"
    data, meta = mem_store.objects[key]
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    mem_store.objects[key] = (bytes(flipped), meta)
    bad = check_dataset("mem://bucket/train")
    assert not bad.ok
    assert {p["shard"] for p in bad.problems} == {victim}
    assert any(victim in p["problem"] for p in bad.problems)


def test_lmdb_is_refused_for_a_writable_remote_location(mem_store, planted):
    from shardfeed.convert import PackOptions, pack

    src, _ = planted
    with pytest.raises(UnsupportedURLError, match="LMDB dataset is written to a local disk only"):
        pack(src, "mem://bucket/lmdb", PackOptions(format="lmdb"))
    assert not mem_store.objects


def test_a_read_only_location_is_refused_as_pack_output(planted):
    from shardfeed.convert import PackOptions, pack

    src, _ = planted
    with pytest.raises(UnsupportedURLError, match="cannot be written to"):
        pack(src, "http://127.0.0.1:9/out/", PackOptions(format="wds"))
    assert os.path.isdir(src)


def test_cli_storage_options_are_passed_to_the_location_and_nothing_keeps_them(mem_store, planted, tmp_path):
    from click.testing import CliRunner

    from shardfeed.convert import PackOptions, pack
    from shardfeed.convert.cli import main as cli_main
    from shardfeed.readers.storage.opener import open_location

    src, _ = planted
    pack(src, "mem://bucket/train", PackOptions(format="wds", max_count=8, workers=1))
    seen: list = []

    def factory(url, *, storage_options=None, **_policy):
        seen.append(dict(storage_options or {}))
        return MemLocation(str(url), mem_store)

    register_location("mem", factory, replace=True)
    staged = tmp_path / "staged"
    for args in (["check", "mem://bucket/train"], ["inspect", "mem://bucket/train"],
                 ["stage", "mem://bucket/train", str(staged)]):
        seen.clear()
        r = CliRunner().invoke(cli_main, [*args, "--storage-option", "region_name=mars-1"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert seen and all(o == {"region_name": "mars-1"} for o in seen), (args, seen)
    seen.clear()
    open_location("mem://bucket/train")  # a later call without options gets none: no process-wide state
    assert seen == [{}]


def test_only_the_opener_table_and_the_s3_backend_name_the_s3_scheme():
    import re

    root = Path(__file__).resolve().parents[2]
    allowed = {"readers/storage/objstore.py", "readers/storage/store_urls.py",
               "readers/storage/opener.py"}  # the s3 backend, the table
    pattern = re.compile(r"""[=!]= ?["']s3["']|["']s3["'] ?[=!]=|StoreLocation\(|hasattr\([^)]*list_objects""")
    found = []
    for folder in ("convert", "readers"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "scheme tests outside the opener's table:\n" + "\n".join(found)


@pytest.mark.parametrize("scheme", ["file", "FILE"])
def test_the_file_scheme_cannot_be_replaced_or_unregistered(scheme, planted, tmp_path):
    from shardfeed.readers import open_dataset
    from shardfeed.readers.storage.opener import open_location

    called = []
    with pytest.raises(ValueError, match=r"file:// cannot be replaced or unregistered.*local files"):
        register_location(scheme, lambda url, **_o: called.append(url), replace=True)
    with pytest.raises(ValueError, match=r"file:// cannot be replaced or unregistered.*local files"):
        register_location(scheme, lambda url, **_o: called.append(url))
    with pytest.raises(ValueError, match=r"file:// cannot be replaced or unregistered.*local files"):
        unregister_location(scheme)
    assert "file" in location_schemes() and called == []
    # local paths still read as local files: the planted folder packed and read back
    from shardfeed.convert.write.pack import PackOptions, pack

    src, expected = planted
    out = tmp_path / "out"
    pack(src, out, PackOptions(max_count=4))
    assert type(open_location(str(out))).__name__ == "LocalLocation"
    labels = sorted(int(s.label) for s in open_dataset(str(out), decode=False, shuffle=False))
    assert labels == sorted(label for _, label in expected.values()) and called == []
