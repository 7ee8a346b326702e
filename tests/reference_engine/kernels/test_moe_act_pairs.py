"""The decode MoE kernels with the activation and x handed over as float16 pairs (`moe_decode.ACT_PAIRS`, `X_PAIRS`).

With `ACT_PAIRS` the gate/up kernel stores silu(gate) * up, rounded to bfloat16, as the float16 pairs the down
kernel's half decode takes (`nvfp4_half_dot._store_rows_half_pairs`), and the down kernel loads them instead of
converting the bfloat16 activation in every program. The pairs are the bits the down kernel would build itself, so:

Interpreter (one subprocess), bfloat16 x, 1 and 3 tokens, the routed experts with the shared slot:
- the block output is bit-equal to the bfloat16 activation's for both half decodes (plain and E4M3 order), both load
  forms and two gate/up tiles (8 and 16 rows); outputs poisoned with NaN;
- the gate/up kernel's pairs equal `x_half_pairs` of the bfloat16 activation (from `ACT_PAIRS` 0) in that decode's
  order, and differ from the other order's: a producer writing the wrong order is caught;
- pairs in the other decode's order, fed to the down kernel, change the output (the hand-over is order-sensitive);
- `X_PAIRS`: with the norm folded into the fused router, that launch writes the normed x as the gate/up kernel's pairs;
  the block output, normed row and residual are bit-equal to converting x (1 and 3 tokens, both decodes, with and
  without the activation pairs), and a router writing the other order is caught;
- the setting is ignored (bfloat16 activation) where the half decode does not run: float32 x;
- the tiny model's static decode at batch 1 through the Triton MoE block: every expert launch reads x pairs (or stores
  the activation pairs) as set, the logits are bit-equal to both off, and the other order is caught at every setting.
In process: the tuning keys `moe_act_pairs` and `moe_x_pairs` reach the module settings, and a bad pairs buffer is refused.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import REPO, assert_script_ok, interpreter_run, run_script

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

# x handed over too (`X_PAIRS`): the fused router's norm (`router.ADD_NORM`) writes the normed x as the gate/up kernel's
# pairs. The block with the norm folded in: output, normed row and residual bit-equal to converting x in the kernel.
from reference_engine.kernels import router
from reference_engine.ops.norms import AddNorm
router_weight = torch.randn(E + 1, H, generator=g) * 0.15

def folded(x, residual, norm_weight, words, x_pairs, act_pairs):
    moe_decode.WORDS, moe_decode.X_PAIRS, moe_decode.ACT_PAIRS, moe_decode.GATE_UP_BLOCK_N = words, x_pairs, act_pairs, 8
    router.ADD_NORM = True
    try:
        T = x.shape[0]
        add_norm = AddNorm(residual, norm_weight, torch.full((T, H), float("nan"), dtype=x.dtype), torch.full((T, H), float("nan"), dtype=x.dtype), 1e-6)
        out = torch.full((T, H), float("nan"), dtype=x.dtype)
        assert moe_decode.folds_norm(x, router_weight.to(x.dtype))
        moe_decode.moe_block_decode_add_norm(x, add_norm, router_weight.to(x.dtype), experts, shared, K, out)
    finally:
        moe_decode.WORDS, moe_decode.X_PAIRS, moe_decode.ACT_PAIRS, moe_decode.GATE_UP_BLOCK_N = 0, 0, 0, 16
        router.ADD_NORM = False
    for tensor in (out, add_norm.out, add_norm.residual_out):
        assert torch.isfinite(tensor.float()).all(), "unwritten (NaN) output"
    return out, add_norm.out, add_norm.residual_out

checked = 0
for T in (1, 3):
    x = (torch.randn(T, H, generator=g) * 2).to(torch.bfloat16)
    residual = torch.randn(T, H, generator=g).to(torch.bfloat16)
    norm_weight = (torch.randn(H, generator=g) * 0.1).to(torch.bfloat16)
    for words in (2, 3):
        converted = folded(x, residual, norm_weight, words, 0, 0)
        assert moe_decode.x_pairs_order(T, x) is None  # off
        for x_pairs, act_pairs in ((1, 0), (2, 0), (2, 2), (1, 1)):
            handed = folded(x, residual, norm_weight, words, x_pairs, act_pairs)
            for got, want in zip(handed, converted):
                assert torch.equal(got, want), (T, words, x_pairs, act_pairs)
            checked += 1
print(f"folded block with x pairs bit-equal: {checked} settings")

# Known-wrong: the router writes the other order's pairs; the gate/up kernel then multiplies permuted x.
x = (torch.randn(1, H, generator=g) * 2).to(torch.bfloat16)
residual = torch.randn(1, H, generator=g).to(torch.bfloat16)
norm_weight = (torch.randn(H, generator=g) * 0.1).to(torch.bfloat16)
expected = folded(x, residual, norm_weight, 3, 0, 0)[0]
real_launch = router.router_gemv_topk_with_shared
router.router_gemv_topk_with_shared = lambda *args, pairs_fp8=False, **kwargs: real_launch(*args, pairs_fp8=not pairs_fp8, **kwargs)
moe_decode.router_gemv_topk_with_shared = router.router_gemv_topk_with_shared
try:
    wrong = folded(x, residual, norm_weight, 3, 1, 0)[0]
finally:
    router.router_gemv_topk_with_shared = moe_decode.router_gemv_topk_with_shared = real_launch
error = float((wrong.float() - expected.float()).norm() / expected.float().norm())
print(f"router writing the other order: relative error {error:.2e}")
assert error > 1e-2, error

# Float32 x: no half decode, so the setting leaves the bfloat16-free path alone (same output as off).
x = torch.randn(1, H, generator=g)
weights, ids = routing(1)
assert torch.equal(block(x, weights, ids, 3, 1, 8), block(x, weights, ids, 3, 0, 8))
print("ok")
"""


# The tiny model (bfloat16, NVFP4 linears and experts), batch 1, static decode with the Triton MoE block (the norm folded
# into the fused router) under the interpreter: with each setting, every MoE layer's `_launch` receives x pairs and/or
# stores the activation pairs at every step, and the logits are the same bits as with both off. A known-wrong hand-over
# (both producers writing the other order) must change them at every setting, so each hand-over is live.
MODEL_SCRIPT = r"""
import sys
sys.path.insert(0, TESTS_DIR)
import torch
from runner_ops import use_kernels
import reference_engine.kernels.nvfp4_half_dot as half_dot
from test_cuda_graphs import _decode_logits, _prompts
from reference_engine.kernels import moe_decode, router
from reference_engine.presets import build_preset

KERNELS = {"moe_block_decode": moe_decode.moe_block_decode, "moe_block_decode_add_norm": moe_decode.moe_block_decode_add_norm}
use_kernels(KERNELS)
launches = []
real_launch = moe_decode._launch
def counted(*args, x_pairs=None, **kwargs):
    launches.append((x_pairs is not None, moe_decode.ACT_PAIRS))
    return real_launch(*args, x_pairs=x_pairs, **kwargs)
moe_decode._launch = counted
if WRONG:
    real_pairs = half_dot._rows_half_pairs
    half_dot._rows_half_pairs = lambda values, BN, ASM, FP8: real_pairs(values, BN, ASM, not FP8)

router.ADD_NORM = True
moe_decode.WORDS = 3
model = build_preset("tiny", quantize="nvfp4", seed=7, dtype=torch.bfloat16)
prompts = _prompts(1, model.config.vocab_size, seed=13)
results = {}
for setting in ((0, 0), (1, 0), (0, 2), (2, 1)):
    moe_decode.X_PAIRS, moe_decode.ACT_PAIRS = setting
    launches.clear()
    tokens, logits, _ = _decode_logits(model, "static", prompts, steps=3, max_num_seqs=1)
    assert len(logits) >= 2 and all(torch.isfinite(step).all() for step in logits)
    assert launches, "the Triton MoE block never reached the expert kernels"
    with_x = sum(1 for x_given, _ in launches if x_given)
    assert with_x == (len(launches) if setting[0] else 0), (setting, with_x, len(launches))
    assert all(act == setting[1] for _, act in launches)
    results[setting] = logits
    print(f"x pairs {setting[0]}, act pairs {setting[1]}: {len(launches)} expert launches, {with_x} read x pairs")
same = {setting: all(torch.equal(a, b) for a, b in zip(results[(0, 0)], logits)) for setting, logits in results.items()}
if WRONG:  # each setting on its own must be caught: x pairs alone (1, 0), activation pairs alone (0, 2)
    assert not any(same[setting] for setting in results if setting != (0, 0)), same
    print("wrong order caught at every setting")
else:
    assert all(same.values()), same
print("ok")
"""


@pytest.mark.parametrize("wrong", [False, True], ids=["pairs", "wrong_order"])
def test_static_decode_with_the_moe_pairs_gives_the_same_logits_under_the_interpreter(wrong):
    output = run_script(f"TESTS_DIR = {str(REPO / 'tests' / 'reference_engine')!r}\nWRONG = {wrong!r}\n" + MODEL_SCRIPT, timeout=900)
    print(output)
    assert output.strip().endswith("ok"), output


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=900)


def test_act_pairs_hand_over_is_bit_equal_and_order_checked(run):
    assert_script_ok(run)


def test_tuning_key_sets_the_module_setting(tmp_path, monkeypatch):
    from reference_engine.kernels import moe_decode, tuning

    monkeypatch.setattr(moe_decode, "ACT_PAIRS", 0)
    monkeypatch.setattr(moe_decode, "X_PAIRS", 0)
    path = tmp_path / "card.json"
    path.write_text('{"device": "test card"}')
    tuning.write_setting(path, "moe_act_pairs", 2)
    tuning.write_setting(path, "moe_x_pairs", 1)
    tuning.apply_tuning(path)
    assert (moe_decode.ACT_PAIRS, moe_decode.X_PAIRS) == (2, 1)


def test_router_refuses_a_bad_pairs_buffer():
    from reference_engine.kernels import router
    from reference_engine.ops.norms import AddNorm

    x = torch.randn(1, 64).bfloat16()
    add_norm = AddNorm(torch.randn(1, 64).bfloat16(), torch.randn(64).bfloat16(), torch.empty(1, 64).bfloat16(), torch.empty(1, 64).bfloat16(), 1e-6)
    weights, ids, rw = torch.empty(1, 3), torch.empty(1, 3, dtype=torch.int32), torch.randn(7, 64).bfloat16()
    with pytest.raises(ValueError, match="pairs_out needs add_norm"):
        router.router_gemv_topk_with_shared(x, rw, weights, ids, 2, pairs_out=torch.empty(1, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="pairs_out must be"):
        router.router_gemv_topk_with_shared(x, rw, weights, ids, 2, add_norm=add_norm, pairs_out=torch.empty(1, 64, dtype=torch.int32))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_act_pairs_are_bit_equal_on_cuda_at_the_real_shape(tokens, tmp_path, monkeypatch):
    """The committed decode MoE settings of the card (batch one, small batches, module), the real layer, the shared slot:
    the output with the activation handed over as pairs (both load forms) equals converting it in the down kernel."""
    import json

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


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3])
def test_x_pairs_from_the_fused_router_are_bit_equal_on_cuda_at_the_real_shape(tokens, tmp_path, monkeypatch):
    """The card's committed decode MoE and router settings with the norm folded into the router launch, the real layer:
    output, normed rows and residual with x handed over as pairs (both load forms, with the activation pairs too) equal
    converting x in the gate/up kernel."""
    import json

    from real_moe_layer import EXPERTS, HIDDEN, TOP_K, real_decode_inputs

    from reference_engine.kernels import moe_decode, router, tuning
    from reference_engine.ops.norms import AddNorm

    for module, names in ((moe_decode, ("LOOP", "GATE_UP_BLOCK_N", "GATE_UP_BLOCK_K", "DOWN_BLOCK_H", "DOWN_BLOCK_I", "WORDS", "DOWN_SPLIT", "BATCH_ONE",
                                        "SMALL_BATCHES", "ACT_PAIRS", "X_PAIRS")),
                          (router, ("ADD_NORM", "FUSED_ROUTER_MAX_TOKENS", "ROUTER_ROWS", "ROUTER_WARPS", "PREFETCH_EXPERTS"))):  # fmt: skip
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))
    committed = json.loads(tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability()).read_text())
    keys = ("device", "moe_decode", "moe_decode_batch_one", "moe_decode_small_batches", "fused_router_max_tokens", "router_rows", "router_warps")
    (tmp_path / "t.json").write_text(json.dumps({key: committed[key] for key in keys if key in committed}))
    tuning.apply_tuning(tmp_path / "t.json")
    router.ADD_NORM = True
    experts, shared, x, _, _ = real_decode_inputs(tokens)
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    router_weight = (torch.randn(EXPERTS + 1, HIDDEN, generator=generator, device="cuda") * HIDDEN**-0.5).bfloat16()
    residual = torch.randn(tokens, HIDDEN, generator=generator, device="cuda").bfloat16()
    norm_weight = (torch.randn(HIDDEN, generator=generator, device="cuda") * 0.1).bfloat16()
    assert moe_decode.folds_norm(x, router_weight)
    results = {}
    for setting in ((0, 0), (1, 0), (2, 0), (2, 2)):
        moe_decode.X_PAIRS, moe_decode.ACT_PAIRS = setting
        assert setting[0] == 0 or moe_decode.x_pairs_order(tokens, x) is not None, "x pairs would not be read at this batch"
        add_norm = AddNorm(residual, norm_weight, torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), 1e-6)
        out = torch.full_like(x, float("nan"))
        moe_decode.moe_block_decode_add_norm(x, add_norm, router_weight, experts, shared, TOP_K, out)
        results[setting] = (out, add_norm.out, add_norm.residual_out)
        assert all(torch.isfinite(t).all() for t in results[setting]), setting
    for setting, tensors in results.items():
        assert all(torch.equal(got, want) for got, want in zip(tensors, results[(0, 0)])), setting
