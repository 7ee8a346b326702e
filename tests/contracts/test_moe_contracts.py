"""MoE contracts: the engine ops pass, known-wrong implementations and a perturbed reference fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_engine.ops import moe
from tests.contracts import contract_driver as driver

ENGINE = {
    "moe/router-topk": moe.router_topk,
    "moe/shared-expert": moe.shared_expert,
    "moe/routed-experts": moe.routed_experts,
    "moe/token-permute": moe.token_permute,
    "moe/token-unpermute": moe.token_unpermute,
}
CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).cpu_cases()]
ERRORS = [(cid, error.name) for cid in ENGINE for error in driver.load(cid).contract.errors]
CUDA_CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).contract.cases if case.device == "cuda"]


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_engine_op_passes(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.cuda
@pytest.mark.parametrize("contract_id,case_name", CUDA_CASES)
def test_engine_op_passes_real_shapes_on_cuda(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name), device="cuda")
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


# ------------------------------------------------------------------ known-wrong implementations


def router_without_renormalisation(router_logits, topk_weights, topk_ids, top_k):
    probs = torch.softmax(router_logits.float(), dim=-1)
    order = torch.sort(router_logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    topk_weights.copy_(probs.gather(1, order))
    topk_ids.copy_(order)


def router_ties_to_higher_index(router_logits, topk_weights, topk_ids, top_k):
    flipped = router_logits.float().flip(-1)  # a stable sort of the flipped row prefers the higher index
    order = flipped.shape[-1] - 1 - torch.sort(flipped, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = torch.softmax(router_logits.float(), dim=-1).gather(1, order)
    topk_weights.copy_(chosen / chosen.sum(-1, keepdim=True))
    topk_ids.copy_(order)


def router_softmax_after_topk(router_logits, topk_weights, topk_ids, top_k):
    """Not wrong: with renormalisation, softmax over the top-k logits is the same function (must PASS)."""
    values, order = torch.sort(router_logits.float(), dim=-1, descending=True, stable=True)
    topk_weights.copy_(torch.softmax(values[:, :top_k], dim=-1))
    topk_ids.copy_(order[:, :top_k])


def shared_without_sigmoid_gate(x, gate_proj, up_proj, down_proj, gate_weight, out):
    activation = F.silu(x.float() @ gate_proj.float().T) * (x.float() @ up_proj.float().T)
    out.copy_(activation @ down_proj.float().T)


def shared_gate_and_up_swapped(x, gate_proj, up_proj, down_proj, gate_weight, out):
    moe.shared_expert(x, up_proj, gate_proj, down_proj, gate_weight, out)


def routed_ignores_weights(x, topk_weights, topk_ids, gate_up_proj, down_proj, out):
    moe.routed_experts(x, torch.ones_like(topk_weights), topk_ids, gate_up_proj, down_proj, out)


def routed_gate_up_halves_swapped(x, topk_weights, topk_ids, gate_up_proj, down_proj, out):
    inter = down_proj.shape[2]
    swapped = torch.cat([gate_up_proj[:, inter:], gate_up_proj[:, :inter]], dim=1)
    moe.routed_experts(x, topk_weights, topk_ids, swapped, down_proj, out)


def permute_slot_major(x, topk_ids, permuted_x, expert_offsets, source_rows, num_experts):
    """Within an expert, ordered by slot then token (a stable sort of topk_ids.T.flatten())."""
    tokens, top_k = topk_ids.shape
    slot_major = torch.sort(topk_ids.T.reshape(-1).long(), stable=True).indices  # index s * T + t
    rows = (slot_major % tokens) * top_k + slot_major // tokens
    permuted_x.copy_(x[rows // top_k])
    counts = torch.bincount(topk_ids.reshape(-1).long(), minlength=num_experts)
    expert_offsets.copy_(torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    source_rows.copy_(rows)


def permute_offsets_without_total(x, topk_ids, permuted_x, expert_offsets, source_rows, num_experts):
    """Writes the E exclusive starts but leaves expert_offsets[E] (the total) unwritten."""
    scratch = torch.empty_like(expert_offsets)
    moe.token_permute(x, topk_ids, permuted_x, scratch, source_rows, num_experts)
    expert_offsets[:-1].copy_(scratch[:-1])


def unpermute_without_weights(expert_out, source_rows, topk_weights, out):
    moe.token_unpermute(expert_out, source_rows, torch.ones_like(topk_weights), out)


def unpermute_gathers_with_source_rows(expert_out, source_rows, topk_weights, out):
    """Uses source_rows as if it mapped (token, slot) -> permuted row (it maps the other way)."""
    tokens, top_k = topk_weights.shape
    gathered = expert_out[source_rows.long()].view(tokens, top_k, -1).float()
    out.copy_((gathered * topk_weights[:, :, None]).sum(1))


# (contract, implementation, status of the cases it fails, must it fail every CPU case)
WRONG = [
    ("moe/router-topk", router_without_renormalisation, "INCORRECT_NUMERICAL", False),  # top_k == E sums to 1 anyway
    ("moe/router-topk", router_ties_to_higher_index, "INCORRECT_NUMERICAL", False),
    ("moe/shared-expert", shared_without_sigmoid_gate, "INCORRECT_NUMERICAL", True),
    ("moe/shared-expert", shared_gate_and_up_swapped, "INCORRECT_NUMERICAL", True),
    ("moe/routed-experts", routed_ignores_weights, "INCORRECT_NUMERICAL", True),
    ("moe/routed-experts", routed_gate_up_halves_swapped, "INCORRECT_NUMERICAL", True),
    ("moe/token-permute", permute_slot_major, "INCORRECT_NUMERICAL", False),
    ("moe/token-permute", permute_offsets_without_total, "UNWRITTEN_OUTPUT", True),
    ("moe/token-unpermute", unpermute_without_weights, "INCORRECT_NUMERICAL", False),
    ("moe/token-unpermute", unpermute_gathers_with_source_rows, "INCORRECT_NUMERICAL", True),
]


@pytest.mark.parametrize("contract_id,impl,status,everywhere", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_known_wrong_implementation_is_caught(contract_id, impl, status, everywhere):
    loaded = driver.load(contract_id)
    statuses = {case.name: driver.run_case(loaded, impl, case).status for case in loaded.cpu_cases()}
    failed = {name: s for name, s in statuses.items() if s != "PASSED"}
    assert failed, f"{impl.__name__} passed every case"
    assert set(failed.values()) == {status}, statuses
    if everywhere:
        assert len(failed) == len(statuses), statuses


def test_softmax_after_topk_is_equivalent_when_renormalised():
    loaded = driver.load("moe/router-topk")
    for case in loaded.cpu_cases():
        outcome = driver.run_case(loaded, router_softmax_after_topk, case)
        assert outcome.status == "PASSED", (case.name, outcome.message)


def test_router_cases_contain_ties_at_the_top_k_boundary():
    """The tie rule is only tested if equal logits straddle the boundary; check the inputs have them."""
    loaded = driver.load("moe/router-topk")
    boundary_ties = 0
    for case in loaded.cpu_cases():
        _, params, inputs = driver.make_case_inputs(loaded, case)
        top_k, logits = params["top_k"], inputs["router_logits"].double()
        if top_k == logits.shape[1]:
            continue
        ranked = logits.sort(dim=-1, descending=True).values
        boundary_ties += int((ranked[:, top_k - 1] == ranked[:, top_k]).sum())
    assert boundary_ties >= 5, boundary_ties


def test_bf16_rounding_floor_is_well_inside_the_tolerance():
    for contract_id in ENGINE:
        loaded = driver.load(contract_id)
        for case in loaded.cpu_cases():
            if case.dtype == "bfloat16":
                outcome = driver.rounded_reference(loaded, case)
                assert outcome.status == "PASSED", (contract_id, case.name, outcome.message)
