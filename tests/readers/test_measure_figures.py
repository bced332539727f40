"""The delivery figure's layout: no label or legend covers a bar of "Where the time went", and none
of that panel's text runs into the plot beside it.

The runs are planted (a loader waiting 30 ms per batch against a 20 ms step, so its bar fills most
of the panel, as a stalled `watch` run does); the boxes compared are those matplotlib drew, in
pixels.
"""

from __future__ import annotations

import pytest

from shardfeed.readers.measure.figures import DeliverySeries, _delivery_figure, _pyplot

pytest.importorskip("matplotlib", reason="the plot extra (make install) has matplotlib")


def _covers(a, b) -> bool:
    """Whether two boxes share more than an edge (half a pixel of width and of height)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5


def _series(label: str, wait_s: float, n: int = 30) -> DeliverySeries:
    starts, t = [], 0.0
    for _ in range(n):
        starts.append(t)
        t += wait_s + 0.02
    return DeliverySeries(label, starts, [wait_s] * n, [0.02] * n, [64] * n, None)


@pytest.mark.parametrize("runs", [
    [("loader", 0.03)],                                                  # watch: one stalled loader
    [("BEFORE folder", 0.03), ("AFTER webdataset", 0.002)],              # verify
    [("BEFORE folder", 0.002), ("AFTER webdataset", 0.03)],              # verify, the long bar below
    [(f"epoch {i}", 0.01 * (i + 1)) for i in range(4)],                  # watch over several epochs
])
def test_no_label_or_legend_covers_a_bar(runs):
    plt = _pyplot()
    fig = _delivery_figure(plt, [_series(name, wait) for name, wait in runs], title="3.0x faster")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax_del, ax_bar = fig.axes[0], fig.axes[1]
        bars = [p.get_window_extent(renderer) for p in ax_bar.patches if p.get_width() > 0]
        assert len(bars) == 2 * len(runs)
        texts = [t for t in [*ax_bar.texts, *ax_bar.get_yticklabels()] if t.get_text().strip()]
        names = {name for name, _ in runs}
        labels = [t for t in texts if t.get_text() in names]
        assert sorted(t.get_text() for t in labels) == sorted(names)  # every run is named once
        boxes = [t.get_window_extent(renderer) for t in texts] + [ax_bar.get_legend().get_window_extent(renderer)]
        for box in boxes:
            for bar in bars:
                assert not _covers(box, bar), (box, bar)
            assert not _covers(box, ax_del.get_window_extent(renderer))
        for i, a in enumerate(boxes):  # nor one text another
            for b in boxes[i + 1:]:
                assert not _covers(a, b), (a, b)
    finally:
        plt.close(fig)
