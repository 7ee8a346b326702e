"""Programmatic dependent launch (PDL, sm_90+): the next kernel of a decode step starts while this one runs.

With `PDL` on, the decode kernels are launched with the programmatic-stream-serialization attribute
(`launch_pdl`, kept by CUDA-graph capture as a programmatic edge) and each of them begins with
`_pdl_enter`: `griddepcontrol.wait` (block until the previous kernel in the stream has completed and
its memory is visible) and then `griddepcontrol.launch_dependents` (let the next kernel launch now).
So kernel n + 1 is launched, scheduled and runs whatever precedes its wait (the batch-1 GEMV prefetches
its weight slice into L2 there: weights do not depend on earlier kernels) while kernel n computes.
Ordering is the same as without PDL: nothing after the wait runs before the previous kernel is done,
and that kernel passed its own wait before anything earlier could be pending.

Off by default; the tuning file turns it on per device (`"pdl": true`) after a GPU run compares both.
The interpreter has no grid dependency control: `launch_args()` is empty there.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from reference_engine.kernels.launch import interpreting

PDL = False


def enabled() -> bool:
    return PDL and not interpreting()


def launch_args() -> dict:
    """Extra keyword arguments for a kernel launch: the kernel's PDL constexpr and Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if enabled() else {}


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """First statement of a PDL-aware kernel: wait for the previous kernel, then release the next one."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _prefetch_l2(ptrs):
    """`prefetch.global.L2` at every address of `ptrs` (valid addresses only: no predicate is applied)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
