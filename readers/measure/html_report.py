"""One self-contained HTML page per report: what ``--html PATH`` writes for ``bench``, ``verify``,
``tune`` and ``watch``.

The page has no outside references (no scripts, fonts or style sheets fetched; the figure is an
inline ``data:`` PNG), so it can be mailed, attached to a ticket or opened from a CI artefact. It
holds, in this order: the headline (the verdict), the figure of :mod:`.figures` (when matplotlib is
installed; otherwise a line saying how to get it), the tables, any warnings and advice, and the
full JSON report (folded). Every piece of text is HTML-escaped: dataset paths and URLs come from
the user and may hold ``<``, ``&`` or quotes.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from ..file_io import write_bytes_atomic

__all__ = ["HtmlTable", "render_html_report", "write_html_report", "banner_tone", "BANNER_TONES"]

#: The headline banner's tones: green for a win, grey for no clear difference (or no verdict), red for a loss.
BANNER_TONES = ("win", "neutral", "loss")

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
     color:#222;padding:0 1rem;line-height:1.4}
h1{font-size:1.4rem;margin-bottom:.2rem} h2{font-size:1.1rem;margin-top:1.6rem}
.headline{font-size:1.25rem;font-weight:600;padding:.6rem .9rem;background:#f2f2f2;border-left:5px solid #7f7f7f}
.headline.win{background:#eef6ee;border-left-color:#2ca02c}
.headline.loss{background:#fbeeee;border-left-color:#d62728}
.meta{color:#666;font-size:.85rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}
th{background:#f4f4f4}
img.figure{max-width:100%;border:1px solid #eee}
ul.notes li{margin:.2rem 0}
pre{background:#f8f8f8;padding:.8rem;overflow:auto;font-size:.8rem;max-height:40rem}
"""


@dataclasses.dataclass
class HtmlTable:
    """A table of the page: a caption, a header row and rows of cells (all strings)."""

    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


def banner_tone(verdict: dict | None) -> str:
    """The banner's tone for a verdict of :func:`~shardfeed.readers.measure.verdict.judge_rounds`:
    ``"win"`` (kind ``faster``), ``"loss"`` (``slower``), else ``"neutral"`` (``same``, ``noisy``,
    ``busy``, or no verdict)."""
    kind = (verdict or {}).get("kind")
    return {"faster": "win", "slower": "loss"}.get(kind, "neutral")


def _table_html(t: HtmlTable) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in t.header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in t.rows)
    return f"<h2>{e(t.caption)}</h2>\n<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html_report(*, title: str, headline: str, report_json: Any, tables: Sequence[HtmlTable] = (),
                       notes: Sequence[str] = (), figure_png: bytes | None = None,
                       figure_missing: str | None = None, subtitle: str | None = None, tone: str = "neutral") -> str:
    """The page as one string of HTML (UTF-8, no outside references).

    Args:
        title: the page's ``<title>`` and heading (``"shardfeed verify"``).
        headline: the verdict line, shown first.
        report_json: the report's JSON form (what ``--json`` writes), shown folded at the end.
        tables: the tables, in order.
        notes: warnings and advice lines, shown as a list.
        figure_png: the figure's PNG bytes, embedded as a ``data:`` URI (None: no figure).
        figure_missing: the line shown in place of a missing figure (e.g. how to install matplotlib).
        subtitle: a small line under the heading (command, date).
        tone: the headline banner's colour, one of :data:`BANNER_TONES` (:func:`banner_tone` of a
            verdict): ``"win"`` green, ``"neutral"`` grey, ``"loss"`` red.

    Raises:
        ValueError: ``tone`` is not one of :data:`BANNER_TONES`.
    """
    if tone not in BANNER_TONES:
        raise ValueError(f"tone={tone!r}: expected one of {', '.join(BANNER_TONES)}")
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{e(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="meta">{e(subtitle)}</p>')
    parts.append(f'<p class="headline {tone}" id="headline">{e(headline)}</p>')
    if figure_png:
        data = base64.b64encode(figure_png).decode("ascii")
        parts.append(f'<img class="figure" id="figure" alt="{e(headline)}" src="data:image/png;base64,{data}">')
    elif figure_missing:
        parts.append(f'<p class="meta" id="figure-missing">{e(figure_missing)}</p>')
    parts += [_table_html(t) for t in tables]
    if notes:
        parts.append("<h2>Warnings and advice</h2><ul class=\"notes\">"
                     + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    text = json.dumps(report_json, indent=2, ensure_ascii=False, default=str)
    parts.append(f'<details><summary>The full report (JSON)</summary><pre id="report-json">{e(text)}</pre></details>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html_report(path: str | os.PathLike, *, draw: Callable[[Path], Any] | None = None, **page: Any) -> Path:
    """Write :func:`render_html_report`'s page to ``path``, drawing the figure first with ``draw``.

    Args:
        path: the HTML file to write (replaced atomically: written to a temporary file beside it,
            then renamed).
        draw: called with a temporary PNG path to draw the figure (e.g. ``lambda p: plot_delivery(
            series, p)``); an ImportError from it (no matplotlib) leaves the page without a figure
            and says how to install it; a ValueError, RuntimeError or OSError (a figure that cannot
            be drawn) leaves it without a figure and says why.
        **page: the keyword arguments of :func:`render_html_report` (``figure_png`` excluded).

    Returns:
        ``path`` as a Path.

    Raises:
        OSError: the page cannot be written (e.g. the folder does not exist).
    """
    out = Path(path)
    png = None
    if draw is not None:
        with tempfile.TemporaryDirectory(prefix="shardfeed-html-") as tmp:
            fig = Path(tmp) / "figure.png"
            try:
                draw(fig)
                png = fig.read_bytes()
            except ImportError as exc:
                page.setdefault("figure_missing", f"No figure: {exc}")
            except (ValueError, RuntimeError, OSError) as exc:  # the page (tables, verdict, JSON) still comes
                page.setdefault("figure_missing", f"No figure: it could not be drawn ({type(exc).__name__}: {exc})")
    write_bytes_atomic(out, render_html_report(figure_png=png, **page).encode("utf-8"))
    return out
