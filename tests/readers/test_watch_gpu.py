"""watch on CUDA: the wait is GPU idle time (torch.cuda.synchronize at each request), NVML sampled."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", 0)


def test_an_asynchronous_gpu_step_counts_as_step_not_wait(cuda):
    from shardfeed.readers.measure.watch import watch

    a = torch.randn(2048, 2048, device=cuda)
    batches = [torch.zeros(8, 3)] * 12
    w = watch(batches, device=cuda)
    for _ in w:
        for _ in range(20):
            a = a @ a / a.norm()  # queued on the GPU; the Python call returns at once
    rep = w.report()
    w.close()
    assert rep.timing == "cuda_synchronize" and rep.device == "cuda:0"
    # the GPU work is in the step (synchronised at the next request), so the in-memory loader never stalls
    assert rep.t_step_s["mean"] > 10 * rep.t_wait_s["mean"]
    assert rep.diagnosis["kind"] == "compute-bound"


def test_gpu_utilisation_is_sampled_with_nvml(cuda):
    pytest.importorskip("pynvml")
    from shardfeed.readers.measure.watch import watch

    a = torch.randn(4096, 4096, device=cuda)
    w = watch([None] * 20, device=cuda, sample_interval_s=0.01)
    t0 = time.perf_counter()
    for _ in w:
        for _ in range(10):
            a = a @ a / a.norm()
    assert time.perf_counter() - t0 > 0
    rep = w.report()
    w.close()
    assert rep.gpu_util is not None and 0.0 <= rep.gpu_util <= 1.0
