"""One spelling per concept across CLI and API: ``--on-error raise|skip``, ``--workers``
(``-j``) for packing processes, ``--num-workers`` for DataLoader workers; the old spellings still
work and say they are deprecated.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main
from shardfeed.convert.cli.common import num_workers_options
from shardfeed.convert.write.pack import PackOptions, pack


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("spell") / "src"
    for i in range(6):
        p = root / ("a" if i % 2 else "b") / f"{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.new("RGB", (4, 3), (i * 30, 0, 0)).save(buf, "PNG")
        p.write_bytes(buf.getvalue())
    return root


def _digest(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}


def test_pack_on_error_fail_is_raise_with_a_deprecation_line(folder, tmp_path):
    runner = CliRunner()
    new = runner.invoke(main, ["pack", str(folder), str(tmp_path / "new"), "--on-error", "raise", "-j", "1"])
    assert new.exit_code == 0, new.output
    assert "deprecated" not in new.output
    old = runner.invoke(main, ["pack", str(folder), str(tmp_path / "old"), "--on-error", "fail", "--workers", "1"])
    assert old.exit_code == 0, old.output
    assert "--on-error fail is deprecated: use --on-error raise" in old.output
    # same bytes either way; the manifest records the current spelling
    assert _digest(tmp_path / "new") == _digest(tmp_path / "old")
    manifest = json.loads((tmp_path / "new" / "manifest.json").read_text())
    assert manifest["options"]["on_error"] == "raise"


def test_pack_options_on_error_fail_warns_and_means_raise(folder, tmp_path):
    with pytest.warns(DeprecationWarning, match="on_error='raise'"):
        opts = PackOptions(on_error="fail", workers=1)
    assert opts.on_error == "raise"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PackOptions(workers=1).on_error == "raise"
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        PackOptions(on_error="ignore")
    report = pack(folder, tmp_path / "o", opts)
    assert report.num_samples == 6


def test_num_workers_and_the_old_j():
    @click.command()
    @num_workers_options
    def cmd(num_workers):
        click.echo(f"num_workers={num_workers}")

    runner = CliRunner()
    res = runner.invoke(cmd, ["--num-workers", "3"])
    assert res.exit_code == 0 and "num_workers=3" in res.output and "deprecated" not in res.output
    res = runner.invoke(cmd, ["-j", "2"])
    assert res.exit_code == 0 and "num_workers=2" in res.output
    assert "-j for DataLoader workers is deprecated: use --num-workers" in res.output
    assert "-j" not in runner.invoke(cmd, ["--help"]).output


@pytest.mark.parametrize("command", ["bench", "verify", "tune"])
def test_measure_commands_spell_loader_workers_num_workers(command):
    out = CliRunner().invoke(main, [command, "--help"]).output
    assert "-j," not in out and "-j " not in out
    if command != "tune":
        assert "--num-workers" in out


def test_tune_max_workers_is_max_num_workers(tmp_path):
    runner = CliRunner()
    assert "--max-num-workers" in runner.invoke(main, ["tune", "--help"]).output
    assert "--max-workers" not in runner.invoke(main, ["tune", "--help"]).output
    # the old spelling is still parsed (then the missing dataset stops the command before any work)
    res = runner.invoke(main, ["tune", str(tmp_path / "missing"), "--max-workers", "1"])
    assert "--max-workers is deprecated: use --max-num-workers" in res.output
    assert res.exit_code == 1 and "missing" in res.output


@pytest.mark.parametrize("command", ["pack", "convert"])
def test_packing_commands_spell_processes_workers(command):
    out = CliRunner().invoke(main, [command, "--help"]).output
    assert "-j, --workers" in out and "--num-workers" not in out


_ON_ERROR_ARGS = {"pack": ["SRC", "OUT"], "bench": ["SRC"], "verify": ["A", "B"], "tune": ["SRC"]}


@pytest.mark.parametrize("command", sorted(_ON_ERROR_ARGS))
@pytest.mark.parametrize("spelling, want, warns", [
    ("raise", "raise", False), ("RAISE", "raise", False), ("Raise", "raise", False),
    ("skip", "skip", False), ("Skip", "skip", False), ("SKIP", "skip", False),
    ("fail", "raise", True), ("FAIL", "raise", True), ("Fail", "raise", True),
])
def test_every_command_reads_on_error_the_same_way(command, spelling, want, warns, capsys):
    cmd = main.commands[command]
    with cmd.make_context(command, [*_ON_ERROR_ARGS[command], "--on-error", spelling]) as ctx:
        assert ctx.params["on_error"] == want
    err = capsys.readouterr().err
    if warns:
        assert err.strip() == "shardfeed: warning: --on-error fail is deprecated: use --on-error raise"
    else:
        assert err == ""


@pytest.mark.parametrize("command", sorted(_ON_ERROR_ARGS))
def test_every_command_refuses_an_unknown_on_error(command):
    res = CliRunner().invoke(main, [command, *_ON_ERROR_ARGS[command], "--on-error", "ignore"])
    assert res.exit_code == 2 and "'raise', 'skip'" in res.output
