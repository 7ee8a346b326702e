"""The decode MoE kernels with the activation handed over as float16 pairs (`moe_decode.ACT_PAIRS`).

With `ACT_PAIRS` the gate/up kernel stores silu(gate) * up, rounded to bfloat16, as the float16 pairs the down
kernel's half decode takes (`nvfp4_half_dot._store_rows_half_pairs`), and the down kernel loads them instead of
converting the bfloat16 activation in every program. The pairs are the bits the down kernel would build itself, so:

Interpreter (one subprocess), bfloat16 x, 1 and 3 tokens, the routed experts with the shared slot:
- the block output is bit-equal to the bfloat16 activation's for both half decodes (plain and E4M3 order), both load
  forms and two gate/up tiles (8 and 16 rows); outputs poisoned with NaN;
- the gate/up kernel's pairs equal `x_half_pairs` of the bfloat16 activation (from `ACT_PAIRS` 0) in that decode's
  order, and differ from the other order's: a producer writing the wrong order is caught;
- pairs in the other decode's order, fed to the down kernel, change the output (the hand-over is order-sensitive);
- the setting is ignored (bfloat16 activation) where the half decode does not run: float32 x.
In process: the tuning key `moe_act_pairs` reaches `moe_decode.ACT_PAIRS`.
"""

from __future__ import annotations

import pytest
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = r"""
import torch

from reference_engine.kernels import moe_decode
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(23)
E, H, I, K = 5, 64, 32, 2

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))

def routing(T):
    ids = torch.cat([torch.rand(T, E, generator=g).argsort(dim=1)[:, :K], torch.full((T, 1), E)], dim=1).to(torch.int32)
    weights = torch.rand(T, K + 1, generator=g) + 0.1
    return weights, ids

def block(x, weights, ids, words, act_pairs, block_n):
    moe_decode.WORDS, moe_decode.ACT_PAIRS, moe_decode.GATE_UP_BLOCK_N = words, act_pairs, block_n
    try:
        out = torch.full(x.shape, float("nan"), dtype=x.dtype)
        moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, out)
    finally:
        moe_decode.WORDS, moe_decode.ACT_PAIRS, moe_decode.GATE_UP_BLOCK_N = 0, 0, 16
    assert torch.isfinite(out.float()).all(), "unwritten (NaN) output"
    return out

checked = 0
for T in (1, 3):
    x = (torch.randn(T, H, generator=g) * 2).to(torch.bfloat16)
    weights, ids = routing(T)
    for words in (2, 3):  # 2: plain order; 3: the E4M3 decode's order
        for block_n in (8, 16):
            converted = block(x, weights, ids, words, 0, block_n)
            for act_pairs in (1, 2):
                handed = block(x, weights, ids, words, act_pairs, block_n)
                assert torch.equal(handed, converted), (T, words, block_n, act_pairs, float((handed.float() - converted.float()).abs().max()))
                checked += 1
print(f"block outputs bit-equal: {checked} settings")

# The gate/up kernel alone: its pairs are x_half_pairs of the bfloat16 activation, in its decode's order only.
SLOTS = K + 1
x = (torch.randn(2, H, generator=g) * 2).to(torch.bfloat16)
weights, ids = routing(2)
shared_args = dict(zip(("shared_w_ptr", "shared_scale_ptr", "shared_scale_2_ptr"),
                       (shared.gate_up_packed.view(torch.int64), shared.gate_up_scale, shared.gate_up_scale_2)))
def gate_up(decode, act_pairs):
    if act_pairs:
        act = torch.full((2 * SLOTS, I // 2), -1, dtype=torch.int32)
    else:
        act = torch.full((2 * SLOTS, I), float("nan"))
    moe_decode._gate_up_kernel[(2 * SLOTS, I // 8)](
        x.view(torch.int32), ids, experts.gate_up_packed.view(torch.int64), experts.gate_up_scale, experts.gate_up_scale_2, act, H, I,
        TOP_K=K, WEIGHT_NVFP4=True, BLOCK_N=8, BLOCK_K=16, LOOP=0, DECODE=decode, SHARED=True, ACT_PAIRS=act_pairs, **shared_args)
    return act
for decode, fp8 in ((4, False), (6, True)):  # the interpreter forms of the plain and E4M3 decodes
    activation = gate_up(decode, False).to(torch.bfloat16)
    pairs = gate_up(decode, True)
    assert torch.equal(pairs, x_half_pairs(activation, fp8)), (decode, "pairs differ from x_half_pairs of the activation")
    assert not torch.equal(pairs, x_half_pairs(activation, not fp8)), (decode, "the other order was not told apart")
print("gate/up pairs equal x_half_pairs in their order")

# Known-wrong hand-over: pairs in the other decode's order fed to the down kernel.
weights, ids = routing(1)
x = (torch.randn(1, H, generator=g) * 2).to(torch.bfloat16)
expected = block(x, weights, ids, 3, 0, 8)
import reference_engine.kernels.nvfp4_half_dot as half_dot
real_pairs = half_dot._rows_half_pairs
half_dot._rows_half_pairs = lambda values, BN, ASM, FP8: real_pairs(values, BN, ASM, not FP8)  # the producer's order flipped
try:
    wrong = block(x, weights, ids, 3, 1, 8)
finally:
    half_dot._rows_half_pairs = real_pairs
error = float((wrong.float() - expected.float()).norm() / expected.float().norm())
print(f"other order handed over: relative error {error:.2e}")
assert error > 1e-2, error

# Float32 x: no half decode, so the setting leaves the bfloat16-free path alone (same output as off).
x = torch.randn(1, H, generator=g)
weights, ids = routing(1)
assert torch.equal(block(x, weights, ids, 3, 1, 8), block(x, weights, ids, 3, 0, 8))
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=900)


def test_act_pairs_hand_over_is_bit_equal_and_order_checked(run):
    assert_script_ok(run)


def test_tuning_key_sets_the_module_setting(tmp_path, monkeypatch):
    from reference_engine.kernels import moe_decode, tuning

    monkeypatch.setattr(moe_decode, "ACT_PAIRS", 0)
    path = tmp_path / "card.json"
    path.write_text('{"device": "test card"}')
    tuning.write_setting(path, "moe_act_pairs", 2)
    tuning.apply_tuning(path)
    assert moe_decode.ACT_PAIRS == 2


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_act_pairs_are_bit_equal_on_cuda_at_the_real_shape(tokens, tmp_path, monkeypatch):
    """The committed decode MoE settings of the card (batch one, small batches, module), the real layer, the shared slot:
    the output with the activation handed over as pairs (both load forms) equals converting it in the down kernel."""
    import json

    import torch
    from real_moe_layer import real_decode_inputs

    from reference_engine.kernels import moe_decode, tuning

    for name in ("LOOP", "GATE_UP_BLOCK_N", "GATE_UP_BLOCK_K", "DOWN_BLOCK_H", "DOWN_BLOCK_I", "WORDS", "DOWN_SPLIT", "BATCH_ONE", "SMALL_BATCHES", "ACT_PAIRS"):
        monkeypatch.setattr(moe_decode, name, getattr(moe_decode, name))
    committed = json.loads(tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability()).read_text())
    keys = ("device", "moe_decode", "moe_decode_batch_one", "moe_decode_small_batches")
    (tmp_path / "t.json").write_text(json.dumps({key: committed[key] for key in keys if key in committed}))
    tuning.apply_tuning(tmp_path / "t.json")
    assert moe_decode._settings(tokens)[5] in (2, 3), "the committed setting does not run the half decode at this batch"
    experts, shared, x, ids, weights = real_decode_inputs(tokens)
    outputs = {}
    for act_pairs in (0, 1, 2):
        moe_decode.ACT_PAIRS = act_pairs
        out = torch.full_like(x, float("nan"))
        moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, out)
        assert torch.isfinite(out).all(), act_pairs
        outputs[act_pairs] = out
    assert torch.equal(outputs[1], outputs[0]) and torch.equal(outputs[2], outputs[0])
