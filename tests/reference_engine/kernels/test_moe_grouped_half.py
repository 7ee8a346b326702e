"""The decode MoE block with the experts grouped by expert in packed float16 on CUDA cores (`moe_grouped_half`).

Interpreter (a subprocess per test, so each stays inside the per-test time limit on a slow 2-core CPU): the contract
moe/moe-block-decode's bfloat16 CPU cases through the grouped path, and a known-wrong variant (each routed expert
applied to its first pair only) that the contract's cases must reject; then, one case per test, scripts against the torch op (float32 x) and the per-pair Triton kernels (the same bfloat16 x), with chunks of 1, 2, 3
and 4 tokens, a busy expert of more than one chunk, a shared expert of several chunks with a short last one, repeated
ids within a row, act, y and outputs poisoned with NaN, and x and the activation converted once into float16 pairs
(plan `pairs` 1) giving the same bits; two more known-wrong variants (first chunk only, too few
shared-expert programs) must miss by far. CUDA: the real layer against the per-pair kernels at batch 8, 32 and 64.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import (
    assert_all_passed,
    assert_script_ok,
    contract_records,
    interpreter_run,
)

CONTRACT = "moe/moe-block-decode"
IMPL = "grouped_variants:moe_block_decode_half_grouped"
CPU_CASES = ["small-bf16", "one-token-bf16", "every-expert-chosen-bf16", "router-without-shared-row", "top-k-zero"]
WRONG = {"half_grouped_first_pair_only": ["small-bf16", "every-expert-chosen-bf16"]}

PREAMBLE = r"""
import torch
from reference_engine.kernels import moe_decode, moe_grouped_half as half
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4
import wrong_kernels

g = torch.Generator().manual_seed(23)
E, H, I, K = 6, 128, 64, 2
def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)
experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
half.POISON_SCRATCH = True  # act and y start as NaN: a pair the kernels skip cannot borrow an earlier call's memory

def rel(out, expected):
    assert torch.isfinite(out).all(), "unwritten (NaN) output"
    return float((out.double() - expected.double()).norm() / expected.double().norm())

def run(op, x, ids, w, **kwargs):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype)
    op(x, w, ids, experts, shared, out, **kwargs)
    return out
"""

# Group sizes: T=2 with ids (0, 1) / (0, 2): expert 0 two pairs (a chunk of 2), experts 1, 2 one each; T=3 all on
# expert 3 (a chunk of 3) plus repeated ids; T=9 with expert 2 in every row (9 pairs: chunks 4, 4, 1) and a shared
# expert of 3 chunks (4, 4, 1). One subprocess per case: each stays far inside the per-test time limit on a slow CPU.
CASES = {
    "T2-chunk-of-2": "torch.tensor([[0, 1], [0, 2]])",
    "T3-chunk-of-3-repeated-ids": "torch.tensor([[3, 3], [3, 4], [5, 1]])",
    "T9-chunks-4-4-1": "torch.cat([torch.full((9, 1), 2), torch.randint(3, E, (9, 1), generator=g)], 1)",
}

CASE_SCRIPT = r"""
ids = __IDS__
T = ids.shape[0]
counts = torch.bincount(ids.flatten(), minlength=E).tolist()
ids = torch.cat([ids, torch.full((T, 1), E)], 1).int()
w = torch.rand(T, K + 1, generator=g) + 0.1
x = torch.randn(T, H, generator=g)
xb = x.bfloat16()
grouped = run(half.half_grouped_experts_with_shared, xb, ids, w)
torch_op = run(static_moe.nvfp4_experts_with_shared, xb.float(), ids, w)
per_pair = run(moe_decode.nvfp4_experts_with_shared, xb, ids, w)
to_torch, to_pair = rel(grouped, torch_op), rel(grouped, per_pair)
print(f"T={T} pairs per expert {counts}: grouped vs torch op (float32 x) {to_torch:.2e}, vs per-pair Triton {to_pair:.2e}")
assert to_torch < 1e-2, to_torch  # the activation and the output are rounded to bfloat16
assert to_pair < 1e-5, to_pair  # the same products and roundings; float32 sums in another order
other = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(gate_up_block_n=16, gate_up_block_b=2, down_block_n=64, down_block_b=4))
assert rel(other, grouped) < 1e-5, "another tile plan computes another function"
converted = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(pairs=1))
assert torch.equal(converted, grouped), "x and act converted once (pairs 1) differ from the conversion per program"
converted = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(pairs=1, gate_up_block_n=8, gate_up_block_b=2))
assert rel(converted, grouped) < 1e-5, "pairs 1 with 8 gate/up rows per program"
# The E4M3 decode (fp8 1): the same products in another pair order, x and act pairs times 4; with pairs 1 the same bits.
widened = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(fp8=1))
assert rel(widened, grouped) < 1e-5, ("fp8 1 computes another function", rel(widened, grouped))
widened_pairs = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(fp8=1, pairs=1, gate_up_block_n=8))
assert torch.equal(widened_pairs, widened), "fp8 with x and act converted once differs from the conversion per program"
print("ok")
"""

TILED_SCRIPT = r"""
from dataclasses import replace
from reference_engine.ops.tiled_experts import TiledWeights, tile_major
ids = torch.cat([torch.full((9, 1), 2), torch.randint(3, E, (9, 1), generator=g)], 1)  # chunks 4, 4, 1; shared 4, 4, 1
ids = torch.cat([ids, torch.full((9, 1), E)], 1).int()
w = torch.rand(9, K + 1, generator=g) + 0.1
xb = torch.randn(9, H, generator=g).bfloat16()
for plan in (half.HalfGroupedPlan(), half.HalfGroupedPlan(fp8=1, pairs=1, gate_up_block_n=16, gate_up_block_b=4, down_block_b=2)):
    rows = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=plan)
    tiled = half.tile_experts(experts, shared, plan)
    assert tiled[0].gate_up_words.numel() == experts.gate_up_packed.numel() // 8 and tiled[1].down_scale.numel() == shared.down_scale.numel()
    assert torch.equal(run(half.half_grouped_experts_with_shared, xb, ids, w, plan=plan, tiled=tiled), rows), ("tile-major copies give other bits", plan)
# tile_major against an explicit index: element (e, q, r, k) of a [E, 2R, K] stack lands at its tile-major position.
blocks = torch.arange(2 * 8 * 6, dtype=torch.int64).reshape(2, 8, 6)
flat = tile_major(blocks, 2, 2, 3)
for e, row, k in ((0, 0, 0), (1, 5, 4), (0, 7, 5), (1, 2, 3)):
    q, r = divmod(row, 4)
    at = ((((e * 2 + r // 2) * 2 + k // 3) * 2 + q) * 2 + r % 2) * 3 + k % 3
    assert flat[at] == blocks[e, row, k], (e, row, k)
# Known wrong: row-major words passed as tile-major ones (the right count, the wrong order) must miss by far.
plan = half.HalfGroupedPlan()
right = half.tile_experts(experts, shared, plan)
def flat_rows(t):
    return t.contiguous().view(torch.int64).reshape(-1) if t.dtype == torch.uint8 else t.contiguous().reshape(-1)
wrong = tuple(TiledWeights(flat_rows(a.gate_up_packed), flat_rows(a.gate_up_scale), flat_rows(a.down_packed), flat_rows(a.down_scale), r.tiles)
              for a, r in ((experts, right[0]), (shared, right[1])))
expected = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=plan)
missed = run(half.half_grouped_experts_with_shared, xb, ids, w, plan=plan, tiled=wrong)
error = float((torch.nan_to_num(missed.float(), nan=1e3).double() - expected.double()).norm() / expected.double().norm())
print(f"row-major words read as tile-major: {error:.2e}")
assert error > 5e-2, error
# Copies the stacks carry (`attach_tiled`) are read when ordered for the plan's tiles: the right ones give the same
# bits, the wrong ones miss (so they are read), and under a plan of other tiles the row-major stacks are read.
def carried(copies, plan):
    out = torch.full(xb.shape, float("nan"), dtype=xb.dtype)
    half.half_grouped_experts_with_shared(xb, w, ids, replace(experts, tiled=copies[0]), replace(shared, tiled=copies[1]), out, plan=plan)
    return out
assert torch.equal(carried(right, plan), expected), "carried tile-major copies give other bits"
assert float((torch.nan_to_num(carried(wrong, plan).float(), nan=1e3).double() - expected.double()).norm() / expected.double().norm()) > 5e-2
other = half.HalfGroupedPlan(gate_up_block_n=16)
assert torch.equal(carried(right, other), run(half.half_grouped_experts_with_shared, xb, ids, w, plan=other)), "copies of other tiles were read"
assert half.tile_experts(replace(experts, tiled=right[0]), replace(shared, tiled=right[1]), plan) == right  # kept, not redone
try:
    run(half.half_grouped_experts_with_shared, xb, ids, w, plan=half.HalfGroupedPlan(gate_up_block_n=16), tiled=right)
    raise AssertionError("copies ordered for other tiles accepted")
except ValueError as refused:
    print(f"other tiles refused: {refused}")
print("ok")
"""

BLOCK_SCRIPT = r"""
xb = torch.randn(2, H, generator=g).bfloat16()
ids = torch.tensor([[0, 1, E], [0, 2, E]]).int()
w = torch.rand(2, K + 1, generator=g) + 0.1
try:
    half.half_grouped_experts_with_shared(xb.float(), w, ids, experts, shared, torch.empty(xb.shape))
    raise AssertionError("float32 x accepted")
except ValueError as error:
    print(f"float32 x refused: {error}")

# The whole block (its router picks the ids) at 9 tokens: the known-wrong variants must miss by far. Column 0 of x
# is large and only expert 2's router row reads it, so every row picks expert 2 (9 pairs: chunks 4, 4, 1).
router_weight = torch.randn(E + 1, H, generator=g) * 0.1
router_weight[:, 0] = 0.0
router_weight[2, 0] = 1.0
router_weight = router_weight.bfloat16()
x = torch.randn(9, H, generator=g)
x[:, 0] = 4.0
x = x.bfloat16()
picks = (x.float() @ router_weight[:E].float().T).topk(K, dim=1).indices
assert (picks == 2).any(dim=1).all(), picks
expected = torch.full_like(x, float("nan"))
static_moe.moe_block_decode(x, router_weight, experts, shared, K, expected)  # the torch op: the contract's reference
for name in ("half_grouped_first_chunk_only", "half_grouped_shared_chunks_short", "half_grouped_first_pair_only"):
    out = torch.full_like(x, float("nan"))
    getattr(wrong_kernels, name)(x, router_weight, experts, shared, K, out)
    unwritten = torch.isnan(out).any(dim=1)
    error = float((torch.nan_to_num(out.float(), nan=1e3).double() - expected.double()).norm() / expected.double().norm())
    print(f"wrong {name}: {error:.2e}, rows with an unwritten pair {unwritten.tolist()}")
    assert error > 5e-2, (name, error)
good = torch.full_like(x, float("nan"))
half.MIN_TOKENS = 1
moe_decode.moe_block_decode(x, router_weight, experts, shared, K, good)
half.MIN_TOKENS = None
print(f"right: {rel(good, expected):.2e}")
assert rel(good, expected) < 1e-2
print("ok")
"""


def test_contract_cpu_cases_pass_through_the_half_grouped_path():
    assert_all_passed(contract_records(CONTRACT, {IMPL: CPU_CASES}, timeout=900)[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_contract_catches_known_wrong_half_grouped_variant(wrong):
    found = contract_records(CONTRACT, {f"wrong_kernels:{wrong}": WRONG[wrong]}, timeout=900)[f"wrong_kernels:{wrong}"]
    assert [r["case"] for r in found] == WRONG[wrong]
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r["message"]) for r in found]


@pytest.mark.parametrize("case", sorted(CASES))
def test_half_grouped_matches_per_pair_and_torch_under_every_plan(case):
    """Against the torch op (float32 x) and the per-pair Triton kernels (the same bfloat16 x), then three other plans."""
    assert_script_ok(interpreter_run({}, PREAMBLE + CASE_SCRIPT.replace("__IDS__", CASES[case]), timeout=900))


def test_half_grouped_tile_major_copies_give_the_same_bits():
    """The tile-major copies (`tile_experts`) under two plans give the row-major reads' bits; row-major words passed
    as tile-major ones miss by far; copies carried by the stacks are read only under a plan of their tiles; copies
    ordered for other tiles are refused when passed explicitly."""
    assert_script_ok(interpreter_run({}, PREAMBLE + TILED_SCRIPT, timeout=900))


def test_half_grouped_block_rejects_wrong_variants_and_float32_x():
    assert_script_ok(interpreter_run({}, PREAMBLE + BLOCK_SCRIPT, timeout=900))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [2, 4, 8, 32, 64])
def test_half_grouped_matches_the_per_pair_kernels_on_the_real_layer(tokens):
    """E=256, H=2048, I=512, top-8 + shared, bf16: grouped and per-pair (packed float16) outputs within float32 order."""
    from real_moe_layer import HIDDEN, real_decode_inputs

    from reference_engine.kernels import moe_decode
    from reference_engine.kernels import moe_grouped_half as half

    experts, shared, x, ids, weights = real_decode_inputs(tokens)
    ids[: tokens // 2, 0] = 7  # one busy expert: chunks of 4 and a short last one (a repeated id in a row is summed twice)
    saved = moe_decode.WORDS
    try:
        outs = []
        for words, op, plan in ((2, moe_decode.nvfp4_experts_with_shared, None), (2, half.half_grouped_experts_with_shared, half.HalfGroupedPlan()),
                                (2, half.half_grouped_experts_with_shared, half.HalfGroupedPlan(pairs=1)),
                                (3, half.half_grouped_experts_with_shared, half.HalfGroupedPlan(fp8=1)),
                                (3, half.half_grouped_experts_with_shared, half.HalfGroupedPlan(fp8=1, pairs=1)),
                                (3, moe_decode.nvfp4_experts_with_shared, None)):  # fmt: skip
            moe_decode.WORDS = words  # the per-pair packed float16 path (3: with the E4M3 decode): the same block products
            out = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
            op(x, weights, ids, experts, shared, out, **({} if plan is None else {"plan": plan}))
            outs.append(out)
    finally:
        moe_decode.WORDS = saved
    assert torch.isfinite(outs[1]).all()
    error = float((outs[1].double() - outs[0].double()).norm() / outs[0].double().norm())
    assert error < 1e-3, error
    assert torch.equal(outs[2], outs[1]), "x and act converted once (pairs 1) give other bits than the conversion per program"
    widened = float((outs[3].double() - outs[5].double()).norm() / outs[5].double().norm())  # the E4M3 decode: grouped vs per pair
    assert torch.isfinite(outs[3]).all() and widened < 1e-3, widened
    assert torch.equal(outs[4], outs[3]), "fp8 with x and act converted once gives other bits than the conversion per program"
