"""Gated DeltaNet (linear attention) ops in plain torch: causal conv1d, gates, chunked prefill, recurrent decode.

Every op is destination passing: outputs are preallocated by the caller and written here. An output
may be the same tensor as the state it replaces (`final_state is initial_state`, `state_out is state`,
`conv_state_out is conv_state`): states are read completely before anything is written.

Layouts (see contracts/linear-attention/*.yaml):
- ragged batches: `cu_seqlens [B + 1]` int32, prefix sums of the sequence lengths, starting at 0;
- conv state `[B, C, K - 1]`: the last K - 1 inputs of the sequence, oldest first (zeros for a new one);
- recurrent state `[B, Hv, Dk, Dv]` float32 (zeros for a new sequence);
- key head i serves value heads i * Hv/Hk .. (i + 1) * Hv/Hk - 1 (repeat_interleave, not tile).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_engine.ops.host_values import host_list
from reference_engine.ops.norms import gated_rms_norm
from reference_engine.ops.registry import satisfies

L2_EPS = 1e-6


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_cu_seqlens(cu_seqlens: torch.Tensor, num_tokens: int, name: str = "cu_seqlens") -> list[int]:
    """Validate a ragged-batch offset vector and return it as host integers (one sync, at prefill only)."""
    _require(cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2, f"{name} must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
    _require(cu_seqlens.dtype == torch.int32, f"{name} must be int32, got {cu_seqlens.dtype}")
    offsets = host_list(cu_seqlens)
    _require(offsets[0] == 0, f"{name} must start at 0, got {offsets[0]}")
    _require(offsets[-1] == num_tokens, f"{name} must end at the number of tokens {num_tokens}, got {offsets[-1]}")
    _require(all(b >= a for a, b in itertools.pairwise(offsets)), f"{name} must be non-decreasing, got {offsets}")
    return offsets


def _check_out(tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> None:
    _require(tuple(tensor.shape) == shape, f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    _require(tensor.dtype == dtype, f"{name} must be {dtype}, got {tensor.dtype}")


# ----------------------------------------------------------------------------------------------- conv


def check_causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor, initial_state: torch.Tensor, out: torch.Tensor, final_state: torch.Tensor
) -> tuple[int, int, int, list[int]]:
    """The causal conv1d input checks (the torch op and the Triton kernel share them); returns (T, C, K, offsets)."""
    _require(x.dim() == 2, f"x must be [T, C], got shape {tuple(x.shape)}")
    num_tokens, channels = x.shape
    _require(weight.dim() == 2 and weight.shape[0] == channels, f"weight must be [C={channels}, K], got {tuple(weight.shape)}")
    kernel = weight.shape[1]
    _require(kernel >= 2, f"kernel size must be at least 2, got {kernel}")
    num_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else -1
    _require(
        tuple(initial_state.shape) == (num_seqs, channels, kernel - 1),
        f"initial_state must be [B={num_seqs}, C={channels}, K-1={kernel - 1}], got {tuple(initial_state.shape)}",
    )
    _require(weight.dtype == x.dtype and initial_state.dtype == x.dtype, f"x, weight, initial_state must share a dtype, got {x.dtype}, {weight.dtype}, {initial_state.dtype}")
    _check_out(out, (num_tokens, channels), x.dtype, "out")
    _check_out(final_state, tuple(initial_state.shape), x.dtype, "final_state")
    return num_tokens, channels, kernel, _check_cu_seqlens(cu_seqlens, num_tokens)


@satisfies("linear-attention/causal-conv1d", major=1)
def causal_conv1d(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, K]
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    initial_state: torch.Tensor,  # [B, C, K - 1]
    out: torch.Tensor,  # [T, C]
    final_state: torch.Tensor,  # [B, C, K - 1]
) -> None:
    """Depthwise causal conv over each sequence (previous inputs from `initial_state`), then SiLU."""
    num_tokens, channels, kernel, offsets = check_causal_conv1d(x, weight, cu_seqlens, initial_state, out, final_state)
    num_seqs = len(offsets) - 1

    state_len = kernel - 1
    # Every row index on the host, one copy to the device: source rows are the T inputs, then each sequence's
    # K-1 previous inputs (oldest first); taps [K, T] (tap K-1 is the current input), last inputs [B, K-1].
    taps, last = _conv_rows(offsets, kernel)
    indices = torch.cat([taps.flatten(), last.flatten()]).to(x.device)
    tap_rows, last_rows = indices[: kernel * num_tokens].view(kernel, num_tokens), indices[kernel * num_tokens :].view(num_seqs, state_len)
    source = torch.cat([x, initial_state.transpose(1, 2).reshape(num_seqs * state_len, channels)])  # [T + B(K-1), C]
    w = weight.float()
    acc = source[tap_rows[0]] * w[:, 0]  # [T, C] float32 (the product promotes, as .float() * w)
    for tap in range(1, kernel):
        acc += source[tap_rows[tap]] * w[:, tap]
    out.copy_(F.silu(acc))
    final_state.copy_(source[last_rows].transpose(1, 2))  # [B, K-1, C] -> [B, C, K-1]


def _conv_rows(offsets: list[int], kernel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host int64 row indices into [x; states] for `causal_conv1d`: per tap [K, T], and each sequence's last K-1 inputs [B, K-1]."""
    state_len = kernel - 1
    bounds = torch.tensor(offsets, dtype=torch.int64)
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]  # [B]
    num_seqs, num_tokens = starts.shape[0], offsets[-1]

    def rows(seq: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        """Row holding relative position `rel` (negative = from the state) of sequence `seq`."""
        return torch.where(rel >= 0, starts[seq] + rel, num_tokens + seq * state_len + state_len + rel)

    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), lengths, output_size=num_tokens)  # [T]
    position = torch.arange(num_tokens) - starts[seq_of_token]  # [T]
    shifts = torch.arange(kernel)[:, None] - state_len  # [K, 1]: tap j reads position + j - (K-1)
    seqs = torch.arange(num_seqs)[:, None]  # [B, 1]
    return rows(seq_of_token[None, :], position[None, :] + shifts), rows(seqs, lengths[:, None] - state_len + torch.arange(state_len)[None, :])


@satisfies("linear-attention/causal-conv1d-update", major=1)
def causal_conv1d_update(
    x: torch.Tensor,  # [B, C]
    weight: torch.Tensor,  # [C, K]
    conv_state: torch.Tensor,  # [B, C, K - 1]
    out: torch.Tensor,  # [B, C]
    conv_state_out: torch.Tensor,  # [B, C, K - 1]
) -> None:
    """One new input per sequence: out = silu(conv over [state, x]); the state shifts left by one."""
    _require(x.dim() == 2, f"x must be [B, C], got shape {tuple(x.shape)}")
    batch, channels = x.shape
    _require(weight.dim() == 2 and weight.shape[0] == channels, f"weight must be [C={channels}, K], got {tuple(weight.shape)}")
    kernel = weight.shape[1]
    _require(
        tuple(conv_state.shape) == (batch, channels, kernel - 1),
        f"conv_state must be [B={batch}, C={channels}, K-1={kernel - 1}], got {tuple(conv_state.shape)}",
    )
    _require(weight.dtype == x.dtype and conv_state.dtype == x.dtype, f"x, weight, conv_state must share a dtype, got {x.dtype}, {weight.dtype}, {conv_state.dtype}")
    _check_out(out, (batch, channels), x.dtype, "out")
    _check_out(conv_state_out, tuple(conv_state.shape), x.dtype, "conv_state_out")
    window = torch.cat([conv_state, x[:, :, None]], dim=2)  # [B, C, K]
    result = F.silu((window.float() * weight.float()).sum(dim=2))
    conv_state_out.copy_(window[:, :, 1:])
    out.copy_(result)


# ---------------------------------------------------------------------------------------------- gates


def check_gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
    """The gdn-gates contract's input checks (shared with the Triton kernel)."""
    _require(a.dim() == 2 and a.shape == b.shape, f"a and b must both be [T, Hv], got {tuple(a.shape)} and {tuple(b.shape)}")
    _require(a.dtype == b.dtype, f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    num_v_heads = a.shape[1]
    _require(tuple(A_log.shape) == (num_v_heads,) and tuple(dt_bias.shape) == (num_v_heads,), f"A_log and dt_bias must be [Hv={num_v_heads}], got {tuple(A_log.shape)} and {tuple(dt_bias.shape)}")
    _check_out(g, tuple(a.shape), torch.float32, "g")
    _check_out(beta, tuple(a.shape), torch.float32, "beta")


@satisfies("linear-attention/gdn-gates", major=1)
def gdn_gates(
    a: torch.Tensor,  # [T, Hv]
    b: torch.Tensor,  # [T, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    g: torch.Tensor,  # [T, Hv] float32
    beta: torch.Tensor,  # [T, Hv] float32
) -> None:
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), both in float32."""
    check_gdn_gates(a, b, A_log, dt_bias, g, beta)
    torch.mul(-torch.exp(A_log.float()), F.softplus(a.float() + dt_bias.float()), out=g)  # written in place: no copy launch
    torch.sigmoid(b.float(), out=beta)


# ---------------------------------------------------------------------------------------- delta rule


def _check_qkv(query, key, value, g, beta) -> tuple[int, int, int, int, int]:
    _require(query.dim() == 3 and key.shape == query.shape, f"query and key must both be [T, Hk, Dk], got {tuple(query.shape)} and {tuple(key.shape)}")
    _require(value.dim() == 3 and value.shape[0] == query.shape[0], f"value must be [T={query.shape[0]}, Hv, Dv], got {tuple(value.shape)}")
    tokens, num_k_heads, k_dim = query.shape
    num_v_heads, v_dim = value.shape[1:]
    _require(num_v_heads % num_k_heads == 0, f"value heads ({num_v_heads}) must be a multiple of key heads ({num_k_heads})")
    _require(key.dtype == query.dtype and value.dtype == query.dtype, f"query, key, value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    for name, tensor in (("g", g), ("beta", beta)):
        _require(tuple(tensor.shape) == (tokens, num_v_heads), f"{name} must be [T={tokens}, Hv={num_v_heads}], got {tuple(tensor.shape)}")
        _require(tensor.dtype == torch.float32, f"{name} must be float32, got {tensor.dtype}")
    return tokens, num_k_heads, k_dim, num_v_heads, v_dim


def _prepare_qk(query: torch.Tensor, key: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalise in fp32, scale the query by Dk^-0.5, expand key heads to value heads (interleaved)."""
    group = num_v_heads // query.shape[1]
    q = query.float()
    k = key.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * (q.shape[-1] ** -0.5)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    return _expand_heads(q, group), _expand_heads(k, group)  # [T, Hv, Dk] each


def _expand_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[T, Hk, D] -> [T, Hk * group, D], key head i serving value heads i*G .. i*G + G - 1.

    expand + reshape rather than repeat_interleave: the same order, and no size read back from the
    device, so the decode step stays capturable in a CUDA graph."""
    tokens, num_k_heads, dim = x.shape
    return x[:, :, None, :].expand(tokens, num_k_heads, group, dim).reshape(tokens, num_k_heads * group, dim)


@satisfies("linear-attention/gdn-recurrent-decode", major=1)
def gdn_recurrent_decode(
    query: torch.Tensor,  # [B, Hk, Dk]
    key: torch.Tensor,  # [B, Hk, Dk]
    value: torch.Tensor,  # [B, Hv, Dv]
    g: torch.Tensor,  # [B, Hv] float32
    beta: torch.Tensor,  # [B, Hv] float32
    state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    out: torch.Tensor,  # [B, Hv, Dv]
    state_out: torch.Tensor,  # [B, Hv, Dk, Dv] float32
) -> None:
    """One token per sequence: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; out = S^T q."""
    batch, _, k_dim, num_v_heads, v_dim = _check_qkv(query, key, value, g, beta)
    _check_out(state, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state")
    _check_out(state_out, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state_out")
    _check_out(out, (batch, num_v_heads, v_dim), value.dtype, "out")
    q, k = _prepare_qk(query, key, num_v_heads)
    decayed = state * torch.exp(g)[:, :, None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", decayed, k)
    delta = beta[:, :, None] * (value.float() - predicted)  # [B, Hv, Dv]
    new_state = decayed + k[:, :, :, None] * delta[:, :, None, :]
    result = torch.einsum("bhkv,bhk->bhv", new_state, q)
    state_out.copy_(new_state)
    out.copy_(result)


@dataclass(frozen=True)
class _ChunkPlan:
    """The chunks of a ragged batch in step-major order, all indices on the host (int64).

    Sequences are ordered by decreasing chunk count (`order`, stable), so at step s the sequences with
    an s-th chunk are the first `active[s]` of that order and their s-th chunks are the consecutive
    slots `first[s] .. first[s] + active[s] - 1`: the scan reads and writes contiguous slices."""

    order: torch.Tensor  # [B] sequence index at each sorted position
    identity: bool  # order is 0 .. B-1
    first: tuple[int, ...]  # per step, the first slot
    active: tuple[int, ...]  # per step, the number of sequences with a chunk at that step
    rows: torch.Tensor  # [N, C] token row of each slot entry (`num_tokens` marks padding)
    slot_of_token: torch.Tensor  # [T] slot holding each token
    offset_of_token: torch.Tensor  # [T] its entry within the slot
    heads: torch.Tensor  # [H] 0 .. H-1 (gathered with `rows`)


def _chunk_plan(offsets: list[int], chunk_size: int, num_heads: int) -> _ChunkPlan:
    lengths = [end - start for start, end in itertools.pairwise(offsets)]
    counts = [-(-length // chunk_size) for length in lengths]
    order = sorted(range(len(counts)), key=lambda b: -counts[b])  # stable: equal counts keep batch order
    first, active, starts, ends = [], [], [], []
    for step in range(max(counts, default=0)):
        sequences = [b for b in order if counts[b] > step]  # a prefix of `order`
        first.append(len(starts))
        active.append(len(sequences))
        starts.extend(offsets[b] + step * chunk_size for b in sequences)
        ends.extend(offsets[b + 1] for b in sequences)
    num_tokens = offsets[-1]
    rows = torch.tensor(starts, dtype=torch.int64)[:, None] + torch.arange(chunk_size)  # [N, C]
    real = rows < torch.tensor(ends, dtype=torch.int64)[:, None]
    rows = torch.where(real, rows, num_tokens)
    entry = torch.empty(num_tokens, dtype=torch.int64)
    entry[rows[real]] = torch.arange(rows.numel()).view(rows.shape)[real]  # flat slot entry of each token
    return _ChunkPlan(
        torch.tensor(order, dtype=torch.int64), order == sorted(order), tuple(first), tuple(active), rows, entry // chunk_size, entry % chunk_size,
        torch.arange(num_heads),
    )


@satisfies("linear-attention/gdn-chunked-prefill", major=1)
def gdn_chunked_prefill(
    query: torch.Tensor,  # [T, Hk, Dk]
    key: torch.Tensor,  # [T, Hk, Dk]
    value: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] float32
    beta: torch.Tensor,  # [T, Hv] float32
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    initial_state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    out: torch.Tensor,  # [T, Hv, Dv]
    final_state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    chunk_size: int = 64,
) -> None:
    """The gated delta rule over a ragged batch, chunk by chunk (WY/UT form, fp32).

    Every chunk's matrices are formed at once (batched over chunks and heads); the scan over the
    chunks of each sequence then runs one step per chunk position, all sequences together, on
    contiguous slices (see `_ChunkPlan`): a fixed number of launches per step whatever the batch."""
    tokens, _, k_dim, num_v_heads, v_dim = _check_qkv(query, key, value, g, beta)
    _require(isinstance(chunk_size, int) and chunk_size >= 1, f"chunk_size must be a positive integer, got {chunk_size!r}")
    num_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else -1
    _check_out(initial_state, (num_seqs, num_v_heads, k_dim, v_dim), torch.float32, "initial_state")
    _check_out(final_state, (num_seqs, num_v_heads, k_dim, v_dim), torch.float32, "final_state")
    _check_out(out, (tokens, num_v_heads, v_dim), value.dtype, "out")
    offsets = _check_cu_seqlens(cu_seqlens, tokens)
    device = query.device
    if tokens == 0:
        final_state.copy_(initial_state)
        return

    size = chunk_size
    plan = _chunk_plan(offsets, size, num_v_heads)
    num_chunks = plan.rows.shape[0]
    parts = (plan.rows.flatten(), plan.heads, plan.slot_of_token, plan.offset_of_token, plan.order)
    indices = torch.cat(parts).to(device)  # the one host-to-device copy
    rows, heads, slot_of_token, offset_of_token, order = indices.split([part.numel() for part in parts])

    # q, k (normalised, expanded to value heads), v, g, beta side by side in one float32 tensor with a zero
    # row T for padding, gathered into chunks [N, Hv, C, W] by one index; padding has g = 0, beta = 0: no effect on the state.
    q, k = _prepare_qk(query, key, num_v_heads)  # [T, Hv, Dk] each
    width = 2 * k_dim + v_dim + 2
    packed = torch.empty(tokens + 1, num_v_heads, width, dtype=torch.float32, device=device)
    torch.cat([q, k, value, g[..., None], beta[..., None]], dim=-1, out=packed[:tokens])  # value promoted to float32
    packed[tokens].zero_()
    chunks = packed[rows.view(num_chunks, 1, size), heads.view(1, num_v_heads, 1)]  # [N, Hv, C, W]
    # q and k contiguous: torch's CPU bmm rounds some small strided products differently (1 ulp), and the
    # result should not depend on the packing
    q_c, k_c = chunks[..., :k_dim].contiguous(), chunks[..., k_dim : 2 * k_dim].contiguous()  # [N, Hv, C, Dk]
    v_c = chunks[..., 2 * k_dim : 2 * k_dim + v_dim]  # [N, Hv, C, Dv]
    g_c, beta_c = chunks[..., -2], chunks[..., -1]  # [N, Hv, C]

    log_decay = g_c.cumsum(dim=-1)  # [N, Hv, C]
    above = torch.ones(size, size, dtype=torch.bool, device=device).triu(1)  # j > i
    between = log_decay[..., :, None] - log_decay[..., None, :]  # [N, Hv, C, C], i row, j column
    decay_ij = torch.exp(between.masked_fill(above, float("-inf")))  # exp(c_i - c_j) for j <= i, else 0
    decay = torch.exp(log_decay)  # [N, Hv, C]
    k_beta = k_c * beta_c[..., None]
    lower = (k_beta @ k_c.transpose(-1, -2)) * decay_ij  # diagonal ignored by the unitriangular solve
    pseudo_values = torch.linalg.solve_triangular(lower, v_c * beta_c[..., None], upper=False, unitriangular=True)
    state_keys = torch.linalg.solve_triangular(lower, k_beta * decay[..., None], upper=False, unitriangular=True)
    scores = (q_c @ k_c.transpose(-1, -2)) * decay_ij  # [N, Hv, C, C]
    q_decayed = q_c * decay[..., None]
    k_to_end = k_c * torch.exp(log_decay[..., -1:] - log_decay)[..., None]
    chunk_decay = decay[..., -1:, None]  # [N, Hv, 1, 1] exp(c_last)

    states = initial_state.clone() if plan.identity else initial_state[order]  # [B, Hv, Dk, Dv] in plan order
    out_c = torch.empty_like(chunks[..., :v_dim], memory_format=torch.contiguous_format)  # [N, Hv, C, Dv]
    for first, active in zip(plan.first, plan.active):
        chunk, state = slice(first, first + active), states[:active]  # this step's slots; their sequences' states
        writes = pseudo_values[chunk] - state_keys[chunk] @ state  # [A, Hv, C, Dv]
        torch.add(q_decayed[chunk] @ state, scores[chunk] @ writes, out=out_c[chunk])
        torch.add(state * chunk_decay[chunk], k_to_end[chunk].transpose(-1, -2) @ writes, out=state)

    out.copy_(out_c[slot_of_token, :, offset_of_token])  # [T, Hv, Dv]
    if plan.identity:
        final_state.copy_(states)
    else:
        final_state.index_copy_(0, order, states)


# ------------------------------------------------------------------------------- fused decode step


@dataclass(frozen=True)
class GdnStepDims:
    """Sizes of one Gated DeltaNet decode step, read from the shapes of its arguments."""

    batch: int  # B
    channels: int  # C = 2 * Hk * Dk + Hv * Dv
    kernel: int  # K (conv taps)
    num_k_heads: int  # Hk
    num_v_heads: int  # Hv
    k_head_dim: int  # Dk
    v_head_dim: int  # Dv
    num_slots: int  # S (rows of the state pools)


def check_gdn_decode_step(
    mixed_qkv, z, b, a, conv_weight, A_log, dt_bias, norm_weight, conv_state, recurrent_state, state_slots, has_initial_state, out, eps
) -> GdnStepDims:
    """Validate the arguments of `gdn_decode_step` by shape and dtype only (no host sync); returns the sizes."""
    _require(mixed_qkv.dim() == 2, f"mixed_qkv must be [B, C], got shape {tuple(mixed_qkv.shape)}")
    _require(mixed_qkv.is_floating_point(), f"mixed_qkv must be a floating tensor, got {mixed_qkv.dtype}")
    batch, channels = mixed_qkv.shape
    dtype = mixed_qkv.dtype
    _require(A_log.dim() == 1 and tuple(dt_bias.shape) == tuple(A_log.shape), f"A_log and dt_bias must both be [Hv], got {tuple(A_log.shape)} and {tuple(dt_bias.shape)}")
    num_v_heads = A_log.shape[0]
    _require(norm_weight.dim() == 1, f"norm_weight must be [Dv], got shape {tuple(norm_weight.shape)}")
    v_head_dim = norm_weight.shape[0]
    _require(
        recurrent_state.dim() == 4 and recurrent_state.shape[1] == num_v_heads and recurrent_state.shape[3] == v_head_dim,
        f"recurrent_state must be [S, Hv={num_v_heads}, Dk, Dv={v_head_dim}], got {tuple(recurrent_state.shape)}",
    )
    _require(recurrent_state.dtype == torch.float32, f"recurrent_state must be float32, got {recurrent_state.dtype}")
    num_slots, _, k_head_dim, _ = recurrent_state.shape
    key_dim2 = channels - num_v_heads * v_head_dim  # 2 * Hk * Dk
    _require(
        num_v_heads > 0 and v_head_dim > 0 and k_head_dim > 0 and key_dim2 > 0 and key_dim2 % (2 * k_head_dim) == 0,
        f"C={channels} must be 2 * Hk * Dk + Hv * Dv with Hv={num_v_heads}, Dv={v_head_dim}, Dk={k_head_dim}",
    )
    num_k_heads = key_dim2 // (2 * k_head_dim)
    _require(num_v_heads % num_k_heads == 0, f"value heads ({num_v_heads}) must be a multiple of key heads ({num_k_heads})")
    _require(conv_weight.dim() == 2 and conv_weight.shape[0] == channels and conv_weight.shape[1] >= 2, f"conv_weight must be [C={channels}, K>=2], got {tuple(conv_weight.shape)}")
    kernel = conv_weight.shape[1]
    _require(
        tuple(conv_state.shape) == (num_slots, channels, kernel - 1),
        f"conv_state must be [S={num_slots}, C={channels}, K-1={kernel - 1}], got {tuple(conv_state.shape)}",
    )
    _require(conv_weight.dtype == dtype and conv_state.dtype == dtype, f"mixed_qkv, conv_weight, conv_state must share a dtype, got {dtype}, {conv_weight.dtype}, {conv_state.dtype}")
    value_dim = num_v_heads * v_head_dim
    _check_out(z, (batch, value_dim), dtype, "z")
    _require(tuple(b.shape) == (batch, num_v_heads) and tuple(a.shape) == (batch, num_v_heads), f"b and a must both be [B={batch}, Hv={num_v_heads}], got {tuple(b.shape)} and {tuple(a.shape)}")
    _require(b.is_floating_point() and a.is_floating_point(), f"b and a must be floating tensors, got {b.dtype} and {a.dtype}")
    for name, tensor in (("A_log", A_log), ("dt_bias", dt_bias), ("norm_weight", norm_weight)):
        _require(tensor.is_floating_point(), f"{name} must be a floating tensor, got {tensor.dtype}")
    _check_out(state_slots, (batch,), torch.int64, "state_slots")
    _check_out(has_initial_state, (batch,), torch.bool, "has_initial_state")
    _check_out(out, (batch, value_dim), dtype, "out")
    _require(eps > 0, f"eps must be positive, got {eps}")
    return GdnStepDims(batch, channels, kernel, num_k_heads, num_v_heads, k_head_dim, v_head_dim, num_slots)


@satisfies("linear-attention/gdn-decode-step", major=1)
def gdn_decode_step(
    mixed_qkv: torch.Tensor,  # [B, C] model dtype, C = 2 * Hk * Dk + Hv * Dv, layout [q | k | v]
    z: torch.Tensor,  # [B, Hv * Dv] model dtype (may be a strided view)
    b: torch.Tensor,  # [B, Hv]
    a: torch.Tensor,  # [B, Hv]
    conv_weight: torch.Tensor,  # [C, K]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [Dv] (plain weight, not zero-centred)
    conv_state: torch.Tensor,  # [S, C, K - 1] model dtype, updated in place at rows state_slots
    recurrent_state: torch.Tensor,  # [S, Hv, Dk, Dv] float32, updated in place at rows state_slots
    state_slots: torch.Tensor,  # [B] int64
    has_initial_state: torch.Tensor,  # [B] bool (False: both states start at zero)
    out: torch.Tensor,  # [B, Hv * Dv] model dtype
    eps: float,
) -> None:
    """One Gated DeltaNet decode token per sequence, states read and written in place in the pools.

    The composition the model ran before this op existed: gather both states at `state_slots`
    (zeros where `has_initial_state` is False), `causal_conv1d_update`, scatter the conv state back,
    `gdn_gates`, `gdn_recurrent_decode` (its output rounded to the model dtype), scatter the
    recurrent state back, `gated_rms_norm` with z per value head into `out`. Capturable: no host
    sync, every size fixed by the shapes. Real rows must own distinct slots; padding rows may
    share one scratch slot (what lands there is unspecified).
    """
    dims = check_gdn_decode_step(
        mixed_qkv, z, b, a, conv_weight, A_log, dt_bias, norm_weight, conv_state, recurrent_state, state_slots, has_initial_state, out, eps
    )
    batch, key_dim = dims.batch, dims.num_k_heads * dims.k_head_dim
    heads, v_dim = dims.num_v_heads, dims.v_head_dim
    fresh = ~has_initial_state  # [B]
    conv_in = conv_state[state_slots].masked_fill(fresh[:, None, None], 0)  # [B, C, K-1]
    state_in = recurrent_state[state_slots].masked_fill(fresh[:, None, None, None], 0)  # [B, Hv, Dk, Dv]

    conv_out = torch.empty_like(mixed_qkv, memory_format=torch.contiguous_format)  # [B, C]
    conv_state_out = torch.empty_like(conv_in)  # [B, C, K-1]
    causal_conv1d_update(mixed_qkv, conv_weight, conv_in, out=conv_out, conv_state_out=conv_state_out)
    conv_state[state_slots] = conv_state_out

    query = conv_out[:, :key_dim].reshape(batch, dims.num_k_heads, dims.k_head_dim)  # [B, Hk, Dk]
    key = conv_out[:, key_dim : 2 * key_dim].reshape(batch, dims.num_k_heads, dims.k_head_dim)  # [B, Hk, Dk]
    value = conv_out[:, 2 * key_dim :].reshape(batch, heads, v_dim)  # [B, Hv, Dv]
    g = torch.empty(batch, heads, dtype=torch.float32, device=mixed_qkv.device)  # [B, Hv]
    beta = torch.empty(batch, heads, dtype=torch.float32, device=mixed_qkv.device)  # [B, Hv]
    gdn_gates(a, b, A_log, dt_bias, g=g, beta=beta)

    core = torch.empty(batch, heads, v_dim, dtype=mixed_qkv.dtype, device=mixed_qkv.device)  # [B, Hv, Dv]
    state_out = torch.empty_like(state_in)  # [B, Hv, Dk, Dv]
    gdn_recurrent_decode(query, key, value, g, beta, state_in, out=core, state_out=state_out)
    recurrent_state[state_slots] = state_out

    normed = torch.empty_like(core)  # [B, Hv, Dv]
    gated_rms_norm(core, z.reshape(batch, heads, v_dim), norm_weight, out=normed, eps=eps)
    out.copy_(normed.view(batch, heads * v_dim))
