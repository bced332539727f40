"""An untrusted ``manifest.json``: validated once, at open, by every reader and tool.

Each case edits one field of a manifest that ``shardfeed pack`` wrote (the packed fixture) and
expects a :class:`ManifestError` naming the manifest and the field, from ``open_dataset``, from
``shardfeed check`` and from ``shardfeed inspect`` (exit status 1, one line, no traceback).
Expected samples and labels come from the source folder (``tiny_folder_expected``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main as cli
from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError, ManifestError
from shardfeed.readers.format.manifest import Manifest, validate_manifest


def _copy(packed: Path, tmp_path: Path) -> Path:
    d = tmp_path / "d"
    shutil.copytree(packed, d)
    return d


def _edit(d: Path, change) -> None:
    path = d / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _set(path: str, value):
    """An edit setting ``doc[a][b]... = value`` for ``path`` = "a.b" (list indexes as digits)."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]

    def change(doc):
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


def _dup_shard(doc):
    doc["shards"].append(dict(doc["shards"][0]))
    doc["num_samples"] += doc["shards"][0]["num_samples"]


def _index_as_other_shard(doc):
    doc["shards"][1]["index"] = doc["shards"][0]["index"]


#: (case id, edit, field named in the error)
CASES = [
    ("parent-dir", _set("shards.0.name", "../outside/shard-000000.tar"), "shards[0].name"),
    ("absolute", _set("shards.0.name", "/etc/passwd"), "shards[0].name"),
    ("subfolder", _set("shards.0.name", "sub/shard-000000.tar"), "shards[0].name"),
    ("url", _set("shards.0.name", "http://127.0.0.1:1/shard-000000.tar"), "shards[0].name"),
    ("dot-dot", _set("shards.0.name", ".."), "shards[0].name"),
    ("index-escapes", _set("shards.0.index", "../x.sfidx"), "shards[0].index"),
    ("name-not-string", _set("shards.0.name", 7), "shards[0].name"),
    ("num-samples-string", _set("num_samples", "60"), "num_samples"),
    ("num-samples-negative", _set("num_samples", -1), "num_samples"),
    ("num-samples-float", _set("num_samples", 60.0), "num_samples"),
    ("num-samples-bool", _set("num_samples", True), "num_samples"),
    ("shard-count-string", _set("shards.0.num_samples", "16"), "shards[0].num_samples"),
    ("shard-count-huge", _set("shards.0.num_samples", 10 ** 30), "shards[0].num_samples"),
    ("shard-bytes-negative", _set("shards.0.num_bytes", -5), "shards[0].num_bytes"),
    ("sum-inconsistent", _set("num_samples", 61), "num_samples"),
    ("shard-listed-twice", _dup_shard, "shards[4].name"),
    ("index-shared", _index_as_other_shard, "shards[1].index"),
    ("sha256-not-hex", _set("shards.0.sha256", "xyz"), "shards[0].sha256"),
    ("extensions-negative", _set("shards.0.extensions", {"jpg": -1}), "shards[0].extensions['jpg']"),
    ("classes-not-list", _set("classes", "cat"), "classes"),
    ("classes-twice", _set("classes", ["cat", "cat", "eel"]), "classes"),
    ("class-name-not-string", _set("classes", ["cat", 1, "eel"]), "classes[1]"),
    ("class-map-misses-a-class", _set("class_to_idx", {"cat": 0, "dog": 1}), "class_to_idx"),
    ("class-map-index-string", _set("class_to_idx", {"cat": 0, "dog": "1", "eel": 2}), "class_to_idx['dog']"),
    ("class-map-same-index", _set("class_to_idx", {"cat": 0, "dog": 0, "eel": 2}), "class_to_idx"),
    ("class-map-order", _set("class_to_idx", {"cat": 2, "dog": 1, "eel": 0}), "classes"),
    ("shards-not-list", _set("shards", {}), "shards"),
    ("options-not-object", _set("options", []), "options"),
    ("skipped-entry-not-object", _set("skipped", ["x"]), "skipped"),
    ("format-not-string", _set("format", 3), "format"),
]


@pytest.mark.parametrize("change,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_bad_field_is_a_manifest_error_naming_it(packed_wds, tmp_path, change, field):
    d = _copy(packed_wds, tmp_path)
    _edit(d, change)
    mpath = str(d / "manifest.json")
    with pytest.raises(ManifestError) as info:
        open_dataset(d, check_files=False)
    msg = str(info.value)
    assert msg.startswith(mpath) and f"field {field} " in msg, msg
    for command in ("check", "inspect"):
        r = CliRunner().invoke(cli, [command, str(d)])
        assert r.exit_code == 1, (command, r.output)
        assert "Traceback" not in r.output and "TypeError" not in r.output
        assert f"field {field} " in r.output, (command, r.output)


def test_a_manifest_nested_too_deeply_is_a_manifest_error(packed_wds, tmp_path):
    d = _copy(packed_wds, tmp_path)
    (d / "manifest.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ManifestError, match=r"manifest\.json: JSON nested too deeply"):
        open_dataset(d)
    for command in ("check", "inspect"):
        r = CliRunner().invoke(cli, [command, str(d)])
        assert r.exit_code == 1 and "nested too deeply" in r.output, (command, r.output)
        assert "Traceback" not in r.output and "RecursionError" not in r.output


def test_validate_manifest_accepts_what_pack_wrote(packed_wds, packed_lmdb):
    for d in (packed_wds, packed_lmdb):
        doc = json.loads((d / "manifest.json").read_text())
        validate_manifest(doc, "m")  # no error
        assert Manifest.from_json(doc).num_samples == 60


def test_a_shard_outside_the_dataset_is_never_read(packed_wds, tmp_path):
    """The outside copy is a valid shard: without the check, check said OK and the reader read it."""
    d = _copy(packed_wds, tmp_path)
    (tmp_path / "outside").mkdir()
    shutil.move(d / "shard-000000.tar", tmp_path / "outside" / "shard-000000.tar")
    _edit(d, _set("shards.0.name", "../outside/shard-000000.tar"))
    with pytest.raises(ManifestError, match=r"shards\[0\]\.name"):
        list(open_dataset(d, decode=False))
    r = CliRunner().invoke(cli, ["check", str(d)])
    assert r.exit_code == 1 and "OK" not in r.output.split("error:")[0]


def _forge_cls(shard: Path, sample: int, value: bytes) -> str:
    """Rewrite sample ``sample``'s ``.cls`` member (same length: the tar stays valid); returns its key."""
    with tarfile.open(shard) as tf:
        members = [m for m in tf.getmembers() if m.name.endswith(".cls")]
    m = members[sample]
    raw = bytearray(shard.read_bytes())
    assert len(value) == m.size
    raw[m.offset_data:m.offset_data + m.size] = value
    shard.write_bytes(bytes(raw))
    return m.name.split(".")[0]


@pytest.mark.parametrize("decode", [True, False], ids=["decoded", "raw"])
def test_a_label_beyond_the_class_list_names_shard_and_key(packed_wds, tiny_folder_expected, tmp_path, decode):
    d = _copy(packed_wds, tmp_path)
    key = _forge_cls(d / "shard-000002.tar", 4, b"7")  # 3 classes: 0..2
    with pytest.raises(CorruptDataError, match=rf"shard-000002\.tar key {key}: class index 7 is not one of"):
        list(open_dataset(d, decode=decode, shuffle=False))
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = list(ds)
    assert ds.skipped == 1 and len(out) == len(tiny_folder_expected) - 1
    assert all((s.data, s.label) == tiny_folder_expected[s.meta["path"]] for s in out)
    r = CliRunner().invoke(cli, ["check", str(d)])
    assert r.exit_code == 1 and key in r.output


def test_an_index_offset_past_the_end_of_its_shard(packed_wds, tmp_path):
    d = _copy(packed_wds, tmp_path)
    idx = d / "shard-000001.sfidx"
    offsets = list(struct.unpack(f"<{idx.stat().st_size // 8}Q", idx.read_bytes()))
    size = (d / "shard-000001.tar").stat().st_size
    offsets[-1] = (size // 512 + 100) * 512
    idx.write_bytes(struct.pack(f"<{len(offsets)}Q", *offsets))
    digest = hashlib.sha256(idx.read_bytes()).hexdigest()
    _edit(d, _set("shards.1.index_sha256", digest))  # a consistent-looking manifest
    r = CliRunner().invoke(cli, ["inspect", str(d)])
    assert r.exit_code == 1 and "past the end" in r.output and "shard-000001.sfidx" in r.output, r.output
    with pytest.raises(CorruptDataError, match=r"shard-000001\.sfidx.*past the end"):
        list(open_dataset(d, decode=False, shuffle=False))


def test_an_lmdb_label_beyond_the_class_list_names_the_key(packed_lmdb, tiny_folder_expected, tmp_path):
    import lmdb
    import msgpack

    d = tmp_path / "d"
    shutil.copytree(packed_lmdb, d)
    key = b"000000005"
    env = lmdb.open(str(d), subdir=True, lock=True)
    with env.begin(write=True) as txn:
        rec = msgpack.unpackb(txn.get(key), raw=False)
        path = rec["meta"]["path"]
        rec["label"] = 7  # 3 classes: 0..2
        txn.put(key, msgpack.packb(rec, use_bin_type=True))
    env.close()
    with pytest.raises(CorruptDataError, match=r"data\.mdb key 000000005.*class index 7 is not one of"):
        ds = open_dataset(d, decode=False, shuffle=False)
        [ds[i] for i in range(len(ds))]
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = [s for s in (ds[i] for i in range(len(ds))) if s is not None]
    assert ds.skipped == 1 and {s.meta["path"] for s in out} == set(tiny_folder_expected) - {path}


def _planted_shards(packed: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in packed.iterdir() if p.suffix == ".tar"}


@pytest.mark.parametrize("form", ["http", "http-manifest", "file"])
def test_load_manifest_takes_a_url(form, packed_wds, simple_http_server, tiny_folder_expected):
    from shardfeed.readers import load_manifest

    url = {"http": f"{simple_http_server}/wds/", "http-manifest": f"{simple_http_server}/wds/manifest.json",
           "file": f"file://{packed_wds}"}[form]
    m = load_manifest(url)
    assert m.num_samples == len(tiny_folder_expected)
    assert m.classes == sorted({p.split("/", 1)[0] for p in tiny_folder_expected})
    assert {s.name: s.num_bytes for s in m.shards} == _planted_shards(packed_wds)


def test_load_manifest_of_a_url_names_a_missing_shard(packed_wds, tmp_path, start_http_server, tiny_folder_expected):
    from shardfeed.readers import load_manifest

    d = _copy(packed_wds, tmp_path)
    first = sorted(_planted_shards(d))[0]
    (d / first).unlink()
    base = start_http_server(d)
    with pytest.raises(ManifestError, match=rf"{base}/{first}: listed in manifest.json but missing.*check_files=False"):
        load_manifest(f"{base}/")
    assert load_manifest(f"{base}/", check_files=False).num_samples == len(tiny_folder_expected)


def test_a_missing_shard_is_refused_at_its_first_read_and_skipped_under_skip(packed_wds, tmp_path,
                                                                            tiny_folder_expected):
    from shardfeed.readers.errors import DataSourceError

    d = _copy(packed_wds, tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    gone = manifest["shards"][0]
    (d / gone["name"]).unlink()
    ds = open_dataset(str(d), decode=False, shuffle=False)  # opening stats no shard
    with pytest.raises(DataSourceError, match=rf"{gone['name']}: listed in manifest.json but missing.*on_error"):
        list(ds)
    for kw in ({}, {"check_files": False}):
        ds = open_dataset(str(d), decode=False, on_error="skip", **kw)
        got = {s.meta["path"]: (bytes(s.data), s.label) for s in ds}
        assert len(got) == len(tiny_folder_expected) - gone["num_samples"]
        assert all(tiny_folder_expected[p] == v for p, v in got.items())
        assert ds.skipped == gone["num_samples"]
