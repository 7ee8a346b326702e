"""The two ceilings, measured in the same run: device copy bandwidth and dense matrix-product rate.

Copy bandwidth: a large device-to-device copy (well past the L2), bytes read plus bytes written per
second, median of timed repeats after a warm-up. Matrix rate: a square bf16 product (float32 on the
CPU) on random data. On the CPU the same code measures host memory and BLAS, so the pipeline runs
end to end in tests; those numbers mean nothing for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.bench.timing import time_call


@dataclass(frozen=True)
class Ceilings:
    copy_bandwidth: float  # bytes/s, read + written
    matmul_rate: float  # FLOP/s
    copy_bytes: int
    matmul_size: int
    matmul_dtype: str


def _time_copy(copy_bytes: int, device: torch.device) -> float:
    source = torch.rand(copy_bytes // 4, device=device)  # random data, never zeros
    destination = torch.empty_like(source)
    return time_call(lambda: destination.copy_(source), device, warmup=3, repeat=10)


def measure_ceilings(
    device: torch.device, copy_bytes: int | None = None, matmul_size: int | None = None
) -> Ceilings:
    cuda = device.type == "cuda"
    copy_bytes = copy_bytes or (2 << 30 if cuda else 64 << 20)
    matmul_size = matmul_size or (8192 if cuda else 512)
    copy_seconds = _time_copy(copy_bytes, device)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(matmul_size, matmul_size, device=device, dtype=dtype)
    b = torch.randn(matmul_size, matmul_size, device=device, dtype=dtype)
    matmul_seconds = time_call(lambda: a @ b, device, warmup=3, repeat=10)
    return Ceilings(
        copy_bandwidth=2 * copy_bytes / copy_seconds,
        matmul_rate=2 * matmul_size**3 / matmul_seconds,
        copy_bytes=copy_bytes,
        matmul_size=matmul_size,
        matmul_dtype=str(dtype).removeprefix("torch."),
    )
