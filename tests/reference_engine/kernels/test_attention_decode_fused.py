"""The fused decode pieces of a gated-attention layer and the stacked NVFP4 GEMV, under the Triton interpreter.

- `attention_decode_prep` (q/k zero-centred RMSNorm, half-split partial RoPE, K/V cache write) against an
  independent float64 reference, for the torch op and the Triton kernel;
- `paged_decode_gated` (paged decode times sigmoid(gate), the gate read from the q_proj output) likewise;
- `w4a16_linear_rows` (stacked NVFP4 linears, one tensor scale per row) against the separate linears;
- known-wrong variants (interleaved rotary pairs, norm weight not zero-centred, gate from the query half,
  one shared tensor scale for the stack) are rejected by the same comparisons.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import run_script

SCRIPT = r"""
import torch
from reference_engine.kernels import attention_prep, nvfp4_gemv, paged_decode
from reference_engine.model.linear import Linear
from reference_engine.model.stacked_linear import stack_linears
from reference_engine.ops import static_attention
from reference_engine.quant.linear import w4a16_linear, w4a16_linear_rows
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

g = torch.Generator().manual_seed(11)
T, HQ, HKV, D, R, NB, BS, EPS, THETA = 3, 4, 2, 32, 8, 7, 4, 1e-6, 1e7

def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

def reference_prep(q_gate, key, value, q_norm, k_norm, positions, slots, k_cache, v_cache, interleaved=False, plain_weight=False):
    # float64, from the model's definition
    def norm(x, w):
        y = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
        return y * (w.double() if plain_weight else 1.0 + w.double())
    def rope(x):
        inv = 1.0 / THETA ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
        ang = positions.double()[:, None, None] * inv  # [T, 1, R/2]
        out = x.clone()
        if interleaved:
            a, b = x[..., 0:R:2], x[..., 1:R:2]
            out[..., 0:R:2], out[..., 1:R:2] = a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()
        else:
            a, b = x[..., : R // 2], x[..., R // 2 : R]
            out[..., : R // 2], out[..., R // 2 : R] = a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()
        return out
    q = rope(norm(q_gate.reshape(T, HQ, 2, D)[:, :, 0], q_norm))
    k = rope(norm(key.reshape(T, HKV, D), k_norm))
    kc, vc = k_cache.double().clone(), v_cache.double().clone()
    kc.view(-1, HKV, D)[slots], vc.view(-1, HKV, D)[slots] = k, value.reshape(T, HKV, D).double()
    return q, kc, vc

for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
    stacked = torch.randn(T, HQ * 2 * D + 2 * HKV * D + 8, generator=g).to(dtype)[:, 4:-4]  # strided row views
    q_gate, key, value = stacked.split([HQ * 2 * D, HKV * D, HKV * D], 1)
    q_norm, k_norm = (0.3 * torch.randn(D, generator=g)).to(dtype), (0.3 * torch.randn(D, generator=g)).to(dtype)
    positions = torch.tensor([0, 9, 200003], dtype=torch.int64)
    slots = torch.tensor([5, 13, 26], dtype=torch.int64)
    k0, v0 = torch.randn(NB, BS, HKV, D, generator=g).to(dtype), torch.randn(NB, BS, HKV, D, generator=g).to(dtype)
    expected = reference_prep(q_gate, key, value, q_norm, k_norm, positions, slots, k0, v0)
    wrong = [reference_prep(q_gate, key, value, q_norm, k_norm, positions, slots, k0, v0, interleaved=True),
             reference_prep(q_gate, key, value, q_norm, k_norm, positions, slots, k0, v0, plain_weight=True)]
    for name, op in (("torch", static_attention.attention_decode_prep), ("triton", attention_prep.attention_decode_prep)):
        kc, vc = k0.clone(), v0.clone()
        query = torch.full((T, HQ, D), float("nan"), dtype=dtype)
        op(q_gate, key, value, q_norm, k_norm, positions, kc, vc, slots, query, EPS, R, THETA)
        assert torch.isfinite(query).all(), name
        errors = [rel(query, expected[0]), rel(kc, expected[1]), rel(vc, expected[2])]
        assert max(errors) < bound, (name, dtype, errors)
        for bad in wrong:  # the same comparison rejects a wrong rotation and a wrong norm weight
            assert rel(query, bad[0]) > 10 * bound and rel(kc, bad[1]) > 10 * bound, (name, dtype)
        others = torch.ones(NB * BS, dtype=torch.bool)
        others[slots] = False
        assert torch.equal(kc.view(NB * BS, -1)[others], k0.view(NB * BS, -1)[others]), name
        assert torch.equal(vc.view(NB * BS, -1)[others], v0.view(NB * BS, -1)[others]), name
        print(name, dtype, "prep errors", ["%.1e" % e for e in errors])

    # gated paged decode: attention over the cache times sigmoid(gate), the gate at columns [h*2D+D, (h+1)*2D)
    query = expected[0].to(dtype)
    kc, vc = expected[1].to(dtype), expected[2].to(dtype)
    tables = torch.stack([torch.randperm(NB, generator=g) for _ in range(T)]).to(torch.int32)
    lens = torch.tensor([1, 11, NB * BS], dtype=torch.int32)
    def reference_gated(gate_half):
        rows = []
        for t in range(T):
            keys = kc[tables[t].long()].reshape(-1, HKV, D)[: lens[t]].double()
            vals = vc[tables[t].long()].reshape(-1, HKV, D)[: lens[t]].double()
            heads = []
            for h in range(HQ):
                j = h // (HQ // HKV)
                p = torch.softmax(keys[:, j] @ query[t, h].double() * D**-0.5, 0)
                gate = q_gate[t].reshape(HQ, 2, D)[h, gate_half].double()
                heads.append((p @ vals[:, j]) * torch.sigmoid(gate))
            rows.append(torch.cat(heads))
        return torch.stack(rows)
    want, bad = reference_gated(1), reference_gated(0)
    for name, op in (("torch", static_attention.paged_decode_gated), ("triton", paged_decode.paged_decode_gated)):
        out = torch.full((T, HQ * D), float("nan"), dtype=dtype)
        op(query, kc, vc, tables, lens, q_gate, out, D**-0.5)
        error = rel(out, want)
        assert torch.isfinite(out).all() and error < bound, (name, dtype, error)
        assert rel(out, bad) > 10 * bound, (name, dtype)
        print(name, dtype, "gated decode error %.1e" % error)

# stacked NVFP4 linears: one launch equals the separate linears; one shared tensor scale would not
parts = [torch.randn(n, 64, generator=g) * s for n, s in ((48, 1.0), (16, 40.0), (32, 0.01))]
linears = []
for weight in parts:
    packed, scale, scale_2 = quantize_nvfp4(weight)
    linears.append(Linear(weight.shape[0], 64, weight_packed=packed, weight_scale=scale, weight_scale_2=scale_2))
stack, views = stack_linears(linears)
assert stack.out_features == (48, 16, 32) and stack.row_scale_2.shape == (96,)
for view, linear in zip(views, linears):
    assert torch.equal(view.dense_weight(torch.float32), linear.dense_weight(torch.float32))
    assert view.weight_packed.data_ptr() != linear.weight_packed.data_ptr()  # views of the stack, not the originals
for M in (1, 3):
    x = torch.randn(M, 64, generator=g)
    separate = torch.cat([w4a16_linear(x, l.weight_packed, l.weight_scale, l.weight_scale_2, torch.empty(M, l.out_features)) for l in linears], 1)
    for name, op in (("torch", w4a16_linear_rows), ("triton", nvfp4_gemv.w4a16_linear_rows)):
        out = torch.full((M, 96), float("nan"))
        op(x, stack.weight_packed, stack.weight_scale, stack.row_scale_2, out)
        assert rel(out, separate) < 1e-6, (name, M, rel(out, separate))
    shared = torch.full((M, 96), float("nan"))
    nvfp4_gemv.w4a16_linear(x, stack.weight_packed, stack.weight_scale, linears[0].weight_scale_2, shared)
    assert rel(shared, separate) > 1e-2  # the wrong variant: one tensor scale for all rows
    y = stack(x)
    assert [tuple(part.shape) for part in y] == [(M, 48), (M, 16), (M, 32)]
    assert rel(torch.cat(y, 1), separate) < 1e-6
try:
    w4a16_linear_rows(x, stack.weight_packed, stack.weight_scale, stack.row_scale_2[:-1], torch.empty(3, 96))
except ValueError as error:
    assert "row_scale_2 must be float32 [96]" in str(error), error
else:
    raise AssertionError("a short row_scale_2 was accepted")
print("ok")
"""


def test_fused_attention_decode_pieces_under_the_interpreter():
    output = run_script(SCRIPT)
    assert output.strip().endswith("ok"), output


@pytest.mark.cuda
def test_fused_attention_decode_pieces_on_cuda():
    from reference_engine.kernels import attention_prep, paged_decode
    from reference_engine.ops import static_attention

    torch.manual_seed(0)
    device, T, HQ, HKV, D, R, NB, BS = "cuda", 4, 16, 2, 256, 64, 64, 16
    q_gate = torch.randn(T, HQ * 2 * D, device=device).bfloat16()
    key, value = torch.randn(T, HKV * D, device=device).bfloat16(), torch.randn(T, HKV * D, device=device).bfloat16()
    q_norm, k_norm = (0.3 * torch.randn(D, device=device)).bfloat16(), (0.3 * torch.randn(D, device=device)).bfloat16()
    positions = torch.tensor([0, 17, 1023, 150000], device=device)
    slots = torch.tensor([3, 40, 200, 1000], device=device)
    k0, v0 = torch.randn(NB, BS, HKV, D, device=device).bfloat16(), torch.randn(NB, BS, HKV, D, device=device).bfloat16()
    results = []
    for op in (static_attention.attention_decode_prep, attention_prep.attention_decode_prep):
        kc, vc, query = k0.clone(), v0.clone(), torch.full((T, HQ, D), float("nan"), device=device, dtype=torch.bfloat16)
        op(q_gate, key, value, q_norm, k_norm, positions, kc, vc, slots, query, 1e-6, R, 1e7)
        results.append((query, kc, vc))
    for a, b in zip(*results):
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 1e-2
    query, kc, vc = results[1]
    tables = torch.randperm(NB, device=device)[: T * 16].reshape(T, 16).to(torch.int32)
    lens = torch.tensor([1, 100, 255, 256], device=device, dtype=torch.int32)
    expected = torch.empty(T, HQ * D, device=device, dtype=torch.bfloat16)
    static_attention.paged_decode_gated(query, kc, vc, tables, lens, q_gate, expected, D**-0.5)
    out = torch.full_like(expected, float("nan"))
    paged_decode.paged_decode_gated(query, kc, vc, tables, lens, q_gate, out, D**-0.5)
    assert float((out.double() - expected.double()).norm() / expected.double().norm()) < 1e-2
