"""Decode-shaped routed experts as two Triton kernels (section 3 of the skill), checked against float64.

Kernel 1, grid (T * k, I / BLOCK_N): program (p, n) takes copy p = t * k + j, its expert
e = topk_ids[t, j], and the gate rows n*BN .. n*BN+BN-1 and the matching up rows I + n*BN ..;
it streams those rows once, dots them with x[t], and writes silu(gate) * up for its BN outputs.
Kernel 2, grid (T, H / BLOCK_H): program (t, h) loops over the k slots, reads the [BLOCK_H, I]
slice of each selected down_proj[e], and accumulates topk_weights[t, j] * (act @ slice^T) in
float32: the weighted sum is fused, no atomics, deterministic.

Runs on a GPU when one is present, otherwise on the CPU under the Triton interpreter
(TRITON_INTERPRET=1 is set automatically; small shapes, a few seconds). Compares with a float64
reference of the moe/routed-experts definition, and shows that swapping the gate and up halves
(the w1/w3 order mistake) is caught. Exits non-zero on failure. Note: the Triton 3.6 interpreter
rounds float32 -> bfloat16 by truncation (the GPU rounds to nearest even), which alone pushed the
bf16 error of this kernel from 3e-3 to 6e-3; the wrapper keeps bf16 rounding in torch when
interpreting.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


@triton.jit
def gate_up_swiglu_kernel(x_ptr, ids_ptr, w_ptr, act_ptr, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    copy = tl.program_id(0)  # t * TOP_K + j
    tile = tl.program_id(1)
    token = copy // TOP_K
    expert = tl.load(ids_ptr + copy).to(tl.int64)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # gate rows; up rows are I + rows
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    base = w_ptr + expert * (2 * I * H)
    for k0 in range(0, H, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + token * H + cols).to(tl.float32)  # [BLOCK_K]
        wg = tl.load(base + rows[:, None] * H + cols[None, :]).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        wu = tl.load(base + (I + rows)[:, None] * H + cols[None, :]).to(tl.float32)
        gate += tl.sum(wg * xk[None, :], axis=1)
        up += tl.sum(wu * xk[None, :], axis=1)
    act = gate * tl.sigmoid(gate) * up
    tl.store(act_ptr + copy * I + rows, act.to(act_ptr.dtype.element_ty))


@triton.jit
def down_weighted_sum_kernel(act_ptr, ids_ptr, weights_ptr, w_ptr, out_ptr, H: tl.constexpr, I: tl.constexpr,
                             TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr):
    token = tl.program_id(0)
    tile = tl.program_id(1)
    rows = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        copy = token * TOP_K + j
        expert = tl.load(ids_ptr + copy).to(tl.int64)
        weight = tl.load(weights_ptr + copy)
        partial = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for i0 in range(0, I, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            a = tl.load(act_ptr + copy * I + cols).to(tl.float32)  # [BLOCK_I]
            w = tl.load(w_ptr + expert * (H * I) + rows[:, None] * I + cols[None, :]).to(tl.float32)
            partial += tl.sum(w * a[None, :], axis=1)
        acc += weight * partial
    tl.store(out_ptr + token * H + rows, acc.to(out_ptr.dtype.element_ty))


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def routed_experts_decode(x, topk_weights, topk_ids, gate_up_proj, down_proj, out, block_n=16, block_k=32, block_h=32, block_i=32):
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    inter = down_proj.shape[2]
    # The Triton 3.6 interpreter converts float32 to bfloat16 by truncation, not round-to-nearest-even as the
    # GPU does; under the interpreter the kernels write float32 and torch does the (RNE) rounding instead.
    store_dtype = torch.float32 if INTERPRETED else x.dtype
    act = torch.empty(tokens * top_k, inter, dtype=store_dtype, device=x.device)  # [T*k, I]
    gate_up_swiglu_kernel[(tokens * top_k, inter // block_n)](x, topk_ids, gate_up_proj, act, hidden, inter, top_k, block_n, block_k)
    act = act.to(x.dtype)  # the SwiGLU activation rounded to the activation dtype, as the model does
    result = out if store_dtype == out.dtype else torch.empty(out.shape, dtype=store_dtype, device=out.device)
    down_weighted_sum_kernel[(tokens, hidden // block_h)](act, topk_ids, topk_weights, down_proj, result, hidden, inter, top_k, block_h, block_i)
    if result is not out:
        out.copy_(result)


def reference(x, topk_weights, topk_ids, gate_up_proj, down_proj):
    inter = down_proj.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            h = gate_up_proj[e].double() @ x[t].double()
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(topk_weights[t, j]) * (down_proj[e].double() @ a)
    return out


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts, top_k = 3, 64, 32, 16, 4
    ids = torch.rand(tokens, experts, generator=generator).argsort(dim=1)[:, :top_k].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator), dim=1)
    x = torch.randn(tokens, hidden, generator=generator)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=generator) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=generator) * inter**-0.5
    expected = reference(x, weights, ids, gate_up, down)
    failures = 0
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 6e-3)):  # the moe/routed-experts bounds
        rounded = (x.to(dtype), weights, ids, gate_up.to(dtype), down.to(dtype))  # the reference sees the rounded inputs
        target = reference(*rounded)
        out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device=device)  # poisoned
        routed_experts_decode(*[t.to(device) for t in rounded], out)
        error = float((out.double().cpu() - target).norm() / target.norm())
        ok = error <= bound
        failures += not ok
        print(f"{dtype}: relative Frobenius error {error:.2e} (bound {bound:.0e}) {'ok' if ok else 'FAIL'}")
    swapped = torch.cat([gate_up[:, inter:], gate_up[:, :inter]], dim=1)  # up first: the w3_w1 order
    out = torch.full((tokens, hidden), float("nan"), device=device)
    routed_experts_decode(x.to(device), weights.to(device), ids.to(device), swapped.to(device), down.to(device), out)
    error = float((out.double().cpu() - expected).norm() / expected.norm())
    caught = error > 1e-2
    failures += not caught
    print(f"gate/up swapped: relative error {error:.2f} -> {'caught' if caught else 'NOT caught (FAIL)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
