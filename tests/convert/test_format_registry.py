"""A format added the way docs/architecture.md ("How to add … A format") says: a reader source, a
packer, a streaming writer, a checker and a record reader, registered with ``register_format`` and
its description. The command line, ``pack``, ``convert``, ``check``, ``inspect`` and
``open_dataset`` then handle it without naming it anywhere.

The toy format keeps every sample as one JSON line of ``toy.jsonl`` (the image bytes in base64):
one file, not sharded, local disk only, its summary noun "box".
"""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main
from shardfeed.convert.write.context import PackContext, PackResult
from shardfeed.readers.format.manifest import Manifest, Sample, ShardEntry
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.format.registry import FORMATS, describe, format_choices, register_format

TOY_FILE = "toy.jsonl"
REPO = Path(__file__).resolve().parents[2]


def _toy_line(key: str, data: bytes, ext: str, label: int, meta: dict) -> str:
    return json.dumps({"key": key, "data": base64.b64encode(data).decode(), "ext": ext, "label": label,
                       "meta": meta}) + "\n"


def _write_toy(out: Path, lines: list[str]) -> ShardEntry:
    (out / TOY_FILE).write_text("".join(lines))
    return ShardEntry(TOY_FILE, len(lines), (out / TOY_FILE).stat().st_size)


def pack_toy(scan, samples, out, options, context: PackContext) -> PackResult:
    """The toy packer: the registry's packer contract (:class:`~shardfeed.convert.write.context.Packer`)."""
    lines = []
    for s in samples:
        data = Path(s.file.path).read_bytes()
        lines.append(_toy_line(s.key, data, s.file.ext, s.file.label, s.meta))
        context.progress(1, len(data))
    return PackResult([_write_toy(Path(out), lines)], [], 0, {})


class ToyWriter:
    """The toy streaming writer (the registry's uniform ``create`` factory)."""

    def __init__(self, out, classes, class_to_idx, options):
        self.out, self.classes, self.class_to_idx, self.options = Path(out), classes, class_to_idx, options
        self.lines: list[str] = []

    @classmethod
    def create(cls, out, *, classes, class_to_idx=None, options=None, **_unused):
        return cls(out, classes, class_to_idx, options)

    def write(self, sample: Sample, fields=None) -> None:
        self.lines.append(_toy_line(sample.key, sample.data, sample.ext, sample.label, sample.meta))

    def close(self) -> Manifest:
        manifest = Manifest(format="toy", num_samples=len(self.lines), classes=list(self.classes),
                            class_to_idx=self.class_to_idx, shards=[_write_toy(self.out, self.lines)],
                            options=self.options)
        manifest.write(self.out)
        return manifest

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def iter_toy_records(root, *, verify: bool = True):
    """The toy record reader: ``(key, record)`` in storage order."""
    for line in (Path(root) / TOY_FILE).read_text().splitlines():
        rec = json.loads(line)
        rec["data"] = base64.b64decode(rec["data"])
        yield rec["key"], rec


CHECKED: list[str] = []


def check_toy(loc, manifest, report, decode, progress, limit, max_decode_bytes):
    """The toy checker: counts the records (and says it ran)."""
    CHECKED.append(str(loc.root))
    report.num_shards = 1
    report.shards.append({"name": TOY_FILE, "ok": True})
    for _key, rec in iter_toy_records(loc.root):
        report.num_samples_found += 1
        report.num_bytes += len(rec["data"])
        progress(1, len(rec["data"]))


class ToySource:
    """The toy reader source: ``(location, manifest, **options)``, raw samples in storage order."""

    def __init__(self, location, manifest, **options):
        self.location, self.manifest, self.options = location, manifest, options

    def __iter__(self):
        for _key, rec in iter_toy_records(self.location):
            yield rec["data"], rec["label"]


@pytest.fixture
def toy_format():
    assert "toy" not in FORMATS
    register_format("toy", source=ToySource, title="Toy", sharded=False, remote_readable=False,
                    remote_writable=False, exact_sizes=False, summary_noun="box", files=(TOY_FILE,))
    register_format("toy", packer=pack_toy, writer=ToyWriter, checker=check_toy, records=iter_toy_records)
    CHECKED.clear()
    yield FORMATS["toy"]
    del FORMATS["toy"]


def _by_path(records) -> dict[str, tuple[bytes, int]]:
    return {rec["meta"]["path"]: (rec["data"], rec["label"]) for _key, rec in records}


def test_pack_help_lists_a_registered_format(toy_format):
    out = CliRunner().invoke(main, ["pack", "--help"]).output
    assert "[wds|webdataset|lmdb|toy]" in out
    assert CliRunner().invoke(main, ["convert", "--help"]).output.count("lmdb|toy]") == 1
    assert format_choices() == ["wds", "webdataset", "lmdb", "toy"]


def test_pack_check_inspect_and_open_a_registered_format(toy_format, tiny_image_folder, tiny_folder_expected,
                                                        tmp_path):
    from shardfeed.convert.tools.common import iter_raw_samples
    from shardfeed.convert.tools.inspect import inspect_dataset
    from shardfeed.readers.sources.dataset import open_dataset

    out = tmp_path / "toy_out"
    r = CliRunner().invoke(main, ["pack", str(tiny_image_folder), str(out), "--format", "toy", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "into one box (toy," in r.output  # the format's summary noun, not "shards"
    manifest = load_manifest(out / "manifest.json", check_files=True)  # sizes not checked: exact_sizes=False
    assert manifest.format == "toy" and manifest.num_samples == len(tiny_folder_expected)
    assert "max_count" not in manifest.options  # WebDataset's options do not apply
    assert _by_path(iter_toy_records(out)) == tiny_folder_expected  # the planted bytes and labels
    assert {s.meta["path"]: (s.data, s.label) for _n, s in iter_raw_samples(out)} == tiny_folder_expected

    r = CliRunner().invoke(main, ["check", str(out)])
    assert r.exit_code == 0, r.output
    assert CHECKED == [str(out)] and f"{len(tiny_folder_expected):,} samples in 1 file" in r.output
    report = inspect_dataset(out)
    assert sum(c["count"] for c in report["classes"]) == len(tiny_folder_expected)  # labels from the records

    ds = open_dataset(str(out))
    assert isinstance(ds, ToySource)
    assert sorted(ds) == sorted(tiny_folder_expected.values())


def test_the_description_decides_what_a_command_accepts(toy_format, tiny_image_folder, tmp_path):
    r = CliRunner().invoke(main, ["pack", str(tiny_image_folder), str(tmp_path / "o"), "--format", "toy",
                                  "--max-count", "5"])
    assert r.exit_code != 0
    assert "--max-count applies to WebDataset shards only; Toy writes one box" in r.output
    assert not describe("toy").remote_writable and describe("lmdb").files == ("data.mdb", "lock.mdb")


def test_convert_to_a_registered_format(toy_format, packed_wds, tiny_folder_expected, tmp_path):
    out = tmp_path / "conv"
    r = CliRunner().invoke(main, ["convert", str(packed_wds), str(out), "--format", "toy"])
    assert r.exit_code == 0, r.output
    assert "1 file" in r.output
    assert _by_path(iter_toy_records(out)) == tiny_folder_expected
    assert load_manifest(out / "manifest.json", check_files=False).format == "toy"


def test_describe_an_unregistered_format_gives_the_defaults():
    spec = describe("not-a-format")
    assert spec.sharded and spec.remote_readable and spec.exact_sizes and spec.source is None


#: the modules that may name a format: the registry and each format's own modules
FORMAT_MODULES = {
    "readers/format/registry.py", "readers/sources/webdataset_source.py", "readers/sources/lmdb_source.py",
    "readers/storage/lmdb_io.py",
    "readers/format/lmdb_record.py", "convert/writers/__init__.py", "convert/writers/webdataset.py",
    "convert/writers/lmdb.py", "convert/writers/lmdb_store.py",
}


def _format_name_tests(tree: ast.AST) -> list[int]:
    """Line numbers of comparisons against a format name (``==``, ``!=``, ``in``, ``not in``)."""
    names = {n for s in FORMATS.values() for n in (s.name, *s.aliases)}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators):
            values = [node.left, right]
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                values = list(right.elts)
            elif not isinstance(op, (ast.Eq, ast.NotEq)):
                continue
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                lines.append(node.lineno)
    return lines


def test_no_format_name_test_outside_the_registry_and_the_format_modules():
    found = []
    for pkg in ("convert", "readers"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in FORMAT_MODULES:
                found += [f"{rel}:{n}" for n in _format_name_tests(ast.parse(path.read_text(), rel))]
    assert not found, ("format names tested outside the registry; ask "
                       "readers.format.registry.describe(): ") + ", ".join(found)


def test_register_format_refuses_a_field_it_does_not_have():
    with pytest.raises(TypeError, match="no field.*shard_size"):
        register_format("toy2", shard_size=3)
    assert "toy2" not in FORMATS
