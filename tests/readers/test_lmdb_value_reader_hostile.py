"""``ValueReader`` on damaged ``data.mdb`` files: every read stays inside the file, every walk
ends, and a damaged record raises ``OSError`` (the caller then reads it through the map) while
the undamaged records still read back as their planted bytes."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap

import pytest

lmdb = pytest.importorskip("lmdb")

from shardfeed.readers.storage import lmdb_readahead  # noqa: E402
from shardfeed.readers.storage.lmdb_readahead import ValueReader  # noqa: E402

PS = 4096
_MAIN_DB = 16 + 24 + 48  # the main database's record in a meta page


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``(data.mdb bytes, {key: value}, env.stat())``: 900 keys (a branch page over leaves),
    every 7th value in overflow pages."""
    root = tmp_path_factory.mktemp("hostile_lmdb")
    rng = random.Random(3)
    values = {}
    env = lmdb.open(str(root), map_size=1 << 28, subdir=True)
    with env.begin(write=True) as txn:
        for i in range(900):
            key = b"%06d" % i
            value = rng.randbytes(rng.choice([5000, 9000, 20000]) if i % 7 == 0 else rng.randint(1, 200))
            txn.put(key, value)
            values[key] = value
    stat = env.stat()
    env.close()
    assert stat["depth"] == 2 and stat["overflow_pages"] > 0
    return (root / "data.mdb").read_bytes(), values, stat


class _Env:
    """What ``ValueReader`` asks of an environment: ``stat()`` and ``info()``, here as the damaged
    file's own meta page says (as LMDB opened on that file would report it)."""

    def __init__(self, path, size, fallback):
        self.path, self.size, self.fallback = path, size, fallback

    def stat(self):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            meta = lmdb_readahead._read_meta(fd, self.size)
        except OSError:
            return dict(self.fallback)
        finally:
            os.close(fd)
        return {k: meta[k] for k in self.fallback}

    def info(self):
        return _info_of(self.path, self.size)


def _info_of(path, size) -> dict:
    """``env.info()``'s last transaction and page numbers, as LMDB opened on ``path`` would report."""
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = lmdb_readahead._read_meta(fd, size)
    except OSError:
        return {"last_txnid": -1, "last_pgno": -1}
    finally:
        os.close(fd)
    return {"last_txnid": meta["txnid"], "last_pgno": meta["last_pgno"]}


def _pages(raw):
    """``{pgno: flags}`` of the pages after the two meta pages."""
    out, pgno = {}, 2
    while (pgno + 1) * PS <= len(raw):
        flags = struct.unpack_from("<H", raw, pgno * PS + 10)[0]
        out[pgno] = flags
        pgno += max(1, struct.unpack_from("<I", raw, pgno * PS + 12)[0]) if flags & 4 else 1
    return out


def _read_all(tmp_path, raw, values, stat, monkeypatch):
    """``{key: value or "missing" or "OSError"}`` of every planted key read from ``raw``; asserts
    each ``pread`` lies inside the file."""
    path = tmp_path / "data.mdb"
    path.write_bytes(raw)
    real = os.pread
    outside = []

    def pread(fd, n, offset):
        if offset < 0 or offset + n > len(raw):
            outside.append((offset, n))
        return real(fd, n, offset)

    monkeypatch.setattr(lmdb_readahead.os, "pread", pread)
    try:
        reader = ValueReader(_Env(path, len(raw), stat), path)
    except OSError:
        assert outside == []
        return None
    got = {}
    try:
        for key in values:
            try:
                span = reader.span(key)
                got[key] = "missing" if span is None else reader.read(*span)
            except OSError:
                got[key] = "OSError"
    finally:
        reader.close()
    assert outside == []
    return got


def _edit(raw, *edits):
    data = bytearray(raw)
    for offset, fmt, value in edits:
        struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def test_an_undamaged_file_reads_back_every_planted_value(planted, tmp_path, monkeypatch):
    raw, values, stat = planted
    assert _read_all(tmp_path, raw, values, stat, monkeypatch) == values


@pytest.mark.parametrize("size", [0, 100, 151, PS, 2 * PS - 1])
def test_a_file_too_short_for_its_meta_pages_is_refused_without_reading_past_it(planted, tmp_path, monkeypatch,
                                                                                 size):
    raw, values, stat = planted
    assert _read_all(tmp_path, raw[:size], values, stat, monkeypatch) is None


def _branch(raw):
    (pgno,) = [p for p, flags in _pages(raw).items() if flags & 1]
    lower = struct.unpack_from("<H", raw, pgno * PS + 12)[0]
    return pgno, [struct.unpack_from("<H", raw, pgno * PS + 16 + 2 * i)[0] for i in range((lower - 16) // 2)]


@pytest.mark.parametrize("child", ["itself", "meta", "past the end", "an overflow page"])
def test_a_branch_pointing_anywhere_but_a_child_fails_only_that_subtree(planted, tmp_path, monkeypatch, child):
    raw, values, stat = planted
    pgno, nodes = _branch(raw)
    pages = _pages(raw)
    target = {"itself": pgno, "meta": 1, "past the end": 0xFFFF_FFFF_FFFF,
              "an overflow page": next(p for p, f in pages.items() if f & 4)}[child]
    at = pgno * PS + nodes[1]
    damaged = _edit(raw, (at, "<I", target & 0xFFFFFFFF), (at + 4, "<H", target >> 32))
    got = _read_all(tmp_path, damaged, values, stat, monkeypatch)
    lost = [k for k, v in got.items() if v != values[k]]
    assert lost and all(got[k] == "OSError" for k in lost)
    first_key = damaged[at + 8:at + 8 + struct.unpack_from("<H", damaged, at + 6)[0]]
    assert all(k >= first_key for k in lost)  # the keys under that child, no others
    assert sum(v == values[k] for k, v in got.items()) == len(values) - len(lost) > 0


def test_a_cycle_through_the_root_ends(planted, tmp_path, monkeypatch):
    """Every child of the root is the root itself: each lookup stops after a bounded walk."""
    raw, values, stat = planted
    pgno, nodes = _branch(raw)
    damaged = _edit(raw, *[e for n in nodes for e in ((pgno * PS + n, "<I", pgno), (pgno * PS + n + 4, "<H", 0))])
    got = _read_all(tmp_path, damaged, values, stat, monkeypatch)
    assert set(got.values()) == {"OSError"}


@pytest.mark.parametrize("lower", [0, 15, 16, PS, 0xFFFF])
def test_a_page_with_its_node_count_out_of_range_raises(planted, tmp_path, monkeypatch, lower):
    raw, values, stat = planted
    pgno, _ = _branch(raw)
    got = _read_all(tmp_path, _edit(raw, (pgno * PS + 12, "<H", lower)), values, stat, monkeypatch)
    assert set(got.values()) == {"OSError"}


def _big_node(raw, values):
    """``(leaf page offset, node offset in it, key)`` of a value in overflow pages."""
    for pgno, flags in _pages(raw).items():
        if flags & 2:
            base = pgno * PS
            lower = struct.unpack_from("<H", raw, base + 12)[0]
            for i in range((lower - 16) // 2):
                at = struct.unpack_from("<H", raw, base + 16 + 2 * i)[0]
                if struct.unpack_from("<H", raw, base + at + 4)[0] & 1:
                    ksize = struct.unpack_from("<H", raw, base + at + 6)[0]
                    return base, at, raw[base + at + 8:base + at + 8 + ksize]
    raise AssertionError("no value in overflow pages")


@pytest.mark.parametrize("damage", ["overflow page past the end", "overflow page number 2**64-1",
                                    "overflow page is a leaf", "page count 0", "not an overflow page",
                                    "size 4 GiB", "node offset at the page end", "key size 65535"])
def test_a_damaged_record_raises_and_the_others_read_back(planted, tmp_path, monkeypatch, damage):
    raw, values, stat = planted
    base, at, key = _big_node(raw, values)
    data_at = base + at + 8 + len(key)
    first = struct.unpack_from("<Q", raw, data_at)[0]
    leaf = next(p for p, f in _pages(raw).items() if f & 2)
    index = next(i for i in range(PS) if struct.unpack_from("<H", raw, base + 16 + 2 * i)[0] == at)
    edits = {"overflow page past the end": [(data_at, "<Q", 10 ** 9)],
             "overflow page number 2**64-1": [(data_at, "<Q", 2 ** 64 - 1)],
             "overflow page is a leaf": [(data_at, "<Q", leaf)],
             "page count 0": [(first * PS + 12, "<I", 0)],
             "not an overflow page": [(first * PS + 10, "<H", 2)],
             "size 4 GiB": [(base + at, "<H", 0xFFFF), (base + at + 2, "<H", 0xFFFF)],
             "node offset at the page end": [(base + 16 + 2 * index, "<H", PS - 2)],
             "key size 65535": [(base + at + 6, "<H", 0xFFFF)]}[damage]
    got = _read_all(tmp_path, _edit(raw, *edits), values, stat, monkeypatch)
    assert got[key] in ("OSError", "missing")
    others = {k: v for k, v in got.items() if k != key}
    # at worst the damaged node's page mates are lost too (a node offset or key size breaks the
    # search in its page); never a wrong value
    assert all(v == values[k] or v in ("OSError", "missing") for k, v in others.items())
    assert sum(v == values[k] for k, v in others.items()) >= len(values) - 200


def test_random_damage_never_hangs_or_reads_outside(planted, tmp_path):
    """Bytes of the tree's pages overwritten at random, each file read in a subprocess with a
    timeout: it ends, reads inside the file, and raises nothing but OSError."""
    raw, values, stat = planted
    pages = _pages(raw)
    tree = [0, 1] + [p for p, f in pages.items() if f & 3]
    rng = random.Random(11)
    files = []
    for n in range(12):
        data = bytearray(raw)
        pgno = rng.choice(tree)
        for _ in range(rng.randint(1, 6)):
            data[pgno * PS + rng.choice([rng.randrange(24), rng.randrange(PS)])] = rng.randrange(256)
        path = tmp_path / f"d{n}.mdb"
        path.write_bytes(bytes(data))
        files.append(str(path))
    script = textwrap.dedent(f"""
        import os, sys
        from shardfeed.readers.storage import lmdb_readahead as la
        keys = [b"%06d" % i for i in range(900)]
        stat = {dict(stat)!r}
        for path in sys.argv[1:]:
            size = os.path.getsize(path)
            real = os.pread
            def pread(fd, n, off, size=size, real=real):
                assert 0 <= off and off + n <= size and n <= size, (off, n)
                return real(fd, n, off)
            la.os.pread = pread
            class Env:
                def stat(self):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        m = la._read_meta(fd, size)
                    except OSError:
                        return stat
                    finally:
                        os.close(fd)
                    return {{k: m[k] for k in stat}}
                def info(self):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        m = la._read_meta(fd, size)
                    except OSError:
                        return {{"last_txnid": -1, "last_pgno": -1}}
                    finally:
                        os.close(fd)
                    return {{"last_txnid": m["txnid"], "last_pgno": m["last_pgno"]}}
            try:
                r = la.ValueReader(Env(), path)
            except OSError:
                continue
            for k in keys:
                try:
                    s = r.span(k)
                    if s is not None:
                        r.read(*s)
                except OSError:
                    pass
            r.close()
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", script, *files], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-2000:]


def _hand_built(path, psize: int, values: dict) -> dict:
    """Write an LMDB data file of page size ``psize`` by hand: a branch root (page 2) over one
    leaf per key (pages 3...). Returns the ``env.stat()`` it describes."""
    keys = sorted(values)
    with open(path, "wb") as f:
        for n in (0, 1):  # meta pages
            meta = struct.pack("<QHHHH", n, 0, 0x08, 0, 0)
            meta += struct.pack("<IIQQ", 0xBEEFC0DE, 1, 0, psize * (len(keys) + 3))
            meta += struct.pack("<IHHQQQQQ", psize, 0, 0, 0, 0, 0, 0, 0xFFFFFFFFFFFFFFFF)
            meta += struct.pack("<IHHQQQQQ", 0, 0, 2, 1, len(keys), 0, len(keys), 2)
            meta += struct.pack("<QQ", len(keys) + 2, n)
            f.seek(n * psize)
            f.write(meta)
        nodes, ptrs, upper = b"", [], psize
        for i, key in enumerate(keys):
            child = 3 + i
            node = struct.pack("<HHHH", child & 0xFFFF, (child >> 16) & 0xFFFF, child >> 32,
                               0 if i == 0 else len(key)) + (b"" if i == 0 else key)
            upper -= len(node)
            ptrs.append(upper)
            nodes = node + nodes
        branch = struct.pack("<QHHHH", 2, 0, 0x01, 16 + 2 * len(keys), upper)
        branch += b"".join(struct.pack("<H", p) for p in ptrs)
        f.seek(2 * psize)
        f.write(branch + b"\0" * (upper - len(branch)) + nodes)
        for i, key in enumerate(keys):
            value = values[key]
            node = struct.pack("<HHHH", len(value) & 0xFFFF, len(value) >> 16, 0, len(key)) + key + value
            at = psize - len(node)
            f.seek((3 + i) * psize)
            f.write(struct.pack("<QHHHH", 3 + i, 0, 0x02, 18, at) + struct.pack("<H", at)
                    + b"\0" * (at - 18) + node)
    return {"psize": psize, "depth": 2, "branch_pages": 1, "leaf_pages": len(keys), "overflow_pages": 0,
            "entries": len(keys)}


def test_the_page_cache_stays_within_its_bytes_whatever_the_page_size(tmp_path):
    psize = 65536
    rng = random.Random(8)
    values = {b"%06d" % i: rng.randbytes(rng.randint(1, 3000)) for i in range(300)}
    path = tmp_path / "data.mdb"
    stat = _hand_built(path, psize, values)

    class Env:
        def stat(self):
            return dict(stat)

        def info(self):
            return _info_of(path, os.path.getsize(path))

    reader = ValueReader(Env(), path)
    try:
        assert reader.psize == psize and reader.max_pages * psize <= lmdb_readahead.MAX_PAGE_BYTES
        most = 0
        for key in sorted(values) * 2:
            assert reader.read(*reader.span(key)) == values[key]
            most = max(most, len(reader._pages))
        assert reader.span(b"000300") is None and reader.span(b"") is None
        assert most * psize <= lmdb_readahead.MAX_PAGE_BYTES
    finally:
        reader.close()
