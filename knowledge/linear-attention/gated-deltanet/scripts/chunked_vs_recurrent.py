"""Check the chunked (WY / UT-transform) Gated DeltaNet form against the token recurrence.

Plain torch, float64, CPU; one sequence, grouped value heads, an initial state, a length that
is not a multiple of the chunk size. Run: python chunked_vs_recurrent.py
"""

from __future__ import annotations

import torch


def recurrent(query, key, value, g, beta, state):
    """query/key [T, Hv, Dk] (already normalised and scaled), value [T, Hv, Dv], g/beta [T, Hv],
    state [Hv, Dk, Dv]. Returns out [T, Hv, Dv] and the final state."""
    state = state.clone()
    out = torch.empty_like(value)
    for t in range(query.shape[0]):
        state = state * g[t].exp()[:, None, None]  # decay
        predicted = torch.einsum("hkv,hk->hv", state, key[t])  # S^T k  [Hv, Dv]
        delta = beta[t][:, None] * (value[t] - predicted)  # [Hv, Dv]
        state = state + key[t][:, :, None] * delta[:, None, :]  # S += k delta^T
        out[t] = torch.einsum("hkv,hk->hv", state, query[t])  # S^T q
    return out, state


def chunked(query, key, value, g, beta, state, chunk_size=64):
    """Same contract as `recurrent`, computed chunk by chunk with the UT transform."""
    length, num_heads, _ = query.shape
    state = state.clone()
    out = torch.empty_like(value)
    for start in range(0, length, chunk_size):
        stop = min(start + chunk_size, length)
        size = stop - start
        q, k, v = (x[start:stop].transpose(0, 1) for x in (query, key, value))  # [Hv, C, D]
        b = beta[start:stop].transpose(0, 1)  # [Hv, C]
        gamma = g[start:stop].transpose(0, 1).cumsum(-1)  # [Hv, C] cumulative log decay
        diff = gamma[:, :, None] - gamma[:, None, :]  # gamma_r - gamma_s
        lower_incl = torch.ones(size, size, dtype=torch.bool).tril()
        decay = torch.where(lower_incl, diff, torch.full_like(diff, float("-inf"))).exp()
        strict = decay.tril(-1)  # s < r only
        a = b[:, :, None] * (k @ k.transpose(1, 2)) * strict  # [Hv, C, C]
        eye = torch.eye(size, dtype=q.dtype).expand(num_heads, size, size)
        t_matrix = torch.linalg.solve_triangular(eye + a, eye, upper=False)  # (I + A)^-1
        u = t_matrix @ (b[:, :, None] * v)  # [Hv, C, Dv]
        w = t_matrix @ (b[:, :, None] * gamma.exp()[:, :, None] * k)  # [Hv, C, Dk]
        v_new = u - w @ state  # corrected values
        inter = (q * gamma.exp()[:, :, None]) @ state
        intra = ((q @ k.transpose(1, 2)) * decay) @ v_new
        out[start:stop] = (inter + intra).transpose(0, 1)
        last = gamma[:, -1:]  # [Hv, 1]
        k_to_end = k * (last - gamma).exp()[:, :, None]
        state = state * last.exp()[:, :, None] + k_to_end.transpose(1, 2) @ v_new
    return out, state


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    length, key_heads, value_heads, dim_k, dim_v = 150, 2, 4, 16, 8
    raw_q = torch.randn(length, key_heads, dim_k, generator=generator, dtype=torch.float64)
    raw_k = torch.randn(length, key_heads, dim_k, generator=generator, dtype=torch.float64)
    value = torch.randn(length, value_heads, dim_v, generator=generator, dtype=torch.float64)
    a = torch.randn(length, value_heads, generator=generator, dtype=torch.float64)
    b = torch.randn(length, value_heads, generator=generator, dtype=torch.float64)
    a_log = torch.rand(value_heads, generator=generator, dtype=torch.float64).log()
    dt_bias = torch.randn(value_heads, generator=generator, dtype=torch.float64)
    g = -a_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    beta = b.sigmoid()
    q = raw_q * torch.rsqrt((raw_q * raw_q).sum(-1, keepdim=True) + 1e-6) * dim_k**-0.5
    k = raw_k * torch.rsqrt((raw_k * raw_k).sum(-1, keepdim=True) + 1e-6)
    repeat = value_heads // key_heads  # key head i serves value heads i*repeat .. i*repeat+repeat-1
    q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
    state = torch.randn(value_heads, dim_k, dim_v, generator=generator, dtype=torch.float64)
    out_r, state_r = recurrent(q, k, value, g, beta, state)
    out_c, state_c = chunked(q, k, value, g, beta, state, chunk_size=64)
    print("max |out diff|   =", (out_r - out_c).abs().max().item())
    print("max |state diff| =", (state_r - state_c).abs().max().item())
    assert torch.allclose(out_r, out_c, atol=1e-10) and torch.allclose(state_r, state_c, atol=1e-10)
    wrong, _ = chunked(q, k, value, g, beta * 0.5, state)
    assert not torch.allclose(out_r, wrong), "the check must be able to fail"
    print("ok")


if __name__ == "__main__":
    main()
