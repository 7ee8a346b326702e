"""The norm before the MoE block folded into the fused router launch (`router.ADD_NORM`, `moe_block_decode_add_norm`).

Interpreter (one subprocess), T = 1, 3 (a duplicate row) and 5 (over `FUSED_ROUTER_MAX_TOKENS`: the norm kernel runs),
float32 and bfloat16, every output poisoned with NaN:
- with the fold on, the norm kernel is never called up to 4 tokens (it raises if it is);
- residual_out and the normed rows equal the Triton norm kernel's bit for bit, and the torch op's residual_out bit for
  bit and its normed rows to one rounding; the block's output equals the unfolded Triton op's bit for bit and the torch
  composition `ops.static_moe.moe_block_decode_add_norm` within the block contract's bound;
- a known-wrong writer (no program stores the normed rows) is caught;
- the tickets are back at zero, and a tiny NVFP4 model's decode block through the op equals its eager path.
In process: the torch op equals the norm then the block, the graph-decode model path routes the block through it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = r"""
from dataclasses import replace

import torch

from reference_engine.kernels import launch, moe_decode, norms, router
from reference_engine.ops import norms as torch_norms, static_moe
from reference_engine.ops.backend import torch_ops
from reference_engine.ops.norms import AddNorm
from reference_engine.presets import build_preset
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(23)
E, H, I, K = 6, 64, 32, 2

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
router_weight = torch.randn(E + 1, H, generator=g) * 0.15

def poisoned(T, dtype):
    return torch.full((T, H), float("nan"), dtype=dtype)

def run(op, x, residual, weight, rw, dtype):
    T = x.shape[0]
    add_norm = AddNorm(residual, weight, poisoned(T, dtype), poisoned(T, dtype), 1e-6)
    out = poisoned(T, dtype)
    op(x, add_norm, rw, experts, shared, K, out)
    for name, tensor in (("out", out), ("normed", add_norm.out), ("residual_out", add_norm.residual_out)):
        assert torch.isfinite(tensor).all(), f"{name} left unwritten (NaN)"
    return out, add_norm.out, add_norm.residual_out

def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

real_norm = norms.fused_add_rms_norm
def no_norm_launch(*args, **kwargs):
    raise AssertionError("the norm kernel ran although the router launch folds it in")

for T in (1, 3, 5):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(T, H, generator=g) * 0.7
        residual = torch.randn(T, H, generator=g) * 1.3
        if T == 3:
            x[2], residual[2] = x[1], residual[1]
        x, residual, rw = x.to(dtype), residual.to(dtype), router_weight.to(dtype)
        weight = (torch.randn(H, generator=g) * 0.2).to(dtype)
        router.ADD_NORM = True
        folds = moe_decode.folds_norm(x, rw)
        assert folds == (T <= router.FUSED_ROUTER_MAX_TOKENS), (T, folds)
        if folds:
            norms.fused_add_rms_norm = no_norm_launch
        try:
            fused = run(moe_decode.moe_block_decode_add_norm, x, residual, weight, rw, dtype)
        finally:
            norms.fused_add_rms_norm = real_norm
        router.ADD_NORM = False
        plain = run(moe_decode.moe_block_decode_add_norm, x, residual, weight, rw, dtype)
        composed = run(static_moe.moe_block_decode_add_norm, x, residual, weight, rw, dtype)
        # the Triton norm kernel alone
        kernel_normed, kernel_sum = poisoned(T, dtype), poisoned(T, dtype)
        real_norm(x, residual, weight, out=kernel_normed, residual_out=kernel_sum, eps=1e-6)
        assert torch.equal(fused[2], kernel_sum) and torch.equal(fused[2], composed[2]), (T, dtype, "residual_out")
        assert torch.equal(fused[1], kernel_normed), (T, dtype, "normed rows differ from the norm kernel's", rel(fused[1], kernel_normed))
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-22
        torch.testing.assert_close(fused[1].float(), composed[1].float(), rtol=ulp, atol=1e-6)
        assert torch.equal(fused[0], plain[0]), (T, dtype, "the folded block differs from norm kernel + block", rel(fused[0], plain[0]))
        error = rel(fused[0], composed[0])
        print(f"T={T} {dtype} folded={folds} vs torch composition: {error:.2e}")
        assert error < {torch.float32: 1e-5, torch.bfloat16: 8e-3}[dtype], (T, dtype, error)
        if T == 3:
            assert torch.equal(fused[0][2], fused[0][1])
        assert int(launch._TICKETS[x.device].abs().sum()) == 0, "tickets left behind"

# Known-wrong: no program of a token stores the normed rows and the sum (the writer index past the last program).
router.ADD_NORM, router.NORM_WRITER = True, 10**6
x, residual = torch.randn(1, H, generator=g), torch.randn(1, H, generator=g)
try:
    run(moe_decode.moe_block_decode_add_norm, x, residual, torch.randn(H, generator=g) * 0.2, router_weight, torch.float32)
except AssertionError as error:
    assert "left unwritten" in str(error), error
    print(f"wrong writer caught: {error}")
else:
    raise AssertionError("a fused router that never stores the normed rows passed")
router.NORM_WRITER = 0

# A tiny NVFP4 model's block through the op (fold on) against its eager path on the normed rows.
model = build_preset("tiny", quantize="nvfp4", seed=5)
layer = model.layers[1]
ops = replace(torch_ops(), moe_block_decode_add_norm=moe_decode.moe_block_decode_add_norm)
assert layer.mlp.takes_add_norm(ops)
for T in (1, 3):
    x = torch.randn(T, model.config.hidden_size, generator=g)
    residual = torch.randn(T, model.config.hidden_size, generator=g)
    add_norm = AddNorm(residual, layer.post_attention_layernorm, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), layer.eps)
    got = layer.mlp.decode_add_norm(x, add_norm, ops)
    normed, summed = torch.empty_like(x), torch.empty_like(x)
    torch_norms.fused_add_rms_norm(x, residual, layer.post_attention_layernorm, out=normed, residual_out=summed, eps=layer.eps)
    assert torch.equal(add_norm.residual_out, summed)
    error = rel(got, layer.mlp(normed))
    print(f"tiny block T={T} folded vs eager: {error:.2e}")
    assert error < 1e-5, (T, error)
router.ADD_NORM = False
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT)


def test_router_folds_the_norm_and_equals_the_norm_kernel_then_the_block(run):
    assert_script_ok(run)
    output = run["script"]["output"]
    assert "folded=True" in output and "folded=False" in output and "wrong writer caught" in output


def test_torch_op_is_the_norm_then_the_block():
    from reference_engine.kernels.moe_decode import stack_nvfp4_experts
    from reference_engine.ops import static_moe
    from reference_engine.ops.norms import AddNorm, fused_add_rms_norm
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    g = torch.Generator().manual_seed(4)
    E, H, I, K, T = 5, 32, 16, 2, 3

    def q(rows, cols):
        return quantize_nvfp4(torch.randn(rows, cols, generator=g) * 0.3)

    experts = stack_nvfp4_experts([q(I, H) for _ in range(E)], [q(I, H) for _ in range(E)], [q(H, I) for _ in range(E)])
    shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H), q(I, H), q(H, I))
    rw, x, residual, weight = torch.randn(E + 1, H, generator=g), torch.randn(T, H, generator=g), torch.randn(T, H, generator=g), torch.randn(H, generator=g)
    add_norm = AddNorm(residual, weight, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), 1e-6)
    out = torch.full_like(x, float("nan"))
    static_moe.moe_block_decode_add_norm(x, add_norm, rw, experts, shared, K, out)
    normed, summed, expected = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    fused_add_rms_norm(x, residual, weight, out=normed, residual_out=summed, eps=1e-6)
    static_moe.moe_block_decode(normed, rw, experts, shared, K, expected)
    assert torch.equal(add_norm.out, normed) and torch.equal(add_norm.residual_out, summed) and torch.equal(out, expected)
    with pytest.raises(ValueError, match="residual"):
        static_moe.moe_block_decode_add_norm(x, replace(add_norm, residual=residual[:, :-1]), rw, experts, shared, K, out)
    with pytest.raises(ValueError, match="contiguous"):
        static_moe.moe_block_decode_add_norm(x, replace(add_norm, out=torch.empty(H, T).t()), rw, experts, shared, K, out)


def test_graph_decode_routes_the_moe_block_through_the_add_norm_op():
    from reference_engine.ops import static_moe
    from reference_engine.ops.backend import torch_ops
    from reference_engine.presets import build_preset

    model = build_preset("tiny", quantize="nvfp4", seed=5)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return static_moe.moe_block_decode_add_norm(*args, **kwargs)

    ops = replace(torch_ops(), moe_block_decode_add_norm=counted)
    layer = model.layers[0]
    assert layer.mlp.takes_add_norm(ops) and not layer.mlp.takes_add_norm(None)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, model.config.hidden_size, generator=g)
    residual = torch.randn(2, model.config.hidden_size, generator=g)
    from reference_engine.ops.norms import AddNorm

    add_norm = AddNorm(residual, layer.post_attention_layernorm, torch.empty_like(x), torch.empty_like(x), layer.eps)
    out = layer.mlp.decode_add_norm(x, add_norm, ops)
    assert calls == [2] and out.shape == x.shape and torch.isfinite(out).all()


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3])
def test_folded_norm_equals_the_norm_kernel_on_cuda_at_the_real_shape(tokens, monkeypatch):
    """H = 2048, E = 256: the sum bit-equal, the normed rows within one bf16 rounding of the norm kernel's (another
    reduction tree), the block's output within the bf16 block bound of norm kernel + block."""
    from real_moe_layer import HIDDEN, TOP_K, real_decode_inputs

    from reference_engine.kernels import moe_decode, norms, router
    from reference_engine.ops.norms import AddNorm

    experts, shared, x, _, _ = real_decode_inputs(tokens)
    generator = torch.Generator().manual_seed(100 + tokens)
    residual = (torch.randn(tokens, HIDDEN, generator=generator) * 2).bfloat16().cuda()
    weight = (torch.randn(HIDDEN, generator=generator) * 0.2).bfloat16().cuda()
    router_weight = (torch.randn(experts.num_experts + 1, HIDDEN, generator=generator) * HIDDEN**-0.5).bfloat16().cuda()

    def run(on: bool):
        monkeypatch.setattr(router, "ADD_NORM", on)
        assert moe_decode.folds_norm(x, router_weight) == on
        add_norm = AddNorm(residual, weight, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), 1e-6)
        out = torch.full_like(x, float("nan"))
        moe_decode.moe_block_decode_add_norm(x, add_norm, router_weight, experts, shared, TOP_K, out)
        torch.cuda.synchronize()
        return out, add_norm.out, add_norm.residual_out

    folded, plain = run(True), run(False)
    normed, summed = torch.empty_like(x), torch.empty_like(x)
    norms.fused_add_rms_norm(x, residual, weight, out=normed, residual_out=summed, eps=1e-6)
    assert torch.equal(folded[2], summed) and torch.equal(plain[2], summed)
    torch.testing.assert_close(folded[1].float(), normed.float(), rtol=2.0**-7, atol=0.0)
    assert torch.isfinite(folded[0]).all()
    error = float((folded[0].double() - plain[0].double()).norm() / plain[0].double().norm())
    assert error < 8e-3, error
