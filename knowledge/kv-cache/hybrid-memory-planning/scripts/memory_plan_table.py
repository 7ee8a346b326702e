"""Memory plan of Qwen3.6-35B-A3B on one GPU, from the tensor shapes alone (CPU, instant).

Counts weight bytes per precision (bf16 everything; NVFP4 linears with bf16 embedding, LM head,
router, gates, norms, conv and in_proj_a/b), KV bytes per token, Gated DeltaNet state bytes per
sequence, and for each GPU size the largest number of concurrent 4,096-token sequences (each
needs one state slot and 256 KV blocks of 16). The accounting follows
reference_engine/memory_plan.py (90% of memory usable, an activation workspace for 8,192
tokens per step plus float32 logits per sequence); when that module is importable the script
checks that both agree. Exits non-zero on a disagreement.
"""

from __future__ import annotations

import sys

HIDDEN, VOCAB, LAYERS, ATTENTION_LAYERS, GDN_LAYERS = 2048, 248320, 40, 10, 30
HEADS, KV_HEADS, HEAD_DIM = 16, 2, 256
GDN_V_HEADS, GDN_K_DIM, GDN_V_DIM, GDN_KEY_TOTAL, GDN_VALUE_TOTAL, CONV_KERNEL = 32, 128, 128, 2048, 4096, 4
EXPERTS, TOP_K, EXPERT_I, SHARED_I = 256, 8, 512, 512
CONV_DIM = 2 * GDN_KEY_TOTAL + GDN_VALUE_TOTAL  # 8192
BLOCK_SIZE, FRACTION, BATCHED_TOKENS = 16, 0.9, 8192


def linear(out_features: int, in_features: int, precision: str) -> int:
    if precision == "bf16":
        return 2 * out_features * in_features
    return out_features * in_features // 2 + out_features * in_features // 16 + 8  # codes, fp8 scales, 2 fp32 scalars


def weights(linears: str, lm_head: str = "bf16") -> dict[str, int]:
    attention = linear(2 * HEADS * HEAD_DIM, HIDDEN, linears) + 2 * linear(KV_HEADS * HEAD_DIM, HIDDEN, linears)
    attention += linear(HIDDEN, HEADS * HEAD_DIM, linears) + 2 * 2 * HEAD_DIM
    gdn = linear(CONV_DIM, HIDDEN, linears) + linear(GDN_VALUE_TOTAL, HIDDEN, linears) + linear(HIDDEN, GDN_VALUE_TOTAL, linears)
    gdn += 2 * linear(GDN_V_HEADS, HIDDEN, "bf16") + 2 * CONV_DIM * CONV_KERNEL + 2 * 2 * GDN_V_HEADS + 2 * GDN_V_DIM
    routed = EXPERTS * (linear(2 * EXPERT_I, HIDDEN, linears) + linear(HIDDEN, EXPERT_I, linears))
    shared = 2 * linear(SHARED_I, HIDDEN, linears) + linear(HIDDEN, SHARED_I, linears)
    other = linear(EXPERTS, HIDDEN, "bf16") + linear(1, HIDDEN, "bf16") + 2 * 2 * HIDDEN
    return {
        "embedding": 2 * VOCAB * HIDDEN,
        "lm_head": linear(VOCAB, HIDDEN, lm_head),
        "attention": ATTENTION_LAYERS * attention,
        "linear_attention": GDN_LAYERS * gdn,
        "routed_experts": LAYERS * routed,
        "shared_experts": LAYERS * shared,
        "other": LAYERS * other + 2 * HIDDEN,
    }


def kv_per_token(itemsize: int = 2) -> int:
    return ATTENTION_LAYERS * 2 * KV_HEADS * HEAD_DIM * itemsize


def state_per_sequence() -> int:
    recurrent = GDN_V_HEADS * GDN_K_DIM * GDN_V_DIM * 4  # float32
    conv = CONV_DIM * (CONV_KERNEL - 1) * 2  # bf16, the last 3 inputs
    return GDN_LAYERS * (recurrent + conv)


def activations(max_num_seqs: int) -> int:
    widest = max(CONV_DIM + GDN_VALUE_TOTAL, 2 * HEADS * HEAD_DIM)
    per_token = 2 * (4 * HIDDEN + widest + 2 * TOP_K * EXPERT_I)
    return BATCHED_TOKENS * per_token + max_num_seqs * VOCAB * 4


def max_sequences(gpu_bytes: int, weight_total: int, tokens: int, kv_itemsize: int) -> int:
    """Largest S such that S state slots plus S * ceil(tokens / 16) blocks fit."""
    usable = int(gpu_bytes * FRACTION)
    blocks_each = -(-tokens // BLOCK_SIZE)
    block_bytes = kv_per_token(kv_itemsize) * BLOCK_SIZE
    count = 0
    while usable - weight_total - activations(count + 1) - (count + 1) * (state_per_sequence() + blocks_each * block_bytes) >= 0:
        count += 1
    return count


def cross_check() -> bool:
    try:
        from reference_engine.config import ModelConfig
        from reference_engine.memory_plan import (
            kv_bytes_per_token,
            plan,
            state_bytes_per_sequence,
            weight_bytes,
        )
    except ImportError:
        print("reference_engine not importable: cross-check skipped")
        return True
    config = ModelConfig()
    ok = kv_bytes_per_token(config) == kv_per_token() and state_bytes_per_sequence(config) == state_per_sequence()
    for linears, lm_head in (("bf16", "bf16"), ("nvfp4", "bf16"), ("nvfp4", "nvfp4")):
        ok &= weight_bytes(config, linears, lm_head).total == sum(weights(linears, lm_head).values())
    for gpu in (141e9, 180e9):
        count = max_sequences(int(gpu), sum(weights("nvfp4").values()), 4096, 2)
        result = plan(config, int(gpu), max_num_seqs=count, linears="nvfp4", lm_head="bf16")
        ok &= result.max_sequences_of(4096) >= count
        try:
            over = plan(config, int(gpu), max_num_seqs=count + 1, linears="nvfp4", lm_head="bf16").max_sequences_of(4096)
        except ValueError:
            over = 0
        ok &= over < count + 1
    print("cross-check against reference_engine.memory_plan:", "ok" if ok else "FAIL")
    return ok


def main() -> int:
    for linears in ("bf16", "nvfp4"):
        parts = weights(linears)
        print(f"weights, {linears} linears + bf16 embedding/LM head: {sum(parts.values()) / 1e9:.2f} GB  "
              + ", ".join(f"{k} {v / 1e9:.3f}" for k, v in parts.items()))
    print(f"KV per token: bf16 {kv_per_token()} B, fp8 {kv_per_token(1)} B; GDN state per sequence: {state_per_sequence():,} B")
    print(f"activation workspace at 64 sequences: {activations(64) / 1e9:.3f} GB")
    for name, gpu in (("H200 141 GB", 141e9), ("B200 180 GB", 180e9), ("B200 192 GB", 192e9)):
        for linears in ("nvfp4", "bf16"):
            total = sum(weights(linears).values())
            counts = [max_sequences(int(gpu), total, 4096, itemsize) for itemsize in (2, 1)]
            print(f"{name}, {linears} weights: concurrent 4,096-token sequences: bf16 KV {counts[0]}, fp8 KV {counts[1]}")
    return 0 if cross_check() else 1


if __name__ == "__main__":
    sys.exit(main())
