"""``remove_state_folder`` with entries a pack never writes: links, FIFOs, folders and odd names stay,
nothing outside the folder is followed, and the warning shows each kept name on its one line."""

from __future__ import annotations

import logging
import os

from shardfeed.convert.write.pack_state import STATE_DIR, remove_state_folder


def test_hostile_entries_stay_and_the_warning_has_one_line(tmp_path, caplog):
    state = tmp_path / STATE_DIR
    state.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    (state / "plan.json").symlink_to(outside)
    os.mkfifo(state / "000002.json")
    (state / "000003.json").mkdir()
    (state / "user\nforged: line").write_bytes(b"u")
    (state / "000004.json").write_bytes(b"{}")
    (state / ".files.jsonl.z.abc_1234.tmp").write_bytes(b"t")
    with caplog.at_level(logging.WARNING):
        kept = remove_state_folder(tmp_path)
    assert kept == sorted(["000002.json", "000003.json", "plan.json", "user\nforged: line"])
    assert sorted(os.listdir(state)) == kept
    assert outside.read_bytes() == b"keep"
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in msg and "'user\\nforged: line'" in msg


def test_a_link_named_like_the_folder_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "plan.json").write_bytes(b"p")
    out = tmp_path / "out"
    out.mkdir()
    (out / STATE_DIR).symlink_to(target)
    assert remove_state_folder(out) == []
    assert (target / "plan.json").read_bytes() == b"p" and (out / STATE_DIR).is_symlink()
