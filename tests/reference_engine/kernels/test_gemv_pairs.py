"""x handed to the batch-1 GEMV as float16 pairs by the norm before the mixer (`kernels/gemv_pairs.py`)."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import REPO, run_script

from reference_engine.kernels import gemv_pairs


def test_lookup_answers_only_inside_the_block_for_the_same_unmodified_tensor(monkeypatch):
    monkeypatch.setattr(gemv_pairs, "X_PAIRS", 1)
    x = torch.randn(1, 64).bfloat16()
    pairs = gemv_pairs.pairs_buffer(x)
    pairs.copy_(torch.arange(pairs.numel(), dtype=torch.int32).view(pairs.shape))
    assert gemv_pairs.lookup(x, False) is None
    with gemv_pairs.given(x, pairs):
        plain, fp8 = gemv_pairs.lookup(x.view(1, 64), False), gemv_pairs.lookup(x, True)
        assert torch.equal(plain, pairs[:, 0]) and torch.equal(fp8, pairs[:, 1]) and plain.is_contiguous() and fp8.is_contiguous()
        assert gemv_pairs.lookup(x.clone(), False) is None  # another tensor with the same values
        assert gemv_pairs.lookup(x[:, :32], False) is None  # same address, another shape
        monkeypatch.setattr(gemv_pairs, "X_PAIRS", 0)
        assert gemv_pairs.lookup(x, False) is None  # the setting off
        monkeypatch.setattr(gemv_pairs, "X_PAIRS", 2)
        x.add_(1)  # x changed by torch after its producer wrote the pairs: they no longer describe it
        assert gemv_pairs.lookup(x, False) is None
    assert gemv_pairs.lookup(x, False) is None and not gemv_pairs._ACTIVE
    with pytest.raises(ValueError, match="pairs must be contiguous int32"), gemv_pairs.given(x, pairs[:, 0]):
        pass
    assert not gemv_pairs._ACTIVE


def test_applies_only_to_one_contiguous_bfloat16_token_of_whole_blocks(monkeypatch):
    monkeypatch.setattr(gemv_pairs, "X_PAIRS", 2)
    assert gemv_pairs.applies(torch.empty(1, 64, dtype=torch.bfloat16))
    for x in (torch.empty(2, 64, dtype=torch.bfloat16), torch.empty(1, 64), torch.empty(1, 40, dtype=torch.bfloat16),
              torch.empty(1, 128, dtype=torch.bfloat16)[:, ::2]):  # fmt: skip
        assert not gemv_pairs.applies(x), (x.dtype, x.shape)
    monkeypatch.setattr(gemv_pairs, "X_PAIRS", 0)
    assert not gemv_pairs.applies(torch.empty(1, 64, dtype=torch.bfloat16))


# The tiny model (bfloat16, NVFP4 linears), batch 1, static decode with the Triton norms and NVFP4 linears under the
# interpreter (the batch-1 GEMV forced onto its packed-float16 kernel, both word orders): with the pairs on, every
# layer's mixer GEMV reads them (one hit a layer a step), and the logits are the same bits as with the pairs off. A
# known-wrong hand-over (the other order's pairs) must change the logits.
MODEL_SCRIPT = r"""
import sys
from dataclasses import replace
sys.path.insert(0, TESTS_DIR)
import torch
import reference_engine.runner as runner
from test_cuda_graphs import _decode_logits, _prompts
from reference_engine.kernels import gemv_pairs, norms, nvfp4_gemv
from reference_engine.presets import build_preset

original = runner.select_ops
KERNELS = {"rms_norm": norms.rms_norm, "fused_add_rms_norm": norms.fused_add_rms_norm,
           "w4a16_linear": nvfp4_gemv.w4a16_linear, "w4a16_linear_rows": nvfp4_gemv.w4a16_linear_rows}


def with_kernels(device, use_triton=True):
    ops = original(device, use_triton=use_triton)
    return replace(ops, **KERNELS, backends=ops.backends | {name: "triton" for name in KERNELS})


runner.select_ops = with_kernels
hits = []
lookup = gemv_pairs.lookup


def counted(x2d, fp8):
    found = lookup(x2d, fp8)
    hits.append(found is not None)
    return found if found is None or not WRONG else lookup(x2d, not fp8)


gemv_pairs.lookup = counted
model = build_preset("tiny", quantize="nvfp4", seed=7, dtype=torch.bfloat16)
prompts = _prompts(1, model.config.vocab_size, seed=13)
layers = len(model.layers)
for words in (2, 3):
    nvfp4_gemv.WORDS = words
    results = {}
    for setting in (0, 1, 2):
        gemv_pairs.X_PAIRS = setting
        hits.clear()
        tokens, logits, _ = _decode_logits(model, "static", prompts, steps=3, max_num_seqs=1)
        steps = len(logits)
        assert steps >= 2, steps
        assert sum(hits) == (0 if setting == 0 else layers * steps), (words, setting, sum(hits), layers, steps)
        assert all(torch.isfinite(step).all() for step in logits)
        results[setting] = (tokens, logits)
        print(f"words {words} pairs {setting}: {sum(hits)} GEMVs read the pairs over {steps} steps")
    same = all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1])) and all(torch.equal(a, b) for a, b in zip(results[0][1], results[2][1]))
    if WRONG:
        assert not same, "the other order's pairs gave the same logits: the check could not fail"
        print(f"words {words}: wrong order caught")
    else:
        assert same, "logits with the pairs differ from converting x in the kernel"
print("ok")
"""


@pytest.mark.parametrize("wrong", [False, True], ids=["pairs", "wrong_order"])
def test_static_decode_with_the_pairs_gives_the_same_logits_under_the_interpreter(wrong):
    header = f"TESTS_DIR = {str(REPO / 'tests' / 'reference_engine')!r}\nWRONG = {wrong!r}\n"
    output = run_script(header + MODEL_SCRIPT, timeout=900)
    print(output)
    assert output.strip().endswith("ok"), output
