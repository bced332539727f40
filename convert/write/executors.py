"""Where a pack's tasks run: this machine's process pool (``local``) or a Ray cluster (``ray``).

Packing is task-parallel by design: :func:`~shardfeed.convert.write.plan.plan_shards` fixes every
WebDataset shard's samples before a byte is read, so each shard is one independent task that reads
its source files and writes ``OUT/{prefix}-NNNNNN.tar`` (+ ``.sfidx``, + its completion record in
``OUT/.shardfeed-pack/``); the LMDB packer's tasks read (and re-encode) chunks of samples and hand
the encoded records back to the single writer. An :class:`Executor` runs such tasks and yields
their results **in task order**, whatever order they finish in, so the output does not depend on
the executor: a Ray pack is byte-identical to a local one.

* :class:`LocalExecutor` (``--executor local``, the default): the fork process pool of
  :func:`run_tasks`, ``--workers`` processes; its bounded mode (``max_in_flight``) is the ordered
  pool of the LMDB packer, whose results carry image bytes.
* :class:`RayExecutor` (``--executor ray [--ray-address ADDR]``): one Ray task per pack task.
  Connects to ``ADDR`` (``auto``: the cluster started with ``ray start`` on this machine), else to
  ``RAY_ADDRESS`` when set, else starts a local Ray instance with ``--workers`` CPUs. At most
  ``max_in_flight`` tasks are submitted ahead of the consumer (default: twice the cluster's CPUs plus 2),
  results stream back with ``ray.wait`` and are yielded in order; the progress callback hears of
  each task's samples and bytes when the task completes. A task whose worker or node dies (Ray
  system errors) or that fails with an error other than a deterministic one
  (:class:`~shardfeed.readers.errors.ShardfeedError`, ``ValueError``: a changed source file, a
  corrupt image, a bad option) is resubmitted, at most ``max_retries`` times; a rewritten shard
  has the same bytes (the temporary file is replaced, the rename is atomic), so a retry is
  invisible in the output. The report names the nodes (Ray node id, IP, host name) that ran the
  tasks and the number of retries.

Ray is optional (``pip install 'shardfeed[ray]'``) and imported only when a :class:`RayExecutor`
starts. Every node must reach the source folder and OUT **at the same path** (NFS, a parallel file
system) and have shardfeed installed in the Python environment its Ray workers run; a task that
does not see them fails at once with :class:`SharedStorageError` naming the node.

Fault injection (tests): ``PackOptions(faults=FaultHooks(fail_once_dir=DIR))`` makes the first Ray
task that reaches a hook point (after its first sample, or at its end) create ``DIR/failed-once``
and kill its own worker process, the way a lost node or an out-of-memory kill ends a task
(:mod:`shardfeed.convert.write.faults`); the hooks travel with the task arguments, not the environment.

Driver side: a pack makes its executor once, where it starts
(:meth:`shardfeed.convert.write.context.PackContext.for_options`), and hands it to its packer in the
:class:`~shardfeed.convert.write.context.PackContext`; nothing here keeps a current executor, and no
function makes one behind the caller's back.

Worker side: a task reports progress through :func:`task_progress` (a :class:`ProgressSink` that
reaches the driver's callback, in batches, whatever process the task runs in).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import itertools
import logging
import os
import queue
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, Protocol, Sequence

from shardfeed.readers.errors import ShardfeedError
from shardfeed.readers.runtime import set_signal

from .faults import fail_once

__all__ = [
    "Executor",
    "ExecutorBase",
    "LocalExecutor",
    "ProgressSink",
    "task_progress",
    "run_tasks",
    "RayExecutor",
    "EXECUTORS",
    "ExecutorUnavailableError",
    "SharedStorageError",
    "TaskFailedError",
    "check_executor",
    "make_executor",
    "signals_held",
]

log = logging.getLogger(__name__)

#: ``callback(num_samples, num_input_bytes)``, as taken by :func:`shardfeed.convert.write.pack.pack`.
Progress = Callable[[int, int], None]



class ExecutorUnavailableError(ShardfeedError, ImportError):
    """The executor needs a package that is not installed (the message says what to install)."""


class SharedStorageError(ShardfeedError, FileNotFoundError):
    """A Ray node does not see the source folder or OUT at the path the driver uses."""


class TaskFailedError(ShardfeedError, RuntimeError):
    """A task failed on every attempt (worker or node lost each time, or a transient error)."""


def _no_progress(num_samples: int, num_bytes: int) -> None:
    pass


class ProgressSink:
    """Collects progress increments (samples, input bytes) reported by tasks; thread-safe.

    Inline, each increment goes straight to the driver's callback; in a worker process the
    increments are batched (every 0.1 s at most) onto a multiprocessing queue that the driver drains.

    Args:
        q: the queue to the driver (worker processes), or None.
        callback: ``callback(num_samples, num_input_bytes)`` to call directly (inline), or None.
    """

    def __init__(self, q=None, callback: Progress | None = None):
        self._q = q
        self._callback = callback
        self._pending = [0, 0]
        self._last = time.monotonic()

    def add(self, samples: int, nbytes: int) -> None:
        """Report ``samples`` more samples done and ``nbytes`` more input bytes read."""
        if self._callback is not None:
            self._callback(samples, nbytes)
            return
        self._pending[0] += samples
        self._pending[1] += nbytes
        now = time.monotonic()
        if now - self._last > 0.1:
            self.flush()
            self._last = now

    def flush(self) -> None:
        """Send what is batched to the driver now."""
        if self._q is not None and (self._pending[0] or self._pending[1]):
            self._q.put(tuple(self._pending))
            self._pending = [0, 0]


_worker_progress: ProgressSink | None = None


def task_progress() -> ProgressSink:
    """The :class:`ProgressSink` of the task running in this process (a no-op one outside a task)."""
    return _worker_progress or ProgressSink()


#: The signals that stop a pack (Ctrl-C, ``kill``): held while a pool starts or stops.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _init_worker(q) -> None:
    global _worker_progress
    _worker_progress = ProgressSink(q)
    set_signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and cleans up
    set_signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler: a SIGTERM ends us quietly
    if hasattr(signal, "SIGXFSZ"):
        set_signal(signal.SIGXFSZ, signal.SIG_IGN)  # file-size limit: get EFBIG, not death
    # forked (or spawned) with both blocked (see signals_held): only now, with our own handlers, take them
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then act on them as usual.

    Starting and stopping a process pool must not be cut in the middle: an interrupt raised inside
    ``multiprocessing.Pool()`` leaves running workers nobody can stop (the pool object never
    reaches the caller), and one raised while stopping leaves others behind. Inside the block a
    signal is recorded; at its end the previous handler gets it (``KeyboardInterrupt``,
    :class:`~shardfeed.convert.cli.common.Terminated`). Both signals are also blocked in the
    calling thread, so the processes and threads started in the block begin with them blocked: a
    pool worker takes them only once :func:`_init_worker` has installed its own handlers (a worker
    forked while the CLI's handler was in place would otherwise raise it and print a traceback).
    Outside the main thread (where Python runs no signal handler) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum, frame):
        caught.append(signum)

    previous = {s: set_signal(s, hold) for s in _STOP_SIGNALS}
    masking = hasattr(signal, "pthread_sigmask")  # (not on Windows, where workers are spawned anyway)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if masking else None
    try:
        yield
    finally:
        for s, handler in previous.items():  # first the handlers, then the mask: a pending signal reaches them
            set_signal(s, handler)
        if masking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(caught[0])


def _kill_pool(pool, wait_s: float = 5.0) -> None:
    """Stop a ``multiprocessing.Pool`` now, whatever its workers and its locks are doing.

    ``Pool.terminate()`` waits on locks shared with the workers (the task and result queues'); a
    worker killed while holding one (``kill -- -PGID``, ``timeout``, a container stopping: the
    signal reaches the workers too, and an idle worker holds the task queue's lock) makes it
    wait forever. Here the pool's worker handler is told to start no new worker, every worker is
    killed (``SIGKILL``: no Python code runs, nothing is printed) and reaped, and the pool's own
    finalizer, which would run ``terminate()`` at exit, is cancelled. The pool's helper threads
    are daemon threads; those left blocked on a dead worker's lock end with the process.
    Reads ``Pool``'s private ``_pool``, ``_worker_handler``, ``_change_notifier`` and
    ``_terminate`` (unchanged from Python 3.8 to 3.13).
    """
    from multiprocessing import pool as mp_pool

    handler = getattr(pool, "_worker_handler", None)
    if handler is not None:
        handler._state = mp_pool.TERMINATE  # it replaces no more dead workers
    pool._state = mp_pool.TERMINATE  # (no ResourceWarning from Pool.__del__)
    notifier = getattr(pool, "_change_notifier", None)
    deadline = time.monotonic() + wait_s
    while True:
        for p in list(pool._pool):
            if p.exitcode is None:
                p.kill()
        if handler is None or not handler.is_alive() or time.monotonic() > deadline:
            break
        if notifier is not None:
            notifier.put(None)  # wakes the worker handler, which then sees TERMINATE and ends
        handler.join(0.05)
    for p in list(pool._pool):  # one forked by the handler just before it stopped
        if p.exitcode is None:
            p.kill()
    for p in list(pool._pool):
        p.join(max(0.1, deadline - time.monotonic()))
    finalizer = getattr(pool, "_terminate", None)
    if finalizer is not None:
        finalizer.cancel()


def run_tasks(fn, tasks: Sequence, workers: int, progress: Progress, max_in_flight: int | None = None) -> Iterator:
    """Run ``fn(task)`` for each task in ``workers`` forked processes (inline when 1); yield results in order.

    Progress increments sent by the tasks through :func:`task_progress` reach ``progress``. Ctrl-C,
    SIGTERM, an error or a consumer that stops iterating kill the workers at once and reap them
    before the exception (or ``GeneratorExit``) leaves, at any moment: while the pool starts, runs
    or shuts down, and when the workers got the signal too (:func:`_kill_pool`). With
    ``max_in_flight``, at most that many tasks are submitted ahead of the consumer (memory stays
    bounded when results are large and the consumer is the slower side); None submits every task
    at once.
    """
    global _worker_progress
    if workers <= 1 or len(tasks) <= 1:
        _worker_progress = ProgressSink(callback=progress)
        try:
            for t in tasks:
                yield fn(t)
        finally:
            _worker_progress = None
        return
    import multiprocessing as mp  # here: 10 ms of imports a one-process pack does not need

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    stop = threading.Event()

    def drain():
        while not stop.is_set() or not q.empty():
            try:
                item = q.get(timeout=0.05)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            if item is None:  # the end marker, put after the workers exited: nothing follows it
                return
            progress(*item)

    t = threading.Thread(target=drain, daemon=True)
    pool = None
    try:
        with signals_held():  # a pool half started cannot be stopped: let it start whole
            t.start()
            pool = ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(q,))
        if max_in_flight is None:
            yield from pool.imap(fn, tasks)
        else:
            it = iter(tasks)
            pending = collections.deque(pool.apply_async(fn, (t,)) for t in itertools.islice(it, max_in_flight))
            while pending:
                r = pending.popleft().get()
                pending.extend(pool.apply_async(fn, (t,)) for t in itertools.islice(it, 1))
                yield r
        pool.close()
        pool.join()
        q.put(None)  # wakes the drain thread at once (it would poll up to 50 ms before seeing stop)
    except BaseException:
        if pool is not None:
            with signals_held():  # a second Ctrl-C must not leave workers behind
                _kill_pool(pool)
        raise
    finally:
        stop.set()
        if t.ident is not None:
            t.join(timeout=2)


class Executor(Protocol):
    """Runs a pack's tasks and yields their results in task order.

    Attributes:
        name: the registry name (``"local"``, ``"ray"``).
    """

    name: str

    def map_ordered(self, fn: Callable[[Any], Any], tasks: Sequence, progress: Progress | None = None, *,
                    max_in_flight: int | None = None, required_paths: Sequence[str] = ()) -> Iterator:
        """Run ``fn(task)`` for every task; yield the results in task order.

        Args:
            fn: a module-level function (it travels by reference to the workers).
            tasks: picklable task arguments.
            progress: receives ``(num_samples, num_input_bytes)`` increments that the tasks report
                through :func:`task_progress`.
            max_in_flight: tasks submitted ahead of the consumer at most (bounds memory when results
                are large). None: every task at once (local), ``2 * CPUs + 2`` (Ray). Ray never
                goes below ``CPUs + 2``, which would leave cluster CPUs idle.
            required_paths: paths every worker must see (a remote node that does not fails the task
                with :class:`SharedStorageError`).

        Raises:
            The task's own exception for a deterministic failure; :class:`TaskFailedError` when
            retries are exhausted.
        """
        ...

    def describe(self) -> dict:
        """The report: ``executor`` (name), ``num_tasks`` (tasks run), ``nodes`` (where, with
        ``num_tasks`` each) and ``task_retries``."""
        ...

    def close(self) -> None:
        """Release what the executor started (a local Ray instance); idempotent."""
        ...


class ExecutorBase:
    """Shared plumbing of the executors (context manager, idempotent close)."""

    name = "?"
    #: the module that must be importable for this executor (None: always available)
    requires: str | None = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        pass


class LocalExecutor(ExecutorBase):
    """Tasks in ``workers`` forked processes of this machine (inline when 1), via :func:`run_tasks`.

    Args:
        workers: processes (default: CPU count).

    Raises:
        ValueError: ``workers`` < 1.
    """

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = int(workers or os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.num_tasks = 0

    @classmethod
    def from_options(cls, options) -> "LocalExecutor":
        """The executor a :class:`~shardfeed.convert.write.pack.PackOptions` asks for."""
        return cls(options.workers)

    def map_ordered(self, fn, tasks, progress=None, *, max_in_flight=None, required_paths=()) -> Iterator:
        tasks = list(tasks)
        kwargs = {"max_in_flight": max_in_flight} if max_in_flight is not None else {}
        for result in run_tasks(fn, tasks, self.workers, progress or _no_progress, **kwargs):
            self.num_tasks += 1
            yield result

    def describe(self) -> dict:
        nodes = [{"node_id": None, "ip": None, "host": socket.gethostname(), "num_tasks": self.num_tasks}]
        return {"executor": self.name, "num_tasks": self.num_tasks, "nodes": nodes if self.num_tasks else [],
                "task_retries": 0, "workers": self.workers}


class RayExecutor(ExecutorBase):
    """One Ray task per pack task, on a Ray cluster or a local Ray instance.

    Args:
        address: the cluster to connect to (``ray.init(address=...)``: ``auto``, ``HOST:PORT``,
            ``ray://HOST:10001``); None: ``RAY_ADDRESS`` when set, else a new local instance.
        max_retries: resubmissions of a failed task at most (a task runs at most
            ``max_retries + 1`` times).
        num_cpus: CPUs of a local instance this executor starts (default: CPU count); ignored when
            connecting to a cluster, whose CPUs decide the parallelism.
        max_in_flight: default bound of tasks submitted ahead of the consumer (None: twice the
            cluster's CPUs, plus 2).
        fail_once_dir: test fault (:class:`~shardfeed.convert.write.faults.FaultHooks`): the first task
            to reach a hook point kills its worker once. None in production.

    If Ray is already initialised in this process (``ray.init`` was called), that connection is
    used and left open; an instance this executor started is shut down by :meth:`close`.

    Raises:
        ExecutorUnavailableError: Ray is not installed.
        ValueError: ``max_retries`` < 0.
    """

    name = "ray"
    requires = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 3, *, num_cpus: int | None = None,
                 max_in_flight: int | None = None, fail_once_dir: str | None = None):
        check_executor(self.name)
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.address = address
        self.max_retries = int(max_retries)
        self.num_cpus = num_cpus
        self.max_in_flight = max_in_flight
        self.fail_once_dir = str(fail_once_dir) if fail_once_dir else None
        self.num_tasks = 0
        self.retries = 0
        self.cluster_address: str | None = None
        self.cluster_cpus: int | None = None
        self._nodes: dict[str, dict] = {}
        self._ray = None
        self._owns_instance = False

    @classmethod
    def from_options(cls, options) -> "RayExecutor":
        """The executor a :class:`~shardfeed.convert.write.pack.PackOptions` asks for."""
        faults = getattr(options, "faults", None)
        return cls(getattr(options, "ray_address", None), num_cpus=options.workers,
                   fail_once_dir=faults.fail_once_dir if faults is not None else None)

    # -- connection ------------------------------------------------------------------------

    def _connect(self):
        if self._ray is not None:
            return self._ray
        import ray

        if ray.is_initialized():
            if self.address:
                log.info("Ray is already initialised in this process; using that connection, not %s", self.address)
        else:
            address = self.address or os.environ.get("RAY_ADDRESS") or "local"
            kwargs: dict = {"address": address, "logging_level": logging.WARNING}
            if address == "local":
                kwargs.update(num_cpus=self.num_cpus, include_dashboard=False)
            _check_reachable(address)
            t0 = time.perf_counter()
            try:
                ray.init(**kwargs)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConnectionError(
                    f"Ray cluster at {address!r}: cannot connect ({first}); check --ray-address / RAY_ADDRESS "
                    "(or leave both unset to start a local Ray instance); a cluster with token authentication "
                    "needs the same token here (RAY_AUTH_TOKEN or ~/.ray/auth_token, see `ray get-auth-token`)"
                ) from None
            self._owns_instance = address == "local"
            log.info("Ray %s in %.1f s", "started" if self._owns_instance else f"connected to {address}",
                     time.perf_counter() - t0)
        self._ray = ray
        self.cluster_address = ray.get_runtime_context().gcs_address
        self.cluster_cpus = int(ray.cluster_resources().get("CPU", 0))
        if self.cluster_cpus < 1:
            raise TaskFailedError(f"Ray cluster at {self.cluster_address} has no CPUs to run tasks on; "
                                  "add a worker node (`ray start --address ...`)")
        return ray

    def close(self) -> None:
        """Shut down the local Ray instance this executor started (a cluster connection made by
        someone else is left open)."""
        if self._ray is not None and self._owns_instance:
            self._ray.shutdown()
        self._ray = None
        self._owns_instance = False

    def _task_options(self) -> dict:
        return {"num_cpus": 1, "max_retries": 0, "retry_exceptions": False}

    # -- running ---------------------------------------------------------------------------

    def map_ordered(self, fn, tasks, progress=None, *, max_in_flight=None, required_paths=()) -> Iterator:
        tasks = list(tasks)
        if not tasks:
            return
        ray = self._connect()
        from ray.exceptions import RayError, RayTaskError

        progress = progress or _no_progress
        remote = ray.remote(_ray_task).options(**self._task_options())
        bound = max_in_flight or self.max_in_flight
        # a bound below the CPU count would leave CPUs idle; results for one task per CPU are needed anyway
        window = max(bound, self.cluster_cpus + 2) if bound else 2 * self.cluster_cpus + 2
        paths = tuple(str(p) for p in required_paths)
        pending: dict = {}          # ObjectRef -> task index
        finished: dict = {}         # task index -> result, waiting for its turn
        attempts = [0] * len(tasks)
        next_submit = next_yield = 0
        log.info("running %d tasks on Ray (%d CPUs, %d in flight at most)", len(tasks), self.cluster_cpus, window)
        try:
            while next_yield < len(tasks):
                while next_submit < len(tasks) and len(pending) + len(finished) < window:
                    pending[remote.remote(fn, tasks[next_submit], paths, self.fail_once_dir)] = next_submit
                    next_submit += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    i = pending.pop(ref)
                    try:
                        result, counts, node = ray.get(ref)
                    except RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        cause = cause if isinstance(cause, BaseException) else exc
                        if isinstance(cause, (ShardfeedError, ValueError, KeyboardInterrupt)):
                            raise cause from None  # deterministic: the same input fails again
                        pending[self._retry(remote, fn, tasks, paths, i, attempts, len(tasks),
                                            f"{type(cause).__name__}: {_first_line(cause)}")] = i
                        continue
                    except RayError as exc:  # the worker or its node died, the result was lost
                        pending[self._retry(remote, fn, tasks, paths, i, attempts, len(tasks),
                                            f"{type(exc).__name__}: {_first_line(exc)}")] = i
                        continue
                    self._record_node(node)
                    progress(*counts)
                    finished[i] = result
                while next_yield in finished:
                    self.num_tasks += 1
                    yield finished.pop(next_yield)
                    next_yield += 1
        finally:
            for ref in pending:  # early exit (error, Ctrl-C, consumer stopped): stop what still runs
                try:
                    ray.cancel(ref)  # KeyboardInterrupt in the task: the shard in progress is dropped
                except Exception:  # noqa: BLE001 - best effort while unwinding
                    pass

    def _retry(self, remote, fn, tasks, paths, i: int, attempts: list, num_tasks: int, reason: str):
        attempts[i] += 1
        if attempts[i] > self.max_retries:
            raise TaskFailedError(f"Ray task {i + 1} of {num_tasks} failed {attempts[i]} times (last: {reason}); "
                                  "finished shards are kept: fix the cause and rerun with --resume")
        self.retries += 1
        log.warning("Ray task %d of %d failed (%s); retrying (%d of %d)", i + 1, num_tasks, reason, attempts[i],
                    self.max_retries)
        return remote.remote(fn, tasks[i], paths, self.fail_once_dir)

    def _record_node(self, node: dict) -> None:
        rec = self._nodes.setdefault(node["node_id"], {**node, "num_tasks": 0})
        rec["num_tasks"] += 1

    def describe(self) -> dict:
        nodes = sorted(self._nodes.values(), key=lambda n: (str(n["ip"]), n["node_id"]))
        return {"executor": self.name, "num_tasks": self.num_tasks, "nodes": [dict(n) for n in nodes],
                "task_retries": self.retries, "ray_address": self.cluster_address,
                "ray_cluster_cpus": self.cluster_cpus}


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens on (``ray.init`` would retry for minutes).

    Raises:
        ConnectionError: no TCP connection within ``timeout_s`` seconds.
    """
    if "://" in address or ":" not in address:
        return  # "local", "auto", "ray://...": Ray resolves (and fails) these quickly itself
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(
            f"Ray cluster at {address!r}: nothing answers there ({exc.strerror or exc}); check --ray-address / "
            "RAY_ADDRESS (the head's GCS address, e.g. HEAD_IP:6379, printed by `ray start --head`), or use "
            "--ray-address auto on a node of the cluster") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# the Ray task (runs in a Ray worker process)

def _ray_task(fn, task, required_paths: tuple[str, ...], fail_once_dir: str | None = None):
    """Run ``fn(task)`` in a Ray worker; returns ``(result, (num_samples, num_bytes), node)``.

    The task's progress increments are counted (not streamed) and returned with the result, so a
    task that fails half-way and is retried is counted once.
    """
    import ray

    node = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname()}
    for p in required_paths:
        if not os.path.exists(p):
            raise SharedStorageError(
                f"{p}: not visible on Ray node {node['ip']} ({node['host']}); --executor ray needs the source "
                "folder and OUT on storage every node mounts at the same path (NFS, a parallel file system)")
    counts = [0, 0]

    def progress(n: int, b: int) -> None:
        counts[0] += n
        counts[1] += b
        fail_once(fail_once_dir)

    (result,) = list(run_tasks(fn, [task], 1, progress))
    fail_once(fail_once_dir)
    return result, (counts[0], counts[1]), node


# ---------------------------------------------------------------------------------------------
# registry

#: Executors by name (``--executor``); each class builds itself with ``from_options(PackOptions)``.
EXECUTORS: dict[str, type] = {"local": LocalExecutor, "ray": RayExecutor}


def check_executor(name: str) -> None:
    """Check that executor ``name`` exists and its package is installed (imports nothing).

    Raises:
        ValueError: unknown name.
        ExecutorUnavailableError: its package is missing; the message says how to install it.
    """
    cls = EXECUTORS.get(name)
    if cls is None:
        raise ValueError(f"unknown executor {name!r}: choose one of {', '.join(EXECUTORS)}")
    if cls.requires and importlib.util.find_spec(cls.requires) is None:
        raise ExecutorUnavailableError(f"--executor {name} needs {cls.requires}, which is not installed: "
                                       f"pip install 'shardfeed[{name}]'")


def make_executor(options) -> Executor:
    """A new executor of the kind ``options.executor`` names, configured from ``options`` (a
    PackOptions); the caller closes it (``executor.close()``).

    Raises:
        ValueError, ExecutorUnavailableError: as :func:`check_executor`.
    """
    name = getattr(options, "executor", "local")
    check_executor(name)
    return EXECUTORS[name].from_options(options)
