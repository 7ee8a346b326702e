"""Triton fused router (softmax + top-k + renormalise) against moe/router-topk."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, contract_records

CONTRACT = "moe/router-topk"
IMPL = "reference_engine.kernels.router:router_topk"
# decode-t64-bf16 and prefill-1024-bf16 pass too but take minutes in the interpreter.
CPU_CASES = ["small-f32", "small-bf16", "top-one-f32", "all-experts-f32", "decode-t1-bf16", "top-k-larger-than-e", "top-k-zero", "top-k-disagrees-with-outputs", "logits-one-dim"]
WRONG = ["router_ties_to_higher_index", "router_not_renormalised"]
WRONG_CASES = ["small-f32"]


@pytest.fixture(scope="module")
def records():
    return contract_records(CONTRACT, {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG})


def test_contract_cpu_cases_pass_under_the_interpreter(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert [r["case"] for r in found] == WRONG_CASES
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r["message"]) for r in found]


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 32, 1024])
def test_matches_the_torch_op_on_cuda(tokens):
    from reference_engine.kernels.router import router_topk as triton_router
    from reference_engine.ops.moe import router_topk as torch_router

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    logits = (torch.randn(tokens, 256, generator=generator, device="cuda") * 2).to(torch.bfloat16)
    expected_weights = torch.empty(tokens, 8, device="cuda")
    expected_ids = torch.empty(tokens, 8, dtype=torch.int32, device="cuda")
    torch_router(logits, expected_weights, expected_ids, 8)
    weights = torch.full_like(expected_weights, float("nan"))
    ids = torch.full_like(expected_ids, -1)
    triton_router(logits, weights, ids, 8)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)
