"""A required option left out is a usage error naming it, before any work (an explicit
``default=None`` would count as a value given and reach the command as None)."""

from __future__ import annotations

from click.testing import CliRunner

from shardfeed.convert.cli import main


def test_convert_without_format_is_a_usage_error_naming_the_option(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    r = CliRunner().invoke(main, ["convert", str(src), str(out)])
    assert r.exit_code == 2, r.output
    assert "Missing option '--format'" in r.output and "Traceback" not in r.output
    assert not out.exists()
