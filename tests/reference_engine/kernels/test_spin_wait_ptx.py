"""Spin waits must compile to acquire reads (sm_90 PTX, compiled offline with Triton's bundled tool chain).

Run78 (H100): `moe_pairs_fused`'s down programs spun on volatile reads of a counter, then did one
`tl.atomic_add(ptr, 0, sem="acquire")` whose result was unused. Triton 3.6 drops that atomic when it lowers to LLVM,
so no acquire reached the PTX and the down programs read activations the gate/up programs had not yet stored (NaN rows
at 2 and 4 tokens). The known-wrong form is kept here and must be reported, both by the PTX reading here and by the
check `benchmarks/kernels/compile_sm90.py` applies to every kernel (acquiring atomics in the TTGIR against acquiring
instructions in the PTX); `_wait_for` must spin on `ld.acquire.gpu` with the dependent load after it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from reference_engine.kernels import moe_pairs_fused
from reference_engine.kernels.launch import interpreting

pytestmark = pytest.mark.skipif(interpreting(), reason="compiles for sm_90: needs the compiler, not the interpreter")

REPO = Path(__file__).resolve().parents[3]
DATA_LOAD = r"\bld\.global\.cg\."  # the consumer's load of what the producers stored
SIGNATURE = {"counter_ptr": "*i32", "data_ptr": "*i32", "out_ptr": "*i32"}


@triton.jit
def _volatile_then_unused_acquire(counter_ptr, data_ptr, out_ptr):
    """Session 27's form (known wrong)."""
    seen = tl.load(counter_ptr, volatile=True)
    while seen < 3:
        seen = tl.load(counter_ptr, volatile=True)
    tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.store(out_ptr, tl.load(data_ptr, cache_modifier=".cg"))


@triton.jit
def _wait_for_then_load(counter_ptr, data_ptr, out_ptr):
    moe_pairs_fused._wait_for(counter_ptr, 3, True)
    tl.store(out_ptr, tl.load(data_ptr, cache_modifier=".cg"))


def compiled(kernel):
    return triton.compile(ASTSource(kernel, SIGNATURE), target=GPUTarget("cuda", 90, 32))


def ptx(kernel) -> str:
    return compiled(kernel).asm["ptx"]


def compile_sm90():
    """`benchmarks/kernels/compile_sm90.py`: its every-kernel check (`_acquires`) and its PTX pattern."""
    sys.path.insert(0, str(REPO / "benchmarks" / "kernels"))
    try:
        import compile_sm90
    finally:
        sys.path.pop(0)
    return compile_sm90


def acquire_before_data_load(text: str) -> bool:
    """True when an acquire read of the counter comes before the load of the data the producers wrote."""
    acquire = re.search(compile_sm90().ACQUIRING_PTX, text)
    data = re.search(DATA_LOAD, text)
    return acquire is not None and data is not None and acquire.start() < data.start()


def test_the_dropped_acquire_is_reported():
    text = ptx(_volatile_then_unused_acquire)
    assert "ld.volatile.global" in text and re.search(DATA_LOAD, text)  # the spin and the data load are there
    assert not acquire_before_data_load(text)


def test_the_every_kernel_compile_counts_the_dropped_acquire():
    acquires = compile_sm90()._acquires
    assert acquires(compiled(_volatile_then_unused_acquire)) == (1, 0)  # asked for in the TTGIR, absent from the PTX
    asked, kept = acquires(compiled(_wait_for_then_load))
    assert asked == 0 and kept >= 1  # inline acquire loads: nothing to drop


def test_wait_for_spins_on_acquire_loads_before_the_dependent_load():
    text = ptx(_wait_for_then_load)
    assert acquire_before_data_load(text)
    assert "ld.volatile" not in text
