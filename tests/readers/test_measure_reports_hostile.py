"""Hostile and careless output paths and values for the report pages: ``--plot`` and ``--html``
into a link, into a missing folder, and figures of timings that are not finite numbers.

The victim files, links and timings are planted here; each test checks the victim's own bytes,
the PNG signature of what was written, or the command's exit before any measuring.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main as cli_main
from shardfeed.readers.measure import write_html_report
from shardfeed.readers.measure.figures import DeliverySeries, plot_delivery, plot_tune

pytest.importorskip("matplotlib", reason="the plot extra (make install) has matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VICTIM = b"precious bytes that no report may overwrite\n"


class _Tune:
    """What plot_tune reads of a TuneReport: trials and the one kept."""

    def __init__(self, trials):
        self.trials = trials
        self.best = trials[0]


def _series(**kw) -> DeliverySeries:
    d = {"label": "AFTER wds", "t_start_s": [0.0, 0.5, 1.0], "t_wait_s": [0.1, 0.0, 0.2],
         "t_step_s": [0.4, 0.4, 0.4], "num_samples": [8, 8, 8], "images_per_s": 24.0}
    d.update(kw)
    return DeliverySeries(**d)


def _draw(kind: str, path: Path) -> None:
    if kind == "delivery":
        plot_delivery([_series()], path, title="verdict")
    elif kind == "tune":
        plot_tune(_Tune([{"step": "num_workers", "options": {"num_workers": 2}, "images_per_s": 10.0,
                          "stall_share": 0.1}]), path)
    else:
        write_html_report(path, title="shardfeed verify", headline="</pre><script>alert(1)</script>",
                          report_json={"source": "</pre><script>alert(1)</script>"})


@pytest.mark.parametrize("kind", ["delivery", "tune", "html"])
def test_a_report_at_a_link_replaces_the_link_and_leaves_its_target_alone(tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    link = tmp_path / ("report.html" if kind == "html" else "figure.png")
    os.symlink(victim, link)
    _draw(kind, link)
    assert victim.read_bytes() == VICTIM
    assert not link.is_symlink() and link.is_file()
    head = link.read_bytes()
    if kind == "html":
        assert b"<script>" not in head and b"&lt;/pre&gt;&lt;script&gt;" in head
    else:
        assert head.startswith(PNG_SIGNATURE)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_timings_that_are_not_finite_numbers_still_draw_the_figure(tmp_path, bad):
    s = _series(t_start_s=[0.0, bad, 1.0], t_wait_s=[0.1, bad, 0.2], t_step_s=[bad, 0.4, 0.4], images_per_s=bad)
    assert plot_delivery([s, _series(label="BEFORE folder")], tmp_path / "d.png").read_bytes().startswith(
        PNG_SIGNATURE)
    trials = [{"step": "num_workers", "options": {"num_workers": 2}, "images_per_s": bad, "stall_share": bad},
              {"step": "num_workers", "options": {"num_workers": 4}, "images_per_s": 30.0, "stall_share": 0.2}]
    assert plot_tune(_Tune(trials), tmp_path / "t.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("args", [["bench", "SRC"], ["verify", "SRC", "SRC"], ["tune", "SRC"]])
def test_plot_into_a_missing_folder_is_refused_before_measuring(tmp_path, args):
    missing = tmp_path / "no-such-folder" / "figure.png"
    src = tmp_path / "not-measured"  # never opened: the path check comes first
    argv = [str(src) if a == "SRC" else a for a in args] + ["--plot", str(missing)]
    result = CliRunner().invoke(cli_main, argv)
    assert result.exit_code == 2, result.output
    assert "--plot" in result.output and f"folder {missing.parent} does not exist" in result.output
    assert str(src) not in result.output


ROWS = [("source", "/data/train/" + "x" * 70, "12.3"), ("images/s", "1,234", "5,678")]
HEADER = ("", "BEFORE", "AFTER")


@pytest.mark.parametrize("width", [0, 1, 3, 10])
def test_a_terminal_too_narrow_to_wrap_shows_every_cell_whole(width):
    from shardfeed.readers.measure.tables import format_table

    out = format_table(ROWS, header=HEADER, width=width)
    for cell in [c for r in ROWS for c in r] + ["BEFORE", "AFTER"]:
        assert cell in out  # whole, on one line: not cut into pieces of `width` characters, not dropped


def test_control_characters_in_a_cell_are_shown_escaped_never_sent_to_the_terminal():
    from shardfeed.readers.measure.tables import format_table

    hostile = "/data/\x1b[2J\x1b]0;owned\x07train\nfake row"
    plain = format_table([("source", hostile, "1")], header=HEADER, width=1000)
    assert len(plain.splitlines()) == 3  # header, rule, the one row: the newline did not make a row
    assert "/data/\\x1b[2J\\x1b]0;owned\\x07train\\nfake row" in plain
    wrapped = format_table([("source", hostile, "1")], header=HEADER, width=40)
    assert not any(ch in wrapped for ch in "\x1b\x07")


def _tiny_folder(root: Path) -> Path:
    import io

    from PIL import Image

    for label in range(2):
        d = root / f"class_{label}"
        d.mkdir(parents=True)
        for i in range(4):
            buf = io.BytesIO()
            Image.new("RGB", (24, 20), (40 * i, 100 * label, 7)).save(buf, "JPEG")
            (d / f"{i}.jpg").write_bytes(buf.getvalue())
    return root


def test_a_figure_that_fails_to_draw_loses_no_measurement(tmp_path, monkeypatch):
    import json

    import shardfeed.readers.measure as measure

    def broken(*args, **kwargs):
        raise RuntimeError("the figure broke")

    monkeypatch.setattr(measure, "plot_runs", broken)
    folder = _tiny_folder(tmp_path / "folder")
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    args = ["bench", str(folder), "--image-size", "16", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--model", "tiny", "--num-workers", "0", "--batch-size", "4", "--batches", "2",
            "--html", str(page), "--json", str(out)]
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())  # the measurement is kept
    assert report["batches"]["num_samples"] == [4, 4]
    text = page.read_text()
    assert "No figure: it could not be drawn (RuntimeError: the figure broke)" in text
    assert f"{report['images_per_s']:,.1f} images/s" in text  # the page keeps its verdict
    with pytest.raises(RuntimeError, match="the figure broke"):  # --plot itself still fails, the JSON already there
        out.unlink()
        CliRunner().invoke(cli_main, args[:-4] + ["--plot", str(tmp_path / "f.png"), "--json", str(out)],
                           catch_exceptions=False)
    assert json.loads(out.read_text())["batches"]["num_samples"] == [4, 4]


@pytest.mark.parametrize("args", [["bench", "SRC"], ["verify", "SRC", "SRC"], ["tune", "SRC"]])
@pytest.mark.parametrize("a, b", [("--plot", "--html"), ("--html", "--json"), ("--plot", "--json")])
def test_two_reports_into_the_same_file_are_refused_before_measuring(tmp_path, args, a, b):
    src = tmp_path / "not-measured"
    argv = [str(src) if x == "SRC" else x for x in args] + [a, str(tmp_path / "report"), b, str(tmp_path / "report")]
    result = CliRunner().invoke(cli_main, argv)
    assert result.exit_code == 2, result.output
    assert "name the same file" in result.output and str(src) not in result.output
    assert not (tmp_path / "report").exists()
