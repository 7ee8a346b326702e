"""Linear-attention ops beyond the contract cases: agreement with transformers, in-place states, chunk size, bf16 kernels."""

from __future__ import annotations

import itertools

import pytest
import torch

from reference_engine.ops import linear_attention as la
from tests.contracts import contract_driver as driver

hf = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")


def _gdn_inputs(seed: int, lengths: list[int], k_heads=2, v_heads=4, k_dim=16, v_dim=8):
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "query": torch.randn(tokens, k_heads, k_dim, generator=generator),
        "key": torch.randn(tokens, k_heads, k_dim, generator=generator),
        "value": torch.randn(tokens, v_heads, v_dim, generator=generator),
        "g": -torch.rand(tokens, v_heads, generator=generator) * 0.3 - 0.01,
        "beta": torch.rand(tokens, v_heads, generator=generator),
        "cu_seqlens": cu,
        "initial_state": torch.randn(len(lengths), v_heads, k_dim, v_dim, generator=generator) * 0.5,
    }


def _prefill(inputs, chunk_size=64, final_state=None):
    out = torch.full(inputs["value"].shape, float("nan"))
    final = torch.full(inputs["initial_state"].shape, float("nan")) if final_state is None else final_state
    la.gdn_chunked_prefill(**inputs, out=out, final_state=final, chunk_size=chunk_size)
    return out, final


def test_chunked_prefill_matches_transformers_per_sequence():
    inputs = _gdn_inputs(0, [1, 70, 129])
    out, final = _prefill(inputs)
    offsets = inputs["cu_seqlens"].tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        part = [inputs[name][None, start:end] for name in ("query", "key", "value", "g", "beta")]
        expected, state = hf.torch_chunk_gated_delta_rule(
            *part, chunk_size=64, initial_state=inputs["initial_state"][seq : seq + 1], output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(out[start:end], expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final[seq], state[0], rtol=1e-5, atol=1e-5)


def test_recurrent_decode_matches_transformers():
    inputs = _gdn_inputs(1, [1, 1, 1])
    step = {name: inputs[name] for name in ("query", "key", "value", "g", "beta")}
    out = torch.full(inputs["value"].shape, float("nan"))
    state_out = torch.full(inputs["initial_state"].shape, float("nan"))
    la.gdn_recurrent_decode(**step, state=inputs["initial_state"], out=out, state_out=state_out)
    batched = [tensor[:, None] for tensor in step.values()]  # sequences as the batch, one token each
    expected, state = hf.torch_recurrent_gated_delta_rule(
        *batched, initial_state=inputs["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(out, expected[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state_out, state, rtol=1e-5, atol=1e-5)


def test_conv_matches_transformers_for_new_sequences_and_steps():
    generator = torch.Generator().manual_seed(2)
    x, weight = torch.randn(9, 12, generator=generator), torch.randn(12, 4, generator=generator)
    cu = torch.tensor([0, 9], dtype=torch.int32)
    out, final = torch.empty(9, 12), torch.empty(1, 12, 3)
    la.causal_conv1d(x, weight, cu, torch.zeros(1, 12, 3), out, final)
    expected = hf.causal_conv1d_fn(x.T[None], weight, None, activation="silu")[0].T
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    new_token = torch.randn(1, 12, generator=generator)
    step_out, step_state = torch.empty(1, 12), torch.empty(1, 12, 3)
    la.causal_conv1d_update(new_token, weight, final, step_out, step_state)
    hf_state = final.clone()
    hf_out = hf.causal_conv1d_update(new_token[:, :, None], hf_state, weight, None, "silu")
    torch.testing.assert_close(step_out, hf_out[:, :, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(step_state, hf_state)


def test_prefill_then_decode_equals_one_longer_prefill():
    inputs = _gdn_inputs(3, [40])
    whole_out, whole_final = _prefill(inputs)
    head = {name: inputs[name][:39] for name in ("query", "key", "value", "g", "beta")}
    _, state = _prefill({**head, "cu_seqlens": torch.tensor([0, 39], dtype=torch.int32), "initial_state": inputs["initial_state"]})
    out = torch.empty(1, *inputs["value"].shape[1:])
    last = {name: inputs[name][39:] for name in ("query", "key", "value", "g", "beta")}
    la.gdn_recurrent_decode(**last, state=state, out=out, state_out=state)  # in place
    torch.testing.assert_close(out[0], whole_out[39], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, whole_final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64, 256])
def test_chunk_size_does_not_change_the_result(chunk_size):
    inputs = _gdn_inputs(4, [1, 33, 80])
    reference_out, reference_final = _prefill(inputs, chunk_size=64)
    out, final = _prefill(inputs, chunk_size=chunk_size)
    torch.testing.assert_close(out, reference_out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(final, reference_final, rtol=2e-5, atol=2e-5)


def test_states_may_be_updated_in_place():
    inputs = _gdn_inputs(5, [3, 1, 20])
    _, expected = _prefill({**inputs, "initial_state": inputs["initial_state"].clone()})
    state = inputs["initial_state"]
    _prefill(inputs, final_state=state)
    torch.testing.assert_close(state, expected)
    generator = torch.Generator().manual_seed(6)
    x, weight = torch.randn(10, 6, generator=generator), torch.randn(6, 4, generator=generator)
    cu, conv_state = torch.tensor([0, 2, 10], dtype=torch.int32), torch.randn(2, 6, 3, generator=generator)
    expected_state = torch.empty_like(conv_state)
    la.causal_conv1d(x, weight, cu, conv_state, torch.empty_like(x), expected_state)
    la.causal_conv1d(x, weight, cu, conv_state, torch.empty_like(x), conv_state)
    torch.testing.assert_close(conv_state, expected_state)


def _chunked_with_bf16_operands(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):
    """A chunked implementation the way bf16 GPU kernels do it: matmul operands rounded to bf16, fp32 accumulate.

    The per-chunk state is kept in fp32 but read through bf16, like FLA-style kernels; its error
    must fit the bf16 tolerance of the contract.
    """
    bf = lambda t: t.to(torch.bfloat16).float()
    group = value.shape[1] // query.shape[1]
    q = query.float() * torch.rsqrt((query.float() ** 2).sum(-1, keepdim=True) + 1e-6) * query.shape[-1] ** -0.5
    k = key.float() * torch.rsqrt((key.float() ** 2).sum(-1, keepdim=True) + 1e-6)
    q, k = q.repeat_interleave(group, 1).transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1)  # [Hv, T, Dk]
    v, g, beta = value.float().transpose(0, 1), g.T, beta.T
    offsets = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        state = initial_state[seq].clone()  # [Hv, Dk, Dv]
        for c0 in range(start, end, chunk_size):
            c1 = min(c0 + chunk_size, end)
            qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1, None]
            cum = g[:, c0:c1].cumsum(-1)
            mask = torch.ones(c1 - c0, c1 - c0, dtype=torch.bool).tril()
            decay = torch.exp((cum[:, :, None] - cum[:, None, :]).masked_fill(~mask, float("-inf")))
            system = (bf(kc * bc) @ bf(kc).transpose(1, 2)) * decay
            u = torch.linalg.solve_triangular(system, vc * bc, upper=False, unitriangular=True)
            w = torch.linalg.solve_triangular(system, kc * bc * torch.exp(cum)[..., None], upper=False, unitriangular=True)
            writes = bf(u) - bf(w) @ bf(state)
            scores = (bf(qc) @ bf(kc).transpose(1, 2)) * decay
            out[c0:c1] = (bf(qc * torch.exp(cum)[..., None]) @ bf(state) + bf(scores) @ bf(writes)).transpose(0, 1).to(out.dtype)
            to_end = torch.exp(cum[:, -1:] - cum)[..., None]
            state = state * torch.exp(cum[:, -1])[:, None, None] + bf(kc * to_end).transpose(1, 2) @ bf(writes)
        final_state[seq] = state


def test_bf16_operand_kernel_passes_the_bf16_tolerance():
    loaded = driver.load("linear-attention/gdn-chunked-prefill")
    for case in loaded.cpu_cases():
        outcome = driver.run_case(loaded, _chunked_with_bf16_operands, case)
        if case.dtype == "bfloat16":
            assert outcome.status == "PASSED", (case.name, outcome.message)
        else:  # the same shortcuts are too coarse for the float32 contract
            assert outcome.status == "INCORRECT_NUMERICAL", (case.name, outcome.errors)
