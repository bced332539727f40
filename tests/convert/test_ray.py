"""`shardfeed pack --executor ray`: byte-identical to a local pack (WebDataset and LMDB), a task
that dies once is retried, resume after the driver is killed, clear errors.

One real local Ray instance serves the whole module (``ray.init(num_cpus=2)``); the CLI runs in
subprocesses that join it through ``RAY_ADDRESS``. Expectations: the output of a local pack of the
same folder (itself checked against the source files by test_pack_wds / test_lmdb), and the
source files' own bytes and class folders, read back with ``tarfile`` / ``lmdb`` + ``msgpack``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import lmdb
import msgpack
import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.faults import FaultHooks
from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _image(seed: int, w: int, h: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """36 small images in 3 classes, JPEG and PNG, of different sizes."""
    root = tmp_path_factory.mktemp("ray_src")
    for c, cls in enumerate(["ant", "bee", "cat"]):
        (root / cls).mkdir()
        for i in range(12):
            fmt, ext = (("JPEG", "jpg"), ("PNG", "png"))[i % 2]
            (root / cls / f"{cls}_{i:02d}.{ext}").write_bytes(_image(100 * c + i, 12 + i, 10 + c, fmt))
    return root


def _expected(root: Path) -> dict[str, tuple[bytes, int]]:
    """``{relative path: (bytes, label)}``: labels are the sorted class folders' indices."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return {f"{p.parent.name}/{p.name}": (p.read_bytes(), classes.index(p.parent.name))
            for p in root.glob("*/*")}


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _lmdb_items(d: Path) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(d), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the module; yields its address (for RAY_ADDRESS)."""
    ray = pytest.importorskip("ray")
    # address="local": a new instance even when a cluster runs on this machine (ray.init() would join it)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local_wds(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "wds"
    pack(src, out, PackOptions(format="wds", max_count=4, workers=1))
    return out


def _wait_for_idle_cluster(ray, timeout_s: float = 60) -> None:
    """Wait until every CPU of the cluster is free again (tasks of a killed driver are gone)."""
    total = ray.cluster_resources().get("CPU", 0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and ray.available_resources().get("CPU", 0) < total:
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_wds_ray_is_byte_identical_to_local(ray_cluster, src, local_wds, tmp_path):
    out = tmp_path / "ray"
    report = pack(src, out, PackOptions(format="wds", max_count=4, workers=2, executor="ray"))
    assert _files(out) == _files(local_wds)
    num_shards = len(list(out.glob("*.tar")))
    assert num_shards == 9  # 36 samples, 4 per shard: one Ray task each
    ex = report.extra
    assert ex["executor"] == "ray" and ex["num_tasks"] == num_shards and ex["task_retries"] == 0
    assert len(ex["nodes"]) == 1 and ex["nodes"][0]["ip"] and ex["nodes"][0]["num_tasks"] == num_shards
    assert "ray: 9 tasks on 1 node" in report.summary()
    # and the shards hold the source files' bytes and labels
    got = {}
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            key, ext = name.split(".", 1)
            if ext == "json":
                meta = json.loads(data)
                img = next(v for k, v in members.items() if k.startswith(key + ".") and k.split(".", 1)[1]
                           not in ("json", "cls"))
                got[meta["path"]] = (img, int(members[f"{key}.cls"]))
    assert got == _expected(src)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_wds_reencoded_on_ray_is_byte_identical_to_local(ray_cluster, src, tmp_path):
    opts = {"format": "wds", "max_count": 5, "workers": 2, "reencode": {"resize": 8}}
    pack(src, tmp_path / "local", PackOptions(**opts))
    report = pack(src, tmp_path / "ray", PackOptions(**opts, executor="ray"))
    assert report.extra["executor"] == "ray" and report.extra["num_tasks"] >= 1
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_lmdb_ray_has_the_same_keys_and_values_as_local(ray_cluster, src, tmp_path):
    ref, out = tmp_path / "local", tmp_path / "ray"
    pack(src, ref, PackOptions(format="lmdb", workers=2))
    report = pack(src, out, PackOptions(format="lmdb", workers=2, executor="ray"))
    assert report.extra["executor"] == "ray" and report.extra["num_tasks"] >= 1
    items = _lmdb_items(out)
    assert items == _lmdb_items(ref)
    assert (out / "manifest.json").read_bytes() == (ref / "manifest.json").read_bytes()
    got = {}
    for k, v in items:
        if k.isdigit():
            rec = msgpack.unpackb(v, raw=False)
            got[rec["meta"]["path"]] = (rec["data"], rec["label"])
    assert got == _expected(src)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_task_that_dies_once_is_retried_with_identical_output(ray_cluster, src, local_wds, tmp_path, monkeypatch):
    fail_dir = tmp_path / "fail"
    fail_dir.mkdir()
    out = tmp_path / "ray"
    faults = FaultHooks(fail_once_dir=str(fail_dir))  # the first task kills its worker
    report = pack(src, out, PackOptions(format="wds", max_count=4, workers=2, executor="ray", faults=faults))
    assert (fail_dir / "failed-once").exists(), "the injected failure did not happen"
    assert report.extra["task_retries"] == 1 and report.extra["num_tasks"] == 9
    assert "1 retried" in report.summary()
    assert _files(out) == _files(local_wds)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_retries_are_bounded(ray_cluster, tmp_path, monkeypatch):
    from shardfeed.convert.write.executors import RayExecutor, TaskFailedError

    ex = RayExecutor(max_retries=0, fail_once_dir=str(tmp_path))
    with pytest.raises(TaskFailedError, match="failed 1 times"):
        list(ex.map_ordered(abs, [-1, -2]))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_deterministic_errors_and_missing_shared_storage_fail_at_once(ray_cluster, tmp_path):
    from shardfeed.convert.write.executors import RayExecutor, SharedStorageError

    ex = RayExecutor(max_retries=3)
    assert list(ex.map_ordered(abs, [-3, 2, -1])) == [3, 2, 1]
    with pytest.raises(ValueError, match="invalid literal"):
        list(ex.map_ordered(int, ["1", "not a number"]))
    with pytest.raises(SharedStorageError, match="not visible on Ray node"):
        list(ex.map_ordered(abs, [-1], required_paths=[str(tmp_path / "not-mounted-here")]))
    assert ex.retries == 0


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_after_the_driver_is_killed(hooked_cli, ray_cluster, src, local_wds, tmp_path):
    import ray

    out = tmp_path / "killed"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster}
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.15}), "-q", "pack", str(src), str(out),
                             "--max-count", "4", "--executor", "ray"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob(".shardfeed-pack/0*.json")):
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert not (out / "manifest.json").exists(), "a killed pack must not look complete"
    _wait_for_idle_cluster(ray)  # Ray stops the killed driver's tasks (one may finish its shard first)
    done = list(out.glob(".shardfeed-pack/0*.json"))
    assert 1 <= len(done) < 9, err.decode(errors="replace")[-2000:]
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(out), "--max-count", "4", "--executor", "ray", "--resume",
                        "--json", "-"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["shards_resumed"] == len(done)
    assert report["extra"]["executor"] == "ray" and report["extra"]["num_tasks"] == 9 - len(done)
    assert _files(out) == _files(local_wds)


# ---------------------------------------------------------------------------------------------
# without Ray (these run everywhere)

def test_without_ray_installed_the_error_says_how_to_install(src, tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # find_spec('ray') is None: as if not installed
            "from shardfeed.convert.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "pack", str(src), str(tmp_path / "o"), "--executor", "ray"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'shardfeed[ray]'" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_local_pack_never_imports_ray(src, tmp_path):
    code = ("import sys; from shardfeed.convert.write.pack import pack, PackOptions\n"
            f"pack({str(src)!r}, {str(tmp_path / 'o')!r}, PackOptions(workers=2))\n"
            "print('ray' in sys.modules)")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_ray_address_needs_the_ray_executor():
    with pytest.raises(ValueError, match="--executor ray"):
        PackOptions(ray_address="auto")
