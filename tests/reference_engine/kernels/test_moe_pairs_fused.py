"""The decode MoE experts in one launch (`kernels/moe_pairs_fused.py`): gate/up programs, then down programs that load
their weights before they wait for the activations.

Interpreter (one subprocess; programs run in index order there, so no program ever spins): against an independent
float64 reference and against the two per-pair launches with the same decode (`moe_decode` WORDS 3), at T = 1 and 3
(a duplicate row, repeated ids), down tiles of 4, 8 and 64 rows, NaN-poisoned outputs; both counters back at zero after
every call; `moe_block_decode` routes one-token blocks through the launch only when `MAX_TOKENS` admits them (a spy
counts the calls); known-wrong inputs (shared expert dropped, a routed slot dropped, the down tensor scale of one
expert negated) must miss the reference by far more than the bound; the router in the launch too (`BLOCK`), with and
without the norm before the block, against the router launch followed by the experts' launch.
CUDA (real shapes, T = 1, 2, 4, 8): against the two launches, and replayed from a CUDA graph 16 times on fresh inputs
(the counters reset themselves; each replay checked); the block launch with router and norm at T = 1 and 4. Before
each launch a NaN block of the activation size is freed, so a down program that reads early sees poison (run78). The
wait's acquire itself is checked in the sm_90 PTX by `test_spin_wait_ptx.py`.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = r"""
import torch

from reference_engine.kernels import launch, moe_decode, moe_pairs_fused
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(7)
E, H, I, K = 6, 64, 32, 2
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

def deq64(packed, scale, scale_2):
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    return LUT[codes] * scale.double().repeat_interleave(16, dim=-1) * torch.as_tensor(scale_2).double()

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))

def expert64(gate_up_packed, gate_up_scale, gate_up_scale_2, down_packed, down_scale, down_scale_2):
    gate = deq64(gate_up_packed[:I], gate_up_scale[:I], gate_up_scale_2[0])
    up = deq64(gate_up_packed[I:], gate_up_scale[I:], gate_up_scale_2[1])
    return gate, up, deq64(down_packed, down_scale, down_scale_2)

def reference(x, weights, ids, experts, shared):
    # float64 SwiGLU experts on the bfloat16-rounded activation (as the model rounds it), weighted and summed
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(K + 1):
            if j < K:
                e = int(ids[t, j])
                gate, up, down = expert64(experts.gate_up_packed[e], experts.gate_up_scale[e], experts.gate_up_scale_2[e],
                                          experts.down_packed[e], experts.down_scale[e], experts.down_scale_2[e])
            else:
                gate, up, down = expert64(*(getattr(shared, n) for n in ("gate_up_packed", "gate_up_scale", "gate_up_scale_2", "down_packed", "down_scale", "down_scale_2")))
            xt = x[t].double()
            act = (torch.nn.functional.silu(gate @ xt) * (up @ xt)).to(torch.bfloat16).double()
            out[t] += float(weights[t, j]) * (down @ act)
    return out

def rel(out, expected):
    assert torch.isfinite(out).all(), "unwritten (NaN) output"
    return float((out.double() - expected.double()).norm() / expected.double().norm())

def counters_zero(T):
    return int(launch._TICKETS[torch.device("cpu")][: 2 * T].abs().sum()) == 0

BOUND = 1.5e-2  # against float64: float16 products of the packed pairs and bfloat16 outputs (measured below about 5e-3)
AGREE = 4e-3  # against the two launches: the same products, another float32 order of the slot sum, bfloat16 outputs

def case(T):
    x = torch.randn(T, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    if T == 3:
        x[2] = x[1]
        ids[2] = ids[1]
        ids[0, 1] = ids[0, 0]  # a repeated id in a row counts twice
    ids = torch.cat([ids, torch.full((T, 1), E)], 1).int()
    weights = torch.rand(T, K + 1, generator=g) + 0.1
    if T == 3:
        weights[2] = weights[1]
    return x, ids, weights

moe_decode.WORDS = 3  # the two launches with the fused launch's decode (packed float16 pairs, E4M3)
for T in (1, 3):
    x, ids, weights = case(T)
    expected = reference(x, weights, ids, experts, shared)
    two = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, two)
    print(f"T={T} two launches vs float64: {rel(two, expected):.2e}")
    for rows in (4, 8, 64):
        moe_pairs_fused.DOWN_BLOCK_H = rows
        out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
        moe_pairs_fused.fused_pairs_with_shared(x, weights, ids, experts, shared, out, (0, 16, 128))
        error, agree = rel(out, expected), rel(out, two)
        print(f"T={T} rows={rows} fused vs float64: {error:.2e}, vs two launches: {agree:.2e}")
        assert error < BOUND and agree < AGREE, (T, rows, error, agree)
        assert counters_zero(T), "the launch left its counters behind"
        if T == 3:
            assert torch.equal(out[2], out[1])  # duplicate rows, identical outputs
moe_pairs_fused.DOWN_BLOCK_H = 8

# moe_block_decode hands one-token blocks to the launch only when MAX_TOKENS admits them.
router_weight = torch.randn(E + 1, H, generator=g) * 0.15
calls = []
real = moe_pairs_fused.fused_pairs_with_shared
def spy(x, *args, **kwargs):
    calls.append(x.shape[0])
    return real(x, *args, **kwargs)
moe_pairs_fused.fused_pairs_with_shared = spy
moe_decode.BATCH_ONE = (3, 8, 256, 8, 256, 3)  # the committed batch-one setting's form (tiles clipped to this layer)
for T in (1, 3):
    x = torch.randn(T, H, generator=g).bfloat16()
    results = {}
    for max_tokens in (0, 1, 3):
        moe_pairs_fused.MAX_TOKENS = max_tokens
        calls.clear()
        out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
        moe_decode.moe_block_decode(x, router_weight.bfloat16(), experts, shared, K, out)
        assert calls == ([T] if T <= max_tokens else []), (T, max_tokens, calls)
        results[max_tokens] = out
    agree = rel(results[3], results[0])
    print(f"block T={T} fused vs two launches: {agree:.2e}")
    assert agree < AGREE, (T, agree)
moe_pairs_fused.fused_pairs_with_shared = real

# The router in the launch too (BLOCK), with and without the norm before the block: the same outputs as the router
# launch followed by the experts' launch, the normed row and the sum written, every counter back at zero.
from reference_engine.kernels import router
from reference_engine.ops.norms import AddNorm
moe_pairs_fused.MAX_TOKENS = 3
for T in (1, 3):
    x = torch.randn(T, H, generator=g).bfloat16()
    residual = torch.randn(T, H, generator=g).bfloat16()
    norm_weight = (torch.randn(H, generator=g) * 0.1).bfloat16()
    for add_norm in (False, True):
        router.ADD_NORM = add_norm
        results = {}
        for block in (False, True):
            moe_pairs_fused.BLOCK = block
            normed = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
            summed = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
            out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
            moe_decode.moe_block_decode_add_norm(x, AddNorm(residual, norm_weight, normed, summed, 1e-6), router_weight.bfloat16(), experts, shared, K, out)
            assert torch.isfinite(out).all() and torch.isfinite(normed).all() and torch.isfinite(summed).all()
            assert int(launch._TICKETS[torch.device("cpu")][: 4 * T].abs().sum()) == 0, "the block launch left a counter behind"
            results[block] = (out, normed, summed)
        for a, b in zip(results[False], results[True]):
            assert rel(b, a) < AGREE, (T, add_norm, rel(b, a))
        print(f"block launch T={T} add_norm={add_norm}: vs router + experts launches {rel(results[True][0], results[False][0]):.2e}")
router.ADD_NORM = False
moe_pairs_fused.BLOCK = False
moe_pairs_fused.MAX_TOKENS = 0
moe_decode.BATCH_ONE = None

# Known-wrong inputs: each must miss the float64 reference by far more than the bound.
x, ids, weights = case(3)
expected = reference(x, weights, ids, experts, shared)
def drop_shared(w):
    w = w.clone(); w[:, K] = 0; return w
def drop_slot(w):
    w = w.clone(); w[:, 1] = 0; return w
wrong_down = static_moe.StackedNvfp4Experts(*(getattr(experts, n) for n in ("gate_up_packed", "gate_up_scale", "gate_up_scale_2", "down_packed", "down_scale")),
                                            experts.down_scale_2 * torch.tensor([1.0] * (E - 1) + [-1.0]))
for name, w, stack in (("shared dropped", drop_shared(weights), experts), ("slot 1 dropped", drop_slot(weights), experts),
                       ("down scale of the last expert negated", weights, wrong_down)):
    ids_used = ids.clone()
    ids_used[:, 0] = E - 1  # every row uses the last expert (so its changed scale shows)
    want = reference(x, weights, ids_used, experts, shared)
    out = torch.full((3, H), float("nan"), dtype=torch.bfloat16)
    moe_pairs_fused.fused_pairs_with_shared(x, w, ids_used, stack, shared, out, (0, 16, 128))
    error = rel(out, want)
    print(f"wrong {name}: {error:.2e}")
    assert error > 10 * BOUND, (name, error)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT)


@pytest.mark.slow
def test_fused_launch_matches_reference_and_two_launches_and_rejects_wrong_inputs(run):
    assert_script_ok(run)


def poison_next_activation_buffer(tokens: int) -> None:
    """Free a NaN block of the launch's activation size just before it allocates one: the caching allocator hands that
    block back, so a down program that reads before its gate/up programs stored shows NaN instead of the previous
    call's (correct) activations, which hid the dropped acquire at 1 and 8 tokens in run78."""
    from real_moe_layer import INTER, TOP_K

    poison = torch.full((tokens * (TOP_K + 1), INTER), float("nan"), dtype=torch.bfloat16, device="cuda")
    del poison


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_fused_launch_on_cuda_matches_two_launches_and_replays(tokens):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from real_moe_layer import HIDDEN, real_decode_inputs

    from reference_engine.kernels import launch, moe_decode, moe_pairs_fused
    from reference_engine.kernels.tuning import apply_for_cuda

    apply_for_cuda()
    experts, shared, x, ids, weights = real_decode_inputs(tokens)
    tiles = moe_decode._settings(tokens)[:3]
    want = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
    moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, want)
    for rows, sleep_ns in ((4, 0), (8, 0), (16, 0), (4, 1000)):  # the last: waiting programs sleep between reads (SPIN_NS)
        moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.SPIN_NS = rows, sleep_ns
        got = torch.full_like(want, float("nan"))
        poison_next_activation_buffer(tokens)
        moe_pairs_fused.fused_pairs_with_shared(x, weights, ids, experts, shared, got, tiles)
        torch.cuda.synchronize()
        assert torch.isfinite(got).all()
        error = float((got.double() - want.double()).norm() / want.double().norm())
        assert error < 4e-3, (rows, sleep_ns, error)
    moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.SPIN_NS = 8, 0
    out = torch.full_like(want, float("nan"))
    graph = torch.cuda.CUDAGraph()
    moe_pairs_fused.fused_pairs_with_shared(x, weights, ids, experts, shared, out, tiles)  # compiled before capture
    with torch.cuda.graph(graph):
        moe_pairs_fused.fused_pairs_with_shared(x, weights, ids, experts, shared, out, tiles)
    generator = torch.Generator().manual_seed(99)
    for _ in range(16):
        x.copy_(torch.randn(x.shape, generator=generator).bfloat16())
        ids[:, :-1].copy_(torch.stack([torch.randperm(256, generator=generator)[:8] for _ in range(tokens)]).int())
        out.fill_(float("nan"))
        graph.replay()
        expected = torch.full_like(want, float("nan"))
        moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, expected)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        error = float((out.double() - expected.double()).norm() / expected.double().norm())
        assert error < 4e-3, error
    assert int(launch._TICKETS[x.device][: 2 * tokens].abs().sum()) == 0


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4])
def test_block_launch_with_router_and_norm_on_cuda_matches_separate_launches(tokens):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from real_moe_layer import EXPERTS, HIDDEN, TOP_K, real_decode_inputs

    from reference_engine.kernels import launch, moe_decode, moe_pairs_fused, router
    from reference_engine.kernels.tuning import apply_for_cuda
    from reference_engine.ops.norms import AddNorm

    apply_for_cuda()
    experts, shared, x, _, _ = real_decode_inputs(tokens)
    generator = torch.Generator().manual_seed(tokens + 50)
    router_weight = (torch.randn(EXPERTS + 1, HIDDEN, generator=generator) * HIDDEN**-0.5).bfloat16().cuda()
    residual = torch.randn(tokens, HIDDEN, generator=generator).bfloat16().cuda()
    norm_weight = (torch.randn(HIDDEN, generator=generator) * 0.1).bfloat16().cuda()
    saved = moe_pairs_fused.MAX_TOKENS, moe_pairs_fused.BLOCK, router.ADD_NORM
    try:
        for add_norm in (False, True):
            router.ADD_NORM = add_norm
            results = {}
            for setting in ("off", "block"):
                moe_pairs_fused.MAX_TOKENS = 0 if setting == "off" else tokens
                moe_pairs_fused.BLOCK = setting == "block"
                buffers = [torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(3)]
                poison_next_activation_buffer(tokens)
                moe_decode.moe_block_decode_add_norm(x, AddNorm(residual, norm_weight, buffers[0], buffers[1], 1e-6), router_weight, experts, shared,
                                                     TOP_K, buffers[2])  # fmt: skip
                torch.cuda.synchronize()
                results[setting] = buffers
            for got, want in zip(results["block"], results["off"], strict=True):
                assert torch.isfinite(got).all()
                error = float((got.double() - want.double()).norm() / want.double().norm())
                assert error < 4e-3, (add_norm, error)
            assert int(launch._TICKETS[x.device][: 4 * tokens].abs().sum()) == 0
    finally:
        moe_pairs_fused.MAX_TOKENS, moe_pairs_fused.BLOCK, router.ADD_NORM = saved
