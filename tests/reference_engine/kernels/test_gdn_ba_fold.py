"""The GDN decode step computing b and a itself (`gdn_decode_step(ba_from=)`, the "b/a fold"), against their own launch.

A Gated DeltaNet layer's b and a are two dense linears of its input (stacked: b rows, then a rows). With `ba_from` the
step's recurrent kernel dots the head's two rows with x[row] in float32 and rounds to the model dtype, as the dense
GEMV computes them, and writes b and a into the caller's tensors. Interpreter (one subprocess):
- at small heads (Hk 2, Hv 4, Dk 16, Dv 24, hidden 48: not a power of two, so the masks are exercised) and the real
  heads (Hk 16, Hv 32, Dk = Dv = 128, hidden 2048), batches 1 and 3, bfloat16 and float32, split and unsplit heads,
  with and without the fused conv: b, a, the output and both state pools are bit-equal to the dense GEMV's b and a fed
  to the step; the b/a outputs are poisoned with NaN first;
- known-wrong folds are caught: the stacked weight with a's rows first, and x of the wrong row;
- the tiny model's static decode (batches 1 and 2) with the Triton GDN step: with the fold on, no b/a launch runs, every
  GDN step receives `ba_from`, and the logits are the same bits as with it off; a fold handed the swapped weight
  changes them (the fold is live in the model path).
In process: bad `ba_from` arguments are refused with a clear error, and the tuning key reaches the module setting.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import REPO, assert_script_ok, interpreter_run, run_script

SCRIPT = r"""
import torch

import reference_engine.kernels.gdn_decode_step as step_module
from reference_engine.kernels.dense_gemv import dense_linear

POOL, K, EPS = 6, 4, 1e-6


def case(dtype, hk, hv, dk, dv, hidden, batch, seed):
    g = torch.Generator().manual_seed(seed)
    channels = 2 * hk * dk + hv * dv
    r = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(dtype)
    return dict(
        mixed_qkv=r(batch, channels), z=r(batch, hv * dv), conv_weight=r(channels, K, s=0.5),
        A_log=torch.rand(hv, generator=g).mul(7).add(1).log(), dt_bias=torch.rand(hv, generator=g).mul(2).sub(1),
        norm_weight=(1 + 0.1 * torch.randn(dv, generator=g)).to(dtype), conv_state=r(POOL, channels, K - 1),
        recurrent_state=torch.randn(POOL, hv, dk, dv, generator=g) * 0.5, state_slots=torch.tensor([4, 1, 3][:batch]),
        has_initial_state=torch.tensor([True, False, True][:batch]), x=r(batch, hidden), weight=r(2 * hv, hidden, s=3 * hidden**-0.5),
    ), hv


def run(inputs, hv, fold, weight=None, x=None):
    inputs = {name: value.clone() for name, value in inputs.items()}
    x_in, w_in = inputs.pop("x"), inputs.pop("weight")
    batch = x_in.shape[0]
    ba = torch.full((batch, 2 * hv), float("nan"), dtype=x_in.dtype)
    b, a = ba.split(hv, dim=1)
    extra = {}
    if fold:
        extra = {"ba_from": (x_in if x is None else x, w_in if weight is None else weight)}
    else:
        dense_linear(x_in, w_in, ba)
    out = torch.full((batch, inputs["z"].shape[1]), float("nan"), dtype=x_in.dtype)
    step_module.gdn_decode_step(b=b, a=a, out=out, eps=EPS, **inputs, **extra)
    return ba, out, inputs["conv_state"], inputs["recurrent_state"]


def same(first, second):
    return all(torch.equal(p, q) for p, q in zip(first, second))


checked = 0
for dtype in (torch.bfloat16, torch.float32):
    for shape in ((2, 4, 16, 24, 48), (16, 32, 128, 128, 2048)):
        for batch in (1, 3):
            if shape[1] == 32 and (batch == 3 or dtype == torch.float32):
                continue  # the real heads once, at batch 1 in bfloat16 (the interpreter is slow there)
            inputs, hv = case(dtype, *shape, batch, seed=checked)
            for below, fused in ((1 << 30, False), (0, False), (1 << 30, True)):
                step_module.STEP_SPLIT_BELOW, step_module.FUSED_CONV = below, fused
                launched, folded = run(inputs, hv, False), run(inputs, hv, True)
                assert torch.isfinite(folded[0].float()).all() and torch.isfinite(folded[1].float()).all()
                assert same(launched, folded), (dtype, shape, batch, below, fused, (folded[0].float() - launched[0].float()).abs().max())
                checked += 1
            step_module.STEP_SPLIT_BELOW, step_module.FUSED_CONV = 128, False
            w = inputs["weight"]
            swapped = run(inputs, hv, True, weight=torch.cat([w[hv:], w[:hv]]))
            assert not torch.equal(swapped[0], launched[0]) and not torch.equal(swapped[1], launched[1]), "a swapped b/a weight was not caught"
            if batch > 1:
                wrong_row = run(inputs, hv, True, x=inputs["x"].flip(0).contiguous())
                assert not torch.equal(wrong_row[1], launched[1]), "x of the wrong row was not caught"
print(f"{checked} settings bit-equal; wrong folds caught")
print("ok")
"""


# The tiny model (bfloat16, NVFP4 linears), static decode with the Triton GDN step under the interpreter: with the fold
# on, no b/a linear runs, every GDN step gets `ba_from`, and the logits are the bits of the fold off. WRONG hands the
# fold the weight with a's rows first, which must change them.
MODEL_SCRIPT = r"""
import sys
sys.path.insert(0, TESTS_DIR)
import torch
from runner_ops import use_kernels
from test_cuda_graphs import _decode_logits, _prompts
from reference_engine.kernels import gdn_decode_step
from reference_engine.model import gated_deltanet
from reference_engine.presets import build_preset

calls = {"step": 0, "folded": 0, "projections": 0}
def counted_step(*args, **kwargs):
    calls["step"] += 1
    calls["folded"] += "ba_from" in kwargs
    return gdn_decode_step.gdn_decode_step(*args, **kwargs)
use_kernels({"gdn_decode_step": counted_step})
real_projections = gated_deltanet.GatedDeltaNet._projections
def counted_projections(self, x, ops, *args, **kwargs):  # the path that runs the b/a linear (ops: the static decode's)
    calls["projections"] += ops is not None
    return real_projections(self, x, ops, *args, **kwargs)
gated_deltanet.GatedDeltaNet._projections = counted_projections
if WRONG:
    real_weight = gated_deltanet.GatedDeltaNet._ba_fold_weight
    def swapped(self, ops, x):
        w = real_weight(self, ops, x)
        return None if w is None else torch.cat([w[self.num_v_heads:], w[:self.num_v_heads]])
    gated_deltanet.GatedDeltaNet._ba_fold_weight = swapped

model = build_preset("tiny", quantize="nvfp4", seed=7, dtype=torch.bfloat16)
for batch in (1, 2):
    prompts = _prompts(batch, model.config.vocab_size, seed=13)
    results = {}
    for fold in (0, 8):
        gdn_decode_step.BA_FOLD_MAX_BATCH = fold
        for key in calls:
            calls[key] = 0
        tokens, logits, _ = _decode_logits(model, "static", prompts, steps=3, max_num_seqs=batch)
        assert len(logits) >= 2 and all(torch.isfinite(step).all() for step in logits)
        assert calls["step"] > 0, "the Triton GDN step never ran"
        assert calls["folded"] == (calls["step"] if fold else 0), (fold, calls)
        assert calls["projections"] == (0 if fold else calls["step"]), (fold, calls)  # no b/a linear with the fold
        results[fold] = logits
        print(f"batch {batch}, fold ceiling {fold}: {calls['step']} GDN steps, {calls['folded']} with ba_from")
    equal = all(torch.equal(p, q) for p, q in zip(results[0], results[8]))
    assert equal != WRONG, ("the fold changed the logits" if not WRONG else "a swapped b/a weight was not caught", batch)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=900)


def test_the_fold_is_bit_equal_to_the_b_a_launch_and_wrong_folds_are_caught(run):
    assert_script_ok(run)


@pytest.mark.parametrize("wrong", [False, True], ids=["fold", "swapped_weight"])
def test_static_decode_with_the_fold_gives_the_same_logits_under_the_interpreter(wrong):
    output = run_script(f"TESTS_DIR = {str(REPO / 'tests' / 'reference_engine')!r}\nWRONG = {wrong!r}\n" + MODEL_SCRIPT, timeout=900)
    print(output)
    assert output.strip().endswith("ok"), output


def _step_arguments(batch: int = 1, hidden: int = 48) -> dict:
    hk, hv, dk, dv = 2, 4, 16, 24
    channels = 2 * hk * dk + hv * dv
    return {
        "mixed_qkv": torch.randn(batch, channels), "z": torch.randn(batch, hv * dv), "b": torch.empty(batch, hv), "a": torch.empty(batch, hv),
        "conv_weight": torch.randn(channels, 4), "A_log": torch.rand(hv), "dt_bias": torch.rand(hv), "norm_weight": torch.ones(dv),
        "conv_state": torch.randn(3, channels, 3), "recurrent_state": torch.randn(3, hv, dk, dv), "state_slots": torch.tensor([1] * batch),
        "has_initial_state": torch.ones(batch, dtype=torch.bool), "out": torch.empty(batch, hv * dv), "eps": 1e-6,
    }


@pytest.mark.parametrize(
    ("ba_from", "message"),
    [
        ((torch.randn(1, 48),), "must be a tuple"),
        ((torch.randn(2, 48), torch.randn(8, 48)), r"x must be \[B=1, H\]"),
        ((torch.randn(48, 2)[:, :1].t(), torch.randn(8, 48)), "unit column stride"),
        ((torch.randn(1, 48), torch.randn(6, 48)), r"weight must be contiguous \[2 \* Hv=8, H=48\]"),
        ((torch.randn(1, 48), torch.randn(48, 8).t()), "weight must be contiguous"),
        ((torch.randn(1, 48).double(), torch.randn(8, 48)), "x must be torch.float32"),
        ((torch.randn(1, 16384), torch.randn(8, 16384)), "1 to 8192 columns"),
    ],
)
def test_bad_ba_from_is_refused(ba_from, message):
    from reference_engine.kernels import gdn_decode_step

    with pytest.raises(ValueError, match=message):
        gdn_decode_step.gdn_decode_step(**_step_arguments(), ba_from=ba_from)


def test_b_and_a_may_not_overlap_the_inputs():
    from reference_engine.kernels import gdn_decode_step

    arguments = _step_arguments()
    weight = torch.randn(8, 48)
    arguments["b"] = weight[0, :4].view(1, 4)  # written by the step, read by it too
    with pytest.raises(ValueError, match="b is written and must not overlap"):
        gdn_decode_step.gdn_decode_step(**arguments, ba_from=(torch.randn(1, 48), weight))


def test_tuning_key_sets_the_fold_ceiling(tmp_path, monkeypatch):
    from reference_engine.kernels import gdn_decode_step, tuning

    monkeypatch.setattr(gdn_decode_step, "BA_FOLD_MAX_BATCH", 0)
    assert not gdn_decode_step.folds_ba(1)
    path = tmp_path / "card.json"
    path.write_text('{"device": "test card"}')
    tuning.write_setting(path, "gdn_step_ba_fold_max_batch", 8)
    tuning.apply_tuning(path)
    assert gdn_decode_step.BA_FOLD_MAX_BATCH == 8 and gdn_decode_step.folds_ba(8) and not gdn_decode_step.folds_ba(9) and not gdn_decode_step.folds_ba(0)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_the_fold_matches_the_b_a_launch_on_cuda_at_the_real_shape(batch, tmp_path, monkeypatch):
    """The card's committed GDN step settings, real heads and hidden size: b and a within one bfloat16 step of the dense
    launch's (the GPU's float32 reduction tree may differ), the conv states bit for bit, output and recurrent states
    to rounding; the b/a outputs poisoned first."""
    import sys

    from reference_engine.kernels import gdn_decode_step, tuning

    for name in ("STEP_SPLIT_BELOW", "STEP_SPLIT", "FUSED_CONV", "FUSED_CONV_MAX_BATCH", "STATE_FIRST", "BA_FOLD_MAX_BATCH"):
        monkeypatch.setattr(gdn_decode_step, name, getattr(gdn_decode_step, name))
    tuning.apply_for_cuda()
    sys.path.insert(0, str(REPO / "benchmarks" / "kernels"))
    from time_ba_fold import one_batch

    record = one_batch(batch)
    assert record["close"], record
