"""``-q`` and ``-v`` work after the command name as before it (``shardfeed pack SRC OUT -q``)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (1, 2, 3)).save(buf, "PNG")
    (root / "a" / "x.png").write_bytes(buf.getvalue())
    return root


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_before_or_after_the_command(folder, tmp_path, where):
    out = tmp_path / f"out-{where}"
    args = ["pack", str(folder), str(out), "--workers", "1"]
    args = ["-q", *args] if where == "before" else [*args, "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["num_samples"] == 1
    assert logging.getLogger().level == logging.ERROR


def test_verbose_after_the_command_raises_the_log_level(folder, tmp_path):
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "missing"), "-vv"])
    assert result.exit_code != 0
    assert logging.getLogger().level == logging.DEBUG
    result = CliRunner().invoke(main, ["-v", "pack", str(folder), str(tmp_path / "o"), "--workers", "1", "-v"])
    assert result.exit_code == 0, result.output
    assert logging.getLogger().level == logging.DEBUG  # -v before plus -v after: -vv


def test_every_command_lists_quiet_and_verbose():
    for name, cmd in main.commands.items():
        opts = {o for p in cmd.params for o in p.opts}
        assert {"-q", "--quiet", "-v", "--verbose"} <= opts, name
