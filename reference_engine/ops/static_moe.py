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

The whole MoE block in one op (`moe_block_decode`): router logits of the E routed experts and the
shared expert's gate from one `[E+1, H]` weight, softmax top-k over the first E columns plus a
(top_k+1)-th slot (id E, weight sigmoid(logit E)) for the NVFP4 shared expert (`SharedNvfp4Expert`),
all slots summed in float32 and rounded once into the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from reference_engine.ops.moe import (
    _check_expert_range,
    _check_out,
    _check_routing,
    _require,
    check_routed_experts,
    router_topk_with_shared,
)
from reference_engine.ops.norms import AddNorm, fused_add_rms_norm
from reference_engine.ops.registry import satisfies
from reference_engine.ops.tiled_experts import TiledWeights
from reference_engine.quant.e2m1 import decode_e2m1, unpack_e2m1


def capturing(tensor: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on the current stream (no host reads allowed then)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


WEIGHT_FIELDS = ("gate_up_packed", "gate_up_scale", "gate_up_scale_2", "down_packed", "down_scale", "down_scale_2")


def expert_tensors(weights) -> tuple[torch.Tensor, ...]:
    """The six weight tensors of a stack or a shared expert (any object with `WEIGHT_FIELDS`, as the contracts'
    own classes), in that order; never a tile-major copy it may carry."""
    return tuple(getattr(weights, name) for name in WEIGHT_FIELDS)


@dataclass(frozen=True)
class StackedNvfp4Experts:
    """Per-expert NVFP4 weights stacked on a leading expert dimension (the per-expert Linears are views of these)."""

    gate_up_packed: torch.Tensor  # [E, 2I, H/2] uint8, rows 0:I gate, I:2I up
    gate_up_scale: torch.Tensor  # [E, 2I, H/16] float8_e4m3fn
    gate_up_scale_2: torch.Tensor  # [E, 2] float32, tensor scale of gate (0) and up (1)
    down_packed: torch.Tensor  # [E, H, I/2] uint8
    down_scale: torch.Tensor  # [E, H, I/16] float8_e4m3fn
    down_scale_2: torch.Tensor  # [E] float32
    tiled: TiledWeights | None = field(default=None, compare=False)  # a tile-major copy for the grouped decode kernels

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


@dataclass(frozen=True)
class SharedNvfp4Expert:
    """The shared expert's NVFP4 W4A16 weights, gate and up concatenated (its Linears are views of these)."""

    gate_up_packed: torch.Tensor  # [2I, H/2] uint8, rows 0:I gate, I:2I up
    gate_up_scale: torch.Tensor  # [2I, H/16] float8_e4m3fn
    gate_up_scale_2: torch.Tensor  # [2] float32, tensor scale of gate (0) and up (1)
    down_packed: torch.Tensor  # [H, I/2] uint8
    down_scale: torch.Tensor  # [H, I/16] float8_e4m3fn
    down_scale_2: torch.Tensor  # [] float32
    tiled: TiledWeights | None = field(default=None, compare=False)  # a tile-major copy for the grouped decode kernels

    @classmethod
    def concatenate(
        cls,
        gate: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        up: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        down: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> SharedNvfp4Expert:
        """(weight_packed, weight_scale, weight_scale_2) of gate [I, H], up [I, H], down [H, I] -> one shared expert."""
        return cls(
            gate_up_packed=torch.cat([gate[0], up[0]]).contiguous(),
            gate_up_scale=torch.cat([gate[1], up[1]]).contiguous(),
            gate_up_scale_2=torch.stack([torch.as_tensor(gate[2]).reshape(()), torch.as_tensor(up[2]).reshape(())]).float(),
            down_packed=down[0].contiguous(),
            down_scale=down[1].contiguous(),
            down_scale_2=torch.as_tensor(down[2]).reshape(()).float(),
        )

    @property
    def intermediate_size(self) -> int:
        return int(self.gate_up_packed.shape[0]) // 2

    def dequantize_gate_up(self, dtype: torch.dtype) -> torch.Tensor:
        """[2I, H] in dtype: gate rows times scale_2[0], up rows times scale_2[1]."""
        scale_2 = self.gate_up_scale_2[:, None].expand(2, self.intermediate_size).reshape(-1)  # [2I]: gate rows, then up rows
        return _dequantize(self.gate_up_packed, self.gate_up_scale.float() * scale_2[:, None], dtype)

    def dequantize_down(self, dtype: torch.dtype) -> torch.Tensor:
        """[H, I] in dtype."""
        return _dequantize(self.down_packed, self.down_scale.float() * self.down_scale_2, dtype)


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
    _check_routing(topk_weights, topk_ids, num_tokens)
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    if not capturing(x):
        _check_expert_range(topk_ids, experts.num_experts)
    _nvfp4_routed(x, topk_weights, topk_ids, experts, out)


def _nvfp4_routed(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: StackedNvfp4Experts, out: torch.Tensor) -> None:
    """The routed-experts sum into `out` [T, H] (any float dtype; no checks): gather path or all-experts path."""
    num_tokens, top_k = topk_ids.shape
    num_experts = experts.num_experts
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


def check_shared_expert(shared: SharedNvfp4Expert, hidden: int, intermediate: int) -> None:
    """Shapes and dtypes of the shared expert: intermediate equal to the routed experts' I (the fused ops need it)."""
    expected = {
        "gate_up_packed": ((2 * intermediate, hidden // 2), torch.uint8),
        "gate_up_scale": ((2 * intermediate, hidden // 16), torch.float8_e4m3fn),
        "gate_up_scale_2": ((2,), torch.float32),
        "down_packed": ((hidden, intermediate // 2), torch.uint8),
        "down_scale": ((hidden, intermediate // 16), torch.float8_e4m3fn),
        "down_scale_2": ((), torch.float32),
    }
    for name, (shape, dtype) in expected.items():
        tensor = getattr(shared, name)
        _require(
            tuple(tensor.shape) == shape and tensor.dtype == dtype,
            f"shared.{name} must be {dtype} {shape} (shared intermediate equal to the routed I={intermediate}, H={hidden}), got {tensor.dtype} {tuple(tensor.shape)}",
        )


def check_experts_with_shared(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert, out: torch.Tensor
) -> tuple[int, int, int, int]:
    """Shape/dtype checks of `nvfp4_experts_with_shared` (every implementation); returns (T, H, top_k, I)."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    _require(x.dtype in (torch.float32, torch.bfloat16, torch.float16), f"x must be float32, bfloat16 or float16, got {x.dtype}")
    num_tokens, hidden = x.shape
    slots = _check_routing(topk_weights, topk_ids, num_tokens)
    _require(slots >= 2, f"topk_ids must be [T, top_k + 1] (routed slots then the shared slot), got {tuple(topk_ids.shape)}")
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    intermediate = _check_stacked(experts, hidden)
    check_shared_expert(shared, hidden, intermediate)
    return num_tokens, hidden, slots - 1, intermediate


def _check_stacked(experts: StackedNvfp4Experts, hidden: int) -> int:
    """Shapes and dtypes of the stacked routed experts for hidden size H; returns I."""
    _require(experts.gate_up_packed.dim() == 3, f"experts.gate_up_packed must be [E, 2I, H/2], got {tuple(experts.gate_up_packed.shape)}")
    num_experts, double_intermediate, half_hidden = experts.gate_up_packed.shape
    intermediate = double_intermediate // 2
    _require(half_hidden * 2 == hidden and hidden % 16 == 0, f"experts.gate_up_packed must be [E, 2I, H/2={hidden // 2}] with H % 16 == 0, got {tuple(experts.gate_up_packed.shape)}")
    _require(intermediate % 16 == 0, f"I ({intermediate}) must be a multiple of 16")
    expected = {
        "gate_up_scale": ((num_experts, 2 * intermediate, hidden // 16), torch.float8_e4m3fn),
        "gate_up_scale_2": ((num_experts, 2), torch.float32),
        "down_packed": ((num_experts, hidden, intermediate // 2), torch.uint8),
        "down_scale": ((num_experts, hidden, intermediate // 16), torch.float8_e4m3fn),
        "down_scale_2": ((num_experts,), torch.float32),
    }
    _require(experts.gate_up_packed.dtype == torch.uint8, f"experts.gate_up_packed must be uint8, got {experts.gate_up_packed.dtype}")
    for name, (shape, dtype) in expected.items():
        tensor = getattr(experts, name)
        _require(tuple(tensor.shape) == shape and tensor.dtype == dtype, f"experts.{name} must be {dtype} {shape}, got {tensor.dtype} {tuple(tensor.shape)}")
    return intermediate


def nvfp4_experts_with_shared(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32; column top_k: the shared expert's gate sigmoid(logit E)
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32; column top_k: E (sentinel, not read)
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    out: torch.Tensor,  # [T, H]
) -> None:
    """out[t] = sum_{j<k} w[t, j] expert_{id[t, j]}(x_t) + w[t, k] shared(x_t), summed in float32, rounded once.

    The shared slot is told by its position (the last column), not by its id. Shared SwiGLU: products
    in float32 on the dequantised weights, activation rounded to x's dtype (as the routed experts do)."""
    _, _, top_k, _ = check_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out)
    routed_ids = topk_ids[:, :top_k]
    if not capturing(x):
        _check_expert_range(routed_ids, experts.num_experts)
    acc = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    _nvfp4_routed(x, topk_weights[:, :top_k], routed_ids, experts, acc)
    intermediate = shared.intermediate_size
    projected = x.float() @ shared.dequantize_gate_up(torch.float32).t()  # [T, 2I]
    activation = (F.silu(projected[:, :intermediate]) * projected[:, intermediate:]).to(x.dtype)  # [T, I]
    shared_out = activation.float() @ shared.dequantize_down(torch.float32).t()  # [T, H]
    acc.addcmul_(shared_out, topk_weights[:, top_k:])
    out.copy_(acc)


def check_moe_block_decode(
    x: torch.Tensor, router_weight: torch.Tensor, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert, top_k: int, out: torch.Tensor
) -> tuple[int, int]:
    """Shape/dtype checks of `moe_block_decode` (every implementation); returns (E, I)."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    _require(x.dtype in (torch.float32, torch.bfloat16, torch.float16), f"x must be float32, bfloat16 or float16, got {x.dtype}")
    num_tokens, hidden = x.shape
    intermediate = _check_stacked(experts, hidden)
    num_experts = experts.num_experts
    _require(
        tuple(router_weight.shape) == (num_experts + 1, hidden) and router_weight.dtype == x.dtype,
        f"router_weight must be [E+1={num_experts + 1}, H={hidden}] in x's dtype {x.dtype}, got {router_weight.dtype} {tuple(router_weight.shape)}",
    )
    _require(isinstance(top_k, int) and 1 <= top_k <= num_experts, f"top_k must be an integer in [1, E={num_experts}], got {top_k!r}")
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    check_shared_expert(shared, hidden, intermediate)
    return num_experts, intermediate


@satisfies("moe/moe-block-decode", major=1)
def moe_block_decode(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E+1, H]: router rows, then shared_expert_gate's row
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    top_k: int,
    out: torch.Tensor,  # [T, H]
) -> None:
    """The sparse MoE block on NVFP4 experts, capturable: logits = x @ router_weight^T [T, E+1];
    softmax over the E routed columns, top_k renormalised; plus sigmoid(logit E) * shared(x)."""
    check_moe_block_decode(x, router_weight, experts, shared, top_k, out)
    num_tokens = x.shape[0]
    logits = F.linear(x, router_weight)  # [T, E+1]
    topk_weights = torch.empty(num_tokens, top_k + 1, dtype=torch.float32, device=x.device)
    topk_ids = torch.empty(num_tokens, top_k + 1, dtype=torch.int32, device=x.device)
    router_topk_with_shared(logits, topk_weights, topk_ids, top_k)
    nvfp4_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out)


def moe_block_decode_add_norm(
    x: torch.Tensor,  # [T, H]: the mixer's output, not yet added to the residual stream
    add_norm: AddNorm,  # the post-attention norm: its `out` becomes the block's input
    router_weight: torch.Tensor,  # [E+1, H]
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    top_k: int,
    out: torch.Tensor,  # [T, H]
) -> None:
    """`add_norm.apply(x)` (residual_out = x + residual; out = rms_norm of it), then `moe_block_decode` on the normed
    rows: the torch composition that the Triton op, which may fold the norm into the router launch, must equal."""
    add_norm.check(x)
    add_norm.apply(x, fused_add_rms_norm)
    moe_block_decode(add_norm.out, router_weight, experts, shared, top_k, out)
