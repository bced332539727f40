"""A layout pack's memory: its plan holds a few tens of bytes per image (compact columns, as a
class-folder plan), and a labels file is read in memory that follows its size, not its bound."""

import gc
import tracemalloc

from shardfeed.convert.write import layouts
from shardfeed.convert.write.label_files import MAX_LABELS_FILE_BYTES, read_label_rows
from shardfeed.convert.write.pack import PackOptions

N = 5000


def test_a_small_labels_file_is_read_in_small_memory(tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\n" + "".join(f"im{i}.jpg,c{i % 3}\n" for i in range(20)))
    tracemalloc.start()
    try:
        rows = read_label_rows(labels)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows["im4.jpg"][0] == "c1" and len(rows) == 20
    # one read of the whole bound (1 GiB) allocated it up front, whatever the file's size
    assert MAX_LABELS_FILE_BYTES > 256 << 20 and peak < 4 << 20, peak


def test_a_labels_file_plan_holds_tens_of_bytes_an_image(tmp_path):
    src = tmp_path / "src"
    rows = ["path,label"]
    for d in range(10):
        (src / f"d{d}").mkdir(parents=True)
    for i in range(N):
        rel = f"d{i % 10}/image_{i:06d}.jpg"
        (src / rel).write_bytes(b"x" * (1 + i % 7))
        rows.append(f"{rel},c{i % 20}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    layout = layouts.LayoutOptions(labels_file=tmp_path / "labels.csv")
    gc.collect()
    tracemalloc.start()
    try:
        plan = layouts._checked_plan(src, PackOptions(format="wds", workers=1, seed=2), layout, None)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(plan.planned) == N
    # the scan's tuples, the label map and a list of planned tuples took ~280 bytes an image
    assert held / N <= 100, held / N
