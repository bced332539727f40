"""``shardfeed watch -- python script.py``: an unmodified script's DataLoader is watched.

The script times its own loop with perf_counter around next() and writes that to a file; the
report must agree with it, count the batches the script iterated, and keep its exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = textwrap.dedent('''
    import json, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Waiting(Dataset):
        """Each sample waits 8 ms without CPU, as a read from slow storage does."""
        def __len__(self):
            return 64
        def __getitem__(self, i):
            time.sleep(0.008)
            return torch.full((3, 4, 4), float(i)), i

    loader = DataLoader(Waiting(), batch_size=8, num_workers=2)
    waits, steps, seen = [], [], []
    for epoch in range(2):
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            seen += y.tolist()
            time.sleep(0.02)
            waits.append(t1 - t0)
            steps.append(time.perf_counter() - t1)
    json.dump({"waits": waits, "steps": steps, "seen": seen}, open(sys.argv[1], "w"))
    print("script done")
    sys.exit(3)
''')


def test_watch_runs_an_unmodified_script_and_keeps_its_exit_status(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    own, report_path = tmp_path / "own.json", tmp_path / "watch.json"
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report_path), "--",
                        sys.executable, str(script), str(own)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 3, r.stderr
    assert "script done" in r.stdout
    mine = json.loads(own.read_text())
    assert sorted(mine["seen"]) == sorted(list(range(64)) * 2)  # the script saw every sample, unchanged
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 3
    assert len(rep["loaders"]) == 1
    lo = rep["loaders"][0]
    assert lo["epochs"] == 2
    assert lo["batches"] == 2 * 8 - 1
    w, s = sum(mine["waits"][1:]), sum(mine["steps"][1:])
    assert lo["stall_share"] == pytest.approx(w / (w + s), abs=0.05)
    assert lo["t_wait_s"]["total"] == pytest.approx(w, rel=0.10, abs=0.02)
    assert lo["workers"]["num"] == 2
    # workers that sleep in the dataset's code, with no sign of storage: never storage-bound. With ten
    # CPU burners beside the test (load average about 10) the workers also wait for a core, and the
    # verdict was cpu-contended: then the run queue shows it
    diagnosis = lo["diagnosis"]
    named = diagnosis["between"] if diagnosis["kind"] == "borderline" else [diagnosis["kind"]]
    assert set(named) <= {"unknown", "cpu-contended"}, diagnosis
    if "cpu-contended" in named:
        assert diagnosis["evidence"]["workers_runqueue_share"] >= 0.10, diagnosis
    assert "data stall" in r.stdout  # the summary printed after the script's own output
    assert r.stdout.index("script done") < r.stdout.index("data stall")


def test_watch_without_a_dataloader_says_so_and_keeps_success(tmp_path):
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--", sys.executable, "-c",
                        "print('hello')"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "hello" in r.stdout and "iterated no torch DataLoader" in r.stdout


def test_watch_of_a_missing_program_is_one_clear_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot run" in r.stderr and "Traceback" not in r.stderr


FOREVER = textwrap.dedent('''
    import sys, time, pathlib
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=4, num_workers=1)
    n = 0
    while True:
        for (x,) in loader:
            time.sleep(0.01)
            n += 1
            if n == 10:
                pathlib.Path(sys.argv[1]).write_text("ready")
''')


def _watch_forever_then(tmp_path, send):
    """Run FOREVER under ``shardfeed watch --json`` in a session of its own, call ``send(proc)`` once
    it iterated 10 batches, and return ``(returncode, stdout, stderr, report path)``."""
    import os
    import signal
    import time

    script, ready, report_path = tmp_path / "forever.py", tmp_path / "ready", tmp_path / "watch.json"
    script.write_text(FOREVER)
    proc = subprocess.Popen([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report_path), "--",
                             sys.executable, str(script), str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "script not ready"
        send(proc)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err, report_path


def test_ctrl_c_still_prints_the_report(tmp_path):
    import os
    import signal

    # what Ctrl-C in a terminal does: SIGINT to the whole foreground group
    rc, out, err, report_path = _watch_forever_then(tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    assert rc == 128 + signal.SIGINT, err
    rep = json.loads(report_path.read_text())
    assert rep["loaders"] and rep["loaders"][0]["batches"] >= 9
    assert "data stall" in out


def test_the_scripts_own_sitecustomize_still_runs(tmp_path):
    import os

    own = tmp_path / "site"
    own.mkdir()
    marker = tmp_path / "marker"
    (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": str(own)}
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--", sys.executable, "-c",
                        "import sys; print(sys.argv)"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "ran"


def test_sigterm_to_shardfeed_watch_is_passed_on_and_the_report_printed(tmp_path):
    import signal

    # to shardfeed watch only, as a container stop or `timeout` does
    rc, out, err, report_path = _watch_forever_then(tmp_path, lambda proc: proc.send_signal(signal.SIGTERM))
    assert rc == 128 + signal.SIGTERM, err
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 128 + signal.SIGTERM
    assert rep["loaders"] and rep["loaders"][0]["batches"] >= 9


def _watch_signalled_as_a_group(tmp_path):
    # `timeout` and container stops signal the whole group: the script and its DataLoader workers
    # get SIGTERM together
    import os
    import signal

    rc, out, err, report_path = _watch_forever_then(tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGTERM))
    return rc, out, err, json.loads(report_path.read_text())


def test_sigterm_to_the_process_group_ends_the_script_without_a_traceback(tmp_path):
    # the workers' deaths must not surface as torch's "DataLoader worker ... is killed by signal"
    # traceback while the script exits to write its report
    _, out, err, rep = _watch_signalled_as_a_group(tmp_path)
    assert "Traceback" not in err and "killed by signal" not in err, err
    assert rep["loaders"] and rep["loaders"][0]["batches"] >= 9


def test_sigterm_to_the_process_group_ends_watch_and_the_script_with_status_143(tmp_path):
    # the script gets SIGTERM twice, from the group and passed on by watch: one stop, status 143
    import signal

    rc, out, err, rep = _watch_signalled_as_a_group(tmp_path)
    assert rc == 128 + signal.SIGTERM, out + err
    assert rep["exit_status"] == 128 + signal.SIGTERM


_SIGTERM_INSIDE_A_FORK_CALLBACK = textwrap.dedent('''
    import os, signal, sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    for (x,) in DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4):
        pass
    fired = []

    def after_fork_in_parent():
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100000):  # the SIGTERM handler runs here, inside the at-fork callback
                pass

    os.register_at_fork(after_in_parent=after_fork_in_parent)
    pid = os.fork()  # as a DataLoader starting its workers does
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    start = time.monotonic()
    while time.monotonic() - start < 30:
        time.sleep(0.05)
    print("still running")
''')


def test_sigterm_that_lands_inside_a_fork_callback_still_ends_the_script_with_its_report(tmp_path):
    import signal

    # Python swallows an exception raised inside an os.register_at_fork callback (logging has one,
    # so every DataLoader worker start is such a place): the exit must not be lost there
    script, report_path = tmp_path / "fork_callback.py", tmp_path / "watch.json"
    script.write_text(_SIGTERM_INSIDE_A_FORK_CALLBACK)
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report_path), "--",
                        sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 128 + signal.SIGTERM, r.stdout + r.stderr
    assert "still running" not in r.stdout
    assert "Exception ignored" not in r.stderr, r.stderr
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 128 + signal.SIGTERM
    # 8 samples in batches of 4: 2 batches, the first reported apart as the start-up
    assert rep["loaders"] and rep["loaders"][0]["epochs"] == 1 and rep["loaders"][0]["batches"] == 1


def _second_sigterm_to_the_script(tmp_path, script_text: str, after_s: float):
    """Run ``script_text`` under ``shardfeed watch --json``; once it wrote its pid to the marker file
    (argv[1]), wait ``after_s`` and send the script a SIGTERM of its own. Returns ``(returncode,
    stdout, stderr, report path, seconds from that SIGTERM to the end)``."""
    import os
    import signal
    import time

    script, marker, report_path = tmp_path / "script.py", tmp_path / "pid", tmp_path / "watch.json"
    script.write_text(script_text)
    proc = subprocess.Popen([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", str(report_path), "--",
                             sys.executable, str(script), str(marker)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate()[1] if proc.poll() is not None else "script not ready"
        time.sleep(after_s)
        start = time.monotonic()
        os.kill(int(marker.read_text()), signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err, report_path, took


_SLOW_EXIT_CALLBACK = textwrap.dedent('''
    import atexit, os, pathlib, signal, sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from shardfeed.readers.integrations import autowatch

    autowatch.SAME_STOP_S = 0.2  # a shorter "same stop" window, so the test need not wait 5 s
    for (x,) in DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4):
        pass

    def slow_clean_up():  # an exit callback that hangs (an upload, a stuck join)
        pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
        time.sleep(30)

    atexit.register(slow_clean_up)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
''')


def test_a_later_second_sigterm_ends_an_exit_callback_that_hangs_and_the_report_is_still_written(tmp_path):
    import signal

    # the second kill, past the same-stop window, while an exit callback hangs: the script is to end now
    rc, out, err, report_path, took = _second_sigterm_to_the_script(tmp_path, _SLOW_EXIT_CALLBACK, 0.5)
    assert took < 20, f"the exit callback ran its 30 s ({took:.1f} s)"
    assert rc == 128 + signal.SIGTERM, out + err
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 128 + signal.SIGTERM
    assert rep["loaders"] and rep["loaders"][0]["epochs"] == 1


_SECOND_SIGTERM_WHILE_THREADS_END = textwrap.dedent('''
    import atexit, os, pathlib, signal, sys, threading, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from shardfeed.readers.integrations import autowatch

    autowatch.SAME_STOP_S = 0.2  # a shorter "same stop" window, so the test need not wait 5 s
    for (x,) in DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4):
        pass
    threading.Thread(target=time.sleep, args=(6,)).start()  # an upload thread: the exit waits for it

    def flush_logs():  # the script's own exit callback: must run to its end
        time.sleep(0.5)
        pathlib.Path(sys.argv[1] + ".flushed").write_text("done")

    atexit.register(flush_logs)
    pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
''')


def test_a_second_sigterm_while_the_exit_waits_for_the_scripts_threads_cuts_no_exit_callback(tmp_path):
    import signal

    # the exit waits for the thread; the second SIGTERM comes past the same-stop window
    rc, out, err, report_path, _ = _second_sigterm_to_the_script(tmp_path, _SECOND_SIGTERM_WHILE_THREADS_END, 1.0)
    assert rc == 128 + signal.SIGTERM, out + err
    assert (tmp_path / "pid.flushed").read_text() == "done", err  # the second signal cut no exit callback
    assert "Exception ignored in atexit callback" not in err, err
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 128 + signal.SIGTERM
    assert rep["loaders"] and rep["loaders"][0]["epochs"] == 1


_SIGTERM_BEFORE_ANY_LOADER = textwrap.dedent('''
    import os, signal, sys, time
    from shardfeed.readers.integrations.autowatch import install
    install()  # as the sitecustomize of `shardfeed watch` does
    os.kill(os.getpid(), signal.SIGTERM)  # while the script still imports torch: nothing watched yet
    time.sleep(5)
    print("still running")
''')


def test_sigterm_before_any_dataloader_ends_the_script_of_the_signal_as_unwatched(tmp_path):
    import os
    import signal

    reports = tmp_path / "reports"
    reports.mkdir()
    r = subprocess.run([sys.executable, "-c", _SIGTERM_BEFORE_ANY_LOADER], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SHARDFEED_WATCH_DIR": str(reports)})
    assert r.returncode == -signal.SIGTERM, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr == ""
    assert list(reports.iterdir()) == []


WORKER_SIGTERM = textwrap.dedent('''
    import signal, sys, pathlib
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def report(worker_id):
        handler = signal.getsignal(signal.SIGTERM)
        pathlib.Path(sys.argv[1]).write_text("default" if handler is signal.SIG_DFL else repr(handler))

    ctx = torch.multiprocessing.get_context("fork")
    for _ in DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4, num_workers=1,
                        worker_init_fn=report, multiprocessing_context=ctx):
        pass
    print("main", "default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "watched")
''')


@pytest.mark.multiprocess
def test_a_forked_worker_of_the_watched_script_ends_of_sigterm_as_unwatched(tmp_path):
    # the script's SIGTERM handler (which writes the report) stays in the script's own process; its
    # forked DataLoader workers get SIGTERM's default back, so a signalled group kills them at once
    script, seen = tmp_path / "workers.py", tmp_path / "worker_sigterm"
    script.write_text(WORKER_SIGTERM)
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--", sys.executable, str(script),
                        str(seen)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "main watched" in r.stdout
    assert seen.read_text() == "default"
