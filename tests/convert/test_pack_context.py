"""A pack's context travels as a parameter: the packer runs its tasks on the context's executor,
reports to its progress sink and calls its shard-end hook; an executor the caller passes stays
the caller's; the CLI's fault hooks come from the Click context object, nowhere else."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from shardfeed.convert import PackContext, PackResult
from shardfeed.convert.cli import main
from shardfeed.convert.write.executors import LocalExecutor
from shardfeed.convert.write.faults import FaultHooks
from shardfeed.convert.write.pack import PackOptions, pack_local


class RecordingExecutor(LocalExecutor):
    """One process; records the number of tasks of every ``map_ordered`` call and every close."""

    def __init__(self):
        super().__init__(1)
        self.calls: list[int] = []
        self.closed = 0

    def map_ordered(self, fn, tasks, progress=None, **kwargs):
        tasks = list(tasks)
        self.calls.append(len(tasks))
        yield from super().map_ordered(fn, tasks, progress, **kwargs)

    def close(self) -> None:
        self.closed += 1


def _input_bytes(expected: dict) -> int:
    return sum(len(data) for data, _ in expected.values())


def test_webdataset_pack_runs_on_the_context_executor_and_reports_to_its_sinks(
        tiny_image_folder, tiny_folder_expected, tmp_path):
    ex = RecordingExecutor()
    seen = [0, 0]
    ends: list[tuple[int, str, int]] = []

    def progress(n: int, b: int) -> None:
        seen[0] += n
        seen[1] += b

    options = PackOptions(max_count=25, workers=1)
    context = PackContext.for_options(options, progress=progress, executor=ex,
                                      on_shard_end=lambda e, i: ends.append((i, e.name, e.num_samples)))
    report = pack_local(tiny_image_folder, tmp_path / "out", options, context=context)
    assert len(tiny_folder_expected) == 60
    assert ex.calls == [3]  # 60 images, 25 a shard: 3 planned shards, one task each
    assert seen == [60, _input_bytes(tiny_folder_expected)]
    assert ends == [(0, "shard-000000.tar", 25), (1, "shard-000001.tar", 25), (2, "shard-000002.tar", 10)]
    assert report.extra["num_tasks"] == 3 and report.extra["executor"] == "local"
    context.close()
    assert ex.closed == 0  # the caller's executor: the caller closes it


def test_lmdb_pack_runs_on_the_context_executor(tiny_image_folder, tiny_folder_expected, tmp_path):
    ex = RecordingExecutor()
    seen = [0, 0]
    options = PackOptions(format="lmdb", workers=1)
    context = PackContext.for_options(options, executor=ex,
                                      progress=lambda n, b: seen.__setitem__(slice(None), [seen[0] + n, seen[1] + b]))
    report = pack_local(tiny_image_folder, tmp_path / "out", options, context=context)
    assert ex.calls == [1]  # 60 small images: one chunk (at most 256 samples, 2 MB)
    assert seen == [60, _input_bytes(tiny_folder_expected)]
    assert report.num_samples == 60 and report.extra["lmdb_records_resumed"] == 0


def test_a_context_closes_only_the_executor_it_made(monkeypatch):
    made = RecordingExecutor()
    monkeypatch.setattr("shardfeed.convert.write.context.make_executor", lambda options: made)
    with PackContext.for_options(PackOptions(workers=1)) as context:
        copy = context.replace(on_shard_end=lambda e, i: None)
        copy.close()
        assert made.closed == 0  # a copy shares the executor and does not own it
    assert made.closed == 1
    context.close()
    assert made.closed == 1  # once


def test_pack_local_refuses_callbacks_beside_a_context(tiny_image_folder, tmp_path):
    options = PackOptions(workers=1)
    context = PackContext.for_options(options, executor=RecordingExecutor())
    with pytest.raises(TypeError, match="in the context"):
        pack_local(tiny_image_folder, tmp_path / "out", options, context=context, progress=lambda n, b: None)
    assert not (tmp_path / "out").exists()


def test_pack_result_defaults():
    result = PackResult([], [])
    assert (result.resumed, result.extra, result.finalize) == (0, {}, None)


@pytest.mark.parametrize("obj", [None, {"faults": FaultHooks(lmdb_commit_count=3)}])
def test_cli_pack_takes_fault_hooks_from_the_click_object_only(obj, tiny_image_folder, tmp_path, monkeypatch):
    pack_module = sys.modules["shardfeed.convert.write.pack"]  # (the package's ``pack`` attribute is the function)
    real = pack_module.pack
    given: list = []

    def spy(src, out, options, **kwargs):
        given.append(options.faults)
        return real(src, out, options, **kwargs)

    monkeypatch.setattr(pack_module, "pack", spy)
    result = CliRunner().invoke(main, ["-q", "pack", str(tiny_image_folder), str(tmp_path / "out"), "--format",
                                       "lmdb", "-j", "1"], obj=obj)
    assert result.exit_code == 0, result.output
    assert given == [None if obj is None else obj["faults"]]
    assert given[0] is (None if obj is None else obj["faults"])
