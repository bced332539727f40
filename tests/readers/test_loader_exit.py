"""A loader iterator still held when the interpreter exits is released before the modules are torn
down: its shard files close, and nothing is printed on the way out."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import sys
    import shardfeed.readers.sources.webdataset_source
    from shardfeed.readers import make_loader

    path = sys.argv[1]
    loader = make_loader(path, 256, num_workers=0, decode=False, seed=0)
    it = iter(loader)  # held in a global until the interpreter exits
    next(it)
    for i in range(198):
        next(it)
    st = loader.state_dict()
    r = make_loader(path, 256, num_workers=0, decode=False, seed=0)
    r.load_state_dict(st)
    next(iter(r))
    r = make_loader(path, 256, num_workers=0, decode=False, seed=0)
    r.load_state_dict(st)
    next(iter(r))
    print("read", flush=True)
""")


@pytest.fixture(scope="module")
def hundred_shards(tmp_path_factory):
    from PIL import Image

    from shardfeed.convert import write_dataset

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (40, 90, 160)).save(buf, format="PNG")
    path = tmp_path_factory.mktemp("exit") / "wds"
    write_dataset(({"image": buf.getvalue(), "ext": "png", "label": i % 10} for i in range(100_000)), path,
                  format="webdataset", max_count=1000, classes=[str(i) for i in range(10)])
    return path


def test_an_iterator_held_at_exit_prints_nothing_on_the_way_out(hundred_shards, tmp_path):
    env = dict(os.environ, SHARDFEED_MANIFEST_CACHE="off")
    out = subprocess.run([sys.executable, "-P", "-c", _SCRIPT, str(hundred_shards)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "read"
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]


def test_releasing_the_iterators_closes_their_shard_files(hundred_shards):
    from shardfeed.readers import make_loader
    from shardfeed.readers.iteration import release_epoch_iterators

    def open_shards() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(hundred_shards)))

    it = iter(make_loader(hundred_shards, 256, num_workers=0, decode=False, seed=0))
    next(it)
    assert open_shards() >= 1  # the shard being read
    release_epoch_iterators()
    assert open_shards() == 0


def test_a_released_iterator_stops_without_ending_the_epoch(packed_wds):
    """A ``next()`` after the exit release (a thread still iterating, an exit handler) stops, and the
    loader's state still names the batches not yet read: a checkpoint saved then resumes the epoch."""
    from shardfeed.readers import make_loader
    from shardfeed.readers.iteration import release_epoch_iterators

    loader = make_loader(packed_wds, 4, num_workers=0, decode=False, seed=0)
    it = iter(loader)
    read = [s.key for _ in range(2) for s in next(it)]
    release_epoch_iterators()
    with pytest.raises(StopIteration):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (0, 8)
    fresh = make_loader(packed_wds, 4, num_workers=0, decode=False, seed=0)
    fresh.load_state_dict(state)
    rest = [s.key for batch in fresh for s in batch]
    assert sorted(read + rest) == [f"{i:09d}" for i in range(60)]  # the epoch's other 52 samples, once each


_WORKERS_SCRIPT = textwrap.dedent("""
    import sys
    from shardfeed.readers import make_loader

    path = sys.argv[1]
    held = []
    for persistent in (True, False):
        loader = make_loader(path, 4, num_workers=2, decode=False, seed=0, persistent_workers=persistent,
                             shuffle_buffer=8)
        it = iter(loader)  # workers alive, their queues full, until the interpreter exits
        next(it)
        held.append((loader, it))
    print("read", flush=True)
""")


def test_iterators_with_live_workers_held_at_exit_end_with_the_process(packed_wds, tmp_path):
    """Two loaders with two workers each (persistent and not), their iterators held in globals: the
    process exits by itself (the subprocess limit only guards against a hang), and quietly."""
    env = dict(os.environ, SHARDFEED_MANIFEST_CACHE="off")
    out = subprocess.run([sys.executable, "-P", "-c", _WORKERS_SCRIPT, str(packed_wds)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "read"
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
