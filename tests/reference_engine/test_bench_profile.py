"""The per-kernel table of `bench.profile`: on CUDA only device events count, so an op that launched a kernel is
not listed (and summed) a second time next to its kernel."""

from __future__ import annotations

from dataclasses import dataclass

from torch.autograd import DeviceType

from reference_engine.bench.profile import _table


@dataclass(frozen=True)
class _Event:
    key: str
    count: int
    device_type: DeviceType
    self_device_time_total: float = 0.0
    self_cpu_time_total: float = 0.0


class _Profile:
    def __init__(self, events):
        self._events = events

    def key_averages(self):
        return self._events


EVENTS = [
    _Event("aten::mm", 1, DeviceType.CPU, self_device_time_total=240.0, self_cpu_time_total=30.0),  # the op: its kernel's time again
    _Event("nvjet_sm90_lm_head", 1, DeviceType.CUDA, self_device_time_total=240.0),
    _Event("_rms_norm_kernel", 81, DeviceType.CUDA, self_device_time_total=130.0),
    _Event("aten::copy_", 30, DeviceType.CPU, self_device_time_total=43.0, self_cpu_time_total=90.0),
    _Event("direct_copy_kernel", 30, DeviceType.CUDA, self_device_time_total=43.0),
    _Event("Memcpy DtoH (Device -> Pageable)", 2, DeviceType.CUDA, self_device_time_total=3.0),
    _Event("cudaLaunchKernel", 112, DeviceType.CPU, self_cpu_time_total=400.0),
]


def test_cuda_table_counts_each_kernel_once():
    rows, total, launches = _table(_Profile(EVENTS), cuda=True, top=10)
    assert [r["name"] for r in rows] == ["nvjet_sm90_lm_head", "_rms_norm_kernel", "direct_copy_kernel", "Memcpy DtoH (Device -> Pageable)"]
    assert total == 240.0 + 130.0 + 43.0 + 3.0
    assert launches == 1 + 81 + 30 + 2
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-12


def test_cpu_table_lists_op_times():
    rows, total, launches = _table(_Profile(EVENTS), cuda=False, top=2)
    assert [r["name"] for r in rows] == ["cudaLaunchKernel", "aten::copy_"]
    assert total == 30.0 + 90.0 + 400.0
    assert launches == 1 + 30 + 112
