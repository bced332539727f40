"""At exit, a request cut by the exit hook is not retried: the thread making it ends within the
exit hook's wait instead of opening a new connection to a server that does not answer."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from .exit_helpers import StallingHandler, printed_time, run_child, serving


class _SilentHandler(http.server.BaseHTTPRequestHandler):
    """Reads a GET, writes the marker file, and never answers until the test ends."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        self.server.marker.write_text("waiting")
        self.server.release.wait(60)

    def log_message(self, *args):
        pass


@pytest.fixture
def silent_server(tmp_path):
    with serving(_SilentHandler, marker=tmp_path / "waiting") as (base, srv):
        yield f"{base}/shard-000000.tar", srv


@pytest.mark.network
def test_a_request_waiting_for_its_answer_at_exit_is_not_retried(silent_server):
    url, srv = silent_server
    child = (f"""
        from shardfeed.readers.storage.http_io import HttpRangeStream
        from shardfeed.readers.storage.shard_readahead import SpansAhead
        ahead = SpansAhead(lambda: [("span", lambda: (HttpRangeStream({url!r}, 0), 0), 0, 1 << 20)])
        marker_seen = wait_for({str(srv.marker)!r})  # the request arrived: the thread awaits the headers
        print("WAITING" if marker_seen else "NEVER", flush=True)
        print("T", time.monotonic(), flush=True)
    """)
    r, end = run_child(child, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WAITING" in r.stdout, r.stdout + r.stderr
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    assert len(srv.requests) == 1, srv.requests  # the cut request was not sent again
    took = printed_time(r.stdout, "LEFT_T") - printed_time(r.stdout)  # to the end of shardfeed's exit hook
    assert took < 5, took  # the exit hook's wait (2 s), not a retry's timeout (10 s)


class _CutThenSilentHandler(http.server.BaseHTTPRequestHandler):
    """The first GET: a 1 MiB ``Content-Length``, no body, the connection closed (a cut the
    reader retries). Every later GET is read and never answered."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.requests.append(self.headers.get("Range"))
        if len(self.server.requests) == 1:
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            self.server.marker.write_text("cut")
            return
        self.server.release.wait(60)

    def log_message(self, *args):
        pass


@pytest.fixture
def cut_server(tmp_path):
    with serving(_CutThenSilentHandler, marker=tmp_path / "cut") as (base, srv):
        yield f"{base}/shard-000000.tar", srv


@pytest.mark.network
def test_a_stream_aborted_while_waiting_to_retry_a_cut_read_does_not_reopen(cut_server):
    url, srv = cut_server
    # the wait before a retry made long, so that the exit lands in it (with the default 0.2 s
    # it lands there only sometimes)
    child = (f"""
        from shardfeed.readers.storage import ranged_stream
        from shardfeed.readers.storage.http_io import HttpRangeStream
        from shardfeed.readers.storage.shard_readahead import SpansAhead
        ranged_stream.BACKOFF_S = 1.0
        ahead = SpansAhead(lambda: [("span", lambda: (HttpRangeStream({url!r}, 0), 0), 0, 1 << 20)])
        marker_seen = wait_for({str(srv.marker)!r})  # the first answer was cut: the thread waits to retry
        time.sleep(0.2)
        print("CUT" if marker_seen else "NEVER", flush=True)
        print("T", time.monotonic(), flush=True)
    """)
    r, end = run_child(child, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CUT" in r.stdout, r.stdout + r.stderr
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    assert srv.requests == [None], srv.requests  # no second request after the stream was aborted
    took = printed_time(r.stdout, "LEFT_T") - printed_time(r.stdout)  # to the end of shardfeed's exit hook
    assert took < 5, took  # the exit hook's wait (2 s), not a retry's timeout (10 s)


@pytest.mark.network
def test_requests_made_after_the_exit_hook_ran_keep_their_deadline(silent_server):
    url, srv = silent_server
    child = (f"""
        import time
        from shardfeed.readers.background import stop_all
        from shardfeed.readers.storage.http_io import http_get
        from shardfeed.readers.errors import DataSourceError
        for attempt in range(2):  # the second after the watchdog was stopped and joined
            t0 = time.monotonic()
            try:
                http_get({url!r}, timeout_s=30, retries=0, deadline_s=1.0)
                print("ANSWERED")
            except DataSourceError:
                print("FAILED", round(time.monotonic() - t0, 1) < 5, flush=True)
            print("left", stop_all(timeout_s=10), flush=True)
    """)
    r, end = run_child(child, left_hook=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["FAILED True", "left []"] * 2, r.stdout + r.stderr


class _FilesHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the packed dataset's files (whole files: ``Range`` is not answered)."""

    def __init__(self, request, client_address, server):
        super().__init__(request, client_address, server, directory=str(server.root))

    def log_message(self, *args):
        pass


@pytest.fixture
def files_server(packed_root):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FilesHandler)
    srv.daemon_threads = True
    srv.root = packed_root
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.network
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("workers", [
    pytest.param({"num_workers": 0}, id="in-process"),
    pytest.param({"num_workers": 1, "multiprocessing_context": "spawn"}, id="spawn-persistent"),
    pytest.param({"num_workers": 1, "multiprocessing_context": "forkserver", "persistent_workers": False},
                 id="forkserver"),
    pytest.param({"num_workers": 2, "multiprocessing_context": "fork"}, id="fork-persistent"),
])
def test_a_program_leaving_a_loader_over_http_mid_epoch_exits_at_once_and_cleanly(files_server, workers):
    child = (f"""
        from shardfeed.readers import make_loader
        loader = make_loader({files_server + "/wds/"!r}, batch_size=2, decode=False, collate_fn=list, seed=0,
                             **{workers!r})
        it = iter(loader)
        batch = next(it)
        print("BATCH", len(batch), flush=True)
        print("T", time.monotonic(), flush=True)
    """)
    r, end = run_child(child, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BATCH 2" in r.stdout, r.stdout + r.stderr
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    t = printed_time(r.stdout)
    # from the last statement to the end of shardfeed's exit hook (the listing runs right after
    # it): the interpreter's own teardown after it (torch's included) is not timed, since a busy
    # machine stretches it to tens of seconds
    assert printed_time(r.stdout, "LEFT_T") - t < 4, printed_time(r.stdout, "LEFT_T") - t


@pytest.fixture
def full_backlog():
    """A loopback port whose accept queue is full: a new connection waits in ``connect``."""
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    first = socket.create_connection(("127.0.0.1", port), timeout=5)  # fills the queue
    yield f"http://127.0.0.1:{port}/shard-000000.tar"
    first.close()
    lsock.close()


@pytest.mark.network
def test_a_thread_waiting_to_connect_at_exit_does_not_hold_the_exit(full_backlog):
    child = (f"""
        from shardfeed.readers.storage.http_io import HttpRangeStream
        from shardfeed.readers.storage.shard_readahead import SpansAhead
        ahead = SpansAhead(lambda: [("span", lambda: (HttpRangeStream({full_backlog!r}, 0), 0), 0, 1 << 20)])
        time.sleep(0.5)  # the thread waits in connect (10 s timeout)
        print("T", time.monotonic(), flush=True)
    """)
    r, end = run_child(child, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    t = printed_time(r.stdout)
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    assert printed_time(r.stdout, "LEFT_T") - t < 1.5, printed_time(r.stdout, "LEFT_T") - t  # shardfeed's exit hook


class _PausingHandler(http.server.BaseHTTPRequestHandler):
    """Sends the first 1,000 bytes of ``server.body``, writes the marker file, waits until the
    ``go`` file exists, then sends the rest."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:1000])
        self.wfile.flush()
        self.server.marker.write_text("paused")
        for _ in range(600):
            if self.server.go.exists():
                break
            time.sleep(0.05)
        self.wfile.write(body[1000:])

    def log_message(self, *args):
        pass


@pytest.mark.network
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_exiting_normally_leaves_the_parents_read_in_flight_whole(tmp_path):
    import os

    body = os.urandom(300_000)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PausingHandler)
    srv.daemon_threads = True
    srv.body, srv.marker, srv.go, srv.requests = body, tmp_path / "paused", tmp_path / "go", []
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/f.bin"
    (tmp_path / "want").write_bytes(body)
    child = (f"""
        import hashlib, os, sys, threading, time
        from shardfeed.readers.storage.http_io import HttpRangeStream
        from shardfeed.readers.storage.shard_readahead import SpansAhead
        n = {len(body)}
        ahead = SpansAhead(lambda: [("f", lambda: (HttpRangeStream({url!r}, 0), 0), 0, n)])
        marker_seen = wait_for({str(srv.marker)!r})  # the thread is blocked receiving the rest
        pid = os.fork()
        if pid == 0:  # a thread of its own, so that the exit hook's socket cuts run in the child too
            from shardfeed.readers.background import start_thread
            flag = threading.Event()
            start_thread(lambda: flag.wait(30), name="shardfeed-test-child", stop=flag.set)
            sys.exit(0)  # a normal exit: atexit hooks run in the child
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status), flush=True)
        Path({str(srv.go)!r}).write_text("go")
        held = ahead.take("f")
        got = b"" if held is None else held.read_at(0, n)
        print("SAME", got == Path({str(tmp_path / "want")!r}).read_bytes(), flush=True)
    """)
    try:
        r, end = run_child(child, left_hook=False, timeout=120)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["CHILD 0", "SAME True"], r.stdout + r.stderr
    assert srv.requests == ["/f.bin"], srv.requests  # one answer read whole: its socket was never cut


def test_a_request_armed_while_the_watchdog_is_stopping_still_gets_its_deadline():
    # stop() and arm() both made before the watchdog thread wakes (another reader thread arming a
    # request while the exit hook stops the watchdog): the entry still fires at its time
    child = ("""
        import socket, time
        from shardfeed.readers.storage.http_io import _WATCHDOG
        a, b = socket.socketpair()
        _WATCHDOG.disarm(_WATCHDOG.arm(time.monotonic() + 60, a))  # the thread runs
        with _WATCHDOG._cv:
            _WATCHDOG.stop()
            entry = _WATCHDOG.arm(time.monotonic() + 0.3, a)
        a.settimeout(3)
        t0 = time.monotonic()
        try:
            got = a.recv(1)
        except OSError as exc:
            got = type(exc).__name__
        print("FIRED", entry[3], "EOF", got == b"", "SOON", time.monotonic() - t0 < 2, flush=True)
    """)
    r, end = run_child(child, left_hook=False, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["FIRED True EOF True SOON True"], r.stdout + r.stderr


@pytest.mark.network
def test_a_reader_thread_woken_by_the_exit_hook_does_not_start_its_next_read(tmp_path):
    with serving(StallingHandler, marker=tmp_path / "stalled") as (base, srv):
        r, end = run_child(f"""
            from shardfeed.readers.storage.http_io import HttpRangeStream
            from shardfeed.readers.storage.shard_readahead import SpansAhead
            spans = [(i, (lambda i=i: (HttpRangeStream(f"{base}/shard-{{i:06d}}.tar", 0), 0)), 0, 1 << 20)
                     for i in range(3)]
            ahead = SpansAhead(lambda: spans)
            marker_seen = wait_for({str(srv.marker)!r})  # the first span's read is blocked receiving
            print("T", time.monotonic(), flush=True)
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    t = printed_time(r.stdout)
    assert "LEFT []" in r.stdout, r.stdout + r.stderr
    assert srv.requests == ["/shard-000000.tar"], srv.requests  # the later spans were never asked for
    assert printed_time(r.stdout, "LEFT_T") - t < 1.5, printed_time(r.stdout, "LEFT_T") - t  # shardfeed's exit hook


def test_the_watchdog_asked_to_stop_with_a_request_armed_ends_when_that_request_is_cut():
    child = ("""
        import socket, time
        from shardfeed.readers.storage.http_io import _WATCHDOG
        a, b = socket.socketpair()
        _WATCHDOG.arm(time.monotonic() + 60, a)
        thread = _WATCHDOG._thread
        _WATCHDOG.stop()
        time.sleep(0.3)  # the thread woke, found a request armed and waits for its deadline again
        _WATCHDOG.shut_down_all()
        thread.join(2)
        print("ENDED", not thread.is_alive(), flush=True)
    """)
    r, end = run_child(child, left_hook=False, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["ENDED True"], r.stdout + r.stderr
