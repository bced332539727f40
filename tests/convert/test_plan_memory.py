"""The pack's plan: the seeded order unchanged, and a few tens of bytes per file in memory."""

import gc
import pickle
import random
import tracemalloc

from shardfeed.convert.write.plan import plan_samples, plan_shards
from shardfeed.convert.write.scan import scan_image_folder

N_CLASSES, PER_CLASS = 20, 1000


def _folder(root):
    rels = []
    for c in range(N_CLASSES):
        d = root / f"n{1440764 + c:08d}"
        d.mkdir()
        for i in range(PER_CLASS):
            name = f"n{1440764 + c:08d}_{i * 7 + 10}.JPEG"
            (d / name).write_bytes(b"x" * (1 + i % 5))
            rels.append(f"{d.name}/{name}")
    return rels


def test_the_order_is_the_seeded_shuffle_of_the_scan_order(tmp_path):
    rels = _folder(tmp_path)
    # ImageFolder order: classes sorted, names sorted within each (as strings)
    expected = sorted(rels, key=lambda r: tuple(r.split("/")))
    random.Random(7).shuffle(expected)
    plan = plan_samples(scan_image_folder(tmp_path), seed=7)
    assert [s.file.rel for s in plan] == expected
    assert [plan[i].file.rel for i in (0, 4321, len(expected) - 1)] == [expected[0], expected[4321], expected[-1]]
    view = plan[1000:1010]
    assert [s.key for s in view] == [str(i).zfill(plan.width) for i in range(1000, 1010)]
    assert list(view.files.rels) == expected[1000:1010]
    back = pickle.loads(pickle.dumps(view))
    assert [(s.key, s.file.rel) for s in back] == [(s.key, s.file.rel) for s in view]


def test_scan_and_plan_take_at_most_60_bytes_a_file(tmp_path):
    _folder(tmp_path)
    n = N_CLASSES * PER_CLASS
    gc.collect()
    tracemalloc.start()
    try:
        scan = scan_image_folder(tmp_path)
        scan_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        plan = plan_samples(scan, seed=0)
        plan_shards(plan, max_count=100, max_bytes=1 << 30)
        gc.collect()
        held, plan_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(plan) == n
    # paths as a list of str and a reordered copy of the columns took ~140 bytes a file; the walk's
    # lists of names ~75 more at the scan's peak
    assert held / n <= 60, held / n
    assert scan_peak / n <= 70, scan_peak / n
    # cutting the shards reads the plan in bounded chunks: a few MB whatever the number of files
    assert plan_peak - held <= 4_000_000, plan_peak - held


def _columns(rels, compact):
    from array import array

    from shardfeed.readers.format.imagefolder import ScannedFiles
    from shardfeed.readers.format.path_column import PathColumn

    n = len(rels)
    return ScannedFiles("/src", PathColumn.from_paths(rels) if compact else list(rels), array("q", range(100, 100 + n)),
                        array("q", range(n)), array("i", [i % 2 for i in range(n)]), ["cat", "dög"], [0, 1],
                        array("H", [0] * n), ["jpg"])


def test_compact_paths_give_the_same_tar_sizes_and_fingerprint():
    from types import SimpleNamespace

    from shardfeed.convert.write.pack import PackOptions
    from shardfeed.convert.write.plan_record import plan_fingerprint
    from shardfeed.convert.write.shard_cut import wds_sample_bytes
    from shardfeed.readers.format.sample_members import class_bytes, meta_bytes

    plain = [f"cat/sub/{i}.jpg" for i in range(30)] + ["dög/é.jpg", "cat/ü ß.jpg"]
    odd = plain + ['cat/quote"d.jpg', "cat/tab\t.jpg"]  # escaped by JSON: the general path
    for rels in (plain, odd):
        expected_sizes = {}
        for i, rel in enumerate(rels):
            cname, label = ("cat", 0) if i % 2 == 0 else ("dög", 1)
            expected_sizes[rel] = wds_sample_bytes(100 + i, len(class_bytes(label)),
                                                   len(meta_bytes({"path": rel, "class": cname})))
        prints = set()
        for compact in (False, True):
            scan = SimpleNamespace(root="/src", files=_columns(rels, compact), class_to_idx={"cat": 0, "dög": 1})
            plan = plan_samples(scan, seed=5)
            order = [s.file.rel for s in plan]
            assert sorted(order) == sorted(rels)
            assert list(plan.wds_sizes()) == [expected_sizes[r] for r in order]
            assert list(plan[3:9].wds_sizes()) == [expected_sizes[r] for r in order[3:9]]
            assert [p for part in plan.utf8_path_chunks(7) for p in part] == [r.encode() for r in order]
            prints.add(plan_fingerprint(scan, plan, PackOptions()))
        assert len(prints) == 1  # compact or not, one plan, one fingerprint
