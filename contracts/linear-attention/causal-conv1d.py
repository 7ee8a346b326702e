"""Executable half of linear-attention/causal-conv1d: float64 reference, inputs, error mutations."""

from __future__ import annotations

import itertools

import torch


def random_lengths(total: int, count: int, generator: torch.Generator) -> list[int]:
    """Split `total` tokens into `count` sequences; with two or more, the first has exactly one token."""
    if count == 1:
        return [total]
    if total < count:
        raise ValueError(f"cannot split {total} tokens into {count} non-empty sequences")
    rest = total - 1 - (count - 1)  # tokens left after one per sequence
    cuts = torch.randint(0, rest + 1, (count - 2,), generator=generator).sort().values.tolist()
    bounds = [0, *cuts, rest]
    return [1] + [1 + bounds[i + 1] - bounds[i] for i in range(count - 1)]


def make_inputs(axes, params, dtype, device, generator):
    tokens, seqs, channels, kernel = axes["T"], axes["B"], axes["C"], axes["K"]
    lengths = random_lengths(tokens, seqs, generator)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(tokens, channels, generator=generator, dtype=torch.float64)
    weight = torch.randn(channels, kernel, generator=generator, dtype=torch.float64) * 0.6
    state = torch.randn(seqs, channels, kernel - 1, generator=generator, dtype=torch.float64)
    return {
        "x": x.to(dtype).to(device),
        "weight": weight.to(dtype).to(device),
        "cu_seqlens": cu_seqlens.to(device),
        "initial_state": state.to(dtype).to(device),
    }


def reference(x, weight, cu_seqlens, initial_state):
    kernel = weight.shape[1]
    w = weight.double()
    out = torch.empty(x.shape, dtype=torch.float64)
    final_state = torch.empty(initial_state.shape, dtype=initial_state.dtype)
    offsets = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(itertools.pairwise(offsets)):
        if end == start:  # an empty sequence keeps its state
            final_state[seq] = initial_state[seq]
            continue
        history = torch.cat([initial_state[seq].double(), x[start:end].double().T], dim=1)  # [C, K-1+L]
        windows = history.unfold(1, kernel, 1)  # [C, L, K]: window p covers inputs p-(K-1) .. p
        pre = (windows * w[:, None, :]).sum(dim=2)  # [C, L]
        out[start:end] = (pre * torch.sigmoid(pre)).T
        final_state[seq] = history[:, history.shape[1] - (kernel - 1) :].to(initial_state.dtype)
    return {"out": out, "final_state": final_state}


def weight_fewer_channels(inputs, params):
    inputs["weight"] = inputs["weight"][:-1].clone()
    return inputs, params


def weight_other_dtype(inputs, params):
    inputs["weight"] = inputs["weight"].to(torch.float16)
    return inputs, params


def state_too_wide(inputs, params):
    state = inputs["initial_state"]
    inputs["initial_state"] = torch.cat([state, state[:, :, :1]], dim=2)
    return inputs, params


def state_fewer_sequences(inputs, params):
    inputs["initial_state"] = inputs["initial_state"][:-1].clone()
    return inputs, params


def cu_seqlens_past_end(inputs, params):
    cu = inputs["cu_seqlens"].clone()
    cu[-1] += 1
    inputs["cu_seqlens"] = cu
    return inputs, params


def cu_seqlens_decreasing(inputs, params):
    cu = inputs["cu_seqlens"].clone()
    cu[1] = cu[2] + 1
    inputs["cu_seqlens"] = cu
    return inputs, params


def cu_seqlens_int64(inputs, params):
    inputs["cu_seqlens"] = inputs["cu_seqlens"].long()
    return inputs, params
