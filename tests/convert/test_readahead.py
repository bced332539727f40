"""Read-ahead: bounded concurrent reads, results in input order, same bytes.

Unit tests of :func:`shardfeed.convert.write.readahead.read_ahead` with real threads (reads made to
finish out of order with events, memory and concurrency bounds checked from inside the reads),
and packs with read-ahead on vs off compared byte for byte, and against the source files.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.write.readahead import read_ahead
from shardfeed.convert.write.scan import scan_image_folder
from shardfeed.readers.errors import SourceChangedError


def test_order_preserved_when_reads_complete_out_of_order():
    n = 12
    done = [threading.Event() for _ in range(n)]
    finish_order = []
    lock = threading.Lock()

    def read(i: int) -> str:
        # item i waits until item i+1 finished (the last one goes first): completion order n-1 .. 0
        if i + 1 < n:
            assert done[i + 1].wait(10)
        with lock:
            finish_order.append(i)
        done[i].set()
        return f"value-{i}"

    got = [(r.item, r.value, r.error) for r in read_ahead(range(n), read, max_in_flight=n, batch=1)]
    assert finish_order == list(range(n - 1, -1, -1))  # they really completed in reverse
    assert got == [(i, f"value-{i}", None) for i in range(n)]


@pytest.mark.parametrize("batch", [1, 3])
def test_memory_and_concurrency_bounds(batch):
    sizes = [100, 250, 40, 900, 60, 60, 60, 300, 10, 500, 120, 80] * 3
    budget, threads = 1000, 4
    state = {"held": 0, "max_held": 0, "running": 0, "max_running": 0}
    lock = threading.Lock()

    def read(i: int) -> bytes:
        with lock:  # a read holds its bytes from its start until the consumer takes them
            state["held"] += sizes[i]
            state["max_held"] = max(state["max_held"], state["held"])
            state["running"] += 1
            state["max_running"] = max(state["max_running"], state["running"])
        threading.Event().wait(0.002)
        with lock:
            state["running"] -= 1
        return bytes([i % 256]) * sizes[i]

    out = []
    for r in read_ahead(range(len(sizes)), read, max_in_flight=threads, max_bytes_in_flight=budget,
                        size_of=sizes.__getitem__, batch=batch):
        with lock:
            state["held"] -= sizes[r.item]
        out.append(r.value)
    assert out == [bytes([i % 256]) * s for i, s in enumerate(sizes)]
    assert state["max_held"] <= budget
    assert 1 < state["max_running"] <= threads  # concurrent, and never more than asked


def test_item_larger_than_the_budget_is_read_alone():
    sizes = [10, 5000, 10, 10]
    seen = []
    for r in read_ahead(range(4), lambda i: i, max_in_flight=4, max_bytes_in_flight=100,
                        size_of=sizes.__getitem__, batch=1):
        seen.append(r.value)
    assert seen == [0, 1, 2, 3]


def test_errors_come_back_in_the_failed_items_place():
    def read(i: int) -> int:
        if i in (3, 7):
            raise OSError(f"item {i}: cannot open")
        return i * 10

    for threads in (0, 4):
        res = list(read_ahead(range(10), read, max_in_flight=threads, batch=2))
        assert [r.item for r in res] == list(range(10))
        assert [str(r.error) if r.error else r.value for r in res] == [
            0, 10, 20, "item 3: cannot open", 40, 50, 60, "item 7: cannot open", 80, 90]


def test_closing_early_stops_the_readers():
    started = []
    gen = read_ahead(range(1000), lambda i: started.append(i) or i, max_in_flight=4, batch=2)
    assert next(gen).value == 0
    gen.close()  # waits for the running reads, cancels the rest
    n = len(started)
    assert n < 1000
    threading.Event().wait(0.05)
    assert len(started) == n  # nothing runs after close


def _tree_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.fixture
def reads_count_as_slow(monkeypatch):
    """Every read counts as waiting on storage, so a pack (workers=1, in this process) goes to the
    reader threads after its first block: the threaded path runs on these small local files."""
    from shardfeed.convert.write import readahead

    monkeypatch.setattr(readahead, "ADAPTIVE_BASE_S", -1.0)


@pytest.mark.parametrize("decode_check", [False, True])
def test_pack_bytes_identical_with_read_ahead_on_and_off(tiny_image_folder, tiny_folder_expected, tmp_path,
                                                         decode_check, reads_count_as_slow):
    outs = {}
    for n in (0, 1, 3, 16):
        out = tmp_path / f"ra{n}"
        pack(tiny_image_folder, out, PackOptions(workers=1, max_count=17, read_ahead=n, decode_check=decode_check))
        outs[n] = _tree_bytes(out)
    assert len([k for k in outs[0] if k.endswith(".tar")]) == 4
    for n in (1, 3, 16):
        assert outs[n] == outs[0]
    # and the shards hold the original files' bytes (read back with the standard library)
    import json
    import tarfile

    manifest = json.loads(outs[16]["manifest.json"])
    stored = {}
    for entry in manifest["shards"]:
        with tarfile.open(tmp_path / "ra16" / entry["name"]) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            if name.endswith(".json"):
                meta = json.loads(data)
                key = name[:-5]
                img = next(v for k, v in members.items() if k.startswith(key + ".") and k[len(key) + 1:]
                           in ("jpg", "png"))
                stored[meta["path"]] = (img, int(members[key + ".cls"]))
    assert stored == tiny_folder_expected


def _small_folder(root: Path, n: int = 30) -> Path:
    from PIL import Image

    for i in range(n):
        p = root / f"c{i % 3}" / f"{i:03d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i, 8), (i * 7 % 256, 0, 0)).save(p)
    return root


@pytest.mark.parametrize("read_ahead_n", [0, 8])
def test_unreadable_file_reported_for_the_right_file(tmp_path, read_ahead_n, reads_count_as_slow):
    root = _small_folder(tmp_path / "src")
    scan = scan_image_folder(root)
    # vanished after the scan: unreadable; 15th in sorted order, so read by a thread (after the
    # first inline block of 8) when read-ahead is on
    (root / "c1" / "013.png").unlink()
    with pytest.raises(SourceChangedError, match=r"c1/013\.png: disappeared"):
        pack(root, tmp_path / "o", PackOptions(workers=1, read_ahead=read_ahead_n, shuffle=False), scan=scan)
    assert not (tmp_path / "o" / "manifest.json").exists()
    report = pack(root, tmp_path / "o2", PackOptions(workers=1, read_ahead=read_ahead_n, on_error="skip",
                                                     shuffle=False), scan=scan)
    assert [s["path"] for s in report.skipped] == ["c1/013.png"]
    assert report.num_samples == 29
    ref = tmp_path / "ref"  # the same skip with serial reads: the same bytes
    pack(root, ref, PackOptions(workers=1, read_ahead=0, on_error="skip", shuffle=False), scan=scan)
    assert _tree_bytes(tmp_path / "o2") == _tree_bytes(ref)


def test_read_ahead_option_validated():
    with pytest.raises(ValueError, match="--read-ahead"):
        PackOptions(read_ahead=-1)
    assert "read_ahead" not in PackOptions().fingerprint_fields()  # the output bytes do not depend on it


def test_cli_read_ahead_flag(tiny_image_folder, tmp_path):
    from click.testing import CliRunner

    from shardfeed.convert.cli import main

    runner = CliRunner()
    outs = {}
    for n in ("0", "32"):
        r = runner.invoke(main, ["pack", str(tiny_image_folder), str(tmp_path / n), "-j", "1", "--read-ahead", n])
        assert r.exit_code == 0, r.output
        outs[n] = _tree_bytes(tmp_path / n)
    assert outs["0"] == outs["32"]
    default = next(p.default for p in main.commands["pack"].params if p.name == "read_ahead")
    assert default == PackOptions().read_ahead  # the CLI's default is the library's
    r = runner.invoke(main, ["pack", str(tiny_image_folder), str(tmp_path / "bad"), "--read-ahead", "-1"])
    assert r.exit_code == 2 and "--read-ahead" in r.output


def test_adaptive_stays_inline_for_fast_reads_and_goes_concurrent_for_slow_ones():
    main = threading.current_thread()
    fast = list(read_ahead(range(200), lambda i: (i, threading.current_thread() is main), max_in_flight=8,
                           adaptive=True))
    assert [r.value for r in fast] == [(i, True) for i in range(200)]  # every read in the caller's thread

    def slow(i: int):
        threading.Event().wait(0.002)  # a storage round trip
        return i, threading.current_thread() is main

    res = [r.value for r in read_ahead(range(40), slow, max_in_flight=8, adaptive=True)]
    assert [v[0] for v in res] == list(range(40))  # order kept across the switch
    assert all(v[1] for v in res[:8])  # the first block inline ...
    assert not any(v[1] for v in res[8:])  # ... then the threads


def test_read_ahead_is_bounded(tmp_path):
    """--read-ahead is a thread count per shard: more than MAX_READ_AHEAD is refused, in the API and the CLI."""
    from click.testing import CliRunner

    from shardfeed.convert.cli import main
    from shardfeed.convert.write.pack import MAX_READ_AHEAD, PackOptions

    assert MAX_READ_AHEAD == 1024
    PackOptions(read_ahead=1024)
    with pytest.raises(ValueError, match="read_ahead"):
        PackOptions(read_ahead=1025)
    with pytest.raises(ValueError, match="read_ahead"):
        PackOptions(read_ahead=-1)
    res = CliRunner().invoke(main, ["pack", str(tmp_path), str(tmp_path / "o"), "--read-ahead", "99999999999"])
    assert res.exit_code == 2 and "--read-ahead" in res.output
