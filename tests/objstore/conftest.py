"""Fixtures for the object-store tests: a real S3-API server (moto's standalone server) on
127.0.0.1 for the session, credentials with a recognisable secret, and small fault servers.

``s3_endpoint``
    ``http://127.0.0.1:PORT`` of the moto server; ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY`` (= :data:`SECRET`) and ``AWS_DEFAULT_REGION`` are set in the
    environment for the session (and inherited by DataLoader workers and CLI subprocesses).
``s3_bucket``
    a factory ``make(name) -> name`` creating a fresh bucket.
``error_server``
    a factory ``start(status, code, message) -> endpoint``: a loopback HTTP server answering every
    request with that S3 XML error (403 AccessDenied, 400 ExpiredToken, 503 SlowDown ...);
    ``.hits`` counts the requests it answered.
``stalled_endpoint``
    a loopback server that accepts connections and never answers.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import threading

import pytest

#: The secret key every test runs with; no message, log or report may contain it.
SECRET = "SfSecretKEY-9f3a1c77e2-DoNotPrint"
ACCESS_KEY = "AKIASHARDFEEDTEST01"


def _upload_dir(client, bucket: str, prefix: str, root) -> None:
    from pathlib import Path

    root = Path(root)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=bucket, Key=prefix + p.relative_to(root).as_posix(), Body=p.read_bytes())


@pytest.fixture(scope="session")
def s3_endpoint():
    pytest.importorskip("boto3", reason="the s3 extra is not installed: pip install 'shardfeed[s3]'")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed (the dev extra has it)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    saved = {k: os.environ.get(k) for k in [*env, "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
    os.environ.update(env)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_client(s3_endpoint):
    import boto3

    return boto3.client("s3")


@pytest.fixture(scope="session")
def s3_bucket(s3_client):
    made = set()

    def make(name: str) -> str:
        if name not in made:
            s3_client.create_bucket(Bucket=name)
            made.add(name)
        return name
    return make


@pytest.fixture(scope="session")
def s3_packed(s3_client, s3_bucket, packed_wds, tiny_image_folder):
    """The session's packed WebDataset and image folder uploaded to ``s3://data/``:
    ``(wds_url, folder_url)``."""
    bucket = s3_bucket("data")
    _upload_dir(s3_client, bucket, "wds/", packed_wds)
    _upload_dir(s3_client, bucket, "folder/", tiny_image_folder)
    return f"s3://{bucket}/wds/", f"s3://{bucket}/folder/"


class _ErrorHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        srv = self.server
        srv.hits += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{srv.code}</Code>'
                f"<Message>{srv.message}</Message><RequestId>1</RequestId></Error>").encode()
        self.send_response(srv.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def error_server():
    servers = []

    def start(status: int, code: str, message: str = "injected"):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ErrorHandler)
        srv.status, srv.code, srv.message, srv.hits = status, code, message, 0
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        start.server = srv
        return f"http://127.0.0.1:{srv.server_address[1]}"
    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def stalled_endpoint():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # accepted by the kernel, never read nor answered
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def closed_endpoint():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: connection refused
    return f"http://127.0.0.1:{port}"
