"""Fault injection for tests: slow a pack down or kill a task, through parameters, never the environment.

Production code reads no environment variable for this, and no module-level or context-variable
default either. A test that wants a pack to be slow enough to kill mid-way, or a Ray task to die
once, passes a :class:`FaultHooks` as ``PackOptions(faults=...)`` (or to
:class:`~shardfeed.convert.write.executors.RayExecutor`); the pack's
:class:`~shardfeed.convert.write.context.PackContext` carries them to the driver-side code, the options
carry them to the tasks. Tests that drive the command line in a subprocess run
``tests/hooked_cli.py``, which hands the hooks to the Click command through its context object
(``main(args, obj={"faults": hooks})``); ``shardfeed pack`` passes them on as
``PackOptions(faults=...)``. The hooks never change the output bytes, so they are not part of a
pack's fingerprint.
"""

from __future__ import annotations

import dataclasses
import logging
import os

__all__ = ["FaultHooks", "FAIL_ONCE_MARKER", "fail_once"]

log = logging.getLogger(__name__)

#: Name of the marker file :func:`fail_once` creates in ``FaultHooks.fail_once_dir``.
FAIL_ONCE_MARKER = "failed-once"


@dataclasses.dataclass(frozen=True)
class FaultHooks:
    """Test-only faults a pack injects into itself (picklable: they travel to worker processes).

    Attributes:
        sample_delay_s: sleep this many seconds before reading each sample (so a test can kill a
            pack mid-way); 0: none.
        lmdb_commit_count: records per LMDB transaction (None: the default,
            :data:`~shardfeed.convert.writers.lmdb_store.COMMIT_COUNT`); small values give many
            commits out of a small folder.
        lmdb_commit_delay_s: sleep this many seconds after every LMDB commit; 0: none.
        fail_once_dir: a folder; the first Ray task that reaches a hook point (after its first
            sample, or at its end) creates ``DIR/failed-once`` and kills its own worker process
            (``os._exit``), the way a lost node ends a task. None: never.
        upload_delay_s: a pack to an object store sleeps this many seconds before each upload
            (so a test can kill it mid-upload); 0: none.

    Raises:
        ValueError: a negative delay or a commit count below 1.
    """

    sample_delay_s: float = 0.0
    lmdb_commit_count: int | None = None
    lmdb_commit_delay_s: float = 0.0
    fail_once_dir: str | None = None
    upload_delay_s: float = 0.0

    def __post_init__(self):
        if self.sample_delay_s < 0 or self.lmdb_commit_delay_s < 0 or self.upload_delay_s < 0:
            raise ValueError("fault delays must be at least 0 s")
        if self.lmdb_commit_count is not None and self.lmdb_commit_count < 1:
            raise ValueError(f"lmdb_commit_count must be at least 1, got {self.lmdb_commit_count}")


def fail_once(fail_once_dir: str | None) -> None:
    """Kill this process (``os._exit(17)``) if no process did so before for ``fail_once_dir``.

    The first caller creates ``fail_once_dir/failed-once`` (``O_EXCL``: exactly one caller wins)
    and exits at once; later callers return. Does nothing when ``fail_once_dir`` is None.
    """
    if not fail_once_dir:
        return
    try:
        fd = os.open(os.path.join(fail_once_dir, FAIL_ONCE_MARKER), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    log.warning("fail_once_dir %s: killing this worker once (test fault)", fail_once_dir)
    os._exit(17)
