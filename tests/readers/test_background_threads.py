"""The readers' background threads end before the interpreter finalizes: asked to stop and joined
(bounded) at exit, with requests in flight over HTTP unblocked, so none is ended by the
interpreter mid-call (an abort when that call is C++)."""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from .exit_helpers import StallingHandler, run_child, serving


def _run_child(body: str) -> str:
    """Run ``body`` in a fresh interpreter (:func:`stop_all` stops every registered thread of its
    process: in this one it would stop other tests' threads too); returns its stdout."""
    imports = "from shardfeed.readers.background import start_thread, stop_all\n"
    r, _ = run_child(imports + textwrap.dedent(body), left_hook=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_stop_all_asks_each_thread_to_stop_and_joins_it():
    out = _run_child("""
        flag, asked = threading.Event(), []
        def stop():
            asked.append(True)
            flag.set()
        thread = start_thread(lambda: flag.wait(60), name="shardfeed-test-polls", stop=stop)
        print("daemon", thread.is_alive() and thread.daemon)
        print("left", stop_all(timeout_s=30), "alive", thread.is_alive(), "asked", len(asked))
        print("again", stop_all(timeout_s=30), "asked", len(asked))  # nothing left: not asked again
    """)
    assert out.splitlines() == ["daemon True", "left [] alive False asked 1", "again [] asked 1"]


def test_a_thread_that_ignores_stop_is_named_and_the_wait_is_bounded():
    out = _run_child("""
        release = threading.Event()
        thread = start_thread(lambda: release.wait(60), name="shardfeed-test-deaf", stop=lambda: None)
        t0 = time.monotonic()
        left = stop_all(timeout_s=0.2)
        print("left", left, "bounded", time.monotonic() - t0 < 10, "alive", thread.is_alive())
        release.set()
    """)
    # named, and the wait bounded by timeout_s, never the thread's 60 s
    assert out.splitlines()[0] == "left ['shardfeed-test-deaf'] bounded True alive True"


def test_a_failing_stop_callable_does_not_keep_the_others_from_stopping():
    out = _run_child("""
        flag = threading.Event()
        def broken():
            raise RuntimeError("stop failed")
        first = start_thread(lambda: time.sleep(0.5), name="shardfeed-test-broken", stop=broken)
        second = start_thread(lambda: flag.wait(60), name="shardfeed-test-fine", stop=flag.set)
        print("left", stop_all(timeout_s=30), "second alive", second.is_alive())
    """)
    assert out.splitlines() == ["left [] second alive False"]


@pytest.mark.network
def test_no_reader_thread_is_alive_when_a_process_reading_ahead_over_http_finalizes(tmp_path):
    with serving(StallingHandler, marker=tmp_path / "stalled") as (base, srv):
        url = f"{base}/shard-000000.tar"
        t0 = time.monotonic()
        r, end = run_child(f"""
            from shardfeed.readers.storage.http_io import HttpRangeStream
            from shardfeed.readers.storage.shard_readahead import SpansAhead
            ahead = SpansAhead(lambda: [("span", lambda: (HttpRangeStream({url!r}, 0), 0), 0, 1 << 20)])
            # the server has sent its first bytes: the thread is blocked receiving
            blocked = wait_for({str(srv.marker)!r})
            print("BLOCKED" if blocked else "NEVER", [t.name for t in threading.enumerate()], flush=True)
            time.sleep(0.2)
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BLOCKED" in r.stdout and "shardfeed-epoch-ahead" in r.stdout, r.stdout + r.stderr
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    assert end - t0 < 60  # the stalled request (deadline far away) did not hold the exit


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_thread_held_the_registries_locks_starts_and_stops_threads():
    # a thread holds both registries' locks across the fork (as a reader thread registering a
    # thread or a stream might): the child has fresh locks and none of the parent's threads
    out = _run_child("""
        import os, sys
        from shardfeed.readers import background
        from shardfeed.readers.storage import http_io
        held, release = threading.Event(), threading.Event()
        def hold():
            with background._lock, http_io._LIVE_LOCK:
                held.set()
                release.wait(30)
        parent_thread = start_thread(lambda: release.wait(30), name="shardfeed-test-parent", stop=release.set)
        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        held.wait(30)
        pid = os.fork()
        if pid == 0:
            try:
                flag = threading.Event()
                start_thread(lambda: flag.wait(30), name="shardfeed-test-child", stop=flag.set)
                with http_io._LIVE_LOCK:
                    n = len(http_io._LIVE_STREAMS)
                left = stop_all(timeout_s=10)
                os.write(1, f"child left {left} streams {n}\\n".encode())
            finally:
                os._exit(0)
        for _ in range(400):  # bounded: a deadlocked child is killed, and the line is missing
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        release.set()
        print("parent left", stop_all(timeout_s=10), flush=True)
    """)
    assert "child left [] streams 0" in out, out
    assert "parent left []" in out, out
