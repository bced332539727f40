"""Hostile and careless input to the layouts beyond class folders: labels files, classes files,
sidecar files and the samples of ``write_dataset``.

Each test plants the input (files, labels, bytes) and checks the result against what it planted:
the bytes and labels read back, or a clear error naming the file and the fix, never a crash, an
unbounded allocation or a dataset that its own readers refuse.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import unicodedata
from pathlib import Path

import pytest
from PIL import Image

from shardfeed.convert.write import dataset_writer, label_files, layouts
from shardfeed.convert import write_dataset
from shardfeed.convert.write.layouts import LayoutOptions, pack_layout, read_classes_file, read_labels_file
from shardfeed.convert.write.pack import PackOptions
from shardfeed.readers.errors import CorruptDataError, IncompleteDatasetError
from shardfeed.readers.format.manifest import MAX_FIELDS
from shardfeed.readers.storage.local_manifest import load_manifest


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (seed * 40 % 256, 10, 200)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _by_path(out: Path, fields: tuple = ()) -> dict[str, tuple]:
    """``{meta path: (image bytes, label, *fields)}`` of a packed dataset, read back raw."""
    got = {}
    for name in sorted(p.name for p in out.glob("*.tar")):
        with tarfile.open(out / name) as tf:
            members: dict[str, dict[str, bytes]] = {}
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tf.extractfile(m).read()
        for parts in members.values():
            meta = json.loads(parts["json"])
            label = int(parts["cls"]) if "cls" in parts else -1
            got[meta["path"]] = (parts["jpg"], label, *(parts.get(f) for f in fields))
    return got


# ---------------------------------------------------------------------------------------------
# scanning

def test_an_image_in_a_dotted_folder_beside_a_same_named_image_is_packed(tmp_path):
    src = tmp_path / "src"
    (src / "v1.0").mkdir(parents=True)
    planted = {"v1.jpg": _jpeg(1), "v1.0/cat.jpg": _jpeg(2), "v1.0/dog.jpg": _jpeg(3)}
    for rel, data in planted.items():
        (src / rel).write_bytes(data)
    pack_layout(src, tmp_path / "out", PackOptions(), LayoutOptions(no_labels=True))
    got = _by_path(tmp_path / "out")
    assert {rel: v[0] for rel, v in got.items()} == planted


def test_a_labels_row_naming_a_folder_says_it_is_a_folder(tmp_path):
    src = tmp_path / "src"
    (src / "x.jpg").mkdir(parents=True)
    (src / "x.jpg" / "y.jpg").write_bytes(_jpeg(1))
    (tmp_path / "labels.csv").write_text("x.jpg,cat\nx.jpg/y.jpg,dog\n")
    with pytest.raises(ValueError, match=r"x\.jpg \(a folder\)"):
        pack_layout(src, tmp_path / "out", PackOptions(), LayoutOptions(labels_file=tmp_path / "labels.csv"))


def test_a_labels_file_in_nfc_labels_the_image_named_nfd_on_disk(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    on_disk = unicodedata.normalize("NFD", "café.jpg")  # as macOS writes it
    (src / on_disk).write_bytes(_jpeg(4))
    (src / "plain.jpg").write_bytes(_jpeg(5))
    (tmp_path / "labels.csv").write_text(unicodedata.normalize("NFC", "café.jpg") + ",dog\nplain.jpg,cat\n",
                                         encoding="utf-8")
    pack_layout(src, tmp_path / "out", PackOptions(), LayoutOptions(labels_file=tmp_path / "labels.csv"))
    got = _by_path(tmp_path / "out")
    # classes sorted by name: cat 0, dog 1; the stored path is the file's own spelling
    assert got == {on_disk: (_jpeg(4), 1), "plain.jpg": (_jpeg(5), 0)}


@pytest.mark.parametrize("name, data, problem", [
    ("a.json", b"[" * 200_000 + b"]" * 200_000, "not valid JSON .*nested too deeply"),
    ("a.json", b'{"caption": "unterminated', "not valid JSON"),
    ("a.txt", "légende".encode("latin-1"), "not valid TXT"),
])
def test_a_sidecar_that_would_not_read_back_is_refused_at_pack_naming_it(tmp_path, name, data, problem):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(_jpeg(1))
    (src / "b.jpg").write_bytes(_jpeg(2))
    (src / name).write_bytes(data)
    (src / f"b.{name.split('.')[1]}").write_text('{"caption": "fine"}' if name.endswith("json") else "fine")
    layout = LayoutOptions(no_labels=True, sidecars=(name.split(".")[1],))
    with pytest.raises(ValueError, match=rf"{name}: field .*{problem}"):
        pack_layout(src, tmp_path / "out", PackOptions(), layout)
    assert not (tmp_path / "out" / "manifest.json").exists()
    pack_layout(src, tmp_path / "skip", PackOptions(on_error="skip"), layout)
    assert list(_by_path(tmp_path / "skip")) == ["b.jpg"]
    assert [s["path"] for s in load_manifest(tmp_path / "skip").skipped] == ["a.jpg"]


def test_a_json_field_nested_too_deep_reads_as_a_corrupt_field_not_a_crash():
    from shardfeed.readers.format.sample_members import decode_field

    with pytest.raises(CorruptDataError, match=r"shard-000000\.tar key 7: field 'json' .*too deep"):
        decode_field("json", b"[" * 200_000 + b"]" * 200_000, "shard-000000.tar key 7")


def test_the_card_of_a_json_field_too_deep_or_wide_declares_a_string(tmp_path):
    from shardfeed.convert.write.consumers import dataset_card, field_examples

    deep: dict = {}
    node = deep
    for _ in range(500):
        node["x"] = {}
        node = node["x"]
    wide = {f"k{i}": i for i in range(5000)}
    out = tmp_path / "out"
    m = write_dataset([{"image": _jpeg(1), "ext": "jpg", "deep.json": deep, "wide.json": wide}], out)
    examples = field_examples(out, m)
    card = dataset_card(m, {}, name="t", extra_examples=examples)
    assert '- name: "deep.json"\n    dtype: string' in card and '- name: "wide.json"\n    dtype: string' in card
    assert len(card.splitlines()) < 200


# ---------------------------------------------------------------------------------------------
# labels files

@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_json_lines_end_at_line_ends_only(tmp_path, end):
    planted = {"a\u2028b.jpg": "cat", "c\x85d.jpg": "dog", "e.jpg": "cat"}
    text = "".join(json.dumps({"path": p, "label": v}, ensure_ascii=False) + end for p, v in planted.items())
    (tmp_path / "labels.jsonl").write_text(text, encoding="utf-8", newline="")
    assert read_labels_file(tmp_path / "labels.jsonl") == planted


@pytest.mark.parametrize("name, text", [
    ("labels.jsonl", '{"path": "a.jpg", "label": "cat", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
])
def test_deeply_nested_json_in_a_labels_file_is_an_error_naming_the_line(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"{name} line 1: .*nested too deeply"):
        read_labels_file(tmp_path / name)


@pytest.mark.parametrize("text", ["a.jpg,0\nb.jpg,-1\n", "a.jpg,-3\n", '{"path": "a.jpg", "label": -2}\n'])
def test_a_negative_integer_label_is_refused_naming_the_line(tmp_path, text):
    (tmp_path / "labels.txt").write_text(text)
    line = 2 if "b.jpg" in text else 1
    with pytest.raises(ValueError, match=rf"labels.txt line {line}: label -\d is negative"):
        read_labels_file(tmp_path / "labels.txt")


def test_a_labels_file_is_read_bounded_whatever_its_size_says(tmp_path, monkeypatch):
    monkeypatch.setattr(label_files, "MAX_LABELS_FILE_BYTES", 1000)  # where the limit lives
    fifo = tmp_path / "labels.csv"  # as `--labels <(...)`: a pipe, whose size reads 0
    os.mkfifo(fifo)
    row = b"a.jpg,cat\n" * 1000

    def feed():
        try:
            with open(fifo, "wb") as f:
                f.write(row)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    with pytest.raises(ValueError, match="over the 1000 bytes a labels file may have"):
        read_labels_file(fifo)
    writer.join(timeout=10)


def test_integer_labels_beyond_the_class_bound_are_refused_before_any_class_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(layouts, "MAX_CLASSES", 100)
    monkeypatch.setattr(dataset_writer, "MAX_CLASSES", 100)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(_jpeg(1))
    (src / "b.jpg").write_bytes(_jpeg(2))
    (tmp_path / "labels.csv").write_text("a.jpg,3\nb.jpg,99999999999999999999\n")
    with pytest.raises(ValueError, match=r"label 99999999999999999999 \(of b\.jpg\).*--classes-from"):
        pack_layout(src, tmp_path / "out", PackOptions(), LayoutOptions(labels_file=tmp_path / "labels.csv"))
    with pytest.raises(ValueError, match=r"sample 1: label 100 would make 101 classes"):
        write_dataset([{"image": _jpeg(1), "ext": "jpg", "label": 3},
                       {"image": _jpeg(2), "ext": "jpg", "label": 100}], tmp_path / "out2")


# ---------------------------------------------------------------------------------------------
# classes files (--classes-from)

@pytest.mark.parametrize("text, problem", [
    ('[1, "1", "a"]', "class name 1 is not a string"),
    ('[["a"], {"b": 1}]', r"class name \['a'\] is not a string"),
    ('["", "a"]', "class name '' is empty"),
    ('["a", "b", "a"]', "class name 'a' is listed twice"),
    ('{"a": 0, "b": 5}', r"class indices must be the integers 0 \.\. 1"),
    ('{"a": 0, "b": 0}', r"class indices must be the integers 0 \.\. 1"),
    ('{"a": -1}', r"class indices must be the integers 0 \.\. 0"),
    ("[" * 100_000 + "]" * 100_000, r"not valid JSON \(nested too deeply\)"),
    ('{"class_to_idx": 7}', "a classes file is one name per line"),
])
def test_a_damaged_classes_file_is_refused_naming_it(tmp_path, text, problem):
    (tmp_path / "classes.json").write_text(text)
    with pytest.raises(ValueError, match=rf"classes\.json: {problem}"):
        read_classes_file(tmp_path / "classes.json")


@pytest.mark.parametrize("classes, class_to_idx, problem", [
    (["a", "b"], {"a": 0, "b": 0}, r"class_to_idx gives two classes the same index"),
    (["a", "b"], {"a": -5, "b": 1}, r"class_to_idx\['a'\] is -5, not a non-negative integer class index"),
    (["b", "a"], {"a": 0, "b": 1}, r"classes is not in class index order \(class_to_idx disagrees with it\)"),
])
def test_a_damaged_manifest_as_classes_from_is_refused(tmp_path, classes, class_to_idx, problem):
    d = tmp_path / "train"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({
        "format": "webdataset", "version": 3, "num_samples": 0, "classes": classes,
        "class_to_idx": class_to_idx, "shards": []}))
    with pytest.raises(ValueError, match=rf"train/manifest\.json: field {problem}"):
        read_classes_file(d)


# ---------------------------------------------------------------------------------------------
# write_dataset

@pytest.mark.parametrize("key", ["../evil", "/abs", "a/../b", "a//b", "./a", "a\nb", "a\tb", "a\\b", "a\0b",
                                 "dir/x.y", ""])
def test_write_dataset_refuses_a_key_that_is_not_a_plain_name(tmp_path, key):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="key"):
        write_dataset([{"image": _jpeg(1), "ext": "jpg", "key": key}], out)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*.tar"))


def test_write_dataset_keeps_a_key_with_folders(tmp_path):
    out = tmp_path / "out"
    write_dataset([{"image": _jpeg(1), "ext": "jpg", "key": "part/a"}], out)
    with tarfile.open(out / "shard-000000.tar") as tf:
        assert tf.extractfile("part/a.jpg").read() == _jpeg(1)


def test_write_dataset_refuses_more_fields_than_a_manifest_may_list(tmp_path):
    sample = {"image": _jpeg(1), "ext": "jpg", **{f"f{i}.bin": b"x" for i in range(MAX_FIELDS + 1)}}
    with pytest.raises(ValueError, match=rf"more than the {MAX_FIELDS} a dataset may have"):
        write_dataset([sample], tmp_path / "out")
    with pytest.raises(ValueError, match=rf"more than the {MAX_FIELDS} a dataset may have"):
        write_dataset([{"image": _jpeg(1), "ext": "jpg"}], tmp_path / "out2",
                      fields=[f"f{i}.bin" for i in range(MAX_FIELDS + 1)])
    sample = {"image": _jpeg(1), "ext": "jpg", **{f"f{i}.bin": bytes([i]) for i in range(MAX_FIELDS)}}
    m = write_dataset([sample], tmp_path / "out3")  # at the bound: written and readable
    assert load_manifest(tmp_path / "out3").fields == m.fields and len(m.fields) == MAX_FIELDS


@pytest.mark.parametrize("fmt", ["webdataset", "lmdb"])
def test_an_interrupted_write_dataset_reads_as_unfinished(tmp_path, fmt):
    def samples():
        for i in range(25):
            if i == 17:
                raise KeyboardInterrupt  # Ctrl-C after three full shards
            yield {"image": _jpeg(i), "ext": "jpg", "txt": f"caption {i}"}

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_dataset(samples(), out, format=fmt, max_count=5)
    assert not (out / "manifest.json").exists()
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        load_manifest(out)
    done = tmp_path / "done"
    write_dataset([{"image": _jpeg(1), "ext": "jpg"}], done, format=fmt)
    assert not (done / ".shardfeed-pack").exists()  # a finished write leaves no marker
    assert load_manifest(done).num_samples == 1


@pytest.mark.parametrize("desc, problem", [
    ({"count": "5", "missing": 0}, "count and missing must be integers >= 0"),
    ({"count": -3, "missing": 5}, "count and missing must be integers >= 0"),
    ({"count": True, "missing": 1}, "count and missing must be integers >= 0"),
    ({"count": 1.7, "missing": 0}, "count and missing must be integers >= 0"),
    ({"count": 10 ** 30, "missing": 0}, "exceed num_samples=2"),
])
def test_a_version_3_manifest_with_hostile_field_counts_is_refused(tmp_path, desc, problem):
    out = tmp_path / "out"
    write_dataset([{"image": _jpeg(i), "ext": "jpg", "txt": f"c{i}"} for i in range(2)], out)
    data = json.loads((out / "manifest.json").read_text())
    assert data["version"] == 3 and data["fields"]["txt"] == {"member": "txt", "count": 2, "missing": 0}
    data["fields"]["txt"].update(desc)
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"field 'txt': .*{problem}"):
        load_manifest(out)


def test_a_sidecar_replaced_by_a_fifo_after_the_scan_is_never_read(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(_jpeg(i))
        (src / f"{i}.txt").write_text(f"caption {i}")
    scan = layouts._scan_images

    def scan_then_swap(*args, **kwargs):
        found = scan(*args, **kwargs)
        (src / "1.txt").unlink()
        os.mkfifo(src / "1.txt")  # reading it would block the pack for ever
        return found

    monkeypatch.setattr(layouts, "_scan_images", scan_then_swap)
    result: dict = {}

    def run():
        try:
            pack_layout(src, tmp_path / "out", PackOptions(on_error="skip"),
                        LayoutOptions(no_labels=True, sidecars=("txt",)))
            result["ok"] = True
        except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=60)
    if t.is_alive():  # unblock the reader so the thread ends
        with open(os.open(src / "1.txt", os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        t.join(timeout=10)
        pytest.fail("the pack blocked reading a FIFO")
    assert result == {"ok": True}
    got = _by_path(tmp_path / "out", ("txt",))
    assert {rel: v[2] for rel, v in got.items()} == {"0.jpg": b"caption 0", "2.jpg": b"caption 2"}
    skipped = load_manifest(tmp_path / "out").skipped
    assert [s["path"] for s in skipped] == ["1.jpg"] and "not a regular file" in skipped[0]["reason"]


def test_a_class_name_in_another_unicode_normalisation_is_that_class(tmp_path):
    src = tmp_path / "val"
    src.mkdir()
    (src / "a.jpg").write_bytes(_jpeg(1))
    (src / "b.jpg").write_bytes(_jpeg(2))
    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    (tmp_path / "classes.txt").write_text(f"apple\n{nfd}\n", encoding="utf-8")  # train's folders, named on macOS
    (tmp_path / "labels.csv").write_text(f"a.jpg,{nfc}\nb.jpg,apple\n", encoding="utf-8")
    options = PackOptions(class_to_idx=read_classes_file(tmp_path / "classes.txt"))
    pack_layout(src, tmp_path / "out", options, LayoutOptions(labels_file=tmp_path / "labels.csv"))
    assert _by_path(tmp_path / "out") == {"a.jpg": (_jpeg(1), 1), "b.jpg": (_jpeg(2), 0)}
    assert load_manifest(tmp_path / "out").classes == ["apple", nfd]


@pytest.mark.parametrize("extra, kwargs, error, problem", [
    ({"meta": [1, 2]}, {}, ValueError, "'meta' is a dict of JSON metadata, got list"),
    ({"meta": {"size": float("nan")}}, {}, ValueError, "'meta' is not strict JSON"),
    ({"meta": {"path": "../../etc/cron.d/x"}}, {}, ValueError, r"path '\.\./\.\./etc/cron\.d/x'"),
    ({"x.json": {"score": float("inf")}}, {}, TypeError, "field 'x.json'"),
    ({"ext": "j\ng"}, {}, ValueError, "cannot name an image member"),
    ({"ext": "j g"}, {}, ValueError, "extension 'j g' cannot name an image member"),
    ({"label": 0}, {"classes": ["cat", "cat"]}, ValueError, "a class name is listed twice"),
    ({"label": 0}, {"classes": [1, 2]}, ValueError, "class name 1 is not a string"),
    ({"label": 1}, {"class_to_idx": {"a": 0, "b": 5}}, ValueError, r"class indices must be the integers 0 \.\. 1"),
    ({"label": 0}, {"classes": ["a", "b"], "class_to_idx": {"a": 1, "b": 0}}, ValueError, "disagree"),
])
def test_write_dataset_refuses_a_sample_or_class_list_that_would_be_stored_wrong(tmp_path, extra, kwargs, error,
                                                                                problem):
    out = tmp_path / "out"
    with pytest.raises(error, match=problem):
        write_dataset([{"image": _jpeg(1), "ext": "jpg", **extra}], out, **kwargs)
    assert not (out / "manifest.json").exists()


def test_write_dataset_refuses_a_sample_that_is_not_a_dict_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"sample 0: a sample is a dict .* got bytes"):
        write_dataset([b"not a sample"], tmp_path / "out")


def test_write_dataset_takes_numpy_integer_labels(tmp_path):
    np = pytest.importorskip("numpy")
    out = tmp_path / "out"
    write_dataset([{"image": _jpeg(i), "ext": "jpg", "label": np.int64(i), "path": f"{i}.jpg"} for i in range(3)],
                  out, classes=["a", "b", "c"])
    assert _by_path(out) == {f"{i}.jpg": (_jpeg(i), i) for i in range(3)}


def _flat_src(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(_jpeg(i))
    return src


def test_require_sidecars_without_sidecars_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--require-sidecars needs --sidecars"):
        pack_layout(_flat_src(tmp_path), tmp_path / "out", PackOptions(), LayoutOptions(require_sidecars=True))
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("no_labels, why", [(True, "--no-labels"), (False, "has no class folders")])
def test_a_class_map_for_an_unlabelled_pack_is_refused_not_dropped(tmp_path, no_labels, why):
    with pytest.raises(ValueError, match=rf"--classes-from gives classes, but this pack is unlabelled \(.*{why}\)"):
        pack_layout(_flat_src(tmp_path), tmp_path / "out", PackOptions(class_to_idx={"cat": 0}),
                    LayoutOptions(no_labels=no_labels))


def test_resume_into_a_new_folder_packs_from_the_start(tmp_path):
    src = _flat_src(tmp_path)
    (tmp_path / "labels.csv").write_text("0.jpg,cat\n1.jpg,dog\n2.jpg,cat\n")
    layout = LayoutOptions(labels_file=tmp_path / "labels.csv")
    pack_layout(src, tmp_path / "resumed", PackOptions(resume=True), layout)
    assert _by_path(tmp_path / "resumed") == {"0.jpg": (_jpeg(0), 0), "1.jpg": (_jpeg(1), 1), "2.jpg": (_jpeg(2), 0)}


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", "", "X\n", "png"])
def test_an_lmdb_record_with_a_field_name_that_is_not_a_field_is_damaged(name):
    from shardfeed.readers.format.manifest import decode_record, encode_record

    good = decode_record(encode_record("000000000", b"img", "jpg", -1, {}, {"txt": b"caption"}))
    assert good["fields"] == {"txt": b"caption"} and good["data"] == b"img"
    value = encode_record("000000000", b"img", "jpg", -1, {"path": "a.jpg"}, {"txt": b"caption", name: b"x"})
    with pytest.raises(CorruptDataError, match=r"a\.jpg.*extra field name .* is not a field name"):
        decode_record(value, source="data.mdb")


@pytest.mark.parametrize("swap", ["image", "sidecar", "folder"])
def test_a_file_replaced_by_a_link_after_the_scan_is_never_read(tmp_path, monkeypatch, swap):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for rel in ("0.jpg", "sub/1.jpg"):
        (src / rel).write_bytes(_jpeg(len(rel)))
        (src / rel).with_suffix(".txt").write_text(f"caption of {rel}")
    secret = b"SECRET bytes outside the source folder"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "1.jpg").write_bytes(secret)
    (outside / "1.txt").write_bytes(secret)
    scan = layouts._scan_images

    def scan_then_swap(*args, **kwargs):
        found = scan(*args, **kwargs)
        if swap == "folder":
            for f in (src / "sub").iterdir():
                f.unlink()
            (src / "sub").rmdir()
            os.symlink(outside, src / "sub")
        else:
            name = "sub/1.jpg" if swap == "image" else "sub/1.txt"
            (src / name).unlink()
            os.symlink(outside / Path(name).name, src / name)
        return found

    monkeypatch.setattr(layouts, "_scan_images", scan_then_swap)
    out = tmp_path / "out"
    pack_layout(src, out, PackOptions(on_error="skip"), LayoutOptions(no_labels=True, sidecars=("txt",)))
    assert _by_path(out, ("txt",)) == {"0.jpg": (_jpeg(5), -1, b"caption of 0.jpg")}
    skipped = load_manifest(out).skipped
    assert [s["path"] for s in skipped] == ["sub/1.jpg"] and "changed since the scan" in skipped[0]["reason"]
    assert not any(secret in p.read_bytes() for p in out.iterdir() if p.is_file())


@pytest.mark.parametrize("field, value, problem", [
    ("txt", "légende".encode("latin-1"), "field 'txt' is not valid TXT"),
    ("meta.json", b"{not json", "field 'meta.json' is not valid JSON"),
])
def test_write_dataset_refuses_field_bytes_that_would_not_read_back(tmp_path, field, value, problem):
    with pytest.raises(ValueError, match=rf"sample 1 \(b\.jpg\): {problem}"):
        write_dataset([{"image": _jpeg(0), "ext": "jpg", "path": "a.jpg", field: b"{}" if "json" in field else b"ok"},
                       {"image": _jpeg(1), "ext": "jpg", "path": "b.jpg", field: value}], tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()
