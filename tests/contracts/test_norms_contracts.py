"""Norm contracts: the engine ops pass, known-wrong implementations and a perturbed reference fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_engine.ops import norms
import contract_driver as driver

ENGINE = {
    "norms-and-activations/rmsnorm": norms.rms_norm,
    "norms-and-activations/gated-rmsnorm": norms.gated_rms_norm,
    "norms-and-activations/fused-add-rmsnorm": norms.fused_add_rms_norm,
}
CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).cpu_cases()]
ERRORS = [(cid, error.name) for cid in ENGINE for error in driver.load(cid).contract.errors]


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_engine_op_passes(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_perturbed_reference_fails(contract_id, case_name):
    loaded = driver.load(contract_id)
    assert driver.perturbed(loaded, loaded.case(case_name)).status == "INCORRECT_NUMERICAL"


@pytest.mark.parametrize("contract_id,error_name", ERRORS)
def test_error_cases_raise(contract_id, error_name):
    loaded = driver.load(contract_id)
    error_case = next(e for e in loaded.contract.errors if e.name == error_name)
    outcome = driver.run_error_case(loaded, ENGINE[contract_id], error_case)
    assert outcome.status == "PASSED", outcome.message


def _norm32(x, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_llama_weight(x, weight, out, eps):  # w instead of 1 + w
    out.copy_(_norm32(x, eps) * weight.float())


def rms_norm_no_eps_mean_abs(x, weight, out, eps):  # mean |x| instead of root-mean-square
    out.copy_(x.float() / (x.float().abs().mean(-1, keepdim=True) + eps) * (1 + weight.float()))


def rms_norm_last_row_unwritten(x, weight, out, eps):
    out[:-1].copy_(_norm32(x[:-1], eps) * (1 + weight.float()))


def gated_zero_centred(x, z, weight, out, eps):  # 1 + w where the gated norm uses w
    out.copy_((1 + weight.float()) * _norm32(x, eps) * F.silu(z.float()))


def gated_sigmoid_gate(x, z, weight, out, eps):  # sigmoid(z) instead of silu(z)
    out.copy_(weight.float() * _norm32(x, eps) * torch.sigmoid(z.float()))


def fused_norm_of_x_only(x, residual, weight, out, residual_out, eps):
    residual_out.copy_(x.float() + residual.float())
    out.copy_(_norm32(x, eps) * (1 + weight.float()))


def fused_residual_not_written(x, residual, weight, out, residual_out, eps):
    total = x.float() + residual.float()
    out.copy_(_norm32(total, eps) * (1 + weight.float()))


WRONG = [
    ("norms-and-activations/rmsnorm", rms_norm_llama_weight, "INCORRECT_NUMERICAL"),
    ("norms-and-activations/rmsnorm", rms_norm_no_eps_mean_abs, "INCORRECT_NUMERICAL"),
    ("norms-and-activations/rmsnorm", rms_norm_last_row_unwritten, "UNWRITTEN_OUTPUT"),
    ("norms-and-activations/gated-rmsnorm", gated_zero_centred, "INCORRECT_NUMERICAL"),
    ("norms-and-activations/gated-rmsnorm", gated_sigmoid_gate, "INCORRECT_NUMERICAL"),
    ("norms-and-activations/fused-add-rmsnorm", fused_norm_of_x_only, "INCORRECT_NUMERICAL"),
    ("norms-and-activations/fused-add-rmsnorm", fused_residual_not_written, "UNWRITTEN_OUTPUT"),
]


@pytest.mark.parametrize("contract_id,impl,status", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_known_wrong_implementation_is_caught(contract_id, impl, status):
    loaded = driver.load(contract_id)
    statuses = {driver.run_case(loaded, impl, case).status for case in loaded.cpu_cases()}
    assert statuses == {status}, statuses


def test_bf16_rounding_floor_is_well_inside_the_tolerance():
    for contract_id in ENGINE:
        loaded = driver.load(contract_id)
        for case in loaded.cpu_cases():
            if case.dtype == "bfloat16":
                outcome = driver.rounded_reference(loaded, case)
                assert outcome.status == "PASSED", (contract_id, case.name, outcome.message)


# ---- the same checks through the real harness (toolbox.harness), in process --------------------

HARNESS_TARGETS = {
    "norms-and-activations/rmsnorm": "reference_engine.ops.norms:rms_norm",
    "norms-and-activations/gated-rmsnorm": "reference_engine.ops.norms:gated_rms_norm",
    "norms-and-activations/fused-add-rmsnorm": "reference_engine.ops.norms:fused_add_rms_norm",
}
MODULE = "test_norms_contracts"
HARNESS_WRONG = [
    ("norms-and-activations/rmsnorm", "rms_norm_llama_weight", "INCORRECT_NUMERICAL"),
    ("norms-and-activations/gated-rmsnorm", "gated_zero_centred", "INCORRECT_NUMERICAL"),
    ("norms-and-activations/fused-add-rmsnorm", "fused_residual_not_written", "UNWRITTEN_OUTPUT"),
]


@pytest.mark.parametrize("contract_id", sorted(HARNESS_TARGETS))
def test_engine_op_passes_through_the_toolbox_harness(contract_id):
    harness = pytest.importorskip("toolbox.harness")
    records = harness.run_contracts([contract_id], impl=HARNESS_TARGETS[contract_id], devices=["cpu"], isolation=False)
    assert records and all(record.status.value == "PASSED" for record in records), [(r.case, r.status.value, r.message) for r in records if r.status.value != "PASSED"]


@pytest.mark.parametrize("contract_id,impl,status", HARNESS_WRONG, ids=[w[1] for w in HARNESS_WRONG])
def test_known_wrong_implementation_fails_through_the_toolbox_harness(contract_id, impl, status):
    harness = pytest.importorskip("toolbox.harness")
    records = harness.run_contracts([contract_id], impl=f"{MODULE}:{impl}", devices=["cpu"], isolation=False)
    cases = {record.case: record.status.value for record in records if record.kind == "case"}
    errors = {record.case: record.status.value for record in records if record.kind == "error"}
    assert cases and set(cases.values()) == {status}, cases
    assert set(errors.values()) <= {"MISSING_ERROR", "PASSED"}, errors  # wrong impls skip the input checks


CUDA_CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).contract.cases if case.device == "cuda"]


@pytest.mark.cuda
@pytest.mark.parametrize("contract_id,case_name", CUDA_CASES)
def test_engine_op_passes_cuda_cases(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name), device="cuda")
    assert outcome.status == "PASSED", outcome.message
