"""Triton GDN gates (one launch) against the contract, the torch op, padding rows and known-wrong variants.

One interpreter subprocess runs the contract's CPU cases, then a script that compares the kernel with the torch
op on strided views of a wider buffer (as the model passes in_proj_ba's columns), with NaN-poisoned outputs, with
`valid_tokens` (rows from the count on must come out 0), and two known-wrong variants of the kernel source.
"""

from __future__ import annotations

import json

import pytest
import torch
from kernel_interpreter import assert_all_passed, interpreter_run

CONTRACT = "linear-attention/gdn-gates"
IMPL = "reference_engine.kernels.gdn_gates:gdn_gates"
CPU_CASES = ["small-f32", "small-bf16", "decode-t1-bf16", "decode-t64-bf16", "prefill-1024-bf16", "prefill-1024-f32",
             "a-b-shape-mismatch", "a-b-dtype-mismatch", "a-log-wrong-length", "dt-bias-wrong-length"]  # fmt: skip
BOUND = 1e-5  # the contract's rel_fro bound
WRONG_VARIANTS = {  # (text in the kernel source, its replacement)
    "softplus_without_bias": ("x = a + tl.load(dt_bias_ptr", "x = a + 0.0 * tl.load(dt_bias_ptr"),
    "padding_rows_kept": ("keep = (rows < tl.load(valid_ptr))[:, None]", "keep = (rows >= 0)[:, None]"),
}

SCRIPT = r"""
import json
import wrong_source
import torch
from reference_engine.kernels import gdn_gates as kernel_module
from reference_engine.ops.linear_attention import gdn_gates as torch_op

WRONG_VARIANTS = __WRONG__

def wrong_module(name, old, new):
    return wrong_source.wrong_module(kernel_module, name, old, new)

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

gen = torch.Generator().manual_seed(5)
T, HV = 77, 32
wide = torch.randn(T, 2 * HV + 8, generator=gen) * 4.0  # a and b as column views of one buffer (row stride 72)
wide[:3, HV] = 30.0  # softplus above its threshold
b, a = wide[:, :HV].bfloat16(), wide[:, HV : 2 * HV].bfloat16()
ba = torch.cat([b, a, torch.zeros(T, 8, dtype=torch.bfloat16)], dim=1)
b, a = ba[:, :HV], ba[:, HV : 2 * HV]
assert not a.is_contiguous() and not b.is_contiguous()
A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
ref_g, ref_beta = torch.empty(T, HV), torch.empty(T, HV)
torch_op(a, b, A_log, dt_bias, ref_g, ref_beta)

def run(module, valid=None):
    g, beta = torch.full((T, HV), float("nan")), torch.full((T, HV), float("nan"))
    module.gdn_gates(a, b, A_log, dt_bias, g, beta, **({} if valid is None else {"valid_tokens": valid}))
    return g, beta

result = {"cases": {}, "wrong": {}}
g, beta = run(kernel_module)
result["cases"]["strided"] = {"g": rel(g, ref_g), "beta": rel(beta, ref_beta), "unwritten": int(g.isnan().sum() + beta.isnan().sum())}
valid = torch.tensor([50])
g, beta = run(kernel_module, valid)
result["cases"]["valid-50"] = {"g": rel(g[:50], ref_g[:50]), "beta": rel(beta[:50], ref_beta[:50]), "padding_zero": bool((g[50:] == 0).all() and (beta[50:] == 0).all()),
                               "unwritten": int(g.isnan().sum() + beta.isnan().sum())}
expected_g, expected_beta = ref_g.clone(), ref_beta.clone()
expected_g[50:], expected_beta[50:] = 0.0, 0.0
for name, (old, new) in WRONG_VARIANTS.items():
    g, beta = run(wrong_module(name, old, new), valid)
    result["wrong"][name] = {"g": rel(g, expected_g), "beta": rel(beta, expected_beta)}
try:
    run(kernel_module, torch.tensor([1.5]))
    result["float_valid_error"] = ""
except ValueError as error:
    result["float_valid_error"] = str(error)
print("RESULT" + json.dumps(result))
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES}}, SCRIPT.replace("__WRONG__", repr(WRONG_VARIANTS)))


@pytest.fixture(scope="module")
def measured(run):
    script = run["script"]
    assert script is not None and script["ok"], script
    marker = script["output"].rfind("RESULT")
    assert marker >= 0, script["output"]
    return json.loads(script["output"][marker + len("RESULT"):].splitlines()[0])


def test_contract_cpu_cases_pass_under_the_interpreter(run):
    records = {key.split("|", 1)[1]: value for key, value in run["records"].items()}
    assert_all_passed(records[IMPL], CPU_CASES)


def test_strided_inputs_match_the_torch_op(measured):
    errors = measured["cases"]["strided"]
    assert errors["unwritten"] == 0 and errors["g"] < BOUND and errors["beta"] < BOUND, errors


def test_padding_rows_come_out_zero(measured):
    errors = measured["cases"]["valid-50"]
    assert errors["unwritten"] == 0 and errors["padding_zero"], errors
    assert errors["g"] < BOUND and errors["beta"] < BOUND, errors


@pytest.mark.parametrize("wrong", sorted(WRONG_VARIANTS))
def test_the_comparison_rejects_a_known_wrong_kernel(measured, wrong):
    errors = measured["wrong"][wrong]
    assert max(errors.values()) > 1000 * BOUND, errors


def test_a_float_count_is_refused(measured):
    assert "valid_tokens must hold one integer count" in measured["float_valid_error"], measured["float_valid_error"]


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 1024])
def test_matches_the_torch_op_on_cuda(tokens):
    from reference_engine.kernels.gdn_gates import gdn_gates
    from reference_engine.ops.linear_attention import gdn_gates as torch_op

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    ba = (torch.randn(tokens, 64, generator=generator, device="cuda") * 4.0).bfloat16()
    b, a = ba[:, :32], ba[:, 32:]
    A_log, dt_bias = torch.randn(32, generator=generator, device="cuda"), torch.randn(32, generator=generator, device="cuda")
    expected_g, expected_beta = torch.empty(tokens, 32, device="cuda"), torch.empty(tokens, 32, device="cuda")
    torch_op(a, b, A_log, dt_bias, expected_g, expected_beta)
    g, beta = torch.full_like(expected_g, float("nan")), torch.full_like(expected_beta, float("nan"))
    gdn_gates(a, b, A_log, dt_bias, g, beta, valid_tokens=torch.tensor([tokens - 1], device="cuda"))
    torch.cuda.synchronize()
    assert (g[tokens - 1] == 0).all() and (beta[tokens - 1] == 0).all()
    if tokens > 1:
        torch.testing.assert_close(g[:-1], expected_g[:-1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(beta[:-1], expected_beta[:-1], rtol=1e-5, atol=1e-6)
