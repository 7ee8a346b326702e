"""The decode MoE block with the top-k in the experts' launch (`moe_decode.GATE_UP_TOPK_MAX_TOKENS`).

The fused router launch writes the logits only (`router.router_gemv_logits`: no ticket, no top-k) and every routed
gate/up program picks its expert from its token's logits with the router's own code (`router._topk_pick`); program
(slot 0, row block 0) writes the routing row for the down kernel. The same code on the same logits, so:

Interpreter (one subprocess), 12 experts, top-3 plus the shared expert, bfloat16, 1 and 3 tokens, the E4M3 half decode:
- the block output is bit-equal to the router's top-k path, with the norm folded into the router launch or not, with
  x handed over as float16 pairs or not (normed row and residual bit-equal too); outputs poisoned with NaN;
- the routing rows the gate/up launch writes (ids, weights, shared slot) equal the router's;
- the router launch ran without its top-k (the logits-only wrapper was called, the top-k one was not);
- a known-wrong pick (each program takes the next slot's expert) is caught.
The tiny model's static decode through the Triton MoE block (norm folded, batches 1 and 2): the logits are the same bits
with the move on and off, and the wrong pick changes them (the move is live in the model path).
In process: the tuning key reaches the module and a bad logits buffer is refused.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import REPO, assert_script_ok, interpreter_run, run_script

SCRIPT = r"""
import torch

from reference_engine.kernels import moe_decode, router
from reference_engine.ops import static_moe
from reference_engine.ops.norms import AddNorm
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(29)
E, H, I, K = 12, 64, 32, 3

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

gu, gus, gu2 = q(E * 2 * I, H, 0.2)
dn, dns, dn2 = q(E * H, I, 0.3)
experts = static_moe.StackedNvfp4Experts(gu.view(E, 2 * I, H // 2), gus.view(E, 2 * I, H // 16), gu2.reshape(1, 1).expand(E, 2).contiguous(),
                                         dn.view(E, H, I // 2), dns.view(E, H, I // 16), dn2.reshape(1).expand(E).contiguous())
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
router_weight = (torch.randn(E + 1, H, generator=g) * H ** -0.5).bfloat16()
moe_decode.WORDS, moe_decode.BATCH_ONE, moe_decode.SMALL_BATCHES = 3, None, ()

calls = {"logits": 0, "topk": 0}
real_logits, real_topk = moe_decode.router_gemv_logits, moe_decode.router_gemv_topk_with_shared
def counted_logits(*args, **kwargs):
    calls["logits"] += 1
    return real_logits(*args, **kwargs)
def counted_topk(*args, **kwargs):
    calls["topk"] += 1
    return real_topk(*args, **kwargs)
moe_decode.router_gemv_logits, moe_decode.router_gemv_topk_with_shared = counted_logits, counted_topk

routing = {}
real_launch = moe_decode._launch
def recording_launch(x, topk_weights, topk_ids, *args, **kwargs):
    real_launch(x, topk_weights, topk_ids, *args, **kwargs)
    routing["last"] = (topk_weights.clone(), topk_ids.clone())
moe_decode._launch = recording_launch


def block(x, tokens, move, add_norm_inputs=None, x_pairs=0):
    moe_decode.GATE_UP_TOPK_MAX_TOKENS = 8 if move else 0
    moe_decode.X_PAIRS = x_pairs
    router.ADD_NORM = add_norm_inputs is not None
    assert moe_decode.topk_in_experts(tokens, x) == move
    out = torch.full_like(x, float("nan"))
    before = dict(calls)
    if add_norm_inputs is None:
        moe_decode.moe_block_decode(x, router_weight, experts, shared, K, out)
        extra = ()
    else:
        residual, weight = add_norm_inputs
        add_norm = AddNorm(residual, weight, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), 1e-6)
        moe_decode.moe_block_decode_add_norm(x, add_norm, router_weight, experts, shared, K, out)
        extra = (add_norm.out, add_norm.residual_out)
    ran = (calls["logits"] - before["logits"], calls["topk"] - before["topk"])
    assert ran == ((1, 0) if move else (0, 1)), (move, ran)
    assert torch.isfinite(out.float()).all()
    return (out, *extra), routing["last"]


checked = 0
for tokens in (1, 3):
    x = torch.randn(tokens, H, generator=g).bfloat16()
    residual, weight = torch.randn(tokens, H, generator=g).bfloat16(), (torch.randn(H, generator=g) * 0.1).bfloat16()
    for norm in (None, (residual, weight)):
        for x_pairs in ((0,) if norm is None else (0, 2)):
            reference, reference_routing = block(x, tokens, False, norm, x_pairs)
            moved, moved_routing = block(x, tokens, True, norm, x_pairs)
            assert all(torch.equal(a, b) for a, b in zip(reference, moved)), (tokens, norm is not None, x_pairs)
            assert all(torch.equal(a, b) for a, b in zip(reference_routing, moved_routing)), (tokens, reference_routing, moved_routing)
            checked += 1
    # known wrong: every routed program takes the next slot's expert
    real_expert = moe_decode._topk_expert
    moe_decode._topk_expert = lambda logits, weights, ids, token, slot, row_block, E, TOP_K, BE, BT: real_expert(
        logits, weights, ids, token, (slot + 1) % TOP_K, row_block, E, TOP_K, BE, BT)
    wrong, _ = block(x, tokens, True)
    moe_decode._topk_expert = real_expert
    right, _ = block(x, tokens, False)
    assert not torch.equal(wrong[0], right[0]), "a wrong pick was not caught"
print(f"{checked} settings bit-equal; wrong pick caught")
print("ok")
"""


MODEL_SCRIPT = r"""
import sys
sys.path.insert(0, TESTS_DIR)
import torch
from runner_ops import use_kernels
from test_cuda_graphs import _decode_logits, _prompts
from reference_engine.kernels import moe_decode, router
from reference_engine.presets import build_preset

use_kernels({"moe_block_decode": moe_decode.moe_block_decode, "moe_block_decode_add_norm": moe_decode.moe_block_decode_add_norm})
moved = []
real_launch = moe_decode._launch
def counted(*args, logits=None, **kwargs):
    moved.append(logits is not None)
    return real_launch(*args, logits=logits, **kwargs)
moe_decode._launch = counted
if WRONG:
    real_expert = moe_decode._topk_expert
    moe_decode._topk_expert = lambda logits, weights, ids, token, slot, row_block, E, TOP_K, BE, BT: real_expert(
        logits, weights, ids, token, (slot + 1) % TOP_K, row_block, E, TOP_K, BE, BT)

router.ADD_NORM = True
moe_decode.WORDS = 3
model = build_preset("tiny", quantize="nvfp4", seed=7, dtype=torch.bfloat16)
for batch in (1, 2):
    prompts = _prompts(batch, model.config.vocab_size, seed=13)
    results = {}
    for ceiling in (0, 8):
        moe_decode.GATE_UP_TOPK_MAX_TOKENS = ceiling
        moved.clear()
        tokens, logits, _ = _decode_logits(model, "static", prompts, steps=3, max_num_seqs=batch)
        assert len(logits) >= 2 and all(torch.isfinite(step).all() for step in logits)
        assert moved and all(flag == bool(ceiling) for flag in moved), (ceiling, moved)
        results[ceiling] = logits
        print(f"batch {batch}, ceiling {ceiling}: {len(moved)} expert launches, {sum(moved)} picked their experts")
    equal = all(torch.equal(a, b) for a, b in zip(results[0], results[8]))
    assert equal != WRONG, ("the move changed the logits" if not WRONG else "a wrong pick was not caught", batch)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=900)


def test_the_moved_top_k_is_bit_equal_and_a_wrong_pick_is_caught(run):
    assert_script_ok(run)


@pytest.mark.parametrize("wrong", [False, True], ids=["moved", "wrong_pick"])
def test_static_decode_with_the_moved_top_k_gives_the_same_logits_under_the_interpreter(wrong):
    output = run_script(f"TESTS_DIR = {str(REPO / 'tests' / 'reference_engine')!r}\nWRONG = {wrong!r}\n" + MODEL_SCRIPT, timeout=900)
    print(output)
    assert output.strip().endswith("ok"), output


def test_tuning_key_sets_the_ceiling(tmp_path, monkeypatch):
    from reference_engine.kernels import moe_decode, tuning

    monkeypatch.setattr(moe_decode, "GATE_UP_TOPK_MAX_TOKENS", 0)
    path = tmp_path / "card.json"
    path.write_text('{"device": "test card"}')
    tuning.write_setting(path, "moe_gate_up_topk_max_tokens", 4)
    tuning.apply_tuning(path)
    assert moe_decode.GATE_UP_TOPK_MAX_TOKENS == 4


def test_a_bad_logits_buffer_is_refused():
    from reference_engine.kernels import router

    x, weight = torch.randn(2, 64).bfloat16(), torch.randn(13, 64).bfloat16()
    for logits in (torch.empty(2, 12).bfloat16(), torch.empty(2, 13), torch.empty(13, 2).bfloat16().t()):  # shape, dtype, layout
        with pytest.raises(ValueError, match=r"logits must be contiguous torch.bfloat16 \[2, 13\]"):
            router.router_gemv_logits(x, weight, logits)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3])
def test_the_moved_top_k_is_bit_equal_on_cuda_at_the_real_shape(tokens, tmp_path, monkeypatch):
    """The card's committed decode MoE and router settings, the norm folded into the router launch, the real layer:
    output, normed row and residual with the experts picked in the gate/up launch equal the router's top-k path."""
    import json

    from real_moe_layer import EXPERTS, HIDDEN, TOP_K, real_decode_inputs

    from reference_engine.kernels import moe_decode, router, tuning
    from reference_engine.ops.norms import AddNorm

    for module, names in ((moe_decode, ("LOOP", "GATE_UP_BLOCK_N", "GATE_UP_BLOCK_K", "DOWN_BLOCK_H", "DOWN_BLOCK_I", "WORDS", "DOWN_SPLIT", "BATCH_ONE",
                                        "SMALL_BATCHES", "ACT_PAIRS", "X_PAIRS", "GATE_UP_TOPK_MAX_TOKENS")),
                          (router, ("ADD_NORM", "FUSED_ROUTER_MAX_TOKENS", "ROUTER_ROWS", "ROUTER_WARPS", "PREFETCH_EXPERTS"))):  # fmt: skip
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))
    committed = json.loads(tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability()).read_text())
    keys = ("device", "moe_decode", "moe_decode_batch_one", "moe_decode_small_batches", "fused_router_max_tokens", "router_rows", "router_warps")
    (tmp_path / "t.json").write_text(json.dumps({key: committed[key] for key in keys if key in committed}))
    tuning.apply_tuning(tmp_path / "t.json")
    router.ADD_NORM, router.PREFETCH_EXPERTS = True, False
    experts, shared, x, _, _ = real_decode_inputs(tokens)
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    router_weight = (torch.randn(EXPERTS + 1, HIDDEN, generator=generator, device="cuda") * HIDDEN**-0.5).bfloat16()
    residual = torch.randn(tokens, HIDDEN, generator=generator, device="cuda").bfloat16()
    norm_weight = (torch.randn(HIDDEN, generator=generator, device="cuda") * 0.1).bfloat16()
    results = {}
    for ceiling in (0, 8):
        moe_decode.GATE_UP_TOPK_MAX_TOKENS = ceiling
        assert moe_decode.topk_in_experts(tokens, x) == bool(ceiling), "the move would not run at this batch"
        add_norm = AddNorm(residual, norm_weight, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), 1e-6)
        out = torch.full_like(x, float("nan"))
        moe_decode.moe_block_decode_add_norm(x, add_norm, router_weight, experts, shared, TOP_K, out)
        results[ceiling] = (out, add_norm.out, add_norm.residual_out)
        assert all(torch.isfinite(t.float()).all() for t in results[ceiling])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[8]))
