"""Labels of a labels-file pack: integer labels bounded by the classes they can index, a label that
is both a class name and an index refused unless --label-kind says which, LF/CRLF/CR files alike."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.write.layouts import LayoutOptions, pack_layout, read_labels_file
from shardfeed.convert.write.pack import PackOptions
from shardfeed.readers.storage.local_manifest import load_manifest


def _img(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(5, 6, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _src(tmp_path: Path, n: int = 3) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"{'abc'[i]}.jpg").write_bytes(_img(i))
    return src


def _labels(out: Path) -> dict[str, int]:
    """``{image bytes' source name: .cls}`` read from the shards with the stdlib."""
    import json

    got = {}
    for p in sorted(out.glob("*.tar")):
        with tarfile.open(p) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            if name.endswith(".json"):
                key = name[:-5]
                got[json.loads(data)["path"]] = int(members[key + ".cls"])
    return got


def _pack(src, out, labels_text: str, tmp_path: Path, classes_from=None, **layout):
    lf = tmp_path / "labels.csv"
    lf.write_text(labels_text)
    options = PackOptions(workers=1, class_to_idx=classes_from)
    return pack_layout(src, out, options, LayoutOptions(labels_file=lf, **layout))


def test_one_mistyped_integer_label_is_refused_naming_the_file_line_and_fix(tmp_path):
    src = _src(tmp_path)
    with pytest.raises(ValueError, match=r"labels\.csv line 3: label 5000 \(of c\.jpg\) would make 5,001 classes "
                                         r".*for 3 labelled image\(s\).*--num-classes K"):
        _pack(src, tmp_path / "out", "a.jpg,0\nb.jpg,1\nc.jpg,5000\n", tmp_path)
    assert not (tmp_path / "out").exists()
    # labels 0 and 2 of three images: classes "0" .. "2", as before
    _pack(src, tmp_path / "ok", "a.jpg,0\nb.jpg,2\nc.jpg,2\n", tmp_path)
    assert load_manifest(tmp_path / "ok").classes == ["0", "1", "2"]


def test_num_classes_bounds_integer_labels_and_names_the_classes(tmp_path):
    src = _src(tmp_path)
    _pack(src, tmp_path / "out", "a.jpg,7\nb.jpg,0\nc.jpg,9\n", tmp_path, num_classes=10)
    assert load_manifest(tmp_path / "out").classes == [str(i) for i in range(10)]
    assert _labels(tmp_path / "out") == {"a.jpg": 7, "b.jpg": 0, "c.jpg": 9}
    with pytest.raises(ValueError, match=r"labels\.csv line 2: label 10 \(of b\.jpg\) is not a class of the class "
                                         r"map \(10 classes\)"):
        _pack(src, tmp_path / "out2", "a.jpg,7\nb.jpg,10\nc.jpg,9\n", tmp_path, num_classes=10)
    with pytest.raises(ValueError, match="--num-classes and --classes-from both give the classes"):
        _pack(src, tmp_path / "out3", "a.jpg,0\nb.jpg,1\nc.jpg,0\n", tmp_path, classes_from={"x": 0, "y": 1},
              num_classes=2)


def test_a_label_that_is_both_a_class_name_and_an_index_needs_label_kind(tmp_path):
    src = _src(tmp_path)
    train = {"1": 0, "0": 1, "7": 2}  # a training set whose class folders are digits: "1" has index 0
    text = "a.jpg,0\nb.jpg,1\nc.jpg,7\n"
    with pytest.raises(ValueError, match=r"labels\.csv line 1: label 0 \(of a\.jpg\) is both the class named '0' "
                                         r"\(index 1\) and the class of index 0 \('1'\); 2 label\(s\) so: say which "
                                         r"with --label-kind name or --label-kind index"):
        _pack(src, tmp_path / "out", text, tmp_path, classes_from=train)
    _pack(src, tmp_path / "names", text, tmp_path, classes_from=train, label_kind="name")
    assert _labels(tmp_path / "names") == {"a.jpg": 1, "b.jpg": 0, "c.jpg": 2}
    with pytest.raises(ValueError, match=r"line 3: label 7 \(of c\.jpg\) is not a class"):
        _pack(src, tmp_path / "idx", text, tmp_path, classes_from=train, label_kind="index")
    _pack(src, tmp_path / "idx2", "a.jpg,0\nb.jpg,1\nc.jpg,2\n", tmp_path, classes_from=train, label_kind="index")
    assert _labels(tmp_path / "idx2") == {"a.jpg": 0, "b.jpg": 1, "c.jpg": 2}
    # "7" is a name and no index: that class, no question asked
    _pack(src, tmp_path / "seven", "a.jpg,7\nb.jpg,7\nc.jpg,7\n", tmp_path, classes_from=train)
    assert _labels(tmp_path / "seven") == {"a.jpg": 2, "b.jpg": 2, "c.jpg": 2}


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("sep", [",", "\t"])
def test_lf_crlf_and_cr_only_labels_files_read_alike(tmp_path, end, sep):
    lf = tmp_path / "labels.csv"
    lf.write_bytes(end.join([f"path{sep}label", f"a.jpg{sep}cat", f"b.jpg{sep}dog", f'"c,d.jpg"{sep}cat', ""])
                   .encode())
    assert read_labels_file(lf) == {"a.jpg": "cat", "b.jpg": "dog", "c,d.jpg": "cat"}


def test_cli_num_classes_and_label_kind(tmp_path):
    from shardfeed.convert.cli import main

    src = _src(tmp_path)
    (tmp_path / "l.csv").write_text("a.jpg,0\nb.jpg,5\nc.jpg,1\n")
    r = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "o"), "--labels", str(tmp_path / "l.csv"),
                                  "-j", "1"])
    assert r.exit_code != 0 and "line 2: label 5" in r.output and "--num-classes" in r.output
    r = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "o"), "--labels", str(tmp_path / "l.csv"),
                                  "--num-classes", "6", "-j", "1"])
    assert r.exit_code == 0, r.output
    assert len(load_manifest(tmp_path / "o").classes) == 6
    r = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "o2"), "--label-kind", "name"])
    assert r.exit_code != 0 and "pass --labels" in r.output


def test_write_dataset_bounds_integer_labels_by_the_samples_or_num_classes(tmp_path):
    from shardfeed.convert import write_dataset

    samples = [{"image": _img(i), "ext": "jpg", "path": f"{i}.jpg", "label": lab} for i, lab in enumerate([0, 5000, 1])]
    with pytest.raises(ValueError, match=r"sample 1 \(1\.jpg\): label 5000 would make 5,001 classes .* for 3 samples"
                                         r".*num_classes=K"):
        write_dataset(samples, tmp_path / "a")
    assert not (tmp_path / "a" / "manifest.json").exists()
    with pytest.raises(ValueError, match=r"sample 1 \(1\.jpg\): label 5000 is not a class index of the 10 classes"):
        write_dataset(samples, tmp_path / "b", num_classes=10)
    m = write_dataset(samples, tmp_path / "c", num_classes=5001)
    assert len(m.classes) == 5001 and m.classes[5000] == "5000"
    m = write_dataset([dict(s, label=lab) for s, lab in zip(samples, [0, 2, 2])], tmp_path / "d")
    assert m.classes == ["0", "1", "2"]
