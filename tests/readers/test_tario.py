"""Tar member iteration (readers/format/tario.py) against archives written by tarfile and by our writer."""

from __future__ import annotations

import io
import os
import random
import tarfile

import pytest

from shardfeed.convert.write.tarwriter import TarShardFile
from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.format.offset_index import read_index
from shardfeed.readers.format.tario import iter_members, iter_samples
from shardfeed.readers.format.tario_indexed import SequentialReader, iter_indexed_samples


class NoSeek(io.RawIOBase):
    """A non-seekable stream that returns short reads (like a socket)."""

    def __init__(self, data: bytes, max_read: int = 7000):
        self._b = io.BytesIO(data)
        self._max = max_read

    def readable(self):
        return True

    def readinto(self, b):
        chunk = self._b.read(min(len(b), self._max))
        b[:len(chunk)] = chunk
        return len(chunk)


def _tar(fmt: int, members: list[tuple[str, bytes]], extras: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        if extras:
            d = tarfile.TarInfo("somedir")
            d.type = tarfile.DIRTYPE
            t.addfile(d)
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
        if extras:
            s = tarfile.TarInfo("alink")
            s.type = tarfile.SYMTYPE
            s.linkname = "target"
            t.addfile(s)
    return buf.getvalue()


def _members(rng: random.Random, long_names: bool) -> list[tuple[str, bytes]]:
    out = []
    for i in range(25):
        d = ("deep" * 40 if long_names else "d" * 120) + f"/{i:04d}"
        out.append((f"{d}.jpg", rng.randbytes(rng.randint(0, 3000))))
        out.append((f"{d}.cls", str(i % 3).encode()))
    out.append(("ünï/0099.jpg", b"x" * 512))
    return out


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
@pytest.mark.parametrize("read_bytes", [512, 3000, 1 << 18])
def test_members_match_tarfile(fmt, read_bytes):
    members = _members(random.Random(fmt), long_names=fmt != tarfile.USTAR_FORMAT)
    raw = _tar(fmt, members)
    expected_offsets = {m.name: m.offset for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.isreg()}
    for stream in (io.BytesIO(raw), NoSeek(raw)):
        got = list(iter_members(stream, source="t.tar", read_bytes=read_bytes))
        assert [(n, d) for n, d, _ in got] == members
        assert [o for _, _, o in got] == [expected_offsets[n] for n, _ in members]


def test_pax_size_and_global_header():
    # a PAX size record overrides the header's size field
    big = os.urandom(5000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "global"}) as t:
        ti = tarfile.TarInfo("k.bin")
        ti.size = len(big)
        ti.pax_headers = {"size": str(len(big))}
        t.addfile(ti, io.BytesIO(big))
    got = list(iter_members(io.BytesIO(buf.getvalue()), source="t.tar"))
    assert [(n, d) for n, d, _ in got] == [("k.bin", big)]


def _shard(tmp_path, n=40, seed=0):
    rng = random.Random(seed)
    samples = [(f"{i:09d}", rng.randbytes(rng.randint(1, 4000)), i % 5) for i in range(n)]
    w = TarShardFile(tmp_path, "shard-000000.tar", "shard-000000.idx")
    for key, data, label in samples:
        w.add_sample(key, [("jpg", data), ("cls", str(label).encode()), ("json", b"{}")])
    w.close()
    return tmp_path / "shard-000000.tar", samples


def test_samples_and_ranges(tmp_path):
    path, samples = _shard(tmp_path)
    offsets = read_index(tmp_path / "shard-000000.idx")
    with open(path, "rb") as f:
        got = list(iter_samples(iter_members(f, source=str(path)), source=str(path)))
    assert [k for k, _, _ in got] == [s[0] for s in samples]
    assert [p["jpg"] for _, p, _ in got] == [s[1] for s in samples]
    assert [int(p["cls"]) for _, p, _ in got] == [s[2] for s in samples]
    assert [o for _, _, o in got] == offsets
    raw = path.read_bytes()
    for a, b in [(0, 1), (3, 17), (17, 40), (39, 40)]:
        end = offsets[b] if b < len(offsets) else None
        for stream, kw in [(open(path, "rb"), {}), (NoSeek(raw), {"stream_offset": 0}),
                           (NoSeek(raw[offsets[a]:]), {})]:
            with stream:
                got = list(iter_samples(iter_members(stream, start_offset=offsets[a], end_offset=end,
                                                     source="s", read_bytes=1000, **kw), source="s"))
            assert [k for k, _, _ in got] == [s[0] for s in samples[a:b]]
            assert [p["jpg"] for _, p, _ in got] == [s[1] for s in samples[a:b]]


def test_truncated_shard_never_yields_half_members(tmp_path):
    path, samples = _shard(tmp_path, n=10)
    raw = path.read_bytes()
    sizes = {s[0]: s[1] for s in samples}
    # cut inside headers, data and padding of several members (not inside the final zero blocks)
    for cut in [100, 512, 700, 1500, len(raw) // 2 + 3, len(raw) - 1024 - 1]:
        got = []
        with pytest.raises(CorruptDataError, match=r"t\.tar.*byte offset \d+"):
            for name, data, _ in iter_members(io.BytesIO(raw[:cut]), source="t.tar", read_bytes=600):
                got.append((name, data))
        for name, data in got:  # everything yielded before the error is whole
            if name.endswith(".jpg"):
                assert data == sizes[name[:-4]]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "pax"])
@pytest.mark.parametrize("read_bytes", [512, 1000, 1 << 18])
def test_a_break_names_the_first_header_of_the_member_it_cut(fmt, read_bytes):
    members = _members(random.Random(3), long_names=fmt == tarfile.PAX_FORMAT)[:12]
    raw = _tar(fmt, members, extras=False)
    # each member's first header (its PAX header for the PAX archive) and where its padded data ends
    infos = [m for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.isreg()]
    starts = [0] + [m.offset_data + m.size + (-m.size % 512) for m in infos[:-1]]
    ends = [m.offset_data + m.size + (-m.size % 512) for m in infos]
    for cut in sorted({1, 300, 512, 513, *[e - 1 for e in ends], *[s + 100 for s in starts]}):
        if cut >= ends[-1]:
            continue
        broken = next(i for i, e in enumerate(ends) if e > cut)
        got = []
        with pytest.raises(CorruptDataError) as info:
            for name, _, _ in iter_members(NoSeek(raw[:cut], 333), source="t.tar", read_bytes=read_bytes):
                got.append(name)
        assert info.value.offset == starts[broken], cut
        assert got == [m.name for m in infos[:broken]]


def test_bad_checksum(tmp_path):
    path, _ = _shard(tmp_path, n=3)
    raw = path.read_bytes()
    first_size = int(raw[124:135], 8)
    second = 512 + first_size + (-first_size % 512)
    raw = bytearray(path.read_bytes())
    raw[second + 3] ^= 0x20
    with pytest.raises(CorruptDataError, match=rf"bad tar header checksum at byte offset {second}"):
        list(iter_members(io.BytesIO(bytes(raw)), source="t.tar"))


def test_key_reappearing_is_corrupt():
    raw = _tar(tarfile.USTAR_FORMAT, [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")], extras=False)
    with pytest.raises(CorruptDataError, match=r"x\.tar.*'a' reappears"):
        list(iter_samples(iter_members(io.BytesIO(raw), source="x.tar"), source="x.tar"))


# ---- the indexed fast path (iter_indexed_samples) -----------------------------------------------

def _pread_of(raw: bytes):
    return lambda offset, n: raw[offset:offset + n]


def test_indexed_fast_path_matches_the_source_files(tmp_path):
    path, samples = _shard(tmp_path)
    offsets = read_index(tmp_path / "shard-000000.idx")
    raw = path.read_bytes()
    for a, b in [(0, 40), (0, 1), (3, 17), (39, 40)]:
        for read_bytes in (600, 5000, 1 << 20):  # one sample per read ... all in one read
            got, n = _run_until_stop(iter_indexed_samples(_pread_of(raw), offsets, a, b, len(raw), source="s",
                                                          tag_source=True, read_bytes=read_bytes))
            assert n == b - a
            assert [k for k, _, _ in got] == [s[0] for s in samples[a:b]]
            assert [p["jpg"] for _, p, _ in got] == [s[1] for s in samples[a:b]]
            assert [int(p["cls"]) for _, p, _ in got] == [s[2] for s in samples[a:b]]
            assert [p["__url__"] for _, p, _ in got] == ["s"] * (b - a)
            assert [o for _, _, o in got] == offsets[a:b]
        # over a forward-only stream that starts at the first sample (an HTTP Range answer)
        stream = NoSeek(raw[offsets[a]:], max_read=1000)
        got = list(iter_indexed_samples(SequentialReader(stream, offsets[a]), offsets, a, b, len(raw)))
        assert [p["jpg"] for _, p, _ in got] == [s[1] for s in samples[a:b]]
    # a stream from byte 0 (a server that ignored Range): skips forward to the first sample
    got = list(iter_indexed_samples(SequentialReader(NoSeek(raw), 0), offsets, 5, 9, len(raw)))
    assert [k for k, _, _ in got] == [s[0] for s in samples[5:9]]


def _ustar(members: list[tuple[str, bytes]]) -> tuple[bytes, dict[str, int]]:
    """A ustar archive written by ``tarfile``, and each member's header offset as ``tarfile`` reads it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        return raw, {ti.name: ti.offset for ti in t.getmembers()}


def _run_until_stop(gen) -> tuple[list, int]:
    got = []
    try:
        while True:
            got.append(next(gen))
    except StopIteration as stop:
        return got, stop.value


def test_indexed_fast_path_stops_before_what_it_does_not_handle(tmp_path):
    path, samples = _shard(tmp_path, n=10)
    offsets = read_index(tmp_path / "shard-000000.idx")
    raw = bytearray(path.read_bytes())
    # a flipped byte in the 3rd member header of sample 6 (its json): the fast path yields 0..5
    # and stops; the general reader then raises the checksum error naming that header's offset
    with open(path, "rb") as f:
        members = list(iter_members(f, source="s"))
    json6 = [off for name, _, off in members if name == f"{samples[6][0]}.json"][0]
    raw[json6 + 30] ^= 0x01
    got, n = _run_until_stop(iter_indexed_samples(_pread_of(bytes(raw)), offsets, 0, 10, len(raw)))
    assert n == 6 and [k for k, _, _ in got] == [s[0] for s in samples[:6]]
    with pytest.raises(CorruptDataError, match=f"checksum at byte offset {json6}"):
        list(iter_samples(iter_members(io.BytesIO(bytes(raw)), start_offset=offsets[6], source="s"), source="s"))
    # cut inside sample 8's image: 0..7 come out, and the count says where to go on
    cut = bytes(path.read_bytes()[:offsets[8] + 700])
    got, n = _run_until_stop(iter_indexed_samples(_pread_of(cut), offsets, 0, 10, len(cut)))
    assert n == 8 and [p["jpg"] for _, p, _ in got] == [s[1] for s in samples[:8]]


def test_indexed_fast_path_and_other_writers(tmp_path):
    """PAX long names, GNU long names, directories: the fast path hands over (returns 0 yielded)
    at the first sample it cannot parse; the general reader reads the shard as before."""
    rng = random.Random(5)
    members = _members(rng, long_names=True)
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        raw = _tar(fmt, members, extras=False)
        with tarfile.open(fileobj=io.BytesIO(raw)) as t:
            infos = t.getmembers()
        # first header of each sample: tarfile's offset is the (PAX/GNU) record's start
        starts = [ti.offset for ti in infos if ti.name.endswith(".jpg")]
        got, n = _run_until_stop(iter_indexed_samples(_pread_of(raw), starts, 0, len(starts), len(raw)))
        assert n == 0 and got == []
    # ustar members with a stray member (another key) inside the first sample's span: the fast
    # path hands over before that sample; the general reader passes the stray member over
    raw, offs = _ustar([("a.jpg", b"A" * 700), ("a.cls", b"1"), ("stray.txt", b"zz"), ("b.jpg", b"B" * 10),
                        ("b.cls", b"2")])
    starts = [offs["a.jpg"], offs["b.jpg"]]
    got, n = _run_until_stop(iter_indexed_samples(_pread_of(raw), starts, 0, 2, len(raw)))
    assert n == 0 and got == []
    got, n = _run_until_stop(iter_indexed_samples(_pread_of(raw), starts, 1, 2, len(raw)))
    assert n == 1 and got == [("b", {"jpg": b"B" * 10, "cls": b"2"}, offs["b.jpg"])]
    general = list(iter_samples(iter_members(io.BytesIO(raw), source="t"), source="t", starts=set(starts)))
    assert general == [("a", {"jpg": b"A" * 700, "cls": b"1"}, offs["a.jpg"]),
                       ("b", {"jpg": b"B" * 10, "cls": b"2"}, offs["b.jpg"])]


def test_indexed_fast_path_prefetch_thread(tmp_path):
    """With ``prefetch``, reads happen on a background thread: same samples; a read error reaches
    the caller after the samples read before it; closing early stops the thread."""
    import threading

    path, samples = _shard(tmp_path)
    offsets = read_index(tmp_path / "shard-000000.idx")
    raw = path.read_bytes()
    got = list(iter_indexed_samples(_pread_of(raw), offsets, 0, 40, len(raw), read_bytes=5000, prefetch=2))
    assert [p["jpg"] for _, p, _ in got] == [s[1] for s in samples]

    calls = []

    def failing(offset, n):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError("connection reset")
        return raw[offset:offset + n]

    seen = []
    with pytest.raises(OSError, match="connection reset"):
        for key, _, _ in iter_indexed_samples(failing, offsets, 0, 40, len(raw), read_bytes=5000, prefetch=2):
            seen.append(key)
    assert 0 < len(seen) < 40 and seen == [s[0] for s in samples[:len(seen)]]

    gen = iter_indexed_samples(_pread_of(raw), offsets, 0, 40, len(raw), read_bytes=600, prefetch=2)
    next(gen)
    gen.close()
    for t in threading.enumerate():
        if t.name == "shardfeed-prefetch":
            t.join(timeout=2)
            assert not t.is_alive()


def test_indexed_fast_path_keys_with_folders_dots_and_unicode():
    """The key is the member name up to the first dot of its basename (WebDataset's rule)."""
    names = [("dir.v1/x.y.jpg", b"1" * 600), ("dir.v1/x.cls", b"3"), ("dir.v1/x.y.json", b"{}"),
             ("ünï/ä.b.png", b"2" * 10), ("ünï/ä.b.cls", b"4")]
    raw, offs = _ustar(names)
    got, n = _run_until_stop(iter_indexed_samples(_pread_of(raw), [offs["dir.v1/x.y.jpg"], offs["ünï/ä.b.png"]],
                                                  0, 2, len(raw)))
    assert n == 2
    # the folder's dot does not count; "x.y.jpg" and "x.cls" are both key "dir.v1/x"
    assert got == [("dir.v1/x", {"y.jpg": b"1" * 600, "cls": b"3", "y.json": b"{}"}, offs["dir.v1/x.y.jpg"]),
                   ("ünï/ä", {"b.png": b"2" * 10, "b.cls": b"4"}, offs["ünï/ä.b.png"])]
    assert got == list(iter_samples(iter_members(io.BytesIO(raw), source="t"), source="t"))


@pytest.mark.parametrize("read_bytes", [512, 1 << 18])
def test_old_style_directory_entries_are_not_members(read_bytes):
    """A V7 directory entry (typeflag NUL, name ending in "/", as old tars write them) is skipped;
    a regular file (typeflag "0") is a member whatever its name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data, kind in [("0001.jpg", b"a" * 700, tarfile.REGTYPE), ("olddir/", b"", tarfile.AREGTYPE),
                                 ("0001.cls", b"1", tarfile.AREGTYPE), ("0002.jpg", b"b" * 10, tarfile.REGTYPE)]:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    assert raw[512 * 3 + 156] == 0 and raw[512 * 3:512 * 3 + 7] == b"olddir/"  # the V7 entry as written
    got = list(iter_members(io.BytesIO(raw), source="t.tar", read_bytes=read_bytes))
    assert [(n, d) for n, d, _ in got] == [("0001.jpg", b"a" * 700), ("0001.cls", b"1"), ("0002.jpg", b"b" * 10)]
    assert [o for _, _, o in got] == [0, 512 * 4, 512 * 6]


def test_a_member_twice_in_one_sample_is_corrupt_on_the_indexed_path():
    raw, offs = _ustar([("a.jpg", b"A" * 700), ("a.cls", b"1"), ("a.jpg", b"X" * 10), ("b.jpg", b"B" * 10)])
    assert (offs["a.jpg"], offs["b.jpg"]) == (2560, 3584)  # offs keeps a name's last header
    starts = [0, 3584]
    with pytest.raises(CorruptDataError, match=r"sample 'a' holds member 'a\.jpg' twice \(byte offset 2560\)"):
        list(iter_indexed_samples(_pread_of(raw), starts, 0, 2, len(raw), source="s"))


def test_checksum_fields_hold_the_checksum_python_tarfile_writes():
    """The indexed path's checksum shortcut: for each header Python's ``tarfile`` writes, the field
    it wrote is among those a header with that byte sum can hold (the digit sum by arithmetic)."""
    import zlib

    from shardfeed.readers.format import tario_indexed

    rng = random.Random(7)
    for _ in range(400):
        info = tarfile.TarInfo(f"{rng.randrange(10 ** rng.randrange(1, 12)):0{rng.randrange(1, 10)}d}.jpg")
        info.size = rng.randrange(0, 1 << 24)
        info.mtime = rng.randrange(0, 1 << 31)
        header = info.tobuf(format=tarfile.USTAR_FORMAT)[:512]
        field = header[148:156]
        assert int(field[:6], 8) == sum(header) - sum(field) + 256  # tarfile's own rule
        assert field in tario_indexed._checksum_fields(zlib.adler32(header) & 0xFFFF)
    for c in range(0, 8 ** 6, 97):
        assert tario_indexed._octal_digit_sum(c) == sum(int(d) for d in "%o" % c)
