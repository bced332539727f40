"""A tar header whose size field claims more bytes than the shard holds (octal, GNU base-256, PAX).

The damaged shards are built here from archives written by Python's ``tarfile`` (or copied from
the packed fixture), and the expected samples come from ``tarfile``'s own reading of the intact
bytes, never from the reader under test.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main as cli
from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.format.tario import iter_members

TIB = 1 << 40


def _set_checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def _forge_size(raw: bytearray, offset: int, how: str) -> None:
    """Rewrite the size field of the ustar header at ``offset`` to claim about 1 TiB (or 8 GiB)."""
    h = bytearray(raw[offset:offset + 512])
    if how == "base256":
        h[124:136] = bytes([0x80]) + TIB.to_bytes(11, "big")
    elif how == "octal":
        h[124:136] = b"77777777777\0"  # 8 GiB - 1, the largest octal size
    else:
        raise AssertionError(how)
    _set_checksum(h)
    raw[offset:offset + 512] = h


def _members(n: int) -> list[tuple[str, bytes]]:
    return [m for i in range(n) for m in ((f"{i:04d}.bin", bytes([i]) * (300 + i)), (f"{i:04d}.cls", b"%d" % (i % 3)))]


def _plain_tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _pax_size_tar(members, bad: int) -> bytes:
    """A tar whose member ``bad`` carries a PAX record ``size=1099511627776`` before its header."""
    out = bytearray()
    for i, (name, data) in enumerate(members):
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        if i == bad:
            out += tarfile.TarInfo._create_pax_generic_header({"size": str(TIB)}, tarfile.XHDTYPE, "utf-8")
        out += ti.tobuf(tarfile.USTAR_FORMAT)
        out += data + bytes(-len(data) % 512)
    return bytes(out + bytes(1024))


def _offsets(raw: bytes) -> dict[str, int]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        return {m.name: m.offset for m in tf.getmembers()}


@pytest.mark.parametrize("how", ["base256", "octal", "pax"])
@pytest.mark.parametrize("seekable", [True, False], ids=["file", "stream"])
def test_a_size_past_the_end_of_the_shard_is_a_damaged_header(how, seekable, tmp_path):
    members = _members(6)
    bad = 6  # member 0003.bin
    if how == "pax":
        raw = _pax_size_tar(members, bad)
        intact = _plain_tar(members)
        bad_offset = _offsets(intact)["0003.bin"]  # where the PAX header stands
    else:
        intact = _plain_tar(members)
        bad_offset = _offsets(intact)["0003.bin"]
        raw = bytearray(intact)
        _forge_size(raw, bad_offset, how)
        raw = bytes(raw)
    path = tmp_path / "shard.tar"
    path.write_bytes(raw)
    expected = {name: data for name, data in members[:bad]}
    with tarfile.open(fileobj=io.BytesIO(intact)) as tf:  # tarfile's reading of the intact bytes
        assert {m.name: tf.extractfile(m).read() for m in tf.getmembers()[:bad]} == expected

    got = {}
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            stream = f if seekable else _NoSeek(f)
            with pytest.raises(CorruptDataError) as info:
                for name, data, _ in iter_members(stream, source=str(path)):
                    got[name] = data
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == expected  # every member before the damaged header, whole
    msg = str(info.value)
    assert str(path) in msg and f"byte offset {bad_offset}" in msg and info.value.offset == bad_offset
    if seekable:
        assert "claims" in msg and "damaged" in msg
    assert peak < 64 << 20, peak  # nothing near the claimed size was allocated


class _NoSeek:
    """A forward-only view of a file (no ``seekable``, no ``fileno``): the shard's size is unknown."""

    def __init__(self, f):
        self._f = f

    def read(self, n=-1):
        return self._f.read(n)


def test_a_negative_pax_size_is_a_damaged_header():
    members = _members(2)
    raw = bytearray()
    for i, (name, data) in enumerate(members):
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        if i == 1:
            raw += tarfile.TarInfo._create_pax_generic_header({"size": "-5"}, tarfile.XHDTYPE, "utf-8")
        raw += ti.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)
    with pytest.raises(CorruptDataError, match="negative"):
        list(iter_members(io.BytesIO(bytes(raw + bytes(1024))), source="s.tar"))


def _forged_dataset(packed_wds: Path, tmp_path: Path, how: str) -> tuple[Path, list, int]:
    d = tmp_path / "d"
    shutil.copytree(packed_wds, d)
    shard = d / "shard-000001.tar"
    with tarfile.open(shard) as tf:
        names = [m for m in tf.getmembers()]
    keys = []
    for m in names:
        key = m.name.split(".")[0]
        if not keys or keys[-1][0] != key:
            keys.append((key, m.offset))
    k = 5
    raw = bytearray(shard.read_bytes())
    _forge_size(raw, keys[k][1], how)
    shard.write_bytes(bytes(raw))  # same size: the open-time check passes
    return d, keys, k


@pytest.mark.parametrize("how", ["base256", "octal"])
def test_reader_names_the_damaged_header_and_skips_it(how, packed_wds, tmp_path):
    d, keys, k = _forged_dataset(packed_wds, tmp_path, how)
    with pytest.raises(CorruptDataError, match=rf"shard-000001\.tar.*byte offset {keys[k][1]}\b"):
        list(open_dataset(d, decode=False, shuffle=False))
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = list(ds)
    lost = len(keys) - k  # the damaged sample and the rest of its shard
    assert ds.skipped == lost
    with tarfile.open(packed_wds / "shard-000001.tar") as tf:
        total = sum(1 for m in tf.getmembers() if m.name.endswith(".cls"))
    assert total == len(keys)
    assert len(out) == 60 - lost


@pytest.mark.parametrize("command", ["check", "index"])
def test_check_and_index_report_the_damaged_header(command, packed_wds, tmp_path):
    d, keys, k = _forged_dataset(packed_wds, tmp_path, "base256")
    if command == "index":
        (d / "manifest.json").unlink()
        for idx in d.glob("*.sfidx"):
            idx.unlink()
    r = CliRunner().invoke(cli, [command, str(d)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "MemoryError" not in r.output
    assert "shard-000001.tar" in r.output and str(keys[k][1]) in r.output, r.output


@pytest.mark.parametrize("member", ["cls", "image"])
def test_inspect_reports_a_size_field_past_the_end(member, packed_wds, tmp_path):
    """inspect walks the headers itself to count classes: a forged 8 GiB size field on a .cls
    member was read with one pread of that size."""
    d = tmp_path / "d"
    shutil.copytree(packed_wds, d)
    shard = d / "shard-000001.tar"
    with tarfile.open(shard) as tf:
        suffixes = (".cls",) if member == "cls" else (".jpg", ".png")
        m = [m for m in tf.getmembers() if m.name.endswith(suffixes)][3]
    raw = bytearray(shard.read_bytes())
    _forge_size(raw, m.offset, "octal")
    shard.write_bytes(bytes(raw))
    r = CliRunner().invoke(cli, ["inspect", str(d)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "MemoryError" not in r.output
    assert "shard-000001.tar" in r.output and f"byte offset {m.offset}" in r.output, r.output
