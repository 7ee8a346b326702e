"""Linear-attention contracts: the engine ops pass, known-wrong implementations and a perturbed reference fail."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from reference_engine.ops import linear_attention as la
from tests.contracts import contract_driver as driver

ENGINE = {
    "linear-attention/causal-conv1d": la.causal_conv1d,
    "linear-attention/causal-conv1d-update": la.causal_conv1d_update,
    "linear-attention/gdn-gates": la.gdn_gates,
    "linear-attention/gdn-chunked-prefill": la.gdn_chunked_prefill,
    "linear-attention/gdn-recurrent-decode": la.gdn_recurrent_decode,
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


def conv_without_state(x, weight, cu_seqlens, initial_state, out, final_state):
    """Treats every sequence as new: zeros instead of the conv state."""
    la.causal_conv1d(x, weight, cu_seqlens, torch.zeros_like(initial_state), out, final_state)


def conv_missing_silu(x, weight, cu_seqlens, initial_state, out, final_state):
    offsets = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        history = torch.cat([initial_state[seq].float(), x[start:end].float().T], dim=1)
        out[start:end] = (history.unfold(1, weight.shape[1], 1) * weight.float()[:, None, :]).sum(2).T.to(out.dtype)
        final_state[seq] = history[:, history.shape[1] - weight.shape[1] + 1 :].to(final_state.dtype)


def conv_update_missing_silu(x, weight, conv_state, out, conv_state_out):
    window = torch.cat([conv_state, x[:, :, None]], dim=2)
    out.copy_((window.float() * weight.float()).sum(2))
    conv_state_out.copy_(window[:, :, 1:])


def conv_update_state_not_shifted(x, weight, conv_state, out, conv_state_out):
    la.causal_conv1d_update(x, weight, conv_state, out, torch.empty_like(conv_state_out))
    conv_state_out.copy_(conv_state)


def gates_without_softplus(a, b, A_log, dt_bias, g, beta):
    g.copy_(-torch.exp(A_log.float()) * (a.float() + dt_bias.float()))
    beta.copy_(torch.sigmoid(b.float()))


def gates_beta_in_activation_dtype(a, b, A_log, dt_bias, g, beta):
    """What transformers does (sigmoid in bf16): one bf16 ulp off, beyond a float32 contract."""
    g.copy_(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))
    beta.copy_(torch.sigmoid(b).float())


def _delta_rule(query, key, value, g, beta, offsets, states, out, *, tile=False, decay_first=True, skip_partial=None):
    """Token-by-token float32 delta rule with switchable mistakes; writes out rows and returns final states."""
    group = value.shape[1] // query.shape[1]
    q = query.float() * torch.rsqrt((query.float() ** 2).sum(-1, keepdim=True) + 1e-6) * query.shape[-1] ** -0.5
    k = key.float() * torch.rsqrt((key.float() ** 2).sum(-1, keepdim=True) + 1e-6)
    expand = (lambda t: t.repeat(1, group, 1)) if tile else (lambda t: t.repeat_interleave(group, dim=1))
    q, k = expand(q), expand(k)
    finals = []
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        if skip_partial:
            end = start + (end - start) // skip_partial * skip_partial
        state = states[seq].clone()
        for t in range(start, end):
            decay = torch.exp(g[t])[:, None, None]
            if decay_first:
                state = state * decay
            delta = beta[t][:, None] * (value[t].float() - (k[t][:, None, :] @ state)[:, 0])
            state = state + k[t][:, :, None] * delta[:, None, :]
            if not decay_first:
                state = state * decay
            out[t] = (q[t][:, None, :] @ state)[:, 0].to(out.dtype)
        finals.append(state)
    return torch.stack(finals)


def prefill_drops_initial_state(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    la.gdn_chunked_prefill(query, key, value, g, beta, cu_seqlens, torch.zeros_like(initial_state), out, final_state, chunk_size)


def prefill_skips_last_partial_chunk(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    final_state.copy_(_delta_rule(query, key, value, g, beta, cu_seqlens.tolist(), initial_state, out, skip_partial=chunk_size))


def prefill_decay_after_update(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    final_state.copy_(_delta_rule(query, key, value, g, beta, cu_seqlens.tolist(), initial_state, out, decay_first=False))


def prefill_heads_tiled(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    final_state.copy_(_delta_rule(query, key, value, g, beta, cu_seqlens.tolist(), initial_state, out, tile=True))


def prefill_plain_recurrence(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    """Control: the same helper without a mistake must pass (so the mistakes above are what fails)."""
    final_state.copy_(_delta_rule(query, key, value, g, beta, cu_seqlens.tolist(), initial_state, out))


def decode_heads_tiled(query, key, value, g, beta, state, out, state_out):
    state_out.copy_(_delta_rule(query, key, value, g, beta, list(range(query.shape[0] + 1)), state, out, tile=True))


def decode_decay_after_update(query, key, value, g, beta, state, out, state_out):
    state_out.copy_(_delta_rule(query, key, value, g, beta, list(range(query.shape[0] + 1)), state, out, decay_first=False))


def decode_state_not_written(query, key, value, g, beta, state, out, state_out):
    _delta_rule(query, key, value, g, beta, list(range(query.shape[0] + 1)), state, out)


def decode_plain_recurrence(query, key, value, g, beta, state, out, state_out):
    state_out.copy_(_delta_rule(query, key, value, g, beta, list(range(query.shape[0] + 1)), state, out))


# (contract, implementation, status of the cases it fails, must it fail every CPU case)
WRONG = [
    ("linear-attention/causal-conv1d", conv_without_state, "INCORRECT_NUMERICAL", True),
    ("linear-attention/causal-conv1d", conv_missing_silu, "INCORRECT_NUMERICAL", True),
    ("linear-attention/causal-conv1d-update", conv_update_missing_silu, "INCORRECT_NUMERICAL", True),
    ("linear-attention/causal-conv1d-update", conv_update_state_not_shifted, "INCORRECT_NUMERICAL", True),
    ("linear-attention/gdn-gates", gates_without_softplus, "INCORRECT_NUMERICAL", True),
    ("linear-attention/gdn-gates", gates_beta_in_activation_dtype, "INCORRECT_NUMERICAL", False),
    ("linear-attention/gdn-chunked-prefill", prefill_drops_initial_state, "INCORRECT_NUMERICAL", True),
    ("linear-attention/gdn-chunked-prefill", prefill_skips_last_partial_chunk, "UNWRITTEN_OUTPUT", False),
    ("linear-attention/gdn-chunked-prefill", prefill_decay_after_update, "INCORRECT_NUMERICAL", True),
    ("linear-attention/gdn-chunked-prefill", prefill_heads_tiled, "INCORRECT_NUMERICAL", False),
    ("linear-attention/gdn-recurrent-decode", decode_heads_tiled, "INCORRECT_NUMERICAL", False),
    ("linear-attention/gdn-recurrent-decode", decode_decay_after_update, "INCORRECT_NUMERICAL", True),
    ("linear-attention/gdn-recurrent-decode", decode_state_not_written, "UNWRITTEN_OUTPUT", True),
]
CONTROLS = [
    ("linear-attention/gdn-chunked-prefill", prefill_plain_recurrence),
    ("linear-attention/gdn-recurrent-decode", decode_plain_recurrence),
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


@pytest.mark.parametrize("contract_id,impl", CONTROLS, ids=[c[1].__name__ for c in CONTROLS])
def test_helper_without_mistake_passes(contract_id, impl):
    loaded = driver.load(contract_id)
    for case in loaded.cpu_cases():
        outcome = driver.run_case(loaded, impl, case)
        assert outcome.status == "PASSED", (case.name, outcome.message)


def test_bf16_rounding_floor_is_well_inside_the_tolerance():
    for contract_id in ENGINE:
        loaded = driver.load(contract_id)
        for case in loaded.cpu_cases():
            if case.dtype == "bfloat16":
                outcome = driver.rounded_reference(loaded, case)
                assert outcome.status == "PASSED", (contract_id, case.name, outcome.message)
