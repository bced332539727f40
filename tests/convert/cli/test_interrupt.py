"""Ctrl-C and SIGTERM end a command with one line and status 130/143, also when stopping raises a
second error on the way out (PyTorch's "DataLoader worker ... is killed by signal" RuntimeError
when the workers got the same SIGTERM, as under ``timeout`` or a container stop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

from shardfeed.convert.cli.common import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, fail_cleanly, interrupt_behind


def _command(first: BaseException, second: Exception | None):
    @click.command()
    @fail_cleanly
    def cmd():
        try:
            raise first
        except BaseException:
            if second is None:
                raise
            raise second  # noqa: B904 -- raised while handling, as torch's SIGCHLD handler does
    return cmd


@pytest.mark.parametrize("first, status, word", [(KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
                                                 (Terminated(), EXIT_TERMINATED, "terminated")])
def test_an_error_raised_while_stopping_ends_as_the_interrupt(first, status, word):
    second = RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")
    r = CliRunner().invoke(_command(first, second), [])
    assert r.exit_code == status, r.output
    assert f"shardfeed: {word}" in r.output
    assert "DataLoader worker" not in r.output and "Traceback" not in r.output


def test_an_error_without_an_interrupt_behind_it_is_not_taken_for_one():
    r = CliRunner().invoke(_command(ValueError("first"), RuntimeError("second, not an interrupt")), [])
    assert r.exit_code not in (EXIT_INTERRUPTED, EXIT_TERMINATED)
    assert isinstance(r.exception, RuntimeError)
    assert interrupt_behind(RuntimeError("alone")) is None


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_to_the_process_group_during_verify_prints_one_line(tmp_path):
    # `timeout` signals the whole process group: the DataLoader workers die with the main process
    from PIL import Image

    src = tmp_path / "src"
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(32):
            Image.new("RGB", (32, 32), (8 * i, 100 * c, 50)).save(src / f"c{c}" / f"{i}.jpg")
    cli = [sys.executable, "-m", "shardfeed.convert.cli"]
    subprocess.run([*cli, "-q", "pack", str(src), str(tmp_path / "wds")], check=True, timeout=120)
    proc = subprocess.Popen([*cli, "verify", str(src), str(tmp_path / "wds"), "--model", "tiny", "--image-size", "32",
                             "--batch-size", "8", "--batches", "5000", "--warmup", "0", "--repeats", "1",
                             "--num-workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = []
        for _ in range(50):  # "shardfeed: round 1/1: before (...)": the loop is running
            seen.append(proc.stderr.readline())
            if "round 1/1" in seen[-1] or not seen[-1]:
                break
        assert "round 1/1" in seen[-1], "".join(seen)
        time.sleep(1.5)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == EXIT_TERMINATED, err
    assert "shardfeed: terminated" in err
    assert "Traceback" not in err, err


_CHILD_SIGNALLED_WHILE_STARTING = """
import multiprocessing, os, signal, sys
from shardfeed.convert.cli.common import stop_on_sigterm

def signalled_before_resetting_its_handler():
    os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` does to the group while a worker starts
    print("still running after SIGTERM", flush=True)

stop_on_sigterm()
child = multiprocessing.get_context("fork").Process(target=signalled_before_resetting_its_handler)
child.start()
child.join(30)
print("child exit code", child.exitcode, flush=True)
"""


def test_a_forked_child_signalled_before_it_resets_sigterm_dies_of_it_without_a_traceback():
    r = subprocess.run([sys.executable, "-c", _CHILD_SIGNALLED_WHILE_STARTING], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"child exit code {-signal.SIGTERM}", r.stdout + r.stderr
    assert r.stderr == ""


_DEL_FAILS_AFTER_TERMINATED = """
import click
from shardfeed.convert.cli.common import Terminated, fail_cleanly

class HalfBuilt:  # as a DataLoader iterator whose __init__ the signal interrupted
    def __del__(self):
        raise AttributeError("'HalfBuilt' object has no attribute '_workers_status'")

@click.command()
@fail_cleanly
def cmd():
    half_built = HalfBuilt()
    raise Terminated()

cmd()
"""


@pytest.mark.parametrize("debug, shown", [("", False), ("1", True)])
def test_an_object_failing_in_del_after_sigterm_prints_nothing_more(debug, shown):
    env = {**os.environ, "SHARDFEED_DEBUG": debug}
    r = subprocess.run([sys.executable, "-c", _DEL_FAILS_AFTER_TERMINATED], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == EXIT_TERMINATED, r.stderr
    assert r.stderr.startswith("shardfeed: terminated\n"), r.stderr
    assert ("_workers_status" in r.stderr) is shown, r.stderr


_SIGNAL_LOST_IN_DEL = """
import os, signal, time
import click
from shardfeed.convert.cli.common import fail_cleanly, stop_on_sigterm

class Collected:  # the signal arrives while the main thread runs a __del__ (or an at-fork hook)
    def __del__(self):
        os.kill(os.getpid(), signal.SIGNAL)
        time.sleep(0.2)  # the handler runs here, inside __del__

@click.command()
@fail_cleanly
def cmd():
    stop_on_sigterm()
    Collected()
    for _ in range(50):
        time.sleep(0.1)
    print("finished")

cmd()
"""

_SIGTERM_THEN_ANOTHER_ERROR = """
import os, signal, time
import click
from shardfeed.convert.cli.common import fail_cleanly, stop_on_sigterm

@click.command()
@fail_cleanly
def cmd():
    stop_on_sigterm()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except KeyboardInterrupt:
        pass  # lost, as a handler's exception is lost in code that swallows it
    # the workers died of the same signal: the error comes later, with no interrupt behind it
    raise RuntimeError("DataLoader worker (pid(s) 1) exited unexpectedly")

cmd()
"""


@pytest.mark.parametrize("script, status, word", [
    (_SIGNAL_LOST_IN_DEL.replace("SIGNAL", "SIGTERM"), EXIT_TERMINATED, "terminated"),
    (_SIGNAL_LOST_IN_DEL.replace("SIGNAL", "SIGINT"), EXIT_INTERRUPTED, "interrupted"),
    (_SIGTERM_THEN_ANOTHER_ERROR, EXIT_TERMINATED, "terminated"),
], ids=["sigterm-in-del", "sigint-in-del", "later-error"])
def test_a_signal_whose_exception_is_lost_still_ends_the_command(script, status, word):
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == status, r.stdout + r.stderr
    assert "finished" not in r.stdout
    assert r.stderr.splitlines()[-1] == f"shardfeed: {word}", r.stderr
    assert "DataLoader worker" not in r.stderr
