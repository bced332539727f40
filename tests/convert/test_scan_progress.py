"""``shardfeed pack`` shows the progress of the folder scan on stderr (listing the folders, then
checking the files, counted against the files the test planted); none with ``-q``, and never in
the ``--json -`` report on stdout."""

from __future__ import annotations

import json
import re
import sys

from .progress_tty import run_on_tty

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]


def _planted_files(folder) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


def test_pack_shows_the_scan_progress_on_stderr(tiny_image_folder, tmp_path):
    n = _planted_files(tiny_image_folder)
    rc, out, err = run_on_tty([*SHARDFEED, "pack", str(tiny_image_folder), str(tmp_path / "o"), "-j", "1",
                               "--json", "-"])
    assert rc == 0, err
    assert f"scan {tiny_image_folder}: listing folders" in err
    # every planted file checked (tqdm's unit_scale writes 60 as 60.0, 3 as 3.00)
    assert re.search(rf"scan {re.escape(str(tiny_image_folder))}: checking files: 100%.*\b{n}(\.0+)?/{n}(\.0+)? ", err)
    assert json.loads(out)["num_samples"] == n  # stdout holds the report alone


def test_pack_quiet_shows_no_scan_progress(tiny_image_folder, tmp_path):
    rc, out, err = run_on_tty([*SHARDFEED, "-q", "pack", str(tiny_image_folder), str(tmp_path / "o"), "-j", "1"])
    assert rc == 0, err
    assert err == "" and out.startswith("packed 60 samples")


def test_scan_reports_every_file_listed_then_checked(tiny_image_folder):
    from shardfeed.convert.write.scan import scan_image_folder

    n = _planted_files(tiny_image_folder)
    events = []
    scan = scan_image_folder(tiny_image_folder, progress=lambda phase, k: events.append((phase, k)))
    phases = [p for p, _ in events]
    assert phases == sorted(phases, key=["listed", "checked"].index)  # listing first, then checking
    assert sum(k for p, k in events if p == "listed") == n  # the root holds only class folders
    assert sum(k for p, k in events if p == "checked") == n == len(scan.files)
