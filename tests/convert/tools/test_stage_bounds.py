"""``stage`` copies at most what the manifest lists: a source that sends more (a shard listed at
a few KB arriving as megabytes) is stopped at the listed size plus one byte and refused, naming
its URL, before DEST holds more than the listed bytes; files ``stage`` writes in DEST are never
opened through a link. Right values: the sizes in the manifest the test packs, the bytes of a
victim file the test plants."""

from __future__ import annotations

import http.server
import io
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.tools.stage import stage

JUNK_BYTES = 64 << 20  # what the server would send after each shard's real bytes


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("sb") / "src"
    for i in range(8):
        p = src / f"c{i % 2}" / f"{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
        p.write_bytes(buf.getvalue())
    out = src.parent / "ds"
    pack(src, out, PackOptions(workers=1, max_count=4))
    return out


class _Oversized(http.server.BaseHTTPRequestHandler):
    """Serves the dataset, with ``JUNK_BYTES`` more after each ``.tar`` (counted in ``server.sent``)."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        srv = self.server
        name = self.path.lstrip("/")
        path = srv.root / name
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        junk = JUNK_BYTES if name.endswith(".tar") else 0
        self.send_response(200)
        if srv.with_length:
            self.send_header("Content-Length", str(len(data) + junk))
        self.end_headers()
        try:
            self.wfile.write(data)
            block = b"\0" * (64 << 10)
            for _ in range(junk // len(block)):
                self.wfile.write(block)
                with srv.lock:
                    srv.sent[name] = srv.sent.get(name, 0) + len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.mark.network
@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "until-close"])
def test_stage_stops_an_oversized_shard_at_its_listed_size(packed, tmp_path, with_length):
    import json

    listed = {s["name"]: s["num_bytes"] for s in json.loads((packed / "manifest.json").read_text())["shards"]}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Oversized)
    srv.root, srv.with_length, srv.sent, srv.lock = packed, with_length, {}, threading.Lock()
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    dest = tmp_path / "dest"
    try:
        report = stage(url, dest, min_free_bytes=1000, retries=0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert not report.ok and not (dest / "manifest.json").exists()
    assert sorted(p["shard"] for p in report.problems) == sorted(listed)
    for p in report.problems:
        assert f"{url}{p['shard']}" in p["problem"] and "more than the" in p["problem"], p
    assert report.bytes_copied <= sum(listed.values())
    for f in dest.iterdir():  # nothing in DEST beyond what the manifest lists
        assert not f.name.endswith(".tar") and not f.name.endswith(".tar.stage.tmp"), f.name
    assert max(srv.sent.values(), default=0) < 16 << 20  # the copy stopped reading, not the server sending


def test_stage_never_writes_through_a_planted_link(packed, tmp_path):
    import json

    first = json.loads((packed / "manifest.json").read_text())["shards"][0]["name"]
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the victim's bytes")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f".{first}.stage.tmp").symlink_to(victim)
    with pytest.raises(OSError, match=rf"\.{first}\.stage\.tmp: is a symbolic link"):
        stage(packed, dest, min_free_bytes=1000)
    assert victim.read_bytes() == b"the victim's bytes"
    # a link where a staged file goes is not the stage's own: refused, the link and its target untouched
    (dest / f".{first}.stage.tmp").unlink()
    (dest / first).symlink_to(victim)
    with pytest.raises(ValueError, match=rf"'{first}'\); nothing was replaced"):
        stage(packed, dest, min_free_bytes=1000)
    assert victim.read_bytes() == b"the victim's bytes" and (dest / first).is_symlink()
