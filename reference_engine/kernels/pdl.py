"""Programmatic dependent launch (PDL, sm_90+) for the decode kernels: the next kernel is dispatched before this one ends.

A kernel launched with Triton's `launch_pdl` option carries the programmatic-stream-serialization attribute (CUDA-graph
capture keeps it as a programmatic edge). Every PDL-aware kernel here starts with `pdl_wait`: `griddepcontrol.wait`
blocks until the previous kernel in the stream has completed and its writes are visible, so nothing the kernel reads or
writes can race with it, wherever the release below is placed. The release, `griddepcontrol.launch_dependents`, lets
the next kernel be dispatched once every program of this one has executed it (or exited):
- `MODE` 1: right after the wait. The next kernel's programs become resident while this one runs and then block in
  their own wait; their dispatch and set-up overlap this kernel, at the cost of the slots they hold.
- `MODE` 2: after the kernel's main loop (`pdl_release`, before its last stores or ticket). The next kernel is dispatched
  during this one's tail only, so its programs hold no slots this kernel's main loops could use.
`MODE` 0 (the default) launches plainly; the tuning key `pdl` sets it per card after `benchmarks/kernels/time_launch_folds.py`
times all three in the batch-1 decode graph.

History: run10 (2026-12-02, H200) launched the kernels of that day with MODE 1 and an L2 prefetch of the GEMV's weights
before the wait; a decode-like chain took 52.1 against 49.9 us a layer and the step 3.00 against 2.76 ms (benchmarks/NOTES.md).
Neither form here prefetches. Since then the step has gone from 984 to 367 launches, and an empty launch costs 0.95 us
in a batch-1 graph (run58), which is what this overlap could hide.

The interpreter has no grid dependency control: `launch_args()` is empty there, and the kernels compile their PDL code
out (`PDL` 0).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from reference_engine.kernels.launch import interpreting

MODE = 0  # 0 off, 1 release at the start, 2 release after the main loop (tuning key `pdl`)


def launch_args() -> dict:
    """Extra keyword arguments for a PDL-aware kernel's launch: its `PDL` constexpr and Triton's `launch_pdl` option."""
    if MODE not in (0, 1, 2):
        raise ValueError(f"pdl.MODE must be 0, 1 or 2, got {MODE!r}")
    return {"PDL": MODE, "launch_pdl": True} if MODE and not interpreting() else {}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """A PDL-aware kernel's first statement: wait for the previous kernel (and with PDL 1 release the next at once)."""
    if PDL:
        gdc_wait()
        if PDL == 1:
            gdc_launch_dependents()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """With PDL 2: release the next kernel (placed after the main loop, before the last stores)."""
    if PDL == 2:
        gdc_launch_dependents()
