"""Bytes-per-step arithmetic for MTP speculative decoding of Qwen3.6-35B-A3B at batch 1.

Shapes from configuration_qwen3_5_moe.py (hidden 2048, 30 GDN + 10 attention layers, 256
experts top 8 of intermediate 512, vocab 248320) and the MTP module (fc 4096 -> 2048, one
attention layer with MoE, shared LM head). Weights: NVFP4 linears at 0.5625 B per weight
(4-bit element + one E4M3 scale per 16), bf16 LM head, router and small projections; the MTP fc
in bf16 (NVFP4 checkpoints keep it unquantised). Experts touched by m tokens assume independent
uniform routing, an upper bound (real consecutive tokens share experts).

Run: python spec_arithmetic.py [--bandwidth 4.27e12] [--lm-head-bytes-per-weight 2] [--routing shared]
"""

from __future__ import annotations

import argparse

HIDDEN, VOCAB, EXPERTS, TOP_K, INTER = 2048, 248320, 256, 8, 512
GDN_LAYERS, ATTN_LAYERS = 30, 10
NVFP4 = 0.5625  # bytes per weight
BF16 = 2.0

GDN_LINEAR = 8192 * HIDDEN + 4096 * HIDDEN + HIDDEN * 4096  # in_proj_qkv, in_proj_z, out_proj
GDN_SMALL = 2 * 32 * HIDDEN + 8192 * 4  # in_proj_a/b, conv1d (bf16)
ATTN_LINEAR = 8192 * HIDDEN + 2 * 512 * HIDDEN + HIDDEN * 4096  # q (with gate), k, v, o
EXPERT = 3 * INTER * HIDDEN  # gate, up, down
ROUTER = EXPERTS * HIDDEN
GDN_STATE_BYTES = 32 * 128 * 128 * 4  # per layer per sequence, fp32


ROUTING = {"mode": "independent"}


def distinct_experts(tokens: int) -> float:
    """Expected distinct experts per layer touched by `tokens` tokens.

    independent: uniform top-8 per token, an upper bound; shared: every token picks the same 8
    experts, the lower bound. Real routing lies between.
    """
    if ROUTING["mode"] == "shared":
        return float(TOP_K)
    return EXPERTS * (1.0 - (1.0 - TOP_K / EXPERTS) ** tokens)


def target_step_bytes(tokens: int, lm_head_bpw: float) -> float:
    """Weights read by one target forward over `tokens` positions of one sequence, plus GDN state traffic."""
    dense = GDN_LAYERS * (GDN_LINEAR * NVFP4 + GDN_SMALL * BF16) + ATTN_LAYERS * ATTN_LINEAR * NVFP4
    moe = (GDN_LAYERS + ATTN_LAYERS) * ((distinct_experts(tokens) * EXPERT + EXPERT) * NVFP4 + ROUTER * BF16)
    lm_head = VOCAB * HIDDEN * lm_head_bpw
    state = GDN_LAYERS * GDN_STATE_BYTES * (1 + tokens)  # read once, one checkpoint written per position
    return dense + moe + lm_head + state


def mtp_draft_bytes(lm_head_bpw: float) -> float:
    """One MTP draft step: fc (bf16), one attention layer, one MoE (8 experts + shared), the shared LM head."""
    fc = 2 * HIDDEN * HIDDEN * BF16
    layer = ATTN_LINEAR * NVFP4 + (TOP_K * EXPERT + EXPERT) * NVFP4 + ROUTER * BF16
    return fc + layer + VOCAB * HIDDEN * lm_head_bpw


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens emitted per verification step with k drafts, i.i.d. acceptance rate alpha (Leviathan et al.)."""
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bandwidth", type=float, default=4.27e12, help="bytes/s (default: measured H200)")
    parser.add_argument("--lm-head-bytes-per-weight", type=float, default=BF16)
    parser.add_argument("--routing", choices=["independent", "shared"], default="independent")
    args = parser.parse_args()
    ROUTING["mode"] = args.routing
    bw, lm = args.bandwidth, args.lm_head_bytes_per_weight
    plain = target_step_bytes(1, lm)  # reads the GDN state once and writes it once
    print(f"plain decode step: {plain / 1e9:.3f} GB -> {plain / bw * 1e3:.3f} ms, {bw / plain:.0f} tokens/s")
    print(f"MTP draft step:    {mtp_draft_bytes(lm) / 1e9:.3f} GB")
    print("m tokens -> distinct experts per layer: " + ", ".join(f"{m}: {distinct_experts(m):.1f}" for m in (1, 2, 3, 4, 5)))
    print(f"{'k':>2} {'verify GB':>9} {'step GB':>8} | " + " ".join(f"a={a:<4}" for a in (0.5, 0.6, 0.7, 0.8, 0.9)) + "   (speed-up vs plain, bytes model)")
    for k in (1, 2, 3, 4):
        verify = target_step_bytes(k + 1, lm)
        step = verify + k * mtp_draft_bytes(lm)
        speedups = [expected_tokens(a, k) * plain / step for a in (0.5, 0.6, 0.7, 0.8, 0.9)]
        print(f"{k:>2} {verify / 1e9:>9.3f} {step / 1e9:>8.3f} | " + " ".join(f"{s:6.2f}" for s in speedups))


if __name__ == "__main__":
    main()
