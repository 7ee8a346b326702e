"""x handed to the batch-1 GEMV as float16 pairs by the norm before the mixer (`kernels/gemv_pairs.py`)."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import REPO, run_script

from reference_engine.kernels import gemv_pairs


def _script_ok(source: str) -> None:
    """Run `source` under the interpreter; its last line must be "ok"."""
    output = run_script(source, timeout=900)
    print(output)
    assert output.strip().endswith("ok"), output


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
    with pytest.raises(ValueError, match="pairs_out must be contiguous int32"), gemv_pairs.given(x, pairs[:, 0]):
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


# gdn_decode_step(pairs_out=): each head's gated-norm output again as float16 pairs in both orders, bit-equal to
# `x_half_pairs(out)`, with out and both state pools the same bits as without; bfloat16, random data and states, one
# and two rows, the split-head path and one program per head, the conv in the launch or not. A known-wrong variant
# (the E4M3 half written in the plain order) must be caught, and a bad buffer refused.
GDN_SCRIPT = r"""
import torch
import wrong_source
import reference_engine.kernels.gdn_decode_step as step_module
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs

HK, HV, DK, DV, K, POOL = 2, 4, 16, 32, 4, 5
gen = torch.Generator().manual_seed(17)
C = 2 * HK * DK + HV * DV


def inputs(batch):
    bf = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).bfloat16()
    return dict(mixed_qkv=bf(batch, C), z=bf(batch, HV * DV), b=bf(batch, HV, scale=2.0), a=bf(batch, HV, scale=2.0),
                conv_weight=bf(C, K, scale=0.5), A_log=torch.rand(HV, generator=gen).mul(7).add(1).log(),
                dt_bias=torch.rand(HV, generator=gen).mul(2).sub(1), norm_weight=(1 + 0.1 * torch.randn(DV, generator=gen)).bfloat16(),
                conv_state=bf(POOL, C, K - 1), recurrent_state=torch.randn(POOL, HV, DK, DV, generator=gen) * 0.5,
                state_slots=torch.tensor([3, 1][:batch]), has_initial_state=torch.tensor([True, False][:batch]))


def run(module, case, pairs):
    args = {name: value.clone() for name, value in case.items()}
    out = torch.full((case["mixed_qkv"].shape[0], HV * DV), float("nan")).bfloat16()
    pairs_out = torch.full((out.shape[0], 2, HV * DV // 2), -1, dtype=torch.int32) if pairs else None
    module.gdn_decode_step(**args, out=out, eps=1e-6, **({} if pairs_out is None else {"pairs_out": pairs_out}))
    return out, args["conv_state"], args["recurrent_state"], pairs_out


checked = []
for batch in (1, 2):
    case = inputs(batch)
    for split_below in (128, 0):
        for fused_max in (0, 64):
            step_module.STEP_SPLIT_BELOW, step_module.FUSED_CONV_MAX_BATCH = split_below, fused_max
            plain = run(step_module, case, False)
            out, conv, rec, pairs = run(step_module, case, True)
            assert torch.isfinite(out.float()).all()
            assert torch.equal(out, plain[0]) and torch.equal(conv, plain[1]) and torch.equal(rec, plain[2]), "pairs_out changed the step"
            assert torch.equal(pairs[:, 0], x_half_pairs(out, False)) and torch.equal(pairs[:, 1], x_half_pairs(out, True)), (batch, split_below, fused_max)
            checked.append((case, pairs))
print(f"{len(checked)} settings: pairs_out == x_half_pairs(out) in both orders")
wrong = wrong_source.wrong_module(step_module, "fp8_half_plain", "dest + (HV * DV) // 2, words, word_ok, True)", "dest + (HV * DV) // 2, words, word_ok, False)")
wrong.STEP_SPLIT_BELOW, wrong.FUSED_CONV_MAX_BATCH = 128, 0
assert not torch.equal(run(wrong, checked[0][0], True)[3], checked[0][1]), "the wrong order was not caught"
print("wrong fp8_half_plain: caught")
try:
    step_module.gdn_decode_step(**inputs(1), out=torch.empty(1, HV * DV).bfloat16(), eps=1e-6, pairs_out=torch.empty(1, HV * DV // 2, dtype=torch.int32))
    raise AssertionError("a one-order pairs_out accepted")
except ValueError as error:
    print(f"refused: {error}")
print("ok")
"""


def test_gdn_step_writes_the_out_proj_pairs_under_the_interpreter():
    _script_ok(GDN_SCRIPT)


# paged_decode_gated(pairs_out=): each head's gated output again as float16 pairs in both orders for o_proj, bit-equal
# to `x_half_pairs(out)`, out unchanged; bfloat16, random query, cache and gate, one and two sequences of different
# lengths. A known-wrong variant (the E4M3 half at the plain half's offset) must be caught, a bad buffer refused.
PAGED_SCRIPT = r"""
import torch
import wrong_source
import reference_engine.kernels.paged_decode as paged
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs

HQ, HKV, D, BS, BLOCKS = 4, 2, 32, 16, 8
gen = torch.Generator().manual_seed(29)
bf = lambda *shape: torch.randn(*shape, generator=gen).bfloat16()


def run(module, batch, pairs):
    g = torch.Generator().manual_seed(31 + batch)
    query = torch.randn(batch, HQ, D, generator=g).bfloat16()
    k_cache, v_cache = torch.randn(BLOCKS, BS, HKV, D, generator=g).bfloat16(), torch.randn(BLOCKS, BS, HKV, D, generator=g).bfloat16()
    tables = torch.tensor([[5, 2, 7], [1, 3, 0]][:batch], dtype=torch.int32)
    lens = torch.tensor([37, 20][:batch], dtype=torch.int32)
    q_gate = torch.randn(batch, HQ * 2 * D, generator=g).bfloat16()
    out = torch.full((batch, HQ * D), float("nan")).bfloat16()
    pairs_out = torch.full((batch, 2, HQ * D // 2), -1, dtype=torch.int32) if pairs else None
    module.paged_decode_gated(query, k_cache, v_cache, tables, lens, q_gate, out, 0.125, **({} if pairs_out is None else {"pairs_out": pairs_out}))
    return out, pairs_out


cases = []
for batch in (1, 2):
    plain, _ = run(paged, batch, False)
    out, pairs = run(paged, batch, True)
    assert torch.isfinite(out.float()).all() and torch.equal(out, plain), "pairs_out changed out"
    assert torch.equal(pairs[:, 0], x_half_pairs(out, False)) and torch.equal(pairs[:, 1], x_half_pairs(out, True)), batch
    cases.append((batch, pairs))
print("paged pairs == x_half_pairs(out) in both orders")
wrong = wrong_source.wrong_module(paged, "fp8_at_plain", "dest + (HQ * D) // 2, words, word_ok, True)", "dest, words, word_ok, True)")
assert not torch.equal(run(wrong, 1, True)[1], cases[0][1]), "the misplaced E4M3 half was not caught"
print("wrong fp8_at_plain: caught")
try:
    paged.paged_decode_gated(torch.empty(1, HQ, D).bfloat16(), bf(BLOCKS, BS, HKV, D), bf(BLOCKS, BS, HKV, D), torch.zeros(1, 3, dtype=torch.int32),
                             torch.tensor([5], dtype=torch.int32), bf(1, HQ * 2 * D), torch.empty(1, HQ * D).bfloat16(), 0.125,
                             pairs_out=torch.empty(1, HQ * D // 2, dtype=torch.int32))
    raise AssertionError("a one-order pairs_out accepted")
except ValueError as error:
    print(f"refused: {error}")
print("ok")
"""


def test_paged_decode_writes_the_o_proj_pairs_under_the_interpreter():
    _script_ok(PAGED_SCRIPT)


# The tiny model (bfloat16, NVFP4 linears), batch 1, static decode with the Triton norms and NVFP4 linears under the
# interpreter (the batch-1 GEMV forced onto its packed-float16 kernel, both word orders): with the pairs on, every
# layer's first mixer GEMV and every output projection (GDN out_proj, attention o_proj) read them, and the logits are
# the same bits as with the pairs off. A
# known-wrong hand-over (the other order's pairs) must change the logits.
MODEL_SCRIPT = r"""
import sys
sys.path.insert(0, TESTS_DIR)
import torch
from runner_ops import use_kernels
from test_cuda_graphs import _decode_logits, _prompts
from reference_engine.kernels import gdn_decode_step, gemv_pairs, norms, nvfp4_gemv, paged_decode
from reference_engine.presets import build_preset

KERNELS = {"rms_norm": norms.rms_norm, "fused_add_rms_norm": norms.fused_add_rms_norm,
           "w4a16_linear": nvfp4_gemv.w4a16_linear, "w4a16_linear_rows": nvfp4_gemv.w4a16_linear_rows,
           "gdn_decode_step": gdn_decode_step.gdn_decode_step, "paged_decode_gated": paged_decode.paged_decode_gated}
use_kernels(KERNELS)
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
readers = 2 * layers  # every mixer's input projection and its output projection (GDN out_proj, attention o_proj)
for words in (2, 3):
    nvfp4_gemv.WORDS = words
    results = {}
    for setting in (0, 1, 2):
        gemv_pairs.X_PAIRS = setting
        hits.clear()
        tokens, logits, _ = _decode_logits(model, "static", prompts, steps=3, max_num_seqs=1)
        steps = len(logits)
        assert steps >= 2, steps
        assert sum(hits) == (0 if setting == 0 else readers * steps), (words, setting, sum(hits), readers, steps)
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
    _script_ok(f"TESTS_DIR = {str(REPO / 'tests' / 'reference_engine')!r}\nWRONG = {wrong!r}\n" + MODEL_SCRIPT)


def test_scopes_nest_and_leave_in_order(monkeypatch):
    """The decoder's scope (the mixer input) holds while the GDN layer opens its own (out_proj's input) inside it."""
    monkeypatch.setattr(gemv_pairs, "X_PAIRS", 1)
    outer, inner = torch.randn(1, 64).bfloat16(), torch.randn(1, 32).bfloat16()
    outer_pairs, inner_pairs = gemv_pairs.pairs_buffer(outer), gemv_pairs.pairs_buffer(inner)
    with gemv_pairs.given(outer, outer_pairs):
        with gemv_pairs.given(inner, inner_pairs):
            assert gemv_pairs.lookup(inner, True).data_ptr() == inner_pairs[:, 1].data_ptr()
            assert gemv_pairs.lookup(outer, False).data_ptr() == outer_pairs[:, 0].data_ptr()
        assert gemv_pairs.lookup(inner, True) is None and gemv_pairs.lookup(outer, True) is not None
    assert not gemv_pairs._ACTIVE


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gdn_step_pairs_on_cuda_at_the_real_heads():
    """Hk 16, Hv 32, Dk = Dv = 128, one row (the split-head path with the conv in the launch, as the batch-1 graph
    runs it): out and both pools the same bits with and without the pairs, the pairs bit-equal to `x_half_pairs(out)`."""
    from reference_engine.kernels.gdn_decode_step import gdn_decode_step
    from reference_engine.kernels.nvfp4_half_dot import x_half_pairs

    hk, hv, dk, dv, k, pool = 16, 32, 128, 128, 4, 3
    channels = 2 * hk * dk + hv * dv
    g = torch.Generator(device="cuda").manual_seed(23)

    def bf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()

    case = {"mixed_qkv": bf(1, channels), "z": bf(1, hv * dv), "b": bf(1, hv, scale=2.0), "a": bf(1, hv, scale=2.0), "conv_weight": bf(channels, k, scale=0.5),
                "A_log": torch.rand(hv, generator=g, device="cuda").mul(7).add(1).log(), "dt_bias": torch.rand(hv, generator=g, device="cuda").mul(2).sub(1),
                "norm_weight": (1 + 0.1 * torch.randn(dv, generator=g, device="cuda")).bfloat16(), "conv_state": bf(pool, channels, k - 1),
                "recurrent_state": torch.randn(pool, hv, dk, dv, generator=g, device="cuda") * 0.5,
                "state_slots": torch.tensor([1], device="cuda"), "has_initial_state": torch.tensor([True], device="cuda")}  # fmt: skip
    results = []
    for pairs in (None, torch.full((1, 2, hv * dv // 2), -1, dtype=torch.int32, device="cuda")):
        args = {name: value.clone() for name, value in case.items()}
        out = torch.full((1, hv * dv), float("nan"), device="cuda").bfloat16()
        gdn_decode_step(**args, out=out, eps=1e-6, **({} if pairs is None else {"pairs_out": pairs}))
        results.append((out, args["conv_state"], args["recurrent_state"], pairs))
    (out, conv, rec, _), (out_p, conv_p, rec_p, pairs) = results
    assert torch.isfinite(out.float()).all()
    assert torch.equal(out, out_p) and torch.equal(conv, conv_p) and torch.equal(rec, rec_p)
    assert torch.equal(pairs[:, 0], x_half_pairs(out_p, False)) and torch.equal(pairs[:, 1], x_half_pairs(out_p, True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_paged_decode_pairs_on_cuda_at_the_real_heads():
    """Hq 16 over Hkv 2 at head dim 256, one sequence of 300 tokens: out the same bits with and without the pairs, the
    pairs bit-equal to `x_half_pairs(out)` in both orders."""
    from reference_engine.kernels.nvfp4_half_dot import x_half_pairs
    from reference_engine.kernels.paged_decode import paged_decode_gated

    hq, hkv, d, bs, blocks = 16, 2, 256, 16, 32
    g = torch.Generator(device="cuda").manual_seed(37)
    query = torch.randn(1, hq, d, generator=g, device="cuda").bfloat16()
    k_cache, v_cache = (torch.randn(blocks, bs, hkv, d, generator=g, device="cuda").bfloat16() for _ in range(2))
    tables = torch.randperm(blocks, device="cuda")[:19].to(torch.int32)[None]
    lens = torch.tensor([300], dtype=torch.int32, device="cuda")
    q_gate = torch.randn(1, hq * 2 * d, generator=g, device="cuda").bfloat16()
    results = []
    for pairs in (None, torch.full((1, 2, hq * d // 2), -1, dtype=torch.int32, device="cuda")):
        out = torch.full((1, hq * d), float("nan"), device="cuda").bfloat16()
        paged_decode_gated(query, k_cache, v_cache, tables, lens, q_gate, out, d**-0.5, **({} if pairs is None else {"pairs_out": pairs}))
        results.append((out, pairs))
    (out, _), (out_p, pairs) = results
    assert torch.isfinite(out.float()).all() and torch.equal(out, out_p)
    assert torch.equal(pairs[:, 0], x_half_pairs(out_p, False)) and torch.equal(pairs[:, 1], x_half_pairs(out_p, True))
