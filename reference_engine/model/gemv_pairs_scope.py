"""The model's side of `kernels/gemv_pairs.py`: a pairs buffer when a producer and the GEMV after it are Triton kernels.

The producer (the norm before a mixer, the Gated DeltaNet step before out_proj, the gated paged decode before o_proj) writes its bfloat16 output once more as
the batch-1 GEMV's float16 pairs; the GEMV that reads that output inside `given` takes them instead of converting it.
The kernels module is imported only when a graph decode's op set uses Triton kernels.
"""

from __future__ import annotations

import contextlib

import torch


def pairs_for(ops, out: torch.Tensor, producer: str, consumer: str) -> torch.Tensor | None:
    """An int32 [1, 2, K / 2] buffer for `out`'s pairs when `ops` (a graph decode's OpSet, or None) runs `producer` and
    `consumer` as Triton kernels and the setting applies to `out` (one bfloat16 token); else None."""
    if ops is None or ops.backends.get(producer) != "triton" or ops.backends.get(consumer) != "triton":
        return None
    from reference_engine.kernels import gemv_pairs

    return gemv_pairs.pairs_buffer(out) if gemv_pairs.applies(out) else None


def given(out: torch.Tensor, pairs: torch.Tensor | None) -> contextlib.AbstractContextManager:
    """`gemv_pairs.given(out, pairs)`, or nothing when there are no pairs."""
    if pairs is None:
        return contextlib.nullcontext()
    from reference_engine.kernels import gemv_pairs

    return gemv_pairs.given(out, pairs)
