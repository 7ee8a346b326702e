"""Where a Triton kernel may run, and the output buffer it writes.

A wrapper launches on CUDA tensors, or on CPU tensors when the Triton interpreter is on
(`TRITON_INTERPRET=1`, read by Triton when the kernels are defined: set it before importing a
kernel module). The interpreter of Triton 3.6 converts float32 to bfloat16 by truncation where the
GPU rounds to nearest even; under the interpreter the kernels therefore write a float32 buffer and
torch rounds it into the 16-bit output (`staging_buffer` / `finish`), so CPU tests see the same
rounding as the GPU.

`cdiv` and `next_power_of_2` are the host-side integer helpers the wrappers use for grids and block sizes: Triton
3.6's `triton.cdiv` / `triton.next_power_of_2` are constexpr functions whose call from Python goes through the JIT's
call machinery (about 10 us each on a 2-core CI machine, several times a launch), for the same integer.
"""

from __future__ import annotations

import os

import torch


def cdiv(x: int, div: int) -> int:
    """ceil(x / div) for a positive div: `triton.cdiv`'s value, computed on plain ints."""
    return (x + div - 1) // div


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0): `triton.next_power_of_2`'s value, computed on plain ints."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def require_launchable(*tensors: torch.Tensor) -> None:
    """ValueError unless every tensor is on CUDA, or every tensor is on the CPU under the interpreter."""
    devices = {tensor.device for tensor in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    device = devices.pop()
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreting():
        return
    raise ValueError(f"this Triton kernel runs on CUDA tensors (or on the CPU with TRITON_INTERPRET=1), got {device}")


def staging_buffer(out: torch.Tensor) -> torch.Tensor:
    """`out` itself, or under the interpreter a float32 buffer of its shape for 16-bit outputs."""
    if interpreting() and out.dtype in (torch.bfloat16, torch.float16):
        return torch.empty(out.shape, dtype=torch.float32, device=out.device)
    return out


def finish(buffer: torch.Tensor, out: torch.Tensor) -> None:
    """Round the staging buffer into `out` (no-op when the kernel wrote `out` directly)."""
    if buffer is not out:
        out.copy_(buffer)


_TICKETS: dict[torch.device, torch.Tensor] = {}


def ticket_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters for kernels whose last program finishes a reduction (it draws the last ticket
    and puts its counter back to zero), kept per device. Kernels on one stream run one after another, so
    they share these; allocated outside graph capture on first use (a capture that grows them records the
    zeroing, which is then repeated at every replay: still correct)."""
    counters = _TICKETS.get(device)
    if counters is None or counters.numel() < count:
        counters = torch.zeros(max(count, 4096), dtype=torch.int32, device=device)
        _TICKETS[device] = counters
    return counters
