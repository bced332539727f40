"""``shardfeed watch -- python script.py`` counts what the script's loop receives, whatever loader
it iterates: shardfeed's own ``make_loader`` (a ``DataLoader`` subclass with an ``__iter__`` of its
own) as well as a plain ``DataLoader``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = textwrap.dedent('''
    import json, sys
    from shardfeed.readers import make_loader

    loader = make_loader(sys.argv[1], batch_size=int(sys.argv[3]), num_workers=int(sys.argv[4]), image_size=16,
                         shuffle=False)
    sizes = []
    for epoch in range(2):
        for images, labels in loader:
            sizes.append(int(images.shape[0]))
    json.dump({"sizes": sizes}, open(sys.argv[2], "w"))
''')


@pytest.mark.parametrize("num_workers", [0, 1])
def test_watch_counts_the_samples_a_make_loader_loop_receives(tmp_path, tiny_image_folder, num_workers):
    script, own, report_path = tmp_path / "train.py", tmp_path / "own.json", tmp_path / "watch.json"
    script.write_text(SCRIPT)
    batch_size = 8
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--warmup", "0", "--json",
                        str(report_path), "--", sys.executable, str(script), str(tiny_image_folder), str(own),
                        str(batch_size), str(num_workers)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    sizes = json.loads(own.read_text())["sizes"]
    # 60 images in batches of 8, two epochs: what the loop received, counted here
    assert sizes == ([8] * 7 + [4]) * 2
    rep = json.loads(report_path.read_text())
    assert len(rep["loaders"]) == 1  # one loader, watched once (not also through DataLoader.__iter__)
    lo = rep["loaders"][0]
    assert lo["epochs"] == 2
    assert lo["batches"] == len(sizes)
    assert lo["num_samples"] == sum(sizes) == 120
    assert lo["per_batch"]["num_samples"] == sizes


FORKS = textwrap.dedent('''
    import json, multiprocessing, os, sys
    from torch.utils.data import DataLoader

    def iterate(n):
        for x in DataLoader(list(range(n)), batch_size=4):
            pass

    if __name__ == "__main__":
        pid = os.fork()
        if pid == 0:  # a child of os.fork that ends through sys.exit
            iterate(12)
            sys.exit(0)
        os.waitpid(pid, 0)
        p = multiprocessing.get_context("fork").Process(target=iterate, args=(20,))
        p.start()
        p.join()
        json.dump({"fork": pid, "process": p.pid}, open(sys.argv[1], "w"))
''')


def test_watch_reports_the_loaders_iterated_in_forked_children(tmp_path):
    script, own, report_path = tmp_path / "forks.py", tmp_path / "own.json", tmp_path / "watch.json"
    script.write_text(FORKS)
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report_path), "--",
                        sys.executable, str(script), str(own)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    pids = json.loads(own.read_text())
    rep = json.loads(report_path.read_text())
    assert len(rep["loaders"]) == len(rep["processes"]) == 2  # one loader in each process
    by_pid = {p["pid"]: i for i, p in enumerate(rep["processes"])}
    assert set(by_pid) == {pids["fork"], pids["process"]}  # the parent iterated nothing
    # 12 and 20 samples in batches of 4: 3 and 5 batches, the first of each reported apart
    batches = {pid: rep["loaders"][i]["batches"] for pid, i in by_pid.items()}
    assert batches == {pids["fork"]: 3 - 1, pids["process"]: 5 - 1}
    assert f"[pid {pids['fork']}]" in r.stdout and f"[pid {pids['process']}]" in r.stdout


def test_a_script_run_by_a_python_without_shardfeed_is_told_which_python_to_use(tmp_path):
    import os
    import subprocess
    import sys
    import venv

    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)  # a Python that cannot import shardfeed
    python = bare / "bin" / "python"
    # no PYTHONPATH of the caller's: through it, the bare Python could import shardfeed after all
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "watch", "--", str(python), "-c",
                        "print('ran')"], capture_output=True, text=True, timeout=120, env=env)
    assert "ran" in r.stdout, r.stdout + r.stderr
    assert f"this Python ({python}) cannot import shardfeed" in r.stderr, r.stderr
    assert "activate its environment" in r.stderr, r.stderr
