"""Routed experts with static shapes and no host synchronisation: the variant a CUDA graph can capture.

The plain op (`ops/moe.py`) groups tokens by expert with a host loop over the expert counts, so its
shapes depend on the routing. Here every shape depends only on T, top_k and E:
- gather path (T * top_k < E): the weights of the T * top_k chosen (token, slot) pairs are gathered
  with `index_select` on the expert dimension and applied with batched matrix products;
- all-experts path (T * top_k >= E): every expert is applied to every token and the routing weights
  (scattered into a dense [T, E] matrix, zero for unchosen experts) combine them; cheaper once the
  batch touches most experts.
NVFP4 experts (`StackedNvfp4Experts`) are gathered packed (uint8 codes and float8 block scales) and
dequantised after the gather, so only the chosen experts' 4-bit bytes are read.
The data-dependent checks (expert ids in range) run only when no CUDA graph is being captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_engine.ops.moe import (
    _check_expert_range,
    _check_out,
    _check_routing,
    _require,
    check_routed_experts,
)
from reference_engine.ops.registry import satisfies
from reference_engine.quant.e2m1 import decode_e2m1, unpack_e2m1


def capturing(tensor: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on the current stream (no host reads allowed then)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


@dataclass(frozen=True)
class StackedNvfp4Experts:
    """Per-expert NVFP4 weights stacked on a leading expert dimension (the per-expert Linears are views of these)."""

    gate_up_packed: torch.Tensor  # [E, 2I, H/2] uint8, rows 0:I gate, I:2I up
    gate_up_scale: torch.Tensor  # [E, 2I, H/16] float8_e4m3fn
    gate_up_scale_2: torch.Tensor  # [E, 2] float32, tensor scale of gate (0) and up (1)
    down_packed: torch.Tensor  # [E, H, I/2] uint8
    down_scale: torch.Tensor  # [E, H, I/16] float8_e4m3fn
    down_scale_2: torch.Tensor  # [E] float32

    @property
    def num_experts(self) -> int:
        return int(self.gate_up_packed.shape[0])

    def dequantize_gate_up(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """ids [N] int64 -> gate_up weights [N, 2I, H] in dtype, gathered packed then dequantised."""
        packed = self.gate_up_packed.index_select(0, ids)  # [N, 2I, H/2]
        scale = self.gate_up_scale.index_select(0, ids).float()  # [N, 2I, H/16]
        half = packed.shape[1] // 2
        scale_2 = self.gate_up_scale_2.index_select(0, ids)[:, :, None].expand(-1, 2, half)  # [N, 2, I]
        scale_2 = scale_2.reshape(-1, 2 * half)  # [N, 2I]: gate rows then up rows
        return _dequantize(packed, scale * scale_2[:, :, None], dtype)

    def dequantize_down(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """ids [N] int64 -> down weights [N, H, I] in dtype."""
        packed = self.down_packed.index_select(0, ids)  # [N, H, I/2]
        scale = (
            self.down_scale.index_select(0, ids).float()
            * self.down_scale_2.index_select(0, ids)[:, None, None]
        )
        return _dequantize(packed, scale, dtype)


_BYTE_VALUES: dict[torch.device, torch.Tensor] = {}  # device -> [256, 2]; filled on first (uncaptured) use


def _byte_values(device: torch.device) -> torch.Tensor:
    """The two E2M1 values (low nibble, high nibble) of every byte 0..255, float32, on `device`."""
    if device not in _BYTE_VALUES:
        every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None]  # [256, 1]
        _BYTE_VALUES[device] = decode_e2m1(unpack_e2m1(every_byte)).to(device)  # [256, 2]
    return _BYTE_VALUES[device]


def _dequantize(
    packed: torch.Tensor, block_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """packed [..., K/2] uint8, block_scale [..., K/16] float32 (already times the tensor scale) -> [..., K] in dtype.

    Each byte is looked up whole in a 256 x 2 table (low nibble first), one gather instead of
    unpack + mask + widen + gather: the same values, fewer passes over the weights.
    """
    table = _byte_values(packed.device)  # [256, 2] float32
    values = F.embedding(packed.reshape(-1).int(), table)  # [numel, 2] float32
    blocks = values.reshape(*block_scale.shape, 16) * block_scale[..., None]
    return blocks.reshape(*packed.shape[:-1], packed.shape[-1] * 2).to(dtype)


def _combine(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    token_rows: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Apply N gathered experts to their tokens and sum with weights.

    x [T, H]; gate_up [N, 2I, H]; down [N, H, I]; token_rows [N] int64 (token of each pair);
    weights [N] float32. Matrix products in x's dtype, activation and the weighted sum in float32.
    """
    intermediate = down.shape[2]
    inputs = x.index_select(0, token_rows)[:, :, None]  # [N, H, 1]
    projected = torch.bmm(gate_up, inputs)[:, :, 0].float()  # [N, 2I]
    activation = (F.silu(projected[:, :intermediate]) * projected[:, intermediate:]).to(
        x.dtype
    )  # [N, I]
    expert_out = torch.bmm(down, activation[:, :, None])[:, :, 0].float()  # [N, H]
    acc = torch.zeros(
        x.shape[0], x.shape[1], dtype=torch.float32, device=x.device
    )  # [T, H]
    acc.index_add_(0, token_rows, expert_out * weights[:, None])
    out.copy_(acc)


def _combine_all(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    dense_weights: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Every expert on every token: x [T, H], gate_up [E, 2I, H], down [E, H, I], dense_weights [T, E] float32."""
    intermediate = down.shape[2]
    projected = torch.einsum("th,eih->eti", x, gate_up).float()  # [E, T, 2I]
    activation = (
        F.silu(projected[..., :intermediate]) * projected[..., intermediate:]
    ).to(x.dtype)  # [E, T, I]
    expert_out = torch.bmm(activation, down.transpose(1, 2)).float()  # [E, T, H]
    out.copy_(torch.einsum("eth,te->th", expert_out, dense_weights))


def _dense_routing_weights(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """[T, E] float32: the routing weight of each chosen expert, 0 elsewhere."""
    dense = torch.zeros(
        topk_ids.shape[0], num_experts, dtype=torch.float32, device=topk_ids.device
    )
    return dense.scatter_add_(1, topk_ids.long(), topk_weights)


def _pairs(topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T*k] int64, token rows [T*k] int64) of the flattened (token, slot) pairs."""
    num_tokens, top_k = topk_ids.shape
    expert_ids = topk_ids.reshape(-1).long()
    token_rows = (
        torch.arange(num_tokens * top_k, device=topk_ids.device) // top_k
    )  # [T*k]: t for pair t*k + j
    return expert_ids, token_rows


@satisfies("moe/routed-experts", major=1)
def routed_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    gate_up_proj: torch.Tensor,  # [E, 2I, H]
    down_proj: torch.Tensor,  # [E, H, I]
    out: torch.Tensor,  # [T, H]
) -> None:
    """Same function as `ops.moe.routed_experts`, with shapes fixed by (T, top_k, E) and no host sync."""
    num_tokens, _, top_k, num_experts, _ = check_routed_experts(x, topk_weights, topk_ids, gate_up_proj, down_proj, out)
    if not capturing(x):
        _check_expert_range(topk_ids, num_experts)
    if num_tokens * top_k >= num_experts:
        _combine_all(
            x,
            gate_up_proj,
            down_proj,
            _dense_routing_weights(topk_weights, topk_ids, num_experts),
            out,
        )
        return
    expert_ids, token_rows = _pairs(topk_ids)
    _combine(
        x,
        gate_up_proj.index_select(0, expert_ids),
        down_proj.index_select(0, expert_ids),
        token_rows,
        topk_weights.reshape(-1),
        out,
    )


def nvfp4_routed_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    experts: StackedNvfp4Experts,
    out: torch.Tensor,  # [T, H]
) -> None:
    """Routed experts over stacked NVFP4 weights: gather packed, dequantise to x's dtype, then as above."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    top_k = _check_routing(topk_weights, topk_ids, num_tokens)
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    num_experts = experts.num_experts
    if not capturing(x):
        _check_expert_range(topk_ids, num_experts)
    if num_tokens * top_k >= num_experts:
        every = torch.arange(num_experts, device=x.device)
        gate_up, down = (
            experts.dequantize_gate_up(every, x.dtype),
            experts.dequantize_down(every, x.dtype),
        )
        _combine_all(
            x,
            gate_up,
            down,
            _dense_routing_weights(topk_weights, topk_ids, num_experts),
            out,
        )
        return
    expert_ids, token_rows = _pairs(topk_ids)
    gate_up, down = (
        experts.dequantize_gate_up(expert_ids, x.dtype),
        experts.dequantize_down(expert_ids, x.dtype),
    )
    _combine(x, gate_up, down, token_rows, topk_weights.reshape(-1), out)
