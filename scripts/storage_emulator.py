#!/usr/bin/env python3
"""A network-storage **emulator**: a read-only FUSE passthrough mount that adds latency.

It mounts a local folder read-only at a mount point and serves every file through FUSE, adding

* ``open_ms`` of latency to every ``open`` (a metadata round trip to the server: NFS OPEN/LOOKUP +
  GETATTR, an object store's HEAD or first GET),
* ``read_ms`` of first-byte latency per read **request** (see "per-read policy" below),
* an optional shared bandwidth cap (``bandwidth_mb_s``, MB = 10^6 bytes, for all requests
  together, like one network link),

and counts what passes through it (opens, read requests, bytes, request sizes, requests in flight
at once), readable from Python while it runs (:meth:`StorageEmulator.stats`). It exists so that
``verify`` and the benchmarks can show what a loader does on the storage users train from without
that storage: **every figure measured on it is an emulation**, not a measurement of NFS, a cloud
disk or a bucket, and is labelled so wherever it is printed.

What the latencies model (public figures; an emulator adds a fixed delay, real storage varies):

=============  ==================================================================================
per request    where such a latency is published
=============  ==================================================================================
0.25-0.5 ms    Managed NFS: Amazon EFS (General Purpose) reads "as low as 250 microseconds"
               (AWS, "Amazon EFS performance", docs.aws.amazon.com/efs/latest/ug/performance.html);
               io2 Block Express EBS volumes "average latency of under 500 microseconds for 16KiB
               I/O" (AWS, "Amazon EBS optimization", docs.aws.amazon.com/ebs/latest/userguide/
               ebs-optimization.html). The 0.5 ms row.
~2 ms          Cloud block storage at queue depth 1: Google's Hyperdisk tuning guide sizes queue
               depth as 1 outstanding I/O per 500 IOPS (16 KB I/O), i.e. about 2 ms per request
               ("Optimize Hyperdisk performance", cloud.google.com/compute/docs/disks/
               optimize-hyperdisk); EFS Standard writes "as low as 2.7 ms" (AWS page above). The
               2 ms row (also the demo's).
10 ms and up   Bucket FUSE mounts: gcsfuse's own fio benchmark reports 16-21 ms average latency
               for 128-256 KB files (GoogleCloudPlatform/gcsfuse, docs/benchmarks.md); Amazon S3
               gives "100-200 milliseconds" for small objects from latency-sensitive applications
               (AWS, "Performance guidelines for Amazon S3"), and a mountpoint-s3 user measured
               175-243 ms to read the first byte of one file (awslabs/mountpoint-s3 issue #500).
               The 10 ms row is thus an *optimistic* bucket mount.
=============  ==================================================================================

Per-read policy (``read_policy``):

* ``"request"`` (default): every FUSE read request pays ``read_ms``, as an NFS client pays one
  READ RPC round trip per ``rsize`` chunk and a block device one I/O per request. The kernel
  sizes the requests: buffered reads go out as readahead windows of the mount's
  ``read_ahead_kb`` (128 KiB by default), each at most ``max_pages`` pages (32 pages = 128 KiB
  under libfuse 2, which does not negotiate it; 256 pages = 1 MiB under libfuse 3). So a shard is
  read in 128 KiB requests by default and in 1 MiB requests with ``read_ahead_kb=1024`` under
  libfuse 3 (measured here; ``max_read`` and ``big_writes`` do not raise it: ``max_read`` only
  lowers the limit and ``big_writes`` concerns writes). :meth:`StorageEmulator.stats` reports the
  sizes the kernel actually asked for.
* ``"stream"``: only the first read of an open file and every non-sequential read pay
  ``read_ms``; a read that continues where the previous one on the same handle ended streams on
  (bandwidth only), as gcsfuse and mountpoint-s3 keep one ranged GET open per sequential reader.

Kernel caching: files are opened without ``keep_cache`` (the kernel drops a file's cached pages
on every open, like a bucket mount without its file cache) and the kernel's attribute/entry
caches keep libfuse's default timeout (1 s), so a training loop pays latency each epoch.

Multi-threaded: libfuse runs its multi-threaded loop; the latency is ``time.sleep`` (which
releases the GIL) and the bytes are read by libfuse itself (the ``read_buf`` answer names the
source file's descriptor and offset; libfuse splices them into the reply where the kernel offers
splice, else reads them into its buffer, without the GIL), so requests from several
loader workers are in flight at once, as on a real NFS or bucket mount (``max_in_flight`` in the
stats shows how many were). The kernel's own limit on a FUSE mount's background requests (12 by
default, which caps buffered reads) is raised to ``max_background`` (64) at init.

The emulator shares the machine's CPUs with the reader it serves, so each request is kept cheap:
no Python ``bytes`` and no copy of the data in Python, one call into Python per request. What it
models is unchanged by that: the latencies, the bandwidth cap, the counts, and the request sizes
(which the kernel chooses). ``read_bytes`` counts the bytes each request covers within the file's
size at ``open`` (the source folder is not written while mounted).

Needs ``/dev/fuse``, libfuse (``apt-get install fuse3 libfuse2``) and ``pip install mfusepy``
(maintained ctypes binding for libfuse 2 and 3; ``pip install 'shardfeed[dev]'`` has it), and the
right to mount (root, or a user who may run ``fusermount3``).

Examples::

    # from Python (what the bench and the demo use)
    from storage_emulator import StorageEmulator
    with StorageEmulator("data/sample", open_ms=2, read_ms=2) as emu:
        ...  # read files under emu.mountpoint
        print(emu.stats())   # {'opens': ..., 'reads': ..., 'read_bytes': ..., ...}

    # by hand: mount until Ctrl-C
    python scripts/storage_emulator.py mount data/sample /mnt/slow --open-ms 2 --read-ms 2
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EmulatorConfig",
    "StorageEmulator",
    "StorageEmulatorError",
    "fuse_unavailable_reason",
    "serve",
]

log = logging.getLogger("shardfeed.storage_emulator")

READ_POLICIES = ("request", "stream")
_MOUNT_TIMEOUT_S = 15.0


class StorageEmulatorError(RuntimeError):
    """The emulator could not mount, answer or unmount (the message says why and what to install)."""


@dataclass(frozen=True)
class EmulatorConfig:
    """What the emulated storage charges.

    Attributes:
        open_ms: latency added to every ``open`` of a file, milliseconds (>= 0).
        read_ms: first-byte latency added per read request (see ``read_policy``), milliseconds.
        bandwidth_mb_s: shared cap over all read requests, MB/s (10^6 bytes/s); None: no cap.
        read_policy: ``"request"`` (every FUSE read request pays ``read_ms``) or ``"stream"``
            (only the first read of an open file and non-sequential reads pay it).
        libfuse: ``"fuse3"`` or ``"fuse"`` (libfuse 2): the library mfusepy loads.
        read_ahead_kb: the mount's kernel readahead window, KiB (``/sys/class/bdi/<dev>/read_ahead_kb``,
            needs root); None keeps the kernel's default (128 KiB). It bounds the size of the read
            requests that buffered reads send: 1024 gives 1 MiB requests under libfuse 3 (libfuse 2
            stays at 128 KiB), as gcsfuse's and NFS's tuning guides raise it for sequential reads.
        max_threads: libfuse 3's request threads, i.e. how many requests the emulated storage
            serves at once. A network file system or bucket mount keeps many requests in flight
            (an NFS client many RPC slots, gcsfuse and mountpoint-s3 many concurrent GETs);
            libfuse 3's own default of 10 would make the emulator, not the modelled storage, the
            limit of a reader with many reads in flight. Ignored under libfuse 2.
        max_background: the kernel's limit on this mount's background requests (the FUSE
            connection's ``max_background``, set at init; its congestion threshold is 3/4 of it).
            Buffered reads go out as readahead, and with libfuse 3's async direct I/O ``O_DIRECT``
            reads too, all as background requests: at the kernel's default of 12 no more than 12
            reads are in flight on the mount, whatever the readers and ``max_threads`` ask for
            (measured here: 12 at 2, 10 and 30 ms with 32 reads submitted). An NFS client keeps
            tens of RPC slots in flight; a FUSE bucket mount that leaves the default stays at 12.
            None keeps the kernel's default.
    """

    open_ms: float = 0.0
    read_ms: float = 0.0
    bandwidth_mb_s: float | None = None
    read_policy: str = "request"
    libfuse: str = "fuse3"
    read_ahead_kb: int | None = None
    max_threads: int = 64
    max_background: int | None = 64

    def __post_init__(self) -> None:
        if self.open_ms < 0 or self.read_ms < 0:
            raise ValueError(f"latencies must be >= 0 ms, got open_ms={self.open_ms}, read_ms={self.read_ms}")
        if self.bandwidth_mb_s is not None and self.bandwidth_mb_s <= 0:
            raise ValueError(f"bandwidth_mb_s must be > 0 or None, got {self.bandwidth_mb_s}")
        if self.read_policy not in READ_POLICIES:
            raise ValueError(f"read_policy must be one of {READ_POLICIES}, got {self.read_policy!r}")
        if self.libfuse not in ("fuse3", "fuse"):
            raise ValueError(f"libfuse must be 'fuse3' or 'fuse' (libfuse 2), got {self.libfuse!r}")
        if self.read_ahead_kb is not None and self.read_ahead_kb < 0:
            raise ValueError(f"read_ahead_kb must be >= 0 or None, got {self.read_ahead_kb}")
        if self.max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {self.max_threads}")
        if self.max_background is not None and not 1 <= self.max_background <= 65535:
            raise ValueError(f"max_background must be in 1..65535 or None, got {self.max_background}")


# --------------------------------------------------------------------------------------------
# The FUSE file system (runs in the emulator's own process)
# --------------------------------------------------------------------------------------------

class _Counters:
    """Thread-safe operation counts of the emulated storage."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.opens = 0
        self.reads = 0
        self.read_bytes = 0
        self.latency_reads = 0  # read requests that paid read_ms
        self.getattrs = 0
        self.readdirs = 0
        self.read_sizes: dict[int, int] = {}  # requested size in bytes -> number of requests
        self.in_flight = 0
        self.max_in_flight = 0
        self.slept_s = 0.0

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"opens": self.opens, "reads": self.reads, "read_bytes": self.read_bytes,
                    "latency_reads": self.latency_reads, "getattrs": self.getattrs, "readdirs": self.readdirs,
                    "read_sizes": {str(k): v for k, v in sorted(self.read_sizes.items())},
                    "max_request_bytes": max(self.read_sizes) if self.read_sizes else 0,
                    "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                    "slept_s": round(self.slept_s, 6)}


def _make_operations(root: str, config: EmulatorConfig, control_path: str):
    """The mfusepy ``Operations`` of a latency-adding read-only passthrough of ``root``."""
    import mfusepy

    counters = _Counters()
    bw_lock = threading.Lock()
    bw_state = {"next_free": 0.0}
    open_s = config.open_ms / 1000.0
    read_s = config.read_ms / 1000.0
    bytes_per_s = config.bandwidth_mb_s * 1e6 if config.bandwidth_mb_s else None
    streams: dict[int, int] = {}  # fh -> offset where the next sequential read starts
    streams_lock = threading.Lock()
    sizes: dict[int, int] = {}  # fh -> the file's size at open, for the bytes a request serves

    def real(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    def sleep(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)  # releases the GIL: other requests go on meanwhile
            with counters.lock:
                counters.slept_s += seconds

    class Passthrough(mfusepy.Operations):
        use_ns = True

        def init_with_config(self, conn_info, config_3) -> None:
            if conn_info is not None and config.max_background is not None:
                conn_info.max_background = config.max_background
                conn_info.congestion_threshold = max(1, config.max_background * 3 // 4)
            if conn_info is not None:
                # replies spliced from the source file into the kernel's pages (one copy, no
                # buffer per reply), where the kernel and libfuse offer it
                conn_info.want |= conn_info.capable & _FUSE_CAP_SPLICE_WRITE
            threading.Thread(target=_serve_control, args=(control_path, counters), daemon=True,
                             name="emulator-control").start()

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            with counters.lock:
                counters.getattrs += 1
            try:
                st = os.lstat(real(path))
            except OSError as e:
                raise mfusepy.FuseOSError(e.errno) from None
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                  "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
            # read-only: no write bits
            attrs["st_mode"] = attrs["st_mode"] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
            for k in ("st_atime", "st_mtime", "st_ctime"):
                attrs[k] = attrs.pop(k + "_ns")
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            with counters.lock:
                counters.readdirs += 1
            try:
                return [".", "..", *os.listdir(real(path))]
            except OSError as e:
                raise mfusepy.FuseOSError(e.errno) from None

        def readlink(self, path: str) -> str:
            return os.readlink(real(path))

        def access(self, path: str, amode: int) -> int:
            if amode & os.W_OK:
                raise mfusepy.FuseOSError(errno.EROFS)
            if not os.access(real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(real(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                 "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            with counters.lock:
                counters.opens += 1
                counters.in_flight += 1
                counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
            try:
                sleep(open_s)
                try:
                    fh = os.open(real(path), os.O_RDONLY)
                except OSError as e:
                    raise mfusepy.FuseOSError(e.errno) from None
            finally:
                with counters.lock:
                    counters.in_flight -= 1
            with streams_lock:
                streams[fh] = -1  # no stream yet: the first read pays read_ms
            sizes[fh] = os.fstat(fh).st_size  # the source is read-only while mounted
            return fh

        def read_buf(self, path: str, bufpp, size: int, offset: int, fh: int) -> int:
            # libfuse reads the bytes itself (without the GIL) from the descriptor named in the
            # buffer it is handed, and frees the buffer with free(): no bytes object, no copy here
            nbytes = max(0, min(size, sizes.get(fh, 0) - offset))
            with counters.lock:
                counters.reads += 1
                counters.read_sizes[size] = counters.read_sizes.get(size, 0) + 1
                counters.in_flight += 1
                counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
            try:
                if config.read_policy == "request":
                    pay = True
                else:
                    with streams_lock:
                        pay = streams.get(fh, -1) != offset
                        streams[fh] = offset + size
                if pay:
                    with counters.lock:
                        counters.latency_reads += 1
                    sleep(read_s)
                if bytes_per_s:
                    with bw_lock:
                        now = time.monotonic()
                        start = max(now, bw_state["next_free"])
                        bw_state["next_free"] = start + nbytes / bytes_per_s
                        wait = bw_state["next_free"] - now
                    sleep(wait)
                _hand_over_fd(bufpp, fh, size, offset)
                with counters.lock:
                    counters.read_bytes += nbytes
                return 0
            finally:
                with counters.lock:
                    counters.in_flight -= 1

        def release(self, path: str, fh: int) -> int:
            with streams_lock:
                streams.pop(fh, None)
            sizes.pop(fh, None)
            os.close(fh)
            return 0

    return Passthrough()


class _FuseBuf(ctypes.Structure):
    """libfuse's ``struct fuse_buf`` (fuse_common.h; the same in libfuse 2.9 and 3)."""

    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class _FuseBufvec(ctypes.Structure):
    """libfuse's ``struct fuse_bufvec`` with its one inline buffer (``struct fuse_buf buf[1]``)."""

    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", _FuseBuf * 1)]


_FUSE_BUF_IS_FD = 1 << 1
_FUSE_BUF_FD_SEEK = 1 << 2
_FUSE_CAP_SPLICE_WRITE = 1 << 7  # fuse_common.h, libfuse 2.9 and 3
_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def _hand_over_fd(bufpp, fd: int, size: int, offset: int) -> None:
    """Point ``*bufpp`` (a ``read_buf`` answer) at a new ``fuse_bufvec`` naming ``size`` bytes of
    ``fd`` from ``offset``: libfuse reads them (fewer at the file's end) and frees the vector."""
    import mfusepy

    address = _libc.malloc(ctypes.sizeof(_FuseBufvec))
    if not address:
        raise mfusepy.FuseOSError(errno.ENOMEM)
    vec = _FuseBufvec.from_address(address)
    vec.count, vec.idx, vec.off = 1, 0, 0
    buf = vec.buf[0]
    buf.size, buf.flags, buf.mem, buf.fd, buf.pos = size, _FUSE_BUF_IS_FD | _FUSE_BUF_FD_SEEK, None, fd, offset
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = address


def _serve_control(control_path: str, counters: _Counters) -> None:
    """Answer ``stats`` / ``reset`` on a Unix socket: one JSON line per request."""
    if os.path.exists(control_path):
        os.unlink(control_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(control_path)
    srv.listen(8)
    while True:
        conn, _ = srv.accept()
        with conn:
            cmd = conn.makefile("r").readline().strip()
            if cmd == "reset":
                with counters.lock:
                    counters.reset()
                reply = {"ok": True}
            elif cmd == "stats":
                reply = counters.snapshot()
            else:
                reply = {"error": f"unknown command {cmd!r} (stats | reset)"}
            conn.sendall((json.dumps(reply) + "\n").encode())


def serve(root: str, mountpoint: str, config: EmulatorConfig, control_path: str, *, debug: bool = False) -> None:
    """Mount ``root`` at ``mountpoint`` and serve it in this process until unmounted (blocks).

    Raises:
        StorageEmulatorError: mfusepy or libfuse is missing.
    """
    os.environ.setdefault("FUSE_LIBRARY_NAME", config.libfuse)
    try:
        import mfusepy
    except ImportError as e:
        raise StorageEmulatorError(f"the storage emulator needs mfusepy and libfuse ({e}): "
                                   "pip install mfusepy; apt-get install fuse3 libfuse2") from None
    ops = _make_operations(os.path.abspath(root), config, control_path)
    # ro: read-only mount; default_permissions: the kernel checks modes; foreground: stay in this
    # process (the parent unmounts); no 'nothreads': libfuse's multi-threaded loop.
    threads = {"max_threads": config.max_threads} if config.libfuse == "fuse3" else {}
    mfusepy.FUSE(ops, mountpoint, foreground=True, ro=True, debug=debug, fsname="shardfeed-storage-emulator",
                 subtype="shardfeed-emu", default_permissions=True, **threads)


# --------------------------------------------------------------------------------------------
# Starting and stopping it from Python
# --------------------------------------------------------------------------------------------

def _is_mounted(mountpoint: str) -> bool:
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                    return True
    except OSError:
        return os.path.ismount(mountpoint)
    return False


def fuse_unavailable_reason() -> str | None:
    """Why no FUSE mount can be made here, or None when it looks possible (cheap checks only).

    Checks ``/dev/fuse``, the ``mfusepy`` package, libfuse and a ``fusermount`` helper. Whether the
    mount itself succeeds (containers may forbid it) only :class:`StorageEmulator` finds out.
    """
    if not os.path.exists("/dev/fuse"):
        return "FUSE unavailable: /dev/fuse is absent (no FUSE kernel module, or a container without the device)"
    import importlib.util

    if importlib.util.find_spec("mfusepy") is None:
        return "FUSE unavailable: the Python package mfusepy is not installed (pip install mfusepy)"
    import ctypes.util

    if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
        return "FUSE unavailable: libfuse is not installed (apt-get install fuse3 libfuse2)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "FUSE unavailable: no fusermount helper (apt-get install fuse3)"
    return None


class StorageEmulator:
    """Context manager: mount ``source`` through the emulator in a subprocess, unmount on exit.

    Args:
        source: the folder to serve (read-only).
        mountpoint: where to mount it; default: a new temporary folder (removed afterwards).
        open_ms, read_ms, bandwidth_mb_s, read_policy, libfuse, read_ahead_kb, max_threads,
            max_background: see :class:`EmulatorConfig`.
        timeout_s: how long to wait for the mount to appear, seconds.

    Attributes:
        mountpoint: ``Path`` of the mounted copy (valid inside the ``with`` block; None before
            :meth:`start` when no mount point was given).

    Raises:
        StorageEmulatorError: the mount did not come up (the message carries the emulator's
            stderr), or FUSE is unavailable (:func:`fuse_unavailable_reason`).
        FileNotFoundError: ``source`` is not a folder.
    """

    def __init__(self, source: str | os.PathLike, mountpoint: str | os.PathLike | None = None, *,
                 open_ms: float = 0.0, read_ms: float = 0.0, bandwidth_mb_s: float | None = None,
                 read_policy: str = "request", libfuse: str = "fuse3", read_ahead_kb: int | None = None,
                 max_threads: int = 64, max_background: int | None = 64, timeout_s: float = _MOUNT_TIMEOUT_S) -> None:
        self.source = Path(source)
        if not self.source.is_dir():
            raise FileNotFoundError(f"storage emulator: {self.source} is not a folder")
        self.config = EmulatorConfig(open_ms=open_ms, read_ms=read_ms, bandwidth_mb_s=bandwidth_mb_s,
                                     read_policy=read_policy, libfuse=libfuse, read_ahead_kb=read_ahead_kb,
                                     max_threads=max_threads, max_background=max_background)
        #: the mount's readahead window in KiB as read back after mounting (None before)
        self.read_ahead_kb: int | None = None
        self._own_mountpoint = mountpoint is None
        self._workdir: Path | None = None  # made by start(): the control socket, the log, the default mount point
        self.mountpoint: Path | None = Path(mountpoint) if mountpoint is not None else None
        self.control_path = ""
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._stderr_path: Path | None = None

    def __repr__(self) -> str:
        return f"StorageEmulator({str(self.source)!r} at {str(self.mountpoint)!r}, {self.config})"

    def describe(self) -> str:
        """One line for reports: what this emulated storage charges (says it is an emulator)."""
        c = self.config
        bw = f", {c.bandwidth_mb_s:g} MB/s cap" if c.bandwidth_mb_s else ""
        ra = f", readahead {self.read_ahead_kb} KiB" if self.read_ahead_kb is not None else ""
        return (f"emulated network storage (FUSE emulator, not real storage): {c.open_ms:g} ms per open, "
                f"{c.read_ms:g} ms per read {c.read_policy}{bw}{ra}")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "StorageEmulator":
        """Mount and wait until the mount answers.

        Raises:
            StorageEmulatorError: see the class.
        """
        reason = fuse_unavailable_reason()
        if reason:
            raise StorageEmulatorError(reason)
        self._workdir = Path(tempfile.mkdtemp(prefix="shardfeed-emu-"))
        if self._own_mountpoint:
            self.mountpoint = self._workdir / "mnt"
        self.control_path = str(self._workdir / "control.sock")
        self._stderr_path = self._workdir / "emulator.log"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if _is_mounted(str(self.mountpoint)):
            raise StorageEmulatorError(f"{self.mountpoint} is already a mount point; unmount it first "
                                       f"(fusermount3 -u {self.mountpoint})")
        c = self.config
        cmd = [sys.executable, os.path.abspath(__file__), "mount", str(self.source), str(self.mountpoint),
               "--open-ms", repr(c.open_ms), "--read-ms", repr(c.read_ms), "--read-policy", c.read_policy,
               "--libfuse", c.libfuse, "--max-threads", str(c.max_threads), "--control", self.control_path]
        cmd += ["--max-background", str(c.max_background or 0)]
        if c.bandwidth_mb_s:
            cmd += ["--bandwidth-mb-s", repr(c.bandwidth_mb_s)]
        err = open(self._stderr_path, "wb")
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                          start_new_session=True)
        finally:
            err.close()
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                if self._proc.poll() is not None:
                    raise StorageEmulatorError(f"the storage emulator exited (status {self._proc.returncode}) "
                                               f"before mounting {self.mountpoint}: {self._log_tail()}")
                if _is_mounted(str(self.mountpoint)) and os.path.exists(self.control_path):
                    try:
                        self._request("stats")
                        break
                    except OSError:
                        pass
                if time.monotonic() > deadline:
                    raise StorageEmulatorError(f"the storage emulator did not mount {self.mountpoint} within "
                                               f"{self.timeout_s:g} s: {self._log_tail()}")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        self.read_ahead_kb = self._set_read_ahead(self.config.read_ahead_kb)
        log.info("mounted %s at %s (%s)", self.source, self.mountpoint, self.describe())
        return self

    def _set_read_ahead(self, kb: int | None) -> int | None:
        """Set (when ``kb`` is given) and read back the mount's readahead window, KiB."""
        st = os.stat(self.mountpoint)
        path = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
        if kb is not None:
            try:
                path.write_text(str(kb))
            except OSError as e:
                log.warning("could not set read_ahead_kb=%s on %s (%s); the kernel default stays", kb, path, e)
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Unmount (``fusermount3 -u``, lazily if busy), end the process and remove temporary folders."""
        proc, self._proc = self._proc, None
        if self._workdir is None:
            return  # never started
        try:
            if _is_mounted(str(self.mountpoint)):
                helper = shutil.which("fusermount3") or shutil.which("fusermount") or "umount"
                for args in (["-u"], ["-u", "-z"]):
                    cmd = [helper, *args, str(self.mountpoint)] if "fusermount" in helper else \
                        ["umount", *(["-l"] if "-z" in args else []), str(self.mountpoint)]
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode == 0 or not _is_mounted(str(self.mountpoint)):
                        break
                    log.warning("unmounting %s: %s", self.mountpoint, r.stderr.strip())
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        finally:
            self._cleanup_dirs()

    def _cleanup_dirs(self) -> None:
        if self._workdir is None or _is_mounted(str(self.mountpoint)):
            return  # never delete through a live mount
        if self._own_mountpoint:
            try:
                self.mountpoint.rmdir()
            except OSError:
                pass
        shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def __enter__(self) -> "StorageEmulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- statistics --------------------------------------------------------------------------
    def _request(self, cmd: str) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(self.control_path)
            s.sendall((cmd + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def stats(self) -> dict[str, Any]:
        """Operation counts since the mount (or the last :meth:`reset_stats`).

        Returns:
            ``{"opens", "reads" (FUSE read requests), "read_bytes" (bytes served), "latency_reads"
            (requests that paid read_ms), "getattrs", "readdirs", "read_sizes" ({size in bytes as
            str: requests}), "max_request_bytes", "in_flight", "max_in_flight" (requests served at
            once), "slept_s" (latency and bandwidth waits added, summed over threads)}`` plus
            ``"config"`` (this emulator's :class:`EmulatorConfig` as a dict).

        Raises:
            StorageEmulatorError: the emulator is not running.
        """
        if self._proc is None:
            raise StorageEmulatorError("the storage emulator is not running (use it as a context manager)")
        try:
            out = self._request("stats")
        except OSError as e:
            raise StorageEmulatorError(f"the storage emulator does not answer ({e}): {self._log_tail()}") from None
        out["config"] = asdict(self.config)
        out["read_ahead_kb"] = self.read_ahead_kb
        return out

    def reset_stats(self) -> None:
        """Zero the counters (e.g. between the runs of a benchmark)."""
        self._request("reset")

    def _log_tail(self) -> str:
        if self._stderr_path is None:
            return "(not started)"
        try:
            text = self._stderr_path.read_text(errors="replace").strip()
        except OSError:
            return "(no output)"
        return text[-2000:] or "(no output)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mount", help="mount SOURCE at MOUNTPOINT and serve it until unmounted")
    m.add_argument("source")
    m.add_argument("mountpoint")
    m.add_argument("--open-ms", type=float, default=0.0, help="latency per open, ms")
    m.add_argument("--read-ms", type=float, default=0.0, help="first-byte latency per read request, ms")
    m.add_argument("--bandwidth-mb-s", type=float, default=None, help="shared bandwidth cap, MB/s")
    m.add_argument("--read-policy", choices=READ_POLICIES, default="request")
    m.add_argument("--libfuse", choices=("fuse3", "fuse"), default="fuse3")
    m.add_argument("--max-threads", type=int, default=64,
                   help="requests served at once (libfuse 3 request threads) [default: 64]")
    m.add_argument("--max-background", type=int, default=64,
                   help="the mount's kernel limit on background (readahead) requests; 0: the kernel's default "
                        "(12) [default: 64]")
    m.add_argument("--control", default=None, help="Unix socket answering 'stats' / 'reset' "
                                                   "[default: MOUNTPOINT's parent/.emulator-<pid>.sock]")
    m.add_argument("--debug", action="store_true", help="libfuse debug output")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="storage_emulator: %(message)s")
    config = EmulatorConfig(open_ms=args.open_ms, read_ms=args.read_ms, bandwidth_mb_s=args.bandwidth_mb_s,
                            read_policy=args.read_policy, libfuse=args.libfuse, max_threads=args.max_threads,
                            max_background=args.max_background or None)
    control = args.control or os.path.join(os.path.dirname(os.path.abspath(args.mountpoint)),
                                           f".emulator-{os.getpid()}.sock")
    if not os.path.isdir(args.source):
        print(f"storage_emulator: error: {args.source} is not a folder", file=sys.stderr)
        return 2
    try:
        serve(args.source, args.mountpoint, config, control, debug=args.debug)
    except StorageEmulatorError as e:
        print(f"storage_emulator: error: {e}", file=sys.stderr)
        return 2
    finally:
        if os.path.exists(control):
            os.unlink(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
