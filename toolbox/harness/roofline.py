"""Roofline arithmetic for benchmarks: bytes and flops from the contract's expressions, ideal time, fraction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolbox.documents.contract import Roofline
from toolbox.expressions import ExpressionError, evaluate
from toolbox.harness.hardware import HardwareProfile
from toolbox.harness.inputs import Binding, dtype_name, expression_env
from toolbox.harness.statuses import ContractError

MAX_INPUT_SETS = 256


@dataclass(frozen=True)
class RooflinePoint:
    bytes: float
    flops: float
    memory_s: float  # bytes / bandwidth
    compute_s: float  # flops / peak

    @property
    def ideal_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    def fraction(self, measured_s: float) -> float:
        """How close a measured time is to the roofline (1.0 = at the ceiling)."""
        return self.ideal_s / measured_s


def roofline_point(roofline: Roofline, binding: Binding, hardware: HardwareProfile) -> RooflinePoint:
    env = dict(expression_env(binding.axes, binding.params))
    env["itemsize"] = _itemsize(binding)
    try:
        moved, flops = float(evaluate(roofline.bytes, env)), float(evaluate(roofline.flops, env))
    except ExpressionError as error:
        raise ContractError(f"roofline: {error}") from None
    if moved < 0 or flops < 0:
        raise ContractError(f"roofline gives negative bytes ({moved}) or flops ({flops})")
    peak = hardware.peak_for(dtype_name(binding.dtype)).value
    return RooflinePoint(moved, flops, moved / hardware.memory_bandwidth.value, flops / peak)


def _itemsize(binding: Binding) -> int:
    import torch

    return torch.empty(0, dtype=binding.dtype).element_size()


def input_sets_needed(set_bytes: int, l2_bytes: int, memory_free_bytes: int | None = None) -> int:
    """Enough distinct input sets that together they exceed twice the L2 cache (so timed runs read from memory)."""
    if set_bytes <= 0:
        return 1
    count = max(1, math.floor(2 * l2_bytes / set_bytes) + 1)
    if memory_free_bytes is not None:
        count = min(count, max(1, int(0.5 * memory_free_bytes // set_bytes)))
    return min(count, MAX_INPUT_SETS)
