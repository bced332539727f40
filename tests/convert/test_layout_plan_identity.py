"""A layout pack's plan keeps its identity across versions: the fingerprint an interrupted pack
wrote to ``OUT/.shardfeed-pack/plan.json`` is the one ``--resume`` computes now, so a pack
stopped by an earlier version still resumes. The expected values were computed once, from a
planted folder with fixed modification times, and are pinned here."""

from __future__ import annotations

import json
import os

import pytest

from shardfeed.convert.write import layout_shards
from shardfeed.convert.write.layouts import LayoutOptions, pack_layout
from shardfeed.convert.write.pack import PackOptions

#: (layout, pack options) -> the plan fingerprint of the planted folder
PINNED = {
    "labels_sidecars": "910dfc8257827a49579f8ebc9fa2d8d2a05db2145eb581faffaf9966bdababee",
    "unlabelled_noshuffle": "a9e7a4360ffcb9e340aa391c4eed2293f2cd0cc17d3cd52d94a021f9439be555",
    "class_folders_sidecars": "7ba53f7ea74ccebc2061b54094215ffeb238f8aca0ec4161972a17f7cb81a45c",
}


def _plant(root) -> None:
    """Nine images (three in ``sub/``, one ``x.v2.jpg``), sidecar files, a labels file, class
    folders; every file's modification time fixed."""
    (root / "flat" / "sub").mkdir(parents=True)
    rows = ["path,label"]
    for i in range(9):
        rel = f"{'sub/' if i % 3 == 0 else ''}im{i}.{'v2.' if i == 4 else ''}{'png' if i % 2 else 'jpg'}"
        (root / "flat" / rel).write_bytes(bytes([i]) * (100 + 7 * i))
        stem = rel.rsplit(".", 1)[0]
        if i % 2 == 0:
            (root / "flat" / f"{stem}.txt").write_bytes(b"c" * i)
        if i % 4 == 0:
            (root / "flat" / f"{stem}.json").write_bytes(b"{}")
        rows.append(f"{rel},{('cat', 'dog', 'emu')[i % 3]}")
        cls = root / "cf" / ("a" if i % 2 else "b")
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"x{i}.jpg").write_bytes(bytes([i]) * (50 + i))
        (cls / f"x{i}.txt").write_bytes(b"t" * i)
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    for i, p in enumerate(sorted(q for q in root.rglob("*") if q.is_file())):
        os.utime(p, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_000 + 1000 * i))


def _fingerprint(src, out, options: PackOptions, layout: LayoutOptions, monkeypatch) -> str:
    """The fingerprint a pack stopped at its first file read leaves in OUT's plan."""
    def stop(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(layout_shards, "read_checked", stop)
    with pytest.raises(KeyboardInterrupt):
        pack_layout(src, out, options, layout)
    monkeypatch.undo()
    return json.loads((out / ".shardfeed-pack" / "plan.json").read_text())["fingerprint"]


@pytest.mark.parametrize("case", sorted(PINNED))
def test_a_layout_plan_keeps_its_fingerprint(case, tmp_path, monkeypatch):
    _plant(tmp_path)
    monkeypatch.chdir(tmp_path)  # the recorded labels file is the relative path given
    src, options, layout = {
        "labels_sidecars": ("flat", PackOptions(format="wds", max_count=4, workers=1, seed=7),
                            LayoutOptions(labels_file="labels.csv", sidecars=("txt", "json"))),
        "unlabelled_noshuffle": ("flat", PackOptions(format="wds", workers=1, shuffle=False),
                                 LayoutOptions(no_labels=True, sidecars=("txt",))),
        "class_folders_sidecars": ("cf", PackOptions(format="wds", workers=1, seed=3),
                                   LayoutOptions(sidecars=("txt",))),
    }[case]
    got = _fingerprint(tmp_path / src, tmp_path / "out", options, layout, monkeypatch)
    assert got == PINNED[case]
