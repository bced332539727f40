"""Only the command that made a pack can finish it: ``index`` refuses a folder holding a stopped
pack (class folders, a layout pack, ``write_dataset``), writes no manifest there, and the pack's
own ``--resume`` still finishes it; a failed ``index --overwrite`` leaves every offset index as it
was; ``--resume`` removes the temporary files of the stopped pack's own shards and nothing else.

Expectations: the bytes of the files planted or of an uninterrupted pack of the same folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.readers.errors import IncompleteDatasetError


class _Stop(KeyboardInterrupt):
    """Ctrl-C, raised from the progress callback once some shards are complete."""


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != ".shardfeed.lock"}


def _stopped_pack(src: Path, out: Path, options: PackOptions, layout=None, after: int = 30) -> None:
    seen = [0]

    def progress(n, nbytes, *rest):
        seen[0] += n
        if seen[0] >= after:
            raise _Stop()

    with pytest.raises(_Stop):
        pack(src, out, options, layout=layout, progress=progress)
    assert list(out.glob("*.tar")) and not (out / "manifest.json").exists()


def _refused_index(out: Path, *needles: str) -> None:
    before = _files(out)
    r = CliRunner().invoke(main, ["index", str(out)])
    assert r.exit_code == 1, r.output
    for needle in needles:
        assert needle in r.output, r.output
    assert "Traceback" not in r.output
    assert _files(out) == before  # no manifest, no offset index rewritten
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("layout", [None, "no_labels"])
def test_index_refuses_a_stopped_pack_which_resume_then_finishes(tiny_image_folder, tmp_path, layout):
    from shardfeed.convert.write.layouts import LayoutOptions

    opts = PackOptions(format="wds", max_count=8, workers=1, seed=0)
    lay = LayoutOptions(no_labels=True) if layout else None
    ref = tmp_path / "ref"
    pack(tiny_image_folder, ref, opts, layout=lay)
    out = tmp_path / "out"
    _stopped_pack(tiny_image_folder, out, opts, layout=lay)
    _refused_index(out, "unfinished pack", "plan.json", f"shardfeed pack SRC {out} --resume")
    r = CliRunner().invoke(main, ["index", str(out), "--overwrite"])
    assert r.exit_code == 1 and not (out / "manifest.json").exists(), r.output
    pack(tiny_image_folder, out, PackOptions(format="wds", max_count=8, workers=1, seed=0, resume=True), layout=lay)
    assert _files(out) == _files(ref)


def test_index_refuses_a_stopped_write_dataset(tmp_path):
    from shardfeed.convert import write_dataset

    def samples():
        for i in range(10):
            yield {"image": b"\xff\xd8 not decoded %d" % i, "ext": "jpg", "label": i % 2}
        raise RuntimeError("the source broke")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="the source broke"):
        write_dataset(samples(), out, max_count=3)
    assert list(out.glob("*.tar"))
    _refused_index(out, "write_dataset that stopped", "write_dataset.json")


def test_index_unfinished_is_the_library_error(tiny_image_folder, tmp_path):
    from shardfeed.convert import index_shards

    out = tmp_path / "out"
    _stopped_pack(tiny_image_folder, out, PackOptions(format="wds", max_count=8, workers=1))
    with pytest.raises(IncompleteDatasetError, match="only the command that made a pack can finish it"):
        index_shards(out)


def test_failed_index_overwrite_keeps_every_offset_index(tiny_image_folder, tmp_path):
    from shardfeed.convert.write.layouts import LayoutOptions
    from shardfeed.readers import open_dataset

    ds = tmp_path / "ds"
    pack(tiny_image_folder, ds, PackOptions(format="wds", max_count=16, workers=1),
         layout=LayoutOptions(no_labels=True))
    before = _files(ds)
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\neel\n")  # the samples hold no class: every one is left out, so the index fails
    r = CliRunner().invoke(main, ["index", str(ds), "--overwrite", "--classes", str(classes)])
    assert r.exit_code == 1 and "no sample with an image and a class" in r.output, r.output
    assert _files(ds) == before
    assert not [p.name for p in ds.iterdir() if p.name.endswith(".tmp")]
    assert len(list(open_dataset(str(ds), decode=False))) == 60


def test_resume_removes_the_stopped_packs_temporary_files_only(tiny_image_folder, tmp_path):
    opts = PackOptions(format="wds", max_count=8, workers=1, seed=0)
    ref = tmp_path / "ref"
    pack(tiny_image_folder, ref, opts)
    out = tmp_path / "out"
    _stopped_pack(tiny_image_folder, out, opts)
    own = [".shard-000002.sfidx.k3j_x9a2.tmp", ".shard-000002.sfidx.tmp", ".shard-000007.tar.tmp"]
    others = {".notes.tmp": b"mine", ".shard-notes.tmp": b"mine too", ".other-000001.sfidx.ab12cd34.tmp": b"x",
              ".shard-000002.sfidx.k3j_x9a2.tmp.keep": b"y"}
    for name in own:
        (out / name).write_bytes(b"half an index")
    for name, data in others.items():
        (out / name).write_bytes(data)
    pack(tiny_image_folder, out, PackOptions(format="wds", max_count=8, workers=1, seed=0, resume=True))
    files = _files(out)
    assert not any(name in files for name in own)
    assert {n: files.pop(n) for n in others} == others
    assert files == _files(ref)


def test_inspect_of_a_stopped_write_dataset_says_to_write_it_again_not_to_resume_a_pack(tmp_path):
    import io
    import subprocess
    import sys

    import numpy as np
    from PIL import Image

    from shardfeed.convert import write_dataset

    def samples():
        for i in range(30):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(buf, "PNG")
            yield {"image": buf.getvalue(), "ext": "png", "label": 0}
            if i == 25:
                raise RuntimeError("the source failed")

    out = tmp_path / "stopped"
    with pytest.raises(RuntimeError):
        write_dataset(samples(), out, max_count=4, classes=["a"])
    r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "inspect", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "a write_dataset that stopped" in r.stderr and "call write_dataset again into an empty folder" in r.stderr
    assert "--resume" not in r.stderr, r.stderr
