"""Executable half of linear-attention/gdn-chunked-prefill: the float64 token-by-token recurrence, inputs, mutations."""

from __future__ import annotations

import itertools

import torch

L2_EPS = 1e-6


def random_lengths(total: int, count: int, generator: torch.Generator) -> list[int]:
    """Split `total` tokens into `count` sequences; with two or more, the first has exactly one token."""
    if count == 1:
        return [total]
    if total < count:
        raise ValueError(f"cannot split {total} tokens into {count} non-empty sequences")
    rest = total - 1 - (count - 1)
    cuts = torch.randint(0, rest + 1, (count - 2,), generator=generator).sort().values.tolist()
    bounds = [0, *cuts, rest]
    return [1] + [1 + bounds[i + 1] - bounds[i] for i in range(count - 1)]


def random_gates(tokens: int, heads: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """g: per-head decay rates from fast (0.4) to slow (0.005), jittered per token; beta in (0, 1)."""
    rate = torch.rand(heads, generator=generator, dtype=torch.float64) * 0.395 + 0.005
    jitter = torch.rand(tokens, heads, generator=generator, dtype=torch.float64) + 0.5
    g = -(rate * jitter)
    beta = torch.sigmoid(torch.randn(tokens, heads, generator=generator, dtype=torch.float64) * 1.5)
    return g.float(), beta.float()


def make_inputs(axes, params, dtype, device, generator):
    tokens, seqs = axes["T"], axes["B"]
    k_heads, v_heads, k_dim, v_dim = axes["Hk"], axes["Hv"], axes["Dk"], axes["Dv"]
    lengths = random_lengths(tokens, seqs, generator)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(tokens, k_heads, k_dim, generator=generator, dtype=torch.float64) * 1.5
    key = torch.randn(tokens, k_heads, k_dim, generator=generator, dtype=torch.float64) * 1.5
    value = torch.randn(tokens, v_heads, v_dim, generator=generator, dtype=torch.float64)
    g, beta = random_gates(tokens, v_heads, generator)
    state = torch.randn(seqs, v_heads, k_dim, v_dim, generator=generator, dtype=torch.float64) * 0.5
    return {
        "query": query.to(dtype).to(device),
        "key": key.to(dtype).to(device),
        "value": value.to(dtype).to(device),
        "g": g.to(device),
        "beta": beta.to(device),
        "cu_seqlens": cu_seqlens.to(device),
        "initial_state": state.float().to(device),
    }


def normalised_heads(x: torch.Tensor, v_heads: int) -> torch.Tensor:
    """[T, Hk, D] -> L2-normalised float64 [T, Hv, D]; key head i serves value heads i*G .. i*G+G-1."""
    x = x.double()
    x = x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)
    return x.repeat_interleave(v_heads // x.shape[1], dim=1)


def reference(query, key, value, g, beta, cu_seqlens, initial_state, chunk_size=64):
    v_heads = value.shape[1]
    q = normalised_heads(query, v_heads) * query.shape[-1] ** -0.5
    k = normalised_heads(key, v_heads)
    v, decay, write = value.double(), torch.exp(g.double()), beta.double()
    out = torch.empty(v.shape, dtype=torch.float64)
    final_state = torch.empty(initial_state.shape, dtype=torch.float64)
    offsets = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        state = initial_state[seq].double().clone()  # [Hv, Dk, Dv]
        for t in range(start, end):
            state = state * decay[t][:, None, None]
            predicted = (k[t][:, None, :] @ state)[:, 0]  # S^T k per head: [Hv, Dv]
            delta = write[t][:, None] * (v[t] - predicted)
            state = state + k[t][:, :, None] * delta[:, None, :]
            out[t] = (q[t][:, None, :] @ state)[:, 0]
        final_state[seq] = state
    return {"out": out, "final_state": final_state}


def three_value_heads(inputs, params):
    for name in ("value", "g", "beta"):
        inputs[name] = inputs[name][:, :3].clone()
    inputs["initial_state"] = inputs["initial_state"][:, :3].clone()
    return inputs, params


def key_fewer_heads(inputs, params):
    inputs["key"] = inputs["key"][:, :-1].clone()
    return inputs, params


def value_other_dtype(inputs, params):
    inputs["value"] = inputs["value"].to(torch.float16)
    return inputs, params


def g_bf16(inputs, params):
    inputs["g"] = inputs["g"].to(torch.bfloat16)
    return inputs, params


def state_bf16(inputs, params):
    inputs["initial_state"] = inputs["initial_state"].to(torch.bfloat16)
    return inputs, params


def state_transposed(inputs, params):
    inputs["initial_state"] = inputs["initial_state"].transpose(2, 3).contiguous()
    return inputs, params


def cu_seqlens_short(inputs, params):
    cu = inputs["cu_seqlens"].clone()
    cu[-1] -= 1
    inputs["cu_seqlens"] = cu
    return inputs, params


def cu_seqlens_from_one(inputs, params):
    cu = inputs["cu_seqlens"].clone()
    cu[0] = 1
    inputs["cu_seqlens"] = cu
    return inputs, params


def chunk_size_zero(inputs, params):
    return inputs, {**params, "chunk_size": 0}
