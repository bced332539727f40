"""The offset indexes a rank fetches over HTTP: those of the shards it reads, each once per worker
at most, also with persistent workers reading the next epoch ahead. Expected counts come from the
shards the server was asked for; the dataset is planted here (240 shards of 4 samples)."""

from __future__ import annotations

import collections
import http.server
import io
import threading

import numpy as np
import pytest
from PIL import Image

pytestmark = [pytest.mark.network, pytest.mark.multiprocess]


def _counting_handler(log: collections.Counter, lock: threading.Lock):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - http.server's name
            with lock:
                log[self.path] += 1
            super().do_GET()

    return Handler


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    from shardfeed.convert import write_dataset

    out = tmp_path_factory.mktemp("many") / "wds"

    def samples():
        for i in range(240 * 4):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), i % 256, np.uint8)).save(buf, "PNG")
            yield {"image": buf.getvalue(), "ext": "png", "label": i % 3}

    write_dataset(samples(), out, max_count=4, classes=["a", "b", "c"])
    return out


@pytest.mark.parametrize("persistent", [False, True])
def test_a_rank_fetches_the_indexes_of_the_shards_it_reads_only(many_shards, start_http_server, persistent):
    from shardfeed.readers import make_loader

    log, lock = collections.Counter(), threading.Lock()
    base = start_http_server(many_shards, _counting_handler(log, lock))
    loader = make_loader(base + "/", batch_size=4, decode=False, collate_fn=list, rank=3, world_size=8,
                         num_workers=2, seed=0, persistent_workers=persistent)
    assert sum(len(batch) for batch in loader) == 240 * 4 // 8
    with lock:
        indexes = {p: n for p, n in log.items() if p.endswith(".sfidx")}
        shards = {p for p in log if p.endswith(".tar")}
    read = {p[:-len(".tar")] for p in shards}
    # each worker fetches an index once; the next epoch read ahead may need the index of at most
    # two shards it starts or ends inside of (whole shards are read ahead without theirs)
    assert all(n == 1 for n in indexes.values()) or max(indexes.values()) <= 2, indexes
    unread = [p for p in indexes if p[:-len(".sfidx")] not in read]
    assert len(unread) <= 2 * 2, unread
    assert sum(indexes.values()) <= len(read) + 2 * 2, (sum(indexes.values()), len(read))
