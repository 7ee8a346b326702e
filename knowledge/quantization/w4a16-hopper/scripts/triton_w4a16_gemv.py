"""A plain Triton W4A16 NVFP4 GEMV (decode-sized M), checked against the w4a16-linear contract.

Not a tuned kernel: a readable starting point that shows the arithmetic of ../SKILL.md with the
checkpoint layout as is (weight_packed [N, K/2] K-major, element 2j in the low nibble;
weight_scale [N, K/16] E4M3; weight_scale_2 float32 multiplier). Each program owns BLOCK_N
output rows of one token and walks K; codes are decoded with bit arithmetic (no lookup table),
even and odd elements are multiplied with the even and odd activations so nothing is
re-interleaved, block scales are decoded from their E4M3 bits, weight_scale_2 is applied once in
the epilogue, accumulation is float32.

  python triton_w4a16_gemv.py --check      compare with the contract's float64 reference
                                           (CPU works with TRITON_INTERPRET=1, small shapes)
  python triton_w4a16_gemv.py --bench      time decode shapes on a GPU, against the bandwidth floor
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _e2m1(code):
    """uint8 code (0..15) -> float32 value: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    exponent = ((code >> 1) & 3).to(tl.float32)
    mantissa = (code & 1).to(tl.float32)
    magnitude = tl.where(exponent == 0.0, 0.5 * mantissa, tl.exp2(exponent - 1.0) * (1.0 + 0.5 * mantissa))
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def _e4m3(byte):
    """uint8 bits of a positive float8_e4m3fn -> float32 (subnormals included)."""
    exponent = ((byte >> 3) & 15).to(tl.float32)
    mantissa = (byte & 7).to(tl.float32)
    return tl.where(exponent == 0.0, mantissa * 0.001953125, tl.exp2(exponent - 7.0) * (1.0 + 0.125 * mantissa))


@triton.jit
def _w4a16_gemv_kernel(x_ptr, packed_ptr, scale_ptr, scale_2_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    row_ok = rows < N
    pairs = tl.arange(0, BLOCK_K // 2)  # byte index inside the K step  [BK/2]
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        byte = tl.load(packed_ptr + rows[:, None] * (K // 2) + (k0 // 2 + pairs)[None, :], mask=row_ok[:, None], other=0)  # [BN, BK/2]
        scale_bits = tl.load(scale_ptr + rows[:, None] * (K // 16) + (k0 // 16 + pairs // 8)[None, :], mask=row_ok[:, None], other=0)
        scale = _e4m3(scale_bits)  # one E4M3 scale per 8 bytes = 16 elements, broadcast per byte
        x_even = tl.load(x_ptr + m * K + k0 + 2 * pairs).to(tl.float32)  # [BK/2]
        x_odd = tl.load(x_ptr + m * K + k0 + 2 * pairs + 1).to(tl.float32)
        partial = _e2m1(byte & 15) * x_even[None, :] + _e2m1(byte >> 4) * x_odd[None, :]
        acc += tl.sum(partial * scale, axis=1)
    acc = acc * tl.load(scale_2_ptr)
    tl.store(out_ptr + m * N + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)


def w4a16_linear(x, weight_packed, weight_scale, weight_scale_2, out, block_n: int = 16, block_k: int = 256):
    """out [M, N] = x [M, K] @ dequant(W)^T; the contract's signature."""
    if weight_scale.dtype != torch.float8_e4m3fn or weight_packed.dtype != torch.uint8:
        raise ValueError("weight_scale must be float8_e4m3fn and weight_packed uint8")
    M, K = x.shape
    N = weight_packed.shape[0]
    if weight_packed.shape[1] * 2 != K or weight_scale.shape != (N, K // 16):
        raise ValueError(f"x has {K} features but the weight holds {weight_packed.shape[1] * 2}")
    block_k = min(block_k, K) if K % min(block_k, K) == 0 else 16
    scale_2 = weight_scale_2.reshape(1).to(torch.float32)
    grid = (triton.cdiv(N, block_n), M)
    _w4a16_gemv_kernel[grid](x.contiguous(), weight_packed, weight_scale.view(torch.uint8), scale_2, out, N, K, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def _contract():
    root = next(p for p in Path(__file__).resolve().parents if (p / "contracts").is_dir())
    spec = importlib.util.spec_from_file_location("w4a16_contract", root / "contracts" / "quantization" / "w4a16-linear.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(device: str) -> None:
    contract = _contract()
    shapes = [(1, 48, 64, torch.float32), (7, 96, 256, torch.float32), (5, 80, 128, torch.bfloat16), (4, 512, 2048, torch.bfloat16)]
    if device == "cuda":
        shapes += [(1, 8192, 2048, torch.bfloat16), (8, 16384, 2048, torch.bfloat16)]
    for seed, (m, n, k, dtype) in enumerate(shapes):
        generator = torch.Generator().manual_seed(100 + seed)
        inputs = contract.make_inputs({"M": m, "N": n, "K": k}, {}, dtype, device, generator)
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # poisoned
        w4a16_linear(inputs["x"], inputs["weight_packed"], inputs["weight_scale"], inputs["weight_scale_2"], out)
        expected = contract.reference(**{name: t.cpu() for name, t in inputs.items()})["out"]
        error = float((out.double().cpu() - expected).norm() / expected.norm())
        bound = 1e-5 if dtype == torch.float32 else 5e-3
        print(f"M {m:3d} N {n:6d} K {k:5d} {str(dtype):15s} relative Frobenius error {error:.2e} (bound {bound:.0e})")
        assert error <= bound
        # a known-wrong variant: nibbles swapped must fail the same bound
        swapped = (inputs["weight_packed"] >> 4) | (inputs["weight_packed"] << 4)
        w4a16_linear(inputs["x"], swapped, inputs["weight_scale"], inputs["weight_scale_2"], out)
        assert float((out.double().cpu() - expected).norm() / expected.norm()) > 10 * bound, "nibble swap not caught"
    print("check passed (and a nibble-swapped weight fails it)")


def bench(bandwidth: float) -> None:
    contract = _contract()
    for label, (m, n, k) in {"q_proj m1": (1, 8192, 2048), "expert gate+up m1": (1, 1024, 2048), "8 experts gate+up m1": (1, 8192, 2048),
                             "q_proj m8": (8, 8192, 2048), "lm_head m1": (1, 248320, 2048)}.items():
        inputs = contract.make_inputs({"M": m, "N": n, "K": k}, {}, torch.bfloat16, "cuda", torch.Generator().manual_seed(1))
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        floor = (n * k // 2 + n * k // 16 + 4 + 2 * m * (n + k)) / bandwidth * 1e6
        best = None
        for block_n, block_k in ((16, 256), (32, 256), (64, 128), (16, 512), (32, 512)):
            ms = triton.testing.do_bench(lambda: w4a16_linear(inputs["x"], inputs["weight_packed"], inputs["weight_scale"], inputs["weight_scale_2"], out, block_n, block_k))
            if best is None or ms < best[0]:
                best = (ms, block_n, block_k)
        ms, block_n, block_k = best
        print(f"{label:22s} {ms * 1e3:8.2f} us  floor {floor:7.2f} us  ({floor / (ms * 1e3) * 100:4.0f}% of the floor)  BLOCK_N {block_n} BLOCK_K {block_k}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--bandwidth", type=float, default=4.27e12)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.check or not args.bench:
        check(device)
    if args.bench:
        bench(args.bandwidth)
