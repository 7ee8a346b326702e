"""The decode MoE block with the experts grouped by expert at every batch size (`moe_grouped_decode.MIN_TOKENS` 1),
as an implementation the contract harness can run (imported only in the interpreter subprocess)."""

from __future__ import annotations


def moe_block_decode_grouped(x, router_weight, experts, shared, top_k, out):
    from reference_engine.kernels import moe_decode, moe_grouped_decode

    saved = moe_grouped_decode.MIN_TOKENS
    moe_grouped_decode.MIN_TOKENS = 1
    try:
        moe_decode.moe_block_decode(x, router_weight, experts, shared, top_k, out)
    finally:
        moe_grouped_decode.MIN_TOKENS = saved


def moe_block_decode_half_grouped(x, router_weight, experts, shared, top_k, out):
    """The decode MoE block with the experts grouped by expert in packed float16 at every batch size
    (`moe_grouped_half.MIN_TOKENS` 1; bfloat16 x only, other dtypes keep the per-pair kernels)."""
    from reference_engine.kernels import moe_decode, moe_grouped_half

    saved = moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS
    moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = 1, None
    try:
        moe_decode.moe_block_decode(x, router_weight, experts, shared, top_k, out)
    finally:
        moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = saved
