"""The decode MoE block with the experts grouped by expert on tensor cores (`moe_grouped_decode`).

Interpreter (one subprocess): the contract moe/moe-block-decode's CPU cases through the grouped path, and
the two known-wrong grouped variants it must reject where its cases reach them; then a script: the grouped
experts against the torch op (float32) and against the per-pair Triton kernels (bfloat16), with a shared group
and a routed group of more than one tile of pairs (20 tokens, 16-pair tiles), repeated ids within a row,
outputs poisoned with NaN, the byte decode (0) giving the same bits as the word decode (1), and the swapped operand
order (weights first) giving the same values;
the first-tile-only variant must miss by far. CUDA: the real layer against the per-pair kernels.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "moe/moe-block-decode"
IMPL = "grouped_variants:moe_block_decode_grouped"
CPU_CASES = ["small-f32", "small-bf16", "busy-experts-f32", "top-one-f32", "every-expert-chosen-bf16", "router-without-shared-row", "top-k-zero"]
WRONG = {"grouped_shared_group_dropped": ["small-f32", "busy-experts-f32"]}

SCRIPT = r"""
import torch
from reference_engine.kernels import moe_decode, moe_grouped_decode as grouped
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4
import wrong_kernels

g = torch.Generator().manual_seed(17)
E, H, I, K = 6, 128, 64, 2
def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)
experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
grouped.POISON_SCRATCH = True  # act and y start as NaN: a pair the kernels skip cannot borrow an earlier call's memory

def rel(out, expected):
    assert torch.isfinite(out).all(), "unwritten (NaN) output"
    return float((out.double() - expected.double()).norm() / expected.double().norm())

def routing(T, busy=False, repeated=False):
    ids = torch.randint(0, E, (T, K), generator=g)
    if busy:
        ids[:, 0] = 2  # expert 2 in every row: a routed group of T pairs (two tiles at T = 20)
    if repeated:
        ids[0, 1] = ids[0, 0]  # the same expert twice in one row: summed like two
    return torch.cat([ids, torch.full((T, 1), E)], 1).int(), torch.rand(T, K + 1, generator=g) + 0.1

def run(op, x, ids, w, **kwargs):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype)
    op(x, w, ids, experts, shared, out, **kwargs)
    return out

for T, busy, repeated in ((3, False, True), (20, True, False), (20, False, True)):
    ids, w = routing(T, busy, repeated)
    x = torch.randn(T, H, generator=g)
    error = rel(run(grouped.grouped_experts_with_shared, x, ids, w), run(static_moe.nvfp4_experts_with_shared, x, ids, w))
    print(f"T={T} busy={busy} repeated={repeated} float32 grouped vs torch op: {error:.2e}")
    assert error < 1e-5, error
    xb = x.bfloat16()
    per_pair = run(moe_decode.nvfp4_experts_with_shared, xb, ids, w)
    two = run(grouped.grouped_experts_with_shared, xb, ids, w)
    error = rel(two, per_pair)
    print(f"T={T} bfloat16 grouped vs per-pair Triton: {error:.2e}")
    assert error < 1e-5, error  # the same products and activation rounding; float32 sums in another order
    zero = run(grouped.grouped_experts_with_shared, xb, ids, w, plan=grouped.GroupedPlan(decode=0, gate_up_block_n=16, down_block_n=32))
    assert torch.equal(zero, two), "decode 0 (bytes) and decode 1 (words) differ"
    swapped = run(grouped.grouped_experts_with_shared, xb, ids, w, plan=grouped.GroupedPlan(swap=1, gate_up_block_n=16, down_block_n=32))
    error = rel(swapped, per_pair)
    print(f"T={T} bfloat16 grouped, swapped operands, vs per-pair Triton: {error:.2e}")
    assert error < 1e-5, error  # the same products, weights first: only the float32 summation order may differ
    swapped32 = run(grouped.grouped_experts_with_shared, x, ids, w, plan=grouped.GroupedPlan(swap=1, block_m=32))
    error = rel(swapped32, run(static_moe.nvfp4_experts_with_shared, x, ids, w))
    assert error < 1e-5, error

# The first-tile-only variant: through the whole block (its router picks the ids), 20 tokens: the shared group
# holds 20 pairs, more than one 16-pair tile.
router_weight = torch.randn(E + 1, H, generator=g) * 0.1
x = torch.randn(20, H, generator=g)
expected = torch.full_like(x, float("nan"))
static_moe.moe_block_decode(x, router_weight, experts, shared, K, expected)
for name in ("grouped_first_tile_only", "grouped_shared_group_dropped"):
    out = torch.full_like(x, float("nan"))
    getattr(wrong_kernels, name)(x, router_weight, experts, shared, K, out)
    unwritten = torch.isnan(out).any(dim=1)  # rows summing a pair the variant never wrote
    error = rel(torch.nan_to_num(out, nan=1e3), expected)
    print(f"wrong {name}: {error:.2e}, rows with an unwritten pair {unwritten.tolist()}")
    assert error > 1e-2, (name, error)
good = torch.full_like(x, float("nan"))
grouped.MIN_TOKENS = 1
moe_decode.moe_block_decode(x, router_weight, experts, shared, K, good)
grouped.MIN_TOKENS = None
assert rel(good, expected) < 1e-5
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    contracts = {CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": cases for name, cases in WRONG.items()}}
    return interpreter_run(contracts, SCRIPT, timeout=600)


@pytest.fixture(scope="module")
def records(run):
    return {key.split("|", 1)[1]: value for key, value in run["records"].items()}


def test_contract_cpu_cases_pass_through_the_grouped_path(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_contract_catches_known_wrong_grouped_variant(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert [r["case"] for r in found] == WRONG[wrong]
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r["message"]) for r in found]


def test_grouped_matches_per_pair_and_torch_and_rejects_wrong_variants(run):
    assert_script_ok(run)


@pytest.mark.cuda
@pytest.mark.parametrize("swap", [0, 1])
@pytest.mark.parametrize("tokens", [8, 32, 64])
def test_grouped_matches_the_per_pair_kernels_on_the_real_layer(tokens, swap):
    """E=256, H=2048, I=512, top-8 + shared, bf16: grouped (both operand orders; swapped with 64-row wgmma tiles) and
    per-pair outputs within float32 summation order."""
    from real_moe_layer import HIDDEN, real_decode_inputs

    from reference_engine.kernels import moe_decode
    from reference_engine.kernels import moe_grouped_decode as grouped

    experts, shared, x, ids, weights = real_decode_inputs(tokens)
    outs = []
    plan = grouped.GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=64) if swap else None
    for op, kwargs in ((moe_decode.nvfp4_experts_with_shared, {}), (grouped.grouped_experts_with_shared, {"plan": plan})):
        out = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
        op(x, weights, ids, experts, shared, out, **kwargs)
        outs.append(out)
    assert torch.isfinite(outs[1]).all()
    error = float((outs[1].double() - outs[0].double()).norm() / outs[0].double().norm())
    assert error < 1e-3, error
