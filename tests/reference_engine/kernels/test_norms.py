"""Triton RMSNorm kernels against rmsnorm, fused-add-rmsnorm and gated-rmsnorm."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

KERNELS = {
    "norms-and-activations/rmsnorm": (
        "rms_norm", ["small-f32", "small-bf16", "odd-width-f32", "decode-t1-bf16", "weight-wrong-length", "weight-2d", "integer-x", "eps-not-positive"],
        "rms_norm_weight_not_zero_centred",
    ),
    "norms-and-activations/fused-add-rmsnorm": (
        "fused_add_rms_norm", ["small-f32", "small-bf16", "decode-t1-bf16", "residual-shape-mismatch", "residual-dtype-mismatch", "weight-wrong-length"],
        "fused_add_norms_x_not_the_sum",
    ),
    "norms-and-activations/gated-rmsnorm": (
        "gated_rms_norm", ["small-f32", "small-bf16", "decode-t1-bf16", "z-shape-mismatch", "z-dtype-mismatch", "weight-wrong-length"],
        "gated_rms_norm_zero_centred",
    ),
}


@pytest.fixture(scope="module")
def all_records():
    plan = {
        contract: {f"reference_engine.kernels.norms:{function}": cases, f"wrong_kernels:{wrong}": ["small-f32", "small-bf16"]}
        for contract, (function, cases, wrong) in KERNELS.items()
    }
    return interpreter_run(plan)["records"]


@pytest.mark.parametrize("contract", sorted(KERNELS))
def test_contract_cpu_cases_pass_under_the_interpreter_and_a_wrong_variant_is_caught(all_records, contract):
    function, cases, wrong = KERNELS[contract]
    records = all_records[f"{contract}|reference_engine.kernels.norms:{function}"]
    wrong_records = all_records[f"{contract}|wrong_kernels:{wrong}"]
    assert_all_passed(records, cases)
    assert len(wrong_records) == 2
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in wrong_records), [(r["case"], r["status"], r["message"]) for r in wrong_records]


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 64, 1024])
def test_matches_the_torch_ops_on_cuda(tokens):
    from reference_engine.kernels import norms as kernels
    from reference_engine.ops import norms as torch_ops

    generator = torch.Generator(device="cuda").manual_seed(tokens)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda").bfloat16()

    x, residual, weight = randn(tokens, 2048), randn(tokens, 2048), randn(2048) * 0.1
    expected, expected_residual = torch.empty_like(x), torch.empty_like(x)
    torch_ops.fused_add_rms_norm(x, residual, weight, expected, expected_residual)
    out, residual_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    kernels.fused_add_rms_norm(x, residual, weight, out, residual_out)
    assert torch.equal(residual_out, expected_residual)
    torch.testing.assert_close(out, expected, rtol=1.6e-2, atol=1e-2)
    heads, z, head_weight = randn(tokens * 32, 128), randn(tokens * 32, 128), randn(128)
    expected_gated, gated = torch.empty_like(heads), torch.full_like(heads, float("nan"))
    torch_ops.gated_rms_norm(heads, z, head_weight, expected_gated)
    kernels.gated_rms_norm(heads, z, head_weight, gated)
    torch.testing.assert_close(gated, expected_gated, rtol=1.6e-2, atol=1e-2)
    stacked = randn(tokens, 3 * 32 * 128)  # z as a token-strided view, as the eager GDN prefill passes it
    z_view = stacked[:, 4096:8192].view(tokens, 32, 128)
    strided, contiguous = torch.full_like(heads, float("nan")), torch.full_like(heads, float("nan"))
    kernels.gated_rms_norm(heads.view(tokens, 32, 128), z_view, head_weight, strided.view(tokens, 32, 128))
    kernels.gated_rms_norm(heads.view(tokens, 32, 128), z_view.contiguous(), head_weight, contiguous.view(tokens, 32, 128))
    assert torch.equal(strided, contiguous)


# The gated norm reads z [T, heads, D] at any token stride (a view of a stacked projection's output, as the eager GDN
# prefill passes it): equal to the torch op on that view and bit-equal to the kernel on a contiguous copy; the
# neighbouring slice of the same buffer (what a kernel ignoring the stride would read for token 1 on) gives another result.
STRIDED_Z_SCRIPT = """
import torch
from reference_engine.kernels import norms as kernels
from reference_engine.ops import norms as torch_ops

g = torch.Generator().manual_seed(9)
T, H, D = 5, 4, 16
x = torch.randn(T, H, D, generator=g)
stacked = torch.randn(T, 3 * H * D, generator=g)  # [q-like | z | other] per token
z = stacked[:, H * D : 2 * H * D].view(T, H, D)  # token stride 3 * H * D
weight = torch.randn(D, generator=g)
expected = torch.empty_like(x)
torch_ops.gated_rms_norm(x, z, weight, expected)
got, copy = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
kernels.gated_rms_norm(x, z, weight, got)
kernels.gated_rms_norm(x, z.contiguous(), weight, copy)
torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
assert torch.equal(got, copy)
wrong = torch.full_like(x, float("nan"))
kernels.gated_rms_norm(x, stacked.reshape(-1)[: T * H * D].view(T, H, D), weight, wrong)  # rows at row * D
assert float((wrong - expected).abs().max()) > 1e-2
print("ok")
"""


def test_gated_norm_reads_a_token_strided_z_under_the_interpreter():
    assert_script_ok(interpreter_run({}, STRIDED_Z_SCRIPT))


# fused_add_rms_norm(steps_out=): the normed values again in `moe_prefill_gluon.permute_steps` order (the Gluon experts'
# gate/up operand order), bit-equal to permuting `out`, with out and residual_out unchanged; NaN-poisoned buffers, D of
# two 128-column steps, random data. Known-wrong variants (the permuted store in natural order; the step's two-bit
# groups swapped) must be caught by the same checks, and bad buffers refused.
STEPS_SCRIPT = """
import torch
import wrong_source
from reference_engine.kernels import norms as kernels
from reference_engine.kernels.moe_prefill_gluon import permute_steps

g = torch.Generator().manual_seed(41)
T, D = 6, 256
x, residual = torch.randn(T, D, generator=g).bfloat16(), torch.randn(T, D, generator=g).bfloat16()
weight = (torch.randn(D, generator=g) * 0.1).bfloat16()

def run(module, steps=True):
    out, residual_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    steps_out = torch.full_like(x, float("nan")) if steps else None
    module.fused_add_rms_norm(x, residual, weight, out, residual_out, steps_out=steps_out)
    return out, residual_out, steps_out

def steps_ok(out, steps_out):
    return bool(torch.isfinite(steps_out).all()) and torch.equal(steps_out, permute_steps(out))

plain_out, plain_residual, _ = run(kernels, steps=False)
out, residual_out, steps_out = run(kernels)
assert torch.equal(out, plain_out) and torch.equal(residual_out, plain_residual), "steps_out changed out or residual_out"
assert not torch.equal(permute_steps(out), out), "the permutation is the identity on this data: the check could not fail"
assert steps_ok(out, steps_out), "steps_out is not permute_steps(out)"
print("steps_out == permute_steps(out)")
for name, old, new in (
    ("natural_order", "steps_ptr + rows * D + _step_column(cols)", "steps_ptr + rows * D + cols"),
    ("groups_swapped", "(((r >> 1) & 1) << 4) + ((r & 1) << 3)", "(((r >> 1) & 1) << 3) + ((r & 1) << 4)"),
):
    wrong = wrong_source.wrong_module(kernels, name, old, new)
    w_out, _, w_steps = run(wrong)
    assert torch.equal(w_out, out) and not steps_ok(w_out, w_steps), name
    print(f"wrong {name}: caught")
for bad, why in (
    (torch.empty(T, D, dtype=torch.float32), "dtype"),
    (torch.empty(D, T, dtype=torch.bfloat16).t(), "contiguous"),
):
    try:
        kernels.fused_add_rms_norm(x, residual, weight, torch.empty_like(x), torch.empty_like(x), steps_out=bad)
        raise AssertionError(f"steps_out with a wrong {why} accepted")
    except ValueError as error:
        print(f"refused ({why}): {error}")
x96 = torch.randn(T, 96, generator=g).bfloat16()
try:
    kernels.fused_add_rms_norm(x96, x96, weight[:96], torch.empty_like(x96), torch.empty_like(x96), steps_out=torch.empty_like(x96))
    raise AssertionError("steps_out with D = 96 accepted")
except ValueError as error:
    print(f"refused (D 96): {error}")
print("ok")
"""


def test_fused_add_norm_writes_the_permuted_steps_copy_under_the_interpreter():
    assert_script_ok(interpreter_run({}, STEPS_SCRIPT))


@pytest.mark.cuda
def test_fused_add_norm_steps_copy_on_cuda():
    """The real width (2048) at 1024 tokens: steps_out bit-equal to permuting out, out unchanged."""
    from reference_engine.kernels import norms as kernels
    from reference_engine.kernels.moe_prefill_gluon import permute_steps

    generator = torch.Generator(device="cuda").manual_seed(5)
    x, residual = (torch.randn(1024, 2048, generator=generator, device="cuda").bfloat16() for _ in range(2))
    weight = (torch.randn(2048, generator=generator, device="cuda") * 0.1).bfloat16()
    outs = []
    for steps in (None, torch.full_like(x, float("nan"))):
        out, residual_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        kernels.fused_add_rms_norm(x, residual, weight, out, residual_out, steps_out=steps)
        outs.append((out, residual_out, steps))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[1][2], permute_steps(outs[1][0]))


# rms_norm / fused_add_rms_norm(pairs_out=): the bfloat16 output again as the batch-1 GEMV's float16 pairs, bit-equal
# to `x_half_pairs(out, fp8)` in both orders, out and residual_out unchanged; NaN-poisoned outputs and a poisoned
# pairs buffer, random data, one row of the real width and several short rows. Known-wrong variants (the E4M3 order's
# column groups swapped; the float16 value not multiplied by 4) must be caught, and bad buffers refused.
PAIRS_SCRIPT = """
import torch
import wrong_source
from reference_engine.kernels import norms as kernels
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs

g = torch.Generator().manual_seed(43)

def run(module, x, residual, weight, fp8, pairs=True):
    out, residual_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    pairs_out = torch.full((*x.shape[:-1], x.shape[-1] // 2), -1, dtype=torch.int32) if pairs else None
    if residual is None:
        module.rms_norm(x, weight, out, pairs_out=pairs_out, pairs_fp8=fp8)
    else:
        module.fused_add_rms_norm(x, residual, weight, out, residual_out, pairs_out=pairs_out, pairs_fp8=fp8)
    return out, residual_out, pairs_out

cases = []
for T, D in ((1, 2048), (5, 48)):
    x, residual = torch.randn(T, D, generator=g).bfloat16(), torch.randn(T, D, generator=g).bfloat16()
    weight = (torch.randn(D, generator=g) * 0.1).bfloat16()
    for add in (False, True):
        for fp8 in (False, True):
            out, residual_out, pairs = run(kernels, x, residual if add else None, weight, fp8)
            plain_out, plain_residual, _ = run(kernels, x, residual if add else None, weight, fp8, pairs=False)
            assert torch.equal(out, plain_out) and (not add or torch.equal(residual_out, plain_residual)), "pairs_out changed out"
            assert torch.equal(pairs, x_half_pairs(out, fp8)), (T, D, add, fp8)
            assert not torch.equal(pairs, x_half_pairs(out, not fp8)), "both orders agree on this data: the check could not fail"
            cases.append((x, residual if add else None, weight, fp8, pairs))
print(f"{len(cases)} cases: pairs_out == x_half_pairs(out, fp8)")
for x, residual, weight, _, _ in cases[:4]:  # both orders at once (pairs_fp8 None): [T, 2, D / 2], plain then E4M3
    out, both = torch.full_like(x, float("nan")), torch.full((*x.shape[:-1], 2, x.shape[-1] // 2), -1, dtype=torch.int32)
    kernels.rms_norm(x, weight, out, pairs_out=both, pairs_fp8=None)
    assert torch.equal(both[..., 0, :], x_half_pairs(out, False)) and torch.equal(both[..., 1, :], x_half_pairs(out, True))
print("both orders: ok")
for name, old, new in (
    ("fp8_groups_swapped", "(t & 1) * 4 + ((t >> 1) & 1)", "(t & 1) + ((t >> 1) & 1) * 4"),
    ("fp8_not_times_4", "half = half * 4", "half = half * 1"),
):
    wrong = wrong_source.wrong_module(kernels, name, old, new)
    caught = sum(not torch.equal(run(wrong, x, r, w, fp8)[2], pairs) for x, r, w, fp8, pairs in cases if fp8)
    assert caught == sum(case[3] for case in cases), name
    print(f"wrong {name}: caught in {caught} cases")
x, weight = cases[0][0], cases[0][2]
for bad, why in (
    (torch.empty(1, 1024, dtype=torch.int64), "dtype"),
    (torch.empty(1, 2048, dtype=torch.int32), "shape"),
    (torch.empty(2048, 1, dtype=torch.int32)[::2].t(), "contiguous"),
):
    try:
        kernels.rms_norm(x, weight, torch.empty_like(x), pairs_out=bad)
        raise AssertionError(f"pairs_out with a wrong {why} accepted")
    except ValueError as error:
        print(f"refused ({why}): {error}")
try:
    kernels.rms_norm(x.float(), weight.float(), torch.empty_like(x.float()), pairs_out=torch.empty(1, 1024, dtype=torch.int32))
    raise AssertionError("pairs_out for a float32 out accepted")
except ValueError as error:
    print(f"refused (float32 out): {error}")
print("ok")
"""


def test_norms_write_the_gemv_pairs_under_the_interpreter():
    assert_script_ok(interpreter_run({}, PAIRS_SCRIPT, timeout=900))


@pytest.mark.cuda
@pytest.mark.parametrize("fp8", [False, True])
def test_norm_pairs_on_cuda(fp8):
    """The real width (2048), one token and 8: pairs_out bit-equal to x_half_pairs(out), out unchanged."""
    from reference_engine.kernels import norms as kernels
    from reference_engine.kernels.nvfp4_half_dot import x_half_pairs

    generator = torch.Generator(device="cuda").manual_seed(6)
    for tokens in (1, 8):
        x, residual = (torch.randn(tokens, 2048, generator=generator, device="cuda").bfloat16() for _ in range(2))
        weight = (torch.randn(2048, generator=generator, device="cuda") * 0.1).bfloat16()
        outs = []
        for pairs in (None, torch.full((tokens, 1024), -1, dtype=torch.int32, device="cuda")):
            out, residual_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
            kernels.fused_add_rms_norm(x, residual, weight, out, residual_out, pairs_out=pairs, pairs_fp8=fp8)
            outs.append((out, residual_out, pairs))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        assert torch.equal(outs[1][2], x_half_pairs(outs[1][0], fp8))


# Several short rows per program (`ROW_ELEMENTS`): every mode against the torch ops on random data with NaN-poisoned
# outputs, row counts that leave a partial last program, and the fused add's residual bit-equal; a known-wrong launch
# whose programs overlap (the row offset not scaled by ROWS) leaves rows unwritten and is caught.
ROWS_SCRIPT = """
import torch
import wrong_source
from reference_engine.kernels import norms as kernels
from reference_engine.ops import norms as torch_ops

g = torch.Generator().manual_seed(17)
T, H, D = 5, 3, 16  # 15 rows of 16: 4 rows per program at 64 elements, the last program half empty
x, z, residual = (torch.randn(T, H, D, generator=g) for _ in range(3))
weight = torch.randn(D, generator=g) * 0.5

def run(module):
    gated, plain, added, summed = (torch.full_like(x, float("nan")) for _ in range(4))
    module.gated_rms_norm(x, z, weight, gated)
    module.rms_norm(x, weight, plain)
    module.fused_add_rms_norm(x, residual, weight, added, summed)
    return gated, plain, added, summed

assert kernels.rows_per_program(16, 64) == 4 and kernels.rows_per_program(2048, 2048) == 1 and kernels.rows_per_program(128, 2048) == 16
expected = [torch.empty_like(x) for _ in range(4)]
torch_ops.gated_rms_norm(x, z, weight, expected[0])
torch_ops.rms_norm(x, weight, expected[1])
torch_ops.fused_add_rms_norm(x, residual, weight, expected[2], expected[3])
kernels.ROW_ELEMENTS = 64
got = run(kernels)
for name, a, b in zip(("gated", "plain", "fused add"), got, expected):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
assert torch.equal(got[3], expected[3]), "residual sum"
print("4 rows per program: ok")
wrong = wrong_source.wrong_module(kernels, "overlapping_programs", "tl.program_id(0).to(tl.int64) * ROWS", "tl.program_id(0).to(tl.int64)")
wrong.ROW_ELEMENTS = 64
bad = run(wrong)
assert not torch.isfinite(bad[0]).all(), "overlapping programs not caught"
print("overlapping programs: caught")
print("ok")
"""


def test_several_rows_per_program_under_the_interpreter():
    assert_script_ok(interpreter_run({}, ROWS_SCRIPT))


@pytest.mark.cuda
@pytest.mark.parametrize("row_elements", [1, 2048, 4096])
def test_gated_norm_rows_per_program_on_cuda(monkeypatch, row_elements):
    """The Gated DeltaNet output norm's prefill shape (1024 tokens x 32 heads x 128) at several rows per program."""
    from reference_engine.kernels import norms as kernels
    from reference_engine.ops import norms as torch_ops

    monkeypatch.setattr(kernels, "ROW_ELEMENTS", row_elements)
    generator = torch.Generator(device="cuda").manual_seed(row_elements)
    x, z = (torch.randn(1024, 32, 128, generator=generator, device="cuda").bfloat16() for _ in range(2))
    weight = torch.randn(128, generator=generator, device="cuda").bfloat16()
    expected, got = torch.empty_like(x), torch.full_like(x, float("nan"))
    torch_ops.gated_rms_norm(x, z, weight, expected)
    kernels.gated_rms_norm(x, z, weight, got)
    torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=1e-2)
