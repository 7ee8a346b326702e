"""When does FP4 x FP4 (W4A4) beat weight-only W4A16? Roofline floors for Qwen3.6-35B-A3B shapes.

floor = max(bytes / bandwidth, flops / peak). W4A16 multiplies on the bf16 tensor cores (the
weights are dequantised in registers); W4A4 on the FP4 tensor cores (B200 only). Bytes: NVFP4
weights (0.5625 B each) + bf16 activations in + bf16 out; W4A4 activations are quantised on the
fly inside the GEMM's producer, so they are read once in bf16 as well.
Ceilings: H200 measured 4.27 TB/s and 690 TFLOP/s bf16 (this project, 2026-12-02); B200 datasheet
8 TB/s, 2.25 PFLOP/s bf16 dense, 9 PFLOP/s FP4 dense.

Run: python w4a4_vs_w4a16.py
"""

from __future__ import annotations

NVFP4 = 0.5625
H200 = {"bandwidth": 4.27e12, "bf16": 690e12}
B200 = {"bandwidth": 8.0e12, "bf16": 2.25e15, "fp4": 9.0e15}


def dense(m: int, n: int, k: int) -> tuple[float, float]:
    """(bytes, flops) of one linear over m tokens."""
    return n * k * NVFP4 + 2 * m * (n + k), 2.0 * m * n * k


def moe_layer(m: int, experts: int = 256, top_k: int = 8, inter: int = 512, hidden: int = 2048) -> tuple[float, float]:
    """(bytes, flops) of the routed experts of one layer over m tokens (expected distinct experts)."""
    distinct = experts * (1 - (1 - top_k / experts) ** m)
    weights = distinct * 3 * inter * hidden * NVFP4
    activations = 2 * m * top_k * (hidden + 2 * inter + inter + hidden)
    return weights + activations, 2.0 * m * top_k * 3 * inter * hidden


def floor_us(bytes_, flops, bandwidth, peak) -> float:
    return max(bytes_ / bandwidth, flops / peak) * 1e6


def main() -> None:
    print(f"{'shape':34s} {'M':>5s} {'H200 W4A16':>11s} {'B200 W4A16':>11s} {'B200 W4A4':>10s}  (floors, us)")
    for label, cost in (("q_proj 2048 -> 8192", lambda m: dense(m, 8192, 2048)), ("routed experts, one layer", moe_layer)):
        for m in (1, 8, 64, 256, 1024, 8192):
            b, f = cost(m)
            h = floor_us(b, f, H200["bandwidth"], H200["bf16"])
            w16 = floor_us(b, f, B200["bandwidth"], B200["bf16"])
            w4 = floor_us(b, f, B200["bandwidth"], B200["fp4"])
            print(f"{label:34s} {m:5d} {h:11.2f} {w16:11.2f} {w4:10.2f}  {'W4A4 wins x%.1f' % (w16 / w4) if w16 > 1.05 * w4 else 'same floor'}")
    for name, peak in (("bf16", B200["bf16"]), ("fp4", B200["fp4"])):
        ridge = peak / B200["bandwidth"]
        print(f"B200 {name}: ridge {ridge:.0f} FLOP/B; NVFP4 weights bandwidth-bound while M < {ridge * NVFP4 / 2:.0f}")


if __name__ == "__main__":
    main()
