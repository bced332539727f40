"""The local shard cache (``cache_dir``, ``cache_limit``) against a real HTTP server on 127.0.0.1
that counts the requests it answers: one download per file, shared by processes, bounded by the
limit, damaged copies fetched again. Expected bytes come from the shard files themselves (tarfile)."""

from __future__ import annotations

import collections
import fcntl
import hashlib
import http.server
import json
import logging
import multiprocessing as mp
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.format.manifest import Manifest
from shardfeed.readers.storage.http_io import HttpLocation
from shardfeed.readers.storage.cached_location import CachedLocation
from shardfeed.readers.storage.shard_cache import CacheLockTimeout, ShardCache, VERIFIED_MTIME_NS, dataset_identity

pytestmark = pytest.mark.network


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    """Counts the GET requests per path (``gets``, a class attribute set per server); waits
    ``delay_s`` before answering a shard or an index, so concurrent readers overlap."""

    gets: collections.Counter
    delay_s = 0.0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        with self.lock:
            self.gets[self.path] += 1
        if self.path.endswith((".tar", ".sfidx")) and self.delay_s:
            time.sleep(self.delay_s)
        super().do_GET()


def _serve(start_http_server, root: Path, delay_s: float = 0.0) -> tuple[str, collections.Counter]:
    gets: collections.Counter = collections.Counter()
    handler = type("Handler", (_CountingHandler,), {"gets": gets, "delay_s": delay_s})
    return start_http_server(root, handler), gets


def _data_files(gets: collections.Counter) -> dict[str, int]:
    """GETs of shards and indexes (the manifest excluded), by file name."""
    return {path.rsplit("/", 1)[1]: n for path, n in gets.items() if path.endswith((".tar", ".sfidx")) and n}


def _dataset_files(root: Path) -> set[str]:
    m = json.loads((root / "manifest.json").read_text())
    return {s["name"] for s in m["shards"]} | {s["index"] for s in m["shards"]}


def _tar_images(root: Path) -> list[str]:
    """sha256 of every image member of the dataset's shards, in file order (read with tarfile)."""
    out = []
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as t:
            for member in t.getmembers():
                if member.name.rsplit(".", 1)[-1] in ("jpg", "png"):
                    out.append(hashlib.sha256(t.extractfile(member).read()).hexdigest())
    return out


def _images(ds) -> list[str]:
    return [hashlib.sha256(s.data).hexdigest() for s in ds]


def _read_images(source: str, **kw) -> list[str]:
    return _images(open_dataset(source, decode=False, shuffle=False, **kw))


def _cached_size(cache_dir: Path) -> int:
    return sum(p.stat().st_size for p in cache_dir.iterdir() if p.name.endswith((".data", ".tmp")))


def test_second_epoch_fetches_no_shard_bytes(start_http_server, packed_wds, tmp_path):
    url, gets = _serve(start_http_server, packed_wds)
    cache = tmp_path / "cache"
    ds = open_dataset(f"{url}/", decode=False, shuffle=False, cache_dir=cache)
    expected = _tar_images(packed_wds)
    assert _images(ds) == expected
    assert _data_files(gets) == {name: 1 for name in _dataset_files(packed_wds)}  # each file once
    gets.clear()
    assert _images(ds) == expected
    assert _data_files(gets) == {}
    # a new open (another run) reads the manifest again, and no shard
    assert _read_images(f"{url}/", cache_dir=cache) == expected
    assert _data_files(gets) == {}
    # cache names are hashes: no name of the dataset's files appears in the cache folder
    assert not any(".tar" in p.name or "shard-" in p.name for p in cache.iterdir())


def test_loader_workers_and_local_datasets(start_http_server, packed_wds, tmp_path):
    from shardfeed.readers import make_loader

    url, gets = _serve(start_http_server, packed_wds)
    cache = tmp_path / "cache"
    for _ in range(2):
        loader = make_loader(f"{url}/", 8, num_workers=2, cache_dir=cache, cache_limit="10MB", image_size=16)
        assert sum(len(labels) for _, labels in loader) == 60
    assert _data_files(gets) == {name: 1 for name in _dataset_files(packed_wds)}
    # a local dataset is read in place: cache_dir is not used
    local_cache = tmp_path / "unused"
    assert _read_images(str(packed_wds), cache_dir=local_cache) == _tar_images(packed_wds)
    assert not local_cache.exists()


def _read_all_in_child(url: str, cache: str, barrier, results) -> None:
    barrier.wait(timeout=30)
    results.put(len(_read_images(url, cache_dir=cache)))


@pytest.mark.timeout(120)
def test_two_processes_download_each_file_once(start_http_server, packed_wds, tmp_path):
    url, gets = _serve(start_http_server, packed_wds, delay_s=0.05)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_read_all_in_child, args=(f"{url}/", str(tmp_path / "cache"), barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in procs) == [60, 60]
    assert _data_files(gets) == {name: 1 for name in _dataset_files(packed_wds)}


def _location(url: str, cache: ShardCache) -> CachedLocation:
    remote = HttpLocation(f"{url}/")
    return CachedLocation(remote, remote.load_manifest(), cache)


def test_eviction_keeps_the_limit_and_spares_a_shard_being_read(start_http_server, packed_wds, tmp_path):
    url, gets = _serve(start_http_server, packed_wds)
    manifest = json.loads((packed_wds / "manifest.json").read_text())
    shards = manifest["shards"]
    biggest = max(s["num_bytes"] + 8 * s["num_samples"] for s in shards)
    limit = 2 * biggest  # room for two shards and their indexes, not four
    cache = ShardCache(tmp_path / "cache", limit)
    loc = _location(url, cache)
    held_name = shards[0]["name"]
    held, _ = loc.open(held_name)  # being read: never evicted
    held_path = cache.path(loc.dataset_id, held_name)
    for s in shards[1:]:
        for name in (s["name"], s["index"]):
            f, _ = loc.open(name)
            assert f.read() == (packed_wds / name).read_bytes()
            f.close()
            assert _cached_size(cache.directory) <= limit
        assert held_path.exists()
    assert held.read() == (packed_wds / held_name).read_bytes()
    held.close()
    # once closed it may go: reading the others again evicts the least recently used ones
    for s in shards[1:]:
        loc.open(s["name"])[0].close()
    assert _cached_size(cache.directory) <= limit
    assert not held_path.exists()
    # under the limit after a whole epoch through the dataset API too
    assert _read_images(f"{url}/", cache_dir=cache.directory, cache_limit=limit) == _tar_images(packed_wds)
    assert _cached_size(cache.directory) <= limit


def test_limit_below_the_largest_shard_is_refused(start_http_server, packed_wds, tmp_path):
    url, _ = _serve(start_http_server, packed_wds)
    largest = max(s["num_bytes"] for s in json.loads((packed_wds / "manifest.json").read_text())["shards"])
    with pytest.raises(ValueError, match="more than cache_limit"):
        open_dataset(f"{url}/", cache_dir=tmp_path / "c", cache_limit=largest - 1)


@pytest.mark.parametrize("damage", ["truncated", "same size, other bytes"])
def test_a_damaged_copy_is_fetched_again(start_http_server, packed_wds, tmp_path, damage):
    url, gets = _serve(start_http_server, packed_wds)
    cache = ShardCache(tmp_path / "cache")
    manifest = Manifest.from_json((packed_wds / "manifest.json").read_bytes())
    assert manifest.shards[1].sha256  # the manifest records hashes: a changed copy is found by its hash
    assert _read_images(f"{url}/", cache_dir=cache.directory) == _tar_images(packed_wds)
    loc = _location(url, cache)
    victim = cache.path(loc.dataset_id, manifest.shards[1].name)
    data = victim.read_bytes()
    if damage == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    else:
        victim.write_bytes(data[:1024] + bytes(len(data) - 1024))
    gets.clear()
    assert _read_images(f"{url}/", cache_dir=cache.directory) == _tar_images(packed_wds)
    assert _data_files(gets) == {manifest.shards[1].name: 1}
    assert victim.read_bytes() == (packed_wds / manifest.shards[1].name).read_bytes()
    assert victim.stat().st_mtime_ns == VERIFIED_MTIME_NS


def test_a_rewritten_dataset_at_the_same_url_is_not_served_from_old_copies(start_http_server, tiny_image_folder,
                                                                            tmp_path):
    from shardfeed.convert.write.pack import PackOptions, pack

    root = tmp_path / "served"
    pack(tiny_image_folder, root, PackOptions(format="wds", max_count=16, workers=1, seed=0))
    url, gets = _serve(start_http_server, root)
    cache = tmp_path / "cache"
    assert _read_images(f"{url}/", cache_dir=cache) == _tar_images(root)
    before = _tar_images(root)
    pack(tiny_image_folder, root, PackOptions(format="wds", max_count=16, workers=1, seed=1, overwrite=True))
    assert _tar_images(root) != before  # other shard contents under the same file names
    assert _read_images(f"{url}/", cache_dir=cache) == _tar_images(root)


def test_untrusted_names_cannot_leave_the_cache_dir(tmp_path):
    cache = ShardCache(tmp_path / "cache")
    payload = b"x" * 100

    def fetch(out, hasher):
        out.write(payload)
        hasher.update(payload)
        return len(payload)

    for name in ("../../escaped.tar", "/etc/escaped", "a/../../b", "..", "s\0x", "%2e%2e/evil"):
        fd = cache.open("d" * 64, name, num_bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest(),
                        fetch=fetch, where="http://host/" + name)
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    names = [p.name for p in (tmp_path / "cache").iterdir()]
    assert all(p.is_file() and not p.is_symlink() for p in (tmp_path / "cache").iterdir())
    assert all(n == ".shardfeed-cache.lock" or (len(n.split(".")[0]) == 40 and "/" not in n) for n in names)


def test_a_download_that_does_not_match_the_manifest_is_refused(tmp_path):
    from shardfeed.readers.errors import CorruptDataError

    cache = ShardCache(tmp_path / "cache")

    def fetch(out, hasher):
        out.write(b"y" * 10)
        hasher.update(b"y" * 10)
        return 10

    with pytest.raises(CorruptDataError, match="http://host/s.tar: downloaded 10 bytes"):
        cache.open("d" * 64, "s.tar", num_bytes=10, sha256="0" * 64, fetch=fetch, where="http://host/s.tar")
    assert not [p for p in cache.directory.iterdir() if p.name.endswith((".data", ".tmp"))]


def test_waiting_for_another_download_is_bounded(tmp_path):
    cache = ShardCache(tmp_path / "cache", lock_timeout_s=0.2)
    lock_path = cache.directory / (cache.stem("d" * 64, "s.tar") + ".lock")
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process's download (flock: per open file)
    try:
        with pytest.raises(CacheLockTimeout, match=r"waited 0.2 s for another process's download of http://host/s"):
            cache.open("d" * 64, "s.tar", num_bytes=1, sha256=None, fetch=lambda out, h: 0, where="http://host/s")
    finally:
        os.close(held)


def test_credentials_stay_out_of_cache_names_and_logs(start_http_server, packed_wds, tmp_path, caplog):
    url, _ = _serve(start_http_server, packed_wds)
    secret = "Pw-9d1e7SECRET"
    with_user = url.replace("http://", f"http://reader:{secret}@") + "/"
    cache = tmp_path / "cache"
    with caplog.at_level(logging.DEBUG, logger="shardfeed"):
        assert _read_images(with_user, cache_dir=cache) == _tar_images(packed_wds)
        victim = next(p for p in cache.iterdir() if p.name.endswith(".data"))
        victim.write_bytes(b"")  # a damaged copy is logged (naming its URL) and fetched again
        assert _read_images(with_user, cache_dir=cache) == _tar_images(packed_wds)
    assert "fetching it again" in caplog.text
    assert secret not in caplog.text
    assert not any(secret in p.name or "reader" in p.name for p in cache.iterdir())
    # the identity hashes the URL as messages show it (credentials masked): a rotated password keeps the entries
    other = HttpLocation(url.replace("http://", "http://reader:Another-Pw-42@") + "/")
    remote = HttpLocation(with_user)
    assert dataset_identity(remote, remote.load_manifest()) == dataset_identity(other, other.load_manifest())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "fetching it again" in r.getMessage()]
    assert len(warned) == 1


def test_option_checks(packed_wds, tmp_path):
    with pytest.raises(ValueError, match="cache_limit bounds the shard cache: give cache_dir"):
        open_dataset(str(packed_wds), cache_limit=10)
    with pytest.raises(ValueError, match="cache_dir must be a local folder, not a URL"):
        open_dataset(str(packed_wds), cache_dir="s3://bucket/cache")
    with pytest.raises(ValueError, match="cache_limit must be at least 1 byte"):
        open_dataset(str(packed_wds), cache_dir=tmp_path, cache_limit=0)
    with pytest.raises(TypeError, match="cache_limit must be a number of bytes"):
        open_dataset(str(packed_wds), cache_dir=tmp_path, cache_limit=1.5)
    assert ShardCache(tmp_path / "c", "1KiB").limit == 1024
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="choose another cache_dir"):
        ShardCache(tmp_path / "file")


@pytest.mark.timeout(120)
def test_bench_reads_through_the_cache(start_http_server, packed_wds, tmp_path):
    from click.testing import CliRunner

    from shardfeed.convert.cli import main as cli_main

    url, gets = _serve(start_http_server, packed_wds)
    cache = tmp_path / "cache"
    args = ["bench", f"{url}/", "--image-size", "16", "--batch-size", "8", "--warmup", "0", "--batches", "7",
            "--model", "none", "--device", "cpu", "--num-workers", "0", "--no-shuffle", "--cache-dir", str(cache),
            "--cache-limit", "10MB", "--json", str(tmp_path / "r.json")]
    for _ in range(2):
        r = CliRunner().invoke(cli_main, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output
    assert _data_files(gets) == {name: 1 for name in _dataset_files(packed_wds)}


def test_a_full_disk_is_found_before_the_download(tmp_path, monkeypatch):
    import errno

    cache = ShardCache(tmp_path / "cache")
    fetched = []

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(OSError, match="no room for a 4,096-byte file of the shard cache; free some space"):
        cache.open("d" * 64, "s.tar", num_bytes=4096, sha256=None, fetch=lambda out, h: fetched.append(1) or 0,
                   where="http://host/s.tar")
    assert fetched == []
    assert not [p for p in cache.directory.iterdir() if p.name.endswith((".data", ".tmp"))]


def test_what_an_interrupted_download_left_is_removed(tmp_path):
    cache = ShardCache(tmp_path / "cache", limit=10_000)
    stem = cache.stem("d" * 64, "old.tar")
    left = cache.directory / f"{stem}.4242.abcd1234.tmp"  # a download killed mid-way: its lock is free
    left.write_bytes(b"z" * 5000)
    payload = b"p" * 6000

    def fetch(out, hasher):
        out.write(payload)
        hasher.update(payload)
        return len(payload)

    os.close(cache.open("d" * 64, "new.tar", num_bytes=len(payload), sha256=None, fetch=fetch, where="http://h/n"))
    assert not left.exists()
    assert cache.usage() == len(payload)


def test_the_next_shard_is_downloaded_while_one_is_read(start_http_server, packed_wds, tmp_path):
    import pickle

    url, gets = _serve(start_http_server, packed_wds)
    cache = ShardCache(tmp_path / "cache")
    loc = _location(url, cache)
    name = json.loads((packed_wds / "manifest.json").read_text())["shards"][2]["name"]
    loc.open_ahead(name, 0)
    loc.open_ahead(name, 0)  # one at a time: the second call starts nothing while the first runs
    loc._ahead.join(30)
    assert cache.path(loc.dataset_id, name).read_bytes() == (packed_wds / name).read_bytes()
    f, _ = loc.open(name)
    f.close()
    assert _data_files(gets) == {name: 1}
    clone = pickle.loads(pickle.dumps(loc))  # DataLoader workers receive it pickled
    assert clone._ahead is None and clone.dataset_id == loc.dataset_id
