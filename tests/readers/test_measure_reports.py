"""What `bench`, `verify` and `tune` show people: the `--plot` figure, the `--html` page (loaded in
a real headless Chromium), the verdict's note on re-encoded datasets, the real sample count of
partial batches, and the source kind of an image folder in a bucket.

Real components only: a small image folder written here, packed with `shardfeed.convert.write.pack`,
measured through the real CLI; the page is opened by Debian's Chromium through Playwright.
Expected values come from the folder (image count, batch arithmetic), from the pack options the
test chose, or from the command's own `--json` file compared with what the page shows.
"""

from __future__ import annotations

import html
import io
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main as cli_main
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.write.reencode import ReencodeOptions

NUM_CLASSES, PER_CLASS = 2, 12
NUM_IMAGES = NUM_CLASSES * PER_CLASS
COMMON = ["--image-size", "16", "--warmup", "0", "--threads", "1", "--device", "cpu", "--model", "tiny",
          "--num-workers", "0"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The banner's left border per tone, as a browser reports it: green, grey, red.
BANNER_RGB = {"win": "rgb(44, 160, 44)", "neutral": "rgb(127, 127, 127)", "loss": "rgb(214, 39, 40)"}


def _make_folder(root: Path) -> Path:
    rng = np.random.default_rng(7)
    for label in range(NUM_CLASSES):
        d = root / f"class_{label}"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            arr = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, "JPEG", quality=90)
            (d / f"img_{i:03d}.jpg").write_bytes(buf.getvalue())
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    folder = _make_folder(root / "folder")
    wds = root / "wds"
    pack(folder, wds, PackOptions(format="wds", max_count=10, workers=1))
    resized = root / "wds-resized"
    pack(folder, resized, PackOptions(format="wds", max_count=10, workers=1,
                                      reencode=ReencodeOptions(resize=24, quality=80)))
    return {"folder": folder, "wds": wds, "resized": resized}


def _run(args: list) -> "object":
    return CliRunner().invoke(cli_main, [str(a) for a in args], catch_exceptions=False)


def _open_in_chromium(launch_chromium, page_path: Path) -> dict:
    """Load the page in headless Chromium; what it logged as errors and where the figure is."""
    with launch_chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        requests: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_path.as_uri(), wait_until="load")
        figure = page.evaluate("""() => {
            const img = document.getElementById('figure');
            if (!img) return null;
            const r = img.getBoundingClientRect();
            return {complete: img.complete, naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
                    top: r.top, bottom: r.bottom, width: r.width, height: r.height,
                    viewportHeight: window.innerHeight};
        }""")
        info = {
            "errors": errors,
            "requests": requests,
            "figure": figure,
            "headline": page.inner_text("#headline"),
            "banner": page.eval_on_selector("#headline", "e => getComputedStyle(e).borderLeftColor"),
            "report": page.eval_on_selector("#report-json", "e => e.textContent"),
            "scripts": page.eval_on_selector_all("script", "es => es.length"),
            "table_rows": page.eval_on_selector_all("table tbody tr", "rs => rs.map(r => r.innerText)"),
        }
    return info


def _assert_page_ok(info: dict, page_path: Path) -> None:
    assert info["errors"] == []
    # self-contained: the only request is the page itself (the figure is a data: URI)
    assert [u for u in info["requests"] if not u.startswith("data:")] == [page_path.as_uri()]
    fig = info["figure"]
    assert fig is not None and fig["complete"] and fig["naturalWidth"] > 0 and fig["naturalHeight"] > 0
    assert fig["width"] > 300 and fig["height"] > 100
    assert 0 <= fig["top"] < fig["viewportHeight"]  # on the first screen


@pytest.mark.multiprocess
def test_verify_plot_and_html_page_load_in_a_browser(data, tmp_path, launch_chromium):
    png, page, out = tmp_path / "verify.png", tmp_path / "verify.html", tmp_path / "verify.json"
    r = _run(["verify", data["folder"], data["wds"], *COMMON, "--batch-size", "8", "--batches", "2",
              "--repeats", "1", "--plot", png, "--html", page, "--json", out])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    report = json.loads(out.read_text())
    info = _open_in_chromium(launch_chromium, page)
    _assert_page_ok(info, page)
    assert info["headline"] == report["headline"]
    assert json.loads(info["report"]) == report
    assert info["scripts"] == 0
    rows = {row.split("\t")[0]: row.split("\t")[1:] for row in info["table_rows"]}
    assert rows["source"] == [f"folder: {data['folder']}", f"webdataset: {data['wds']}"]
    assert rows["images/s"] == [f"{report['before']['images_per_s']:.1f}", f"{report['after']['images_per_s']:.1f}"]
    # the banner's colour follows the verdict: green for a win, red for a loss, grey otherwise
    assert info["banner"] == BANNER_RGB[{"faster": "win", "slower": "loss"}.get(report["verdict"]["kind"], "neutral")]


@pytest.mark.multiprocess
def test_tune_plot_and_html_list_every_trial(data, tmp_path, launch_chromium):
    png, page, out = tmp_path / "tune.png", tmp_path / "tune.html", tmp_path / "tune.json"
    r = _run(["tune", data["wds"], *COMMON[:-2], "--batch-size", "8", "--batches", "2", "--max-num-workers", "1",
              "--budget-s", "60", "--plot", png, "--html", page, "--json", out])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    report = json.loads(out.read_text())
    info = _open_in_chromium(launch_chromium, page)
    _assert_page_ok(info, page)
    assert len(info["table_rows"]) == len(report["trials"]) >= 2
    for row, trial in zip(info["table_rows"], report["trials"]):
        cells = row.split("\t")
        assert cells[0] == trial["step"] and cells[1] == str(trial["round"])
        assert cells[2] == str(trial["options"]["num_workers"])
        assert cells[6] == f"{trial['images_per_s']:.1f}"


def test_html_page_escapes_user_text(tmp_path):
    from shardfeed.readers.measure import HtmlTable, write_html_report

    hostile = '<script>alert("x")</script> & "quotes"'
    page = tmp_path / "p.html"
    write_html_report(page, title="shardfeed bench", headline=hostile, report_json={"source": hostile},
                      tables=[HtmlTable("t", ("", "run"), [("source", hostile)])], notes=[hostile])
    text = page.read_text()
    assert "<script>" not in text and html.escape(hostile) in text
    assert re.search(r"<(script|link|iframe)\b", text) is None


def _banner_colour(page: str) -> tuple[str, str]:
    """The headline's tone class and the left-border colour its CSS rules give it (the last rule
    that matches wins, as in a browser)."""
    tone = re.search(r'<p class="headline (\w+)" id="headline">', page).group(1)
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    colour = None
    for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", style):
        if selector.strip() in (".headline", f".headline.{tone}"):
            found = re.search(r"border-left(?:-color)?:[^;#]*(#[0-9a-f]{6})", body)
            colour = found.group(1) if found else colour
    return tone, colour


@pytest.mark.parametrize("kind, rgb", [("faster", (0x2c, 0xa0, 0x2c)), ("slower", (0xd6, 0x27, 0x28)),
                                       ("same", (0x7f, 0x7f, 0x7f)), ("noisy", (0x7f, 0x7f, 0x7f)),
                                       ("busy", (0x7f, 0x7f, 0x7f)), (None, (0x7f, 0x7f, 0x7f))])
def test_html_banner_colour_follows_the_verdict(kind, rgb):
    from shardfeed.readers.measure.html_report import banner_tone, render_html_report

    verdict = {"kind": kind} if kind else None
    page = render_html_report(title="shardfeed verify", headline="h", report_json={}, tone=banner_tone(verdict))
    tone, colour = _banner_colour(page)
    assert tone == {"faster": "win", "slower": "loss"}.get(kind, "neutral")
    assert colour is not None and tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5)) == rgb
    assert "rgb(%d, %d, %d)" % rgb == BANNER_RGB[tone]


def test_html_banner_refuses_an_unknown_tone():
    from shardfeed.readers.measure.html_report import render_html_report

    with pytest.raises(ValueError, match="tone='green'"):
        render_html_report(title="t", headline="h", report_json={}, tone="green")


def test_html_page_without_matplotlib_says_how_to_get_the_figure(tmp_path):
    from shardfeed.readers.measure import write_html_report

    def draw(_path):
        raise ImportError("--plot needs matplotlib: pip install 'shardfeed[plot]'")

    page = tmp_path / "p.html"
    write_html_report(page, title="t", headline="h", report_json={}, draw=draw)
    text = page.read_text()
    assert 'id="figure"' not in text and "pip install &#x27;shardfeed[plot]&#x27;" in text


@pytest.mark.multiprocess
def test_batches_row_shows_the_real_sample_count_of_partial_batches(data, tmp_path):
    # 24 images in batches of 10 with no warm-up: the first epoch gives 10, 10 and a partial 4
    out = tmp_path / "bench.json"
    r = _run(["bench", data["wds"], *COMMON, "--batch-size", "10", "--batches", "3", "--no-shuffle",
              "--details", "--json", out])
    assert r.exit_code == 0, r.output
    sizes = [10, 10, NUM_IMAGES - 20]
    report = json.loads(out.read_text())
    assert report["batches"]["num_samples"] == sizes and report["num_samples"] == sum(sizes)
    assert f"3 batches (2 x 10, 1 partial) = {sum(sizes)}" in r.output
    assert "3 x 10 = " not in r.output


@pytest.mark.multiprocess
def test_verify_says_the_gain_includes_decode_cost_when_after_was_reencoded(data, tmp_path):
    out = tmp_path / "v.json"
    r = _run(["verify", data["folder"], data["resized"], *COMMON, "--batch-size", "8", "--batches", "2",
              "--repeats", "1", "--json", out])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    cpi = report["cpu_s_per_image"]
    note = ("the difference includes decode cost, not only reading: AFTER was re-encoded at pack time "
            "(resize 24")
    assert note in report["headline"] and note in r.output
    assert "quality 80" in report["headline"]
    assert f"CPU per image BEFORE {cpi['before'] * 1000:.2f} ms, AFTER {cpi['after'] * 1000:.2f} ms" in r.output
    assert report["after"]["config"]["reencode"]["resize"] == 24
    assert report["before"]["config"]["reencode"] is None


@pytest.mark.multiprocess
def test_verify_without_reencoding_has_no_decode_note_and_three_rounds_by_default(data, tmp_path):
    out = tmp_path / "v.json"
    r = _run(["verify", data["folder"], data["wds"], *COMMON, "--batch-size", "8", "--batches", "1",
              "--json", out])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert "decode cost" not in report["headline"]
    assert report["repeats"] == 3
    assert [x["label"] for x in report["runs"]] == ["before", "after", "after", "before", "before", "after"]


def test_a_table_wider_than_the_terminal_is_wrapped_to_fit_and_keeps_every_word():
    from shardfeed.readers.measure import format_table

    rows = [("page cache", "not evicted (as found; --cold evicts)", "evicted, 3% left of 12 files, 1.2 MB"),
            ("memory, workers (RSS start -> end)", "311.2 MB -> 311.3 MB", "316.9 MB -> 317.0 MB"),
            ("[bold]markup[/bold] stays text", "a", "b")]
    header = ("", "BEFORE", "AFTER")
    plain = format_table(rows, header=header, width=1000)
    assert max(len(line) for line in plain.splitlines()) > 60  # wider than the width asked below
    wrapped = format_table(rows, header=header, width=60)
    assert max(len(line) for line in wrapped.splitlines()) <= 60
    # every character of every cell is there (wrapping moves them, never drops them), markup stays text
    cells = "".join(c for r in [header, *rows] for c in r)
    assert Counter(ch for ch in wrapped if not ch.isspace() and ch != "─") == \
        Counter(ch for ch in cells if not ch.isspace())
    # not a terminal (as under a test runner or a pipe): never wrapped, so output stays grep-able
    assert format_table(rows, header=header) == plain


WATCHED_SCRIPT = '''
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.zeros(3, 4, 4), i

for epoch in range(2):
    for x, y in DataLoader(Slow(), batch_size=4, num_workers=0):
        time.sleep(0.003)
'''


@pytest.mark.multiprocess
def test_watch_plot_and_html_show_every_timed_batch(tmp_path, launch_chromium):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(WATCHED_SCRIPT)
    png, page, out = tmp_path / "watch.png", tmp_path / "watch.html", tmp_path / "watch.json"
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--plot", str(png), "--html", str(page),
                        "--json", str(out), "--", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    report = json.loads(out.read_text())
    # the script iterates 2 epochs of 24 / 4 = 6 batches; each epoch is a new DataLoader (one report each),
    # whose first batch is the warm-up: 5 timed batches of 4 samples per loader
    assert len(report["loaders"]) == 2
    for rep in report["loaders"]:
        assert rep["per_batch"]["num_samples"] == [4] * 5 and len(rep["per_batch"]["t_step_s"]) == 5
    info = _open_in_chromium(launch_chromium, page)
    _assert_page_ok(info, page)
    assert json.loads(info["report"]) == report
    assert len(info["table_rows"]) == 2
