"""The packer joint: what a pack hands its format's packer (:class:`PackContext`) and what it gets
back (:class:`PackResult`), and the packer's signature (:class:`Packer`).

:func:`shardfeed.convert.write.pack.pack` (and :func:`~shardfeed.convert.write.pack.pack_local`) build one
:class:`PackContext` at entry, :meth:`PackContext.for_options`, and pass it down as a parameter:
the executor the packer runs its tasks on, the progress sinks, the shard-end hook of a pack to a
bucket, the storage options and the test fault hooks. Nothing travels ambiently (no context
variable, no module-level default): a packer or helper that needs one of these takes it from the
context it was given, and no function makes an executor of its own.

A packer (registered by dotted name in :mod:`shardfeed.readers.format.registry`, ``FormatSpec.packer``)
is called as ``packer(scan, samples, out, options, context)`` and returns a :class:`PackResult`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from shardfeed.readers.format.manifest import Manifest, ShardEntry

from .executors import Executor, Progress, make_executor
from .faults import FaultHooks
from .plan import PlannedSample
from .scan import ScanResult

__all__ = ["PackContext", "PackResult", "Packer", "OutputProgress", "ShardEndHook"]

#: ``callback(num_output_bytes)``: the stored image bytes, where a packer knows them apart from the input.
OutputProgress = Callable[[int], None]

#: ``callback(entry, index)``: called in the packing process as each shard this run writes is complete.
ShardEndHook = Callable[[ShardEntry, int], None]


def _no_progress(num_samples: int, num_bytes: int) -> None:
    pass


@dataclasses.dataclass
class PackContext:
    """Everything a pack passes to its packer and helpers besides the plan and the options.

    Built once where a pack starts (:meth:`for_options`) and handed down as a parameter. A context
    that made its executor owns it: :meth:`close` (or leaving a ``with`` block) closes it (a Ray
    instance it started is shut down).

    Attributes:
        executor: where the pack's tasks run (:class:`~shardfeed.convert.write.executors.Executor`);
            every packer runs its tasks on this one, so the report describes all of them.
        faults: the test fault hooks (:class:`~shardfeed.convert.write.faults.FaultHooks`), the same
            object as the options' ``faults`` (which the tasks carry to the workers); None in
            production.
        progress: ``callback(num_samples, num_input_bytes)`` as samples are written (a no-op by
            default).
        output_progress: ``callback(num_output_bytes)`` with the stored image bytes, where the
            packer knows them apart from the input (re-encoding), just before the matching
            ``progress`` call; None: not reported.
        on_shard_end: ``callback(entry, index)`` called in this process, in shard order, as each
            shard this run writes is complete (sharded formats; a pack to a bucket uploads it
            then); None: nobody listens. Not called for the shards a resumed pack keeps.
        storage_options: object-store client options (:mod:`shardfeed.readers.storage.objstore`) for a
            SRC or OUT in a bucket; None: the client's defaults.
        owns_executor: :meth:`close` closes the executor (True when :meth:`for_options` made it).
        first_shard: the file index of the first shard this pack writes, and of its resume
            record: 0, or the index after the existing shards for an append.
    """

    executor: Executor
    faults: FaultHooks | None = None
    progress: Progress = _no_progress
    output_progress: OutputProgress | None = None
    on_shard_end: ShardEndHook | None = None
    storage_options: dict | None = None
    owns_executor: bool = False
    first_shard: int = 0

    @classmethod
    def for_options(cls, options: Any, *, progress: Progress | None = None,
                    output_progress: OutputProgress | None = None, on_shard_end: ShardEndHook | None = None,
                    storage_options: dict | None = None, executor: Executor | None = None) -> "PackContext":
        """The context of a pack with ``options`` (a :class:`~shardfeed.convert.write.pack.PackOptions`).

        Args:
            options: the pack's options: ``executor``, ``ray_address``, ``workers`` choose the
                executor, ``faults`` gives the fault hooks.
            progress, output_progress, on_shard_end, storage_options: as the attributes (None:
                none).
            executor: run the tasks on this executor (the caller keeps it and closes it); None:
                a new one for ``options`` (:func:`~shardfeed.convert.write.executors.make_executor`),
                owned by the context.

        Returns:
            A :class:`PackContext`.

        Raises:
            ValueError, shardfeed.convert.write.executors.ExecutorUnavailableError: ``options.executor``
                is unknown or its package is missing.
        """
        owns = executor is None
        return cls(executor=make_executor(options) if executor is None else executor,
                   faults=getattr(options, "faults", None), progress=progress or _no_progress,
                   output_progress=output_progress, on_shard_end=on_shard_end, storage_options=storage_options,
                   owns_executor=owns)

    def replace(self, **changes: Any) -> "PackContext":
        """A copy with ``changes`` (attribute names), sharing the executor; the copy owns no executor."""
        return dataclasses.replace(self, owns_executor=False, **changes)

    def close(self) -> None:
        """Close the executor if this context made it (else nothing)."""
        if self.owns_executor:
            self.owns_executor = False
            self.executor.close()

    def __enter__(self) -> "PackContext":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


@dataclasses.dataclass
class PackResult:
    """What a packer returns to :func:`~shardfeed.convert.write.pack.pack`.

    Attributes:
        shards: the dataset's files in order (:class:`~shardfeed.readers.format.manifest.ShardEntry`; the
            kept shards of a resumed pack included).
        skipped: the files not packed, ``{"path", "key", "reason"}`` each (``on_error="skip"``).
        resumed: shards (or, for a one-file format, 1) kept from an interrupted pack; 0 when none.
        extra: the packer's figures for the report's ``extra`` (``num_planned_shards``, ...).
        finalize: ``finalize(manifest)``, called once the manifest is built and just before
            ``manifest.json`` is written (LMDB commits its copy of the manifest in its final
            transaction); it may add figures to ``extra``. None: nothing to do.
    """

    shards: list[ShardEntry]
    skipped: list[dict]
    resumed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)
    finalize: Callable[[Manifest], None] | None = None


class Packer(Protocol):
    """A format's packer (``FormatSpec.packer`` in :mod:`shardfeed.readers.format.registry`)."""

    def __call__(self, scan: ScanResult, samples: Sequence[PlannedSample], out: Path, options: Any,
                 context: PackContext) -> PackResult:
        """Write the planned samples into ``out`` as a dataset of this format (no manifest).

        Args:
            scan: the folder scan (:class:`~shardfeed.convert.write.scan.ScanResult`; its root must be
                seen by every task).
            samples: the packing order (:func:`~shardfeed.convert.write.plan.plan_samples`; a
                :class:`~shardfeed.convert.write.plan.SamplePlan` or a list of planned samples).
            out: the output folder, prepared (:func:`~shardfeed.convert.write.outdir.prepare_output`)
                and locked.
            options: the :class:`~shardfeed.convert.write.pack.PackOptions` (``resume`` set when an
                interrupted pack is continued).
            context: the executor to run tasks on, the progress sinks and the shard-end hook.

        Returns:
            A :class:`PackResult`.

        Raises:
            ValueError: a sample larger than a limit; ``resume`` of another plan.
            OSError, shardfeed.readers.errors.SourceChangedError,
                shardfeed.readers.errors.CorruptDataError: reading a source or writing OUT failed
                (``on_error="raise"``); what was finished stays for ``resume``.
        """
        ...
