"""Shared, session-scoped fixtures: a tiny image folder, its packed copies, and HTTP servers.

Fixtures (all session-scoped; treat their files as read-only):

``tiny_image_folder``
    ``Path`` of an ImageFolder with 3 classes and 60 small images (RGB JPEG, greyscale PNG,
    RGBA PNG, palette PNG; 20-48 px), generated with a fixed seed.
``mixed_case_folder``
    ``Path`` of an ImageFolder whose class folders differ in case and are partly non-ASCII
    (``MIXED_CASE_CLASSES``), 3 images each.
``tiny_folder_expected``
    ``{relative_path: (file_bytes, label)}`` computed from the folder itself (labels from the
    sorted class folder names), for honest expectations.
``packed_root``
    ``Path`` of a folder holding ``wds/`` (WebDataset, ``max_count=16``: shards of 16/16/16/12)
    and ``lmdb/`` (LMDB), both packed from
    ``tiny_image_folder``.
``packed_wds`` / ``packed_lmdb``
    ``packed_root / "wds"`` / ``packed_root / "lmdb"``.
``nginx_server``
    Base URL (``http://127.0.0.1:PORT``) of an nginx (answers ``Range``) serving
    ``packed_root``; skipped with a reason when nginx is not installed.
``simple_http_server``
    Base URL of Python's ``http.server`` (ignores ``Range``) serving ``packed_root``.
``start_http_server``
    Factory: ``start_http_server(directory, handler_class=None) -> base URL`` for a threaded
    ``http.server`` on 127.0.0.1 (stopped at the end of the session).
``launch_chromium``
    ``with launch_chromium() as browser``: Debian's headless Chromium driven by Playwright;
    skips with a reason when Playwright or Chromium is missing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def _make_image(rng: np.random.Generator, kind: str, w: int, h: int):
    from PIL import Image

    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                     np.full_like(xx, int(rng.integers(0, 256)))], axis=-1)
    noise = rng.integers(-20, 21, size=base.shape)
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    if kind == "jpg":
        return Image.fromarray(rgb, "RGB")
    if kind == "gray":
        return Image.fromarray(rgb[..., 0], "L")
    if kind == "rgba":
        alpha = (rng.integers(0, 256, size=(h, w))).astype(np.uint8)
        return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    return Image.fromarray(rgb, "RGB").quantize(colors=16)  # palette


@pytest.fixture(scope="session")
def tiny_image_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny") / "images"
    rng = np.random.default_rng(1234)
    kinds = ["jpg", "jpg", "gray", "rgba", "palette"]
    for c, cls in enumerate(["cat", "dog", "eel"]):
        d = root / cls
        d.mkdir(parents=True)
        for i in range(20):
            kind = kinds[(i + c) % len(kinds)]
            w, h = int(rng.integers(20, 49)), int(rng.integers(20, 49))
            img = _make_image(rng, kind, w, h)
            if kind == "jpg":
                img.save(d / f"img_{i:03d}.jpg", quality=90)
            else:
                img.save(d / f"img_{i:03d}.png")
    return root


#: Class folders of :func:`mixed_case_folder`: upper and lower case, Latin-1 and CJK letters, in
#: the order they are created (not sorted).
MIXED_CASE_CLASSES = ("cat", "Zebra", "ant", "élan", "Bird", "東京", "Öl")


@pytest.fixture(scope="session")
def mixed_case_folder(tmp_path_factory) -> Path:
    """An ImageFolder whose class folders differ in case and use non-ASCII names (UTF-8 on disk,
    NFC): :data:`MIXED_CASE_CLASSES`, 3 small PNG/JPEG images each (file names non-ASCII too)."""
    root = tmp_path_factory.mktemp("mixed") / "images"
    rng = np.random.default_rng(77)
    for c, cls in enumerate(MIXED_CASE_CLASSES):
        d = root / cls
        d.mkdir(parents=True)
        for i in range(3):
            img = _make_image(rng, "jpg" if i % 2 else "gray", 16 + c, 20 + i)
            img.save(d / (f"bild_{i}_ß.jpg" if i % 2 else f"Img_{i}.png"))
    return root


@pytest.fixture(scope="session")
def tiny_folder_expected(tiny_image_folder) -> dict[str, tuple[bytes, int]]:
    classes = sorted(p.name for p in tiny_image_folder.iterdir() if p.is_dir())
    out = {}
    for label, cls in enumerate(classes):
        for f in sorted((tiny_image_folder / cls).iterdir()):
            out[f"{cls}/{f.name}"] = (f.read_bytes(), label)
    return out


@pytest.fixture(scope="session")
def packed_root(tiny_image_folder, tmp_path_factory) -> Path:
    from shardfeed.convert.write.pack import PackOptions, pack

    root = tmp_path_factory.mktemp("packed")
    pack(tiny_image_folder, root / "wds", PackOptions(format="wds", max_count=16, workers=1, seed=0))
    pack(tiny_image_folder, root / "lmdb", PackOptions(format="lmdb", workers=1, seed=0))
    return root


@pytest.fixture(scope="session")
def packed_wds(packed_root) -> Path:
    return packed_root / "wds"


@pytest.fixture(scope="session")
def packed_lmdb(packed_root) -> Path:
    return packed_root / "lmdb"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass


@pytest.fixture(scope="session")
def start_http_server():
    servers = []

    def start(directory, handler_class=None) -> str:
        handler = functools.partial(handler_class or _QuietHandler, directory=str(directory))
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    # shut down together: each shutdown() waits for its serve loop's next poll (up to 0.5 s)
    stopping = [threading.Thread(target=srv.shutdown) for srv in servers]
    for thread in stopping:
        thread.start()
    for thread, srv in zip(stopping, servers):
        thread.join()
        srv.server_close()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Flags for a quiet, offline headless Chromium (Playwright adds ``--headless`` itself).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")


@contextlib.contextmanager
def _launch_chromium():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra has it)")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; make system-deps installs it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def launch_chromium():
    """``launch_chromium()``: a context manager giving a Playwright ``Browser`` (headless Chromium).

    Skips the test with a reason when Playwright or Chromium is missing (under CI a skip fails).
    """
    return _launch_chromium


@pytest.fixture(scope="session")
def simple_http_server(packed_root, start_http_server) -> str:
    return start_http_server(packed_root)


@pytest.fixture(scope="session")
def nginx_server(packed_root, tmp_path_factory) -> str:
    nginx = shutil.which("nginx") or next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)
    if nginx is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light); the Range-answering "
                    "server tests need it")
    work = tmp_path_factory.mktemp("nginx")
    port = free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read the 0700 pytest tmp dirs
    temp = "\n".join(f"    {k}_temp_path {work}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(f"""{user}daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
{temp}
    server {{
        listen 127.0.0.1:{port};
        root {packed_root};
        location / {{ }}
    }}
}}
""")
    proc = subprocess.Popen([nginx, "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port)
    except RuntimeError:
        proc.kill()
        err = proc.stderr.read().decode(errors="replace")
        log = (work / "error.log").read_text() if (work / "error.log").exists() else ""
        pytest.fail(f"nginx did not start: {err} {log}")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


def _call_on_read_only_folder(fn, folder: Path) -> str:
    """``fn(str(folder))`` where ``folder`` is really read-only; returns its string result.

    Root ignores file modes, so as root the call runs in a forked child switched to user
    ``nobody`` (uid/gid 65534), after checking that this user cannot write to the folder.

    Raises:
        AssertionError: the folder is writable, or ``fn`` failed (its error as the message).
    """
    if os.geteuid() != 0:
        return fn(str(folder))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            try:
                (folder / "probe").write_bytes(b"x")
                msg = "the folder is writable"
            except PermissionError:
                msg = fn(str(folder))
                code = 0
        except BaseException as exc:  # report anything to the parent
            msg = f"{type(exc).__name__}: {exc}"
        os.write(w, msg.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(msg[:2000])
    return msg


@pytest.fixture
def call_on_read_only_folder():
    """``call(fn, folder) -> str``: run ``fn(str(folder))`` with the folder really read-only (see above)."""
    return _call_on_read_only_folder


def _lmdb_entries(out: Path) -> int:
    """Records committed so far in ``out/data.mdb`` (0 when there is none yet); safe during a pack."""
    import lmdb

    if not (out / "data.mdb").exists():
        return 0
    try:
        env = lmdb.open(str(out), readonly=True, lock=True, subdir=True)
    except lmdb.Error:
        return 0
    try:
        return env.stat()["entries"]
    finally:
        env.close()


@pytest.fixture
def lmdb_entries():
    """``count(out) -> int``: records committed so far in an LMDB being packed into ``out``."""
    return _lmdb_entries


@pytest.fixture(scope="session")
def hooked_cli():
    """``hooked_cli(hooks) -> argv prefix``: the ``shardfeed`` CLI in a subprocess with test faults.

    ``hooks`` is a dict of :class:`shardfeed.convert.write.faults.FaultHooks` fields (``sample_delay_s``,
    ``lmdb_commit_count``, ``lmdb_commit_delay_s``...); see ``tests/hooked_cli.py``.
    """
    script = Path(__file__).with_name("hooked_cli.py")

    def command(hooks: dict) -> list[str]:
        return [sys.executable, "-P", str(script), json.dumps(hooks)]

    return command


# ---------------------------------------------------------------------------------------------
# CI: a skip is a failure (only tests marked ``gpu`` may skip)

def ci_is_set() -> bool:
    """Whether the ``CI`` environment variable is set to a true value (``.ci/run`` sets CI=true)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, turn the skip of a test not marked ``gpu`` into a failure.

    nginx, openssl, webdataset, OpenCV, Ray and LMDB are required parts: the Makefile's
    ``install`` and ``system-deps`` install them, so a test that skips for want of one in CI means
    the set-up is broken, and it must not pass silently. Outside CI a skip stays a skip (a
    developer without nginx can still run the rest).
    """
    outcome = yield
    rep = outcome.get_result()
    if not (rep.skipped and ci_is_set()) or hasattr(rep, "wasxfail") or item.get_closest_marker("gpu"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 else str(rep.longrepr)
    rep.outcome = "failed"
    rep.longrepr = (f"skipped under CI={os.environ.get('CI')}, where only tests marked gpu may skip: {reason} "
                    "(install the missing part: `make system-deps install`)")
