"""Mixture-of-experts ops in plain torch: router top-k, shared expert, routed experts, token permute/unpermute.

Destination passing: outputs are preallocated by the caller. Layouts (see contracts/moe/*.yaml):
- router outputs `topk_weights [T, top_k]` float32 (renormalised to sum 1), `topk_ids [T, top_k]` int32,
  each row ordered by decreasing probability, ties broken toward the lower expert index;
- routed weights `gate_up_proj [E, 2I, H]` (rows 0:I gate, I:2I up), `down_proj [E, H, I]`;
- permuted rows: token copies grouped by expert, within an expert ordered by flattened index
  t * top_k + j; `source_rows[r]` is that flattened index, `expert_offsets [E + 1]` the prefix sums.
Matrix products run in the input dtype (fp32 accumulation inside); activations, gates and weighted
sums in float32, rounded once into the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_engine.ops.registry import satisfies


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_out(tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> None:
    _require(tuple(tensor.shape) == shape, f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    _require(tensor.dtype == dtype, f"{name} must be {dtype}, got {tensor.dtype}")


def _check_routing(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_tokens: int) -> int:
    _require(topk_ids.dim() == 2 and topk_ids.shape[0] == num_tokens, f"topk_ids must be [T={num_tokens}, top_k], got {tuple(topk_ids.shape)}")
    _require(topk_ids.dtype == torch.int32, f"topk_ids must be int32, got {topk_ids.dtype}")
    _check_out(topk_weights, tuple(topk_ids.shape), torch.float32, "topk_weights")
    return topk_ids.shape[1]


def _check_expert_range(topk_ids: torch.Tensor, num_experts: int) -> None:
    if topk_ids.numel():
        low, high = int(topk_ids.min()), int(topk_ids.max())
        _require(low >= 0 and high < num_experts, f"topk_ids must lie in [0, {num_experts}), got values in [{low}, {high}]")


@satisfies("moe/router-topk", major=1)
def router_topk(
    router_logits: torch.Tensor,  # [T, E]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    top_k: int,
) -> None:
    """softmax in float32, the top_k largest (ties: lower index first), renormalised to sum 1."""
    _require(router_logits.dim() == 2, f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}")
    num_tokens, num_experts = router_logits.shape
    _require(isinstance(top_k, int) and 1 <= top_k <= num_experts, f"top_k must be an integer in [1, E={num_experts}], got {top_k!r}")
    _check_out(topk_weights, (num_tokens, top_k), torch.float32, "topk_weights")
    _check_out(topk_ids, (num_tokens, top_k), torch.int32, "topk_ids")
    logits = router_logits.float()
    probs = torch.softmax(logits, dim=-1)  # [T, E]
    # A stable descending sort keeps equal logits in index order, so the lower index wins a tie.
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]  # [T, top_k]
    chosen = probs.gather(1, order)
    topk_weights.copy_(chosen / chosen.sum(dim=-1, keepdim=True))
    topk_ids.copy_(order)


def check_router_with_shared(router_logits: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, top_k: int) -> tuple[int, int]:
    """Shape and dtype checks of `router_topk_with_shared` (every implementation); returns (T, E routed experts)."""
    _require(router_logits.dim() == 2 and router_logits.shape[1] >= 2, f"router_logits must be [T, E+1] (E routed experts and the shared gate), got shape {tuple(router_logits.shape)}")
    num_tokens, num_experts = router_logits.shape[0], router_logits.shape[1] - 1
    _require(isinstance(top_k, int) and 1 <= top_k <= num_experts, f"top_k must be an integer in [1, E={num_experts}], got {top_k!r}")
    _check_out(topk_weights, (num_tokens, top_k + 1), torch.float32, "topk_weights")
    _check_out(topk_ids, (num_tokens, top_k + 1), torch.int32, "topk_ids")
    return num_tokens, num_experts


def router_topk_with_shared(
    router_logits: torch.Tensor,  # [T, E+1]: E routed-expert logits, then the shared expert's gate logit
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32
    top_k: int,
) -> None:
    """Slots 0..top_k-1: `router_topk` over columns 0..E-1 (softmax over E only); slot top_k: id E (the
    shared-expert sentinel) with weight sigmoid(logit E) in float32."""
    _, num_experts = check_router_with_shared(router_logits, topk_weights, topk_ids, top_k)
    router_topk(router_logits[:, :num_experts], topk_weights[:, :top_k], topk_ids[:, :top_k], top_k)
    topk_weights[:, top_k].copy_(torch.sigmoid(router_logits[:, num_experts].float()))
    topk_ids[:, top_k].fill_(num_experts)


@satisfies("moe/shared-expert", major=1)
def shared_expert(
    x: torch.Tensor,  # [T, H]
    gate_proj: torch.Tensor,  # [I, H]
    up_proj: torch.Tensor,  # [I, H]
    down_proj: torch.Tensor,  # [H, I]
    gate_weight: torch.Tensor,  # [1, H]
    out: torch.Tensor,  # [T, H]
) -> None:
    """out = sigmoid(x @ gate_weight^T) * down(silu(gate(x)) * up(x))."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    _require(gate_proj.dim() == 2 and gate_proj.shape[1] == hidden, f"gate_proj must be [I, H={hidden}], got {tuple(gate_proj.shape)}")
    intermediate = gate_proj.shape[0]
    _require(tuple(up_proj.shape) == (intermediate, hidden), f"up_proj must be [I={intermediate}, H={hidden}], got {tuple(up_proj.shape)}")
    _require(tuple(down_proj.shape) == (hidden, intermediate), f"down_proj must be [H={hidden}, I={intermediate}], got {tuple(down_proj.shape)}")
    _require(tuple(gate_weight.shape) == (1, hidden), f"gate_weight must be [1, H={hidden}], got {tuple(gate_weight.shape)}")
    for name, tensor in (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj), ("gate_weight", gate_weight)):
        _require(tensor.dtype == x.dtype, f"{name} must have the dtype of x ({x.dtype}), got {tensor.dtype}")
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    activation = (F.silu(F.linear(x, gate_proj).float()) * F.linear(x, up_proj).float()).to(x.dtype)  # [T, I]
    scale = torch.sigmoid(F.linear(x, gate_weight).float())  # [T, 1]
    out.copy_(F.linear(activation, down_proj).float() * scale)


def _group_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source_rows [T*k] int64 in permuted order, counts [E] int64); stable, so ties keep t*k + j order."""
    flat = topk_ids.reshape(-1).long()
    source_rows = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    return source_rows, counts


def check_routed_experts(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, out: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """Shape and dtype checks of moe/routed-experts (shared by every implementation); returns (T, H, top_k, E, I)."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    top_k = _check_routing(topk_weights, topk_ids, num_tokens)
    _require(gate_up_proj.dim() == 3 and gate_up_proj.shape[2] == hidden, f"gate_up_proj must be [E, 2I, H={hidden}], got {tuple(gate_up_proj.shape)}")
    num_experts, double_intermediate = gate_up_proj.shape[:2]
    _require(double_intermediate % 2 == 0, f"gate_up_proj rows must be 2I (even), got {double_intermediate}")
    intermediate = double_intermediate // 2
    _require(
        tuple(down_proj.shape) == (num_experts, hidden, intermediate),
        f"down_proj must be [E={num_experts}, H={hidden}, I={intermediate}], got {tuple(down_proj.shape)}",
    )
    _require(gate_up_proj.dtype == x.dtype and down_proj.dtype == x.dtype, f"expert weights must have the dtype of x ({x.dtype}), got {gate_up_proj.dtype} and {down_proj.dtype}")
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    return num_tokens, hidden, top_k, num_experts, intermediate


@satisfies("moe/routed-experts", major=1)
def routed_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    gate_up_proj: torch.Tensor,  # [E, 2I, H]
    down_proj: torch.Tensor,  # [E, H, I]
    out: torch.Tensor,  # [T, H]
) -> None:
    """out[t] = sum_j w[t, j] * down_e(silu(gate_e x_t) * up_e x_t) with e = topk_ids[t, j]."""
    num_tokens, hidden, top_k, num_experts, intermediate = check_routed_experts(x, topk_weights, topk_ids, gate_up_proj, down_proj, out)
    _check_expert_range(topk_ids, num_experts)
    source_rows, counts = _group_by_expert(topk_ids, num_experts)
    weights = topk_weights.reshape(-1)
    acc = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        rows = source_rows[start : start + count]
        start += count
        tokens = rows // top_k
        projected = F.linear(x[tokens], gate_up_proj[expert]).float()  # [n, 2I]
        activation = (F.silu(projected[:, :intermediate]) * projected[:, intermediate:]).to(x.dtype)
        expert_out = F.linear(activation, down_proj[expert]).float()  # [n, H]
        acc.index_add_(0, tokens, expert_out * weights[rows, None])
    out.copy_(acc)


@satisfies("moe/token-permute", major=1)
def token_permute(
    x: torch.Tensor,  # [T, H]
    topk_ids: torch.Tensor,  # [T, top_k] int32
    permuted_x: torch.Tensor,  # [T * top_k, H]
    expert_offsets: torch.Tensor,  # [E + 1] int32
    source_rows: torch.Tensor,  # [T * top_k] int32
    num_experts: int,
) -> None:
    """Group token copies by expert (stable); record where each permuted row came from."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    _require(topk_ids.dim() == 2 and topk_ids.shape[0] == num_tokens, f"topk_ids must be [T={num_tokens}, top_k], got {tuple(topk_ids.shape)}")
    _require(topk_ids.dtype == torch.int32, f"topk_ids must be int32, got {topk_ids.dtype}")
    top_k = topk_ids.shape[1]
    _require(isinstance(num_experts, int) and num_experts >= 1, f"num_experts must be a positive integer, got {num_experts!r}")
    _check_out(expert_offsets, (num_experts + 1,), torch.int32, "expert_offsets")
    _check_out(permuted_x, (num_tokens * top_k, hidden), x.dtype, "permuted_x")
    _check_out(source_rows, (num_tokens * top_k,), torch.int32, "source_rows")
    _check_expert_range(topk_ids, num_experts)
    rows, counts = _group_by_expert(topk_ids, num_experts)
    permuted_x.copy_(x[rows // top_k])
    expert_offsets[0] = 0
    torch.cumsum(counts, dim=0, out=counts)
    expert_offsets[1:].copy_(counts)
    source_rows.copy_(rows)


@satisfies("moe/token-unpermute", major=1)
def token_unpermute(
    expert_out: torch.Tensor,  # [T * top_k, H]
    source_rows: torch.Tensor,  # [T * top_k] int32
    topk_weights: torch.Tensor,  # [T, top_k] float32
    out: torch.Tensor,  # [T, H]
) -> None:
    """out[t] = sum_j topk_weights[t, j] * expert_out[r] where source_rows[r] = t * top_k + j."""
    _require(topk_weights.dim() == 2 and topk_weights.dtype == torch.float32, f"topk_weights must be [T, top_k] float32, got {tuple(topk_weights.shape)} {topk_weights.dtype}")
    num_tokens, top_k = topk_weights.shape
    _require(expert_out.dim() == 2 and expert_out.shape[0] == num_tokens * top_k, f"expert_out must be [T*top_k={num_tokens * top_k}, H], got {tuple(expert_out.shape)}")
    hidden = expert_out.shape[1]
    _check_out(source_rows, (num_tokens * top_k,), torch.int32, "source_rows")
    _check_out(out, (num_tokens, hidden), expert_out.dtype, "out")
    permuted_of_flat = torch.empty_like(source_rows, dtype=torch.int64)
    permuted_of_flat[source_rows.long()] = torch.arange(source_rows.numel(), device=source_rows.device)
    gathered = expert_out[permuted_of_flat].view(num_tokens, top_k, hidden).float()
    out.copy_((gathered * topk_weights[:, :, None]).sum(dim=1))
