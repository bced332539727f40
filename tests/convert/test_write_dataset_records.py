"""``write_dataset`` validates everything it records before the manifest: malformed ``skipped``
entries, ``options`` and ``files`` that are not strict JSON (NaN and infinities named), a label
against its sample's own ``meta`` class. Each is a ``ValueError`` naming the value, and no
manifest is written; what does pass opens in the readers with the values given."""

from __future__ import annotations

import json
import math

import pytest

from shardfeed.convert import write_dataset
from shardfeed.readers import open_dataset

IMAGE = b"\xff\xd8 any bytes: not decoded here"


def _samples(n: int = 4, **extra):
    return [{"image": IMAGE, "ext": "jpg", "label": i % 2, **extra} for i in range(n)]


def _nothing_finished(out) -> bool:
    return not (out / "manifest.json").exists() and not list(out.glob("*.tar"))


@pytest.mark.parametrize("skipped, named", [
    (["cat/a.jpg"], "skipped[0]"),
    ([{"path": "a.jpg", "reason": "broken"}, {"path": "b.jpg"}], "skipped[1]"),
    ([{"path": "a.jpg", "reason": "broken", "score": math.nan}], "skipped[0]['score']"),
    ("a.jpg", "skipped is a str"),
])
def test_malformed_skipped_is_refused_before_anything_is_written(tmp_path, skipped, named):
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        write_dataset(_samples(), out, classes=["a", "b"], skipped=skipped)
    assert named in str(info.value)
    assert _nothing_finished(out)


def test_a_malformed_entry_the_generator_appends_is_refused_before_the_manifest(tmp_path):
    skipped: list = []

    def samples():
        yield from _samples()
        skipped.append({"path": 3, "reason": "not a path"})

    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"skipped\[0\]"):
        write_dataset(samples(), out, classes=["a", "b"], skipped=skipped)
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("options, named", [
    ({"lr": math.nan}, "options['lr']"),
    ({"schedule": [1.0, math.inf]}, "options['schedule'][1]"),
    ({"nested": {"low": -math.inf}}, "options['nested']['low']"),
    ({"seen": {1, 2}}, "options['seen']"),
    ({3: "a"}, "key 3"),
])
def test_options_that_are_not_strict_json_are_refused_by_name(tmp_path, options, named):
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        write_dataset(_samples(), out, classes=["a", "b"], options=options)
    assert named in str(info.value)
    assert _nothing_finished(out)


def test_files_that_are_not_strict_json_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"files\['found'\]"):
        write_dataset(_samples(), tmp_path / "out", classes=["a", "b"], files={"found": math.nan})


def test_recorded_values_that_pass_are_strict_json_and_open(tmp_path):
    out = tmp_path / "out"
    skipped = [{"path": "c/x.jpg", "reason": "truncated", "key": None}]
    write_dataset(_samples(), out, classes=["a", "b"], skipped=skipped, options={"lr": 0.1, "tags": ["x"]})
    doc = json.loads((out / "manifest.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in manifest"))
    assert doc["skipped"] == skipped and doc["options"]["lr"] == 0.1 and doc["options"]["tags"] == ["x"]
    assert {s.key: s.label for s in open_dataset(str(out), decode=False)} == {f"{i:09d}": i % 2 for i in range(4)}


def test_a_label_that_contradicts_its_meta_class_is_refused(tmp_path):
    samples = [{"image": IMAGE, "ext": "jpg", "label": 0, "meta": {"class": "cat"}},
               {"image": IMAGE, "ext": "jpg", "label": 0, "meta": {"class": "dog"}}]
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"sample 1: label 0 is class 'cat', but its meta names class 'dog'"):
        write_dataset(samples, out, classes=["cat", "dog"])
    assert not (out / "manifest.json").exists()
    with pytest.raises(ValueError, match=r"sample 0: label 1 is class 'dog', but its meta names class 'cat'"):
        write_dataset([{"image": IMAGE, "ext": "jpg", "label": "dog", "meta": {"class": "cat"}}], tmp_path / "o2",
                      classes=["cat", "dog"])
    with pytest.raises(ValueError, match=r"label 1 is class '1', but its meta names class 'dog'.*classes=\[\.\.\.\]"):
        write_dataset([{"image": IMAGE, "ext": "jpg", "label": 1, "meta": {"class": "dog"}}], tmp_path / "o3")


def test_a_label_that_agrees_with_its_meta_class_is_written(tmp_path):
    out = tmp_path / "out"
    samples = [{"image": IMAGE, "ext": "jpg", "label": i % 2, "meta": {"class": ["cat", "dog"][i % 2]}}
               for i in range(4)]
    write_dataset(samples, out, classes=["cat", "dog"])
    assert {s.key: s.label for s in open_dataset(str(out), decode=False)} == {f"{i:09d}": i % 2 for i in range(4)}
