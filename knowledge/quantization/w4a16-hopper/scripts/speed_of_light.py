"""Speed-of-light arithmetic for W4A16 NVFP4 linears of Qwen3.6-35B-A3B (plain Python).

Bytes moved per decode step at batch M, and the floor time at a given bandwidth, for every linear
of the model in three precision plans; then the batch size at which a W4A16 GEMM stops being
bandwidth-bound. Shapes from the model config (hidden 2048, 40 layers: 30 Gated DeltaNet + 10
attention, 256 experts of intermediate 512, top 8, one shared expert, vocabulary 248320).

Run: python speed_of_light.py [--bandwidth 4.27e12] [--flops 690e12] [--batch 1]
"""

from __future__ import annotations

import argparse

NVFP4 = 0.5 + 1 / 16  # bytes per weight: code nibble + one E4M3 scale per 16
BF16 = 2.0

# (name, N, K, uses per token, quantised in the "all linears" plan)
LINEARS = [
    ("gdn in_proj_qkv", 8192, 2048, 30, True),
    ("gdn in_proj_z", 4096, 2048, 30, True),
    ("gdn in_proj_a + in_proj_b", 64, 2048, 30, False),
    ("gdn out_proj", 2048, 4096, 30, True),
    ("attn q_proj", 8192, 2048, 10, True),
    ("attn k_proj + v_proj", 1024, 2048, 10, True),
    ("attn o_proj", 2048, 4096, 10, True),
    ("router (mlp.gate)", 256, 2048, 40, False),
    ("shared_expert_gate", 1, 2048, 40, False),
    ("shared expert gate+up", 1024, 2048, 40, True),
    ("shared expert down", 2048, 512, 40, True),
    ("8 routed experts gate+up", 8 * 1024, 2048, 40, True),
    ("8 routed experts down", 8 * 2048, 512, 40, True),
    ("lm_head", 248320, 2048, 1, False),
]


def weight_bytes(n: int, k: int, nvfp4: bool) -> float:
    return n * k * (NVFP4 if nvfp4 else BF16) + (4 if nvfp4 else 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bandwidth", type=float, default=4.27e12, help="bytes/s (default: measured H200 copy)")
    parser.add_argument("--flops", type=float, default=690e12, help="dense bf16 FLOP/s (default: measured H200)")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    m = args.batch

    print(f"{'linear':28s} {'N x K':>14s} {'per tok':>7s} {'bf16 MB':>9s} {'NVFP4 MB':>9s} {'floor us':>9s}")
    for name, n, k, uses, _ in LINEARS:
        nv = weight_bytes(n, k, True) + m * (n + k) * BF16
        print(f"{name:28s} {n:>6d} x {k:<6d} {uses:>7d} {n * k * BF16 / 1e6:9.2f} {nv / 1e6:9.3f} {nv / args.bandwidth * 1e6:9.2f}")

    plans = {
        "all bf16": lambda q: False,
        "experts NVFP4 (routed + shared)": None,
        "all projections NVFP4 (router, gates, a/b, lm_head bf16)": lambda q: q,
    }
    print(f"\nper decode step at batch {m}, bandwidth {args.bandwidth / 1e12:.2f} TB/s (weights + activations of the linears only):")
    for plan, rule in plans.items():
        total = 0.0
        for name, n, k, uses, quantisable in LINEARS:
            quantised = ("expert" in name and quantisable) if rule is None else rule(quantisable)
            total += uses * (weight_bytes(n, k, quantised) + m * (n + k) * BF16)
        print(f"  {plan:58s} {total / 1e9:6.3f} GB  floor {total / args.bandwidth * 1e3:6.3f} ms")

    ridge = args.flops / args.bandwidth
    print(f"\nridge point {ridge:.0f} FLOP/B; a GEMM over M tokens does 2*M FLOP per weight:")
    print(f"  bf16 weights (2 B):      bandwidth-bound while M < {ridge * BF16 / 2:.0f}")
    print(f"  NVFP4 weights (0.5625 B): bandwidth-bound while M < {ridge * NVFP4 / 2:.0f}")


if __name__ == "__main__":
    main()
