"""``shardfeed watch --`` passes every terminating signal it receives on to the script and keeps
the script's exit status; ``--json -`` leaves stdout to the JSON alone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from .test_watch_cli import _watch_forever_then

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_sigint_to_shardfeed_watch_alone_stops_the_script_and_the_report_is_printed(tmp_path):
    # a scheduler that signals only the wrapper's PID: the script must stop, as on Ctrl-C
    rc, out, err, report_path = _watch_forever_then(tmp_path, lambda proc: proc.send_signal(signal.SIGINT))
    assert rc == 128 + signal.SIGINT, err
    rep = json.loads(report_path.read_text())
    assert rep["exit_status"] == 128 + signal.SIGINT
    assert rep["loaders"] and rep["loaders"][0]["batches"] >= 9
    assert "data stall" in out


def _no_core_dumps():
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_sighup_and_sigquit_to_shardfeed_watch_reach_the_script_and_its_status_is_kept(tmp_path, sig):
    import os
    import time

    # the script keeps the default action of these signals: it dies of the signal, and watch
    # exits as the shell would report that death (128 + the signal's number)
    script, ready = tmp_path / "wait.py", tmp_path / "ready"
    script.write_text(textwrap.dedent('''
        import pathlib, sys, time
        pathlib.Path(sys.argv[1]).write_text("ready")
        time.sleep(120)
    '''))
    proc = subprocess.Popen([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--", sys.executable,
                             str(script), str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_no_core_dumps)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate()[1]
        script_pid = int(subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()[0])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out + err
        # the script is gone: no process of that PID is left running
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(script_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the script is still running")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_json_to_stdout_holds_the_json_alone_and_the_scripts_output_goes_to_stderr(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader
        print("a line of the script's own")
        for x in DataLoader(list(range(12)), batch_size=4):
            print("batch", x.tolist())
    '''))
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "watch", "--json", "-", "--", sys.executable,
                        str(script)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)  # the whole of stdout is one JSON document
    assert rep["exit_status"] == 0 and rep["loaders"][0]["epochs"] == 1
    assert "a line of the script's own" in r.stderr and "batch [8, 9, 10, 11]" in r.stderr
