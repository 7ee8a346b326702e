"""Executable half of linear-attention/gdn-decode-step: float64 reference of the whole step, inputs, mutations.

The reference gathers each row's states at its slot (zeros for a fresh row), then follows the
model's definition in float64: depthwise conv over [conv state, new input] and SiLU, the split into
q, k (per key head) and v (per value head), g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b),
L2 norms (q also times Dk^-0.5), the delta rule with the decay first, and the gated RMSNorm with a
plain weight. The new states go back to the same slots of copies of the pools.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6


def make_inputs(axes, params, dtype, device, generator):
    batch, slots, fresh = axes["B"], axes["S"], axes["F"]
    k_heads, v_heads, k_dim, v_dim, kernel = axes["Hk"], axes["Hv"], axes["Dk"], axes["Dv"], axes["K"]
    channels = 2 * k_heads * k_dim + v_heads * v_dim

    def draw(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

    state_slots = torch.randperm(slots, generator=generator)[:batch].to(torch.int64)  # distinct, scattered
    if batch >= 2 and state_slots[0] < state_slots[1]:
        state_slots[[0, 1]] = state_slots[[1, 0]]  # never in increasing order
    has_initial_state = torch.ones(batch, dtype=torch.bool)
    has_initial_state[torch.randperm(batch, generator=generator)[:fresh]] = False  # their slots hold stale data
    decay_rate = torch.rand(v_heads, generator=generator, dtype=torch.float64) * 0.45 + 0.05  # exp(A_log) in [0.05, 0.5)
    return {
        "mixed_qkv": draw(batch, channels).to(dtype).to(device),
        "z": draw(batch, v_heads * v_dim).to(dtype).to(device),
        "b": draw(batch, v_heads, scale=1.5).to(dtype).to(device),
        "a": draw(batch, v_heads).to(dtype).to(device),
        "conv_weight": draw(channels, kernel, scale=0.5).to(dtype).to(device),
        "A_log": decay_rate.log().float().to(device),
        "dt_bias": draw(v_heads, scale=0.5).float().to(device),
        "norm_weight": (1.0 + draw(v_dim, scale=0.2)).to(dtype).to(device),
        "conv_state": draw(slots, channels, kernel - 1).to(dtype).to(device),
        "recurrent_state": draw(slots, v_heads, k_dim, v_dim, scale=0.5).float().to(device),
        "state_slots": state_slots.to(device),
        "has_initial_state": has_initial_state.to(device),
    }


def reference(mixed_qkv, z, b, a, conv_weight, A_log, dt_bias, norm_weight, conv_state, recurrent_state, state_slots, has_initial_state, eps):
    batch = mixed_qkv.shape[0]
    num_v_heads, v_dim = A_log.shape[0], norm_weight.shape[0]
    k_dim = recurrent_state.shape[2]
    key_dim = (mixed_qkv.shape[1] - num_v_heads * v_dim) // 2  # Hk * Dk
    num_k_heads = key_dim // k_dim
    slots = state_slots.long()
    carried = has_initial_state.bool().cpu()  # False: a fresh sequence, both states start at zero

    conv_in = torch.where(carried[:, None, None], conv_state.double()[slots], 0.0)  # [B, C, K-1]
    window = torch.cat([conv_in, mixed_qkv.double()[:, :, None]], dim=2)  # [B, C, K], oldest first
    conv = (window * conv_weight.double()).sum(dim=2)
    conv = conv * torch.sigmoid(conv)  # SiLU, [B, C]

    group = num_v_heads // num_k_heads
    q = conv[:, :key_dim].reshape(batch, num_k_heads, k_dim).repeat_interleave(group, dim=1)  # [B, Hv, Dk]
    k = conv[:, key_dim : 2 * key_dim].reshape(batch, num_k_heads, k_dim).repeat_interleave(group, dim=1)
    v = conv[:, 2 * key_dim :].reshape(batch, num_v_heads, v_dim)  # [B, Hv, Dv]
    q = q / torch.sqrt((q * q).sum(dim=-1, keepdim=True) + L2_EPS) * k_dim**-0.5
    k = k / torch.sqrt((k * k).sum(dim=-1, keepdim=True) + L2_EPS)
    g = -torch.exp(A_log.double()) * F.softplus(a.double() + dt_bias.double())  # [B, Hv]
    beta = torch.sigmoid(b.double())

    state = torch.where(carried[:, None, None, None], recurrent_state.double()[slots], 0.0)  # [B, Hv, Dk, Dv]
    state = state * torch.exp(g)[:, :, None, None]  # decay first
    delta = beta[:, :, None] * (v - torch.einsum("bhkv,bhk->bhv", state, k))
    state = state + k[:, :, :, None] * delta[:, :, None, :]
    core = torch.einsum("bhkv,bhk->bhv", state, q)  # [B, Hv, Dv]

    gate = z.double().reshape(batch, num_v_heads, v_dim)
    normed = core / torch.sqrt((core * core).mean(dim=-1, keepdim=True) + eps)
    out = norm_weight.double() * normed * gate * torch.sigmoid(gate)  # plain weight, silu(z)

    conv_pool, state_pool = conv_state.double().clone(), recurrent_state.double().clone()
    conv_pool[slots] = window[:, :, 1:]
    state_pool[slots] = state
    return {"out": out.reshape(batch, num_v_heads * v_dim), "conv_state_out": conv_pool, "recurrent_state_out": state_pool}


def only_given_slots_change(inputs, outputs, params) -> None:
    """Rows of both pools not named by state_slots keep their contents bit for bit."""
    slots = inputs["conv_state"].shape[0]
    given = torch.zeros(slots, dtype=torch.bool)
    given[inputs["state_slots"].cpu()] = True
    for name, out_name in (("conv_state", "conv_state_out"), ("recurrent_state", "recurrent_state_out")):
        before = _bytes_per_slot(inputs[name], slots)
        after = _bytes_per_slot(outputs[out_name], slots)
        changed = (before != after).any(dim=1) & ~given
        assert not bool(changed.any()), f"{out_name}: {int(changed.sum())} slots outside state_slots changed"


def _bytes_per_slot(pool: torch.Tensor, slots: int) -> torch.Tensor:
    return pool.detach().cpu().contiguous().reshape(-1).view(torch.uint8).reshape(slots, -1)


def unchanged(inputs, params):
    return inputs, params


def recurrent_state_bf16(inputs, params):
    inputs["recurrent_state"] = inputs["recurrent_state"].to(torch.bfloat16)
    return inputs, params


def state_slots_int32(inputs, params):
    inputs["state_slots"] = inputs["state_slots"].to(torch.int32)
    return inputs, params


def has_initial_state_uint8(inputs, params):
    inputs["has_initial_state"] = inputs["has_initial_state"].to(torch.uint8)
    return inputs, params


def conv_state_too_wide(inputs, params):
    """K cached inputs per channel instead of K - 1."""
    state = inputs["conv_state"]
    inputs["conv_state"] = torch.cat([state, state[:, :, :1]], dim=2)
    return inputs, params


def mixed_qkv_one_channel_short(inputs, params):
    inputs["mixed_qkv"] = inputs["mixed_qkv"][:, :-1].clone()
    return inputs, params


def z_other_dtype(inputs, params):
    other = torch.float16 if inputs["z"].dtype != torch.float16 else torch.float32
    inputs["z"] = inputs["z"].to(other)
    return inputs, params


def a_per_key_head(inputs, params):
    """a with one column per key head instead of per value head."""
    inputs["a"] = inputs["a"][:, : inputs["a"].shape[1] // 2].clone()
    return inputs, params


def norm_weight_key_dim(inputs, params):
    """norm_weight of length Dv / 2 (the gated norm is over the Dv values of a head)."""
    inputs["norm_weight"] = inputs["norm_weight"][: inputs["norm_weight"].shape[0] // 2].clone()
    return inputs, params


def state_pools_of_unequal_size(inputs, params):
    """recurrent_state with one slot fewer than conv_state."""
    inputs["recurrent_state"] = inputs["recurrent_state"][:-1].clone()
    return inputs, params
