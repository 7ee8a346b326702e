"""The device tensors behind the caches: a paged K/V cache per full-attention layer and a state-slot pool per GDN layer.

Full-attention layer i: `k_cache[i]`, `v_cache[i]` each `[num_blocks, block_size, num_kv_heads, head_dim]`
in the model dtype. Gated DeltaNet layer i: `conv_state[i]` `[num_slots, conv_dim, K - 1]` (model
dtype; the last K-1 conv inputs, oldest first) and `recurrent_state[i]`
`[num_slots, num_v_heads, k_head_dim, v_head_dim]` float32. Entries are keyed by the global layer index.
The block manager and slot pool (integers only) decide which block / slot each sequence owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.config import ModelConfig


@dataclass(frozen=True)
class ModelCaches:
    num_blocks: int
    block_size: int
    num_state_slots: int
    k_cache: dict[int, torch.Tensor]  # layer -> [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: dict[int, torch.Tensor]  # layer -> [num_blocks, block_size, num_kv_heads, head_dim]
    conv_state: dict[int, torch.Tensor]  # layer -> [num_slots, conv_dim, K - 1]
    recurrent_state: dict[int, torch.Tensor]  # layer -> [num_slots, num_v_heads, k_head_dim, v_head_dim] float32

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        num_state_slots: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelCaches:
        """Allocate every layer's cache, zero-filled: kernels that read padding slots and mask them (0 * x) never meet NaN garbage."""
        if num_blocks < 1 or block_size < 1 or num_state_slots < 1:
            raise ValueError(
                f"ModelCaches.allocate: num_blocks ({num_blocks}), block_size ({block_size}) and num_state_slots "
                f"({num_state_slots}) must be positive"
            )
        kv_shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        conv_shape = (num_state_slots, config.linear_conv_dim, config.linear_conv_kernel_dim - 1)
        state_shape = (
            num_state_slots,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
        )
        k_cache, v_cache, conv_state, recurrent_state = {}, {}, {}, {}
        for layer in config.full_attention_layers:
            k_cache[layer] = torch.zeros(kv_shape, device=device, dtype=dtype)
            v_cache[layer] = torch.zeros(kv_shape, device=device, dtype=dtype)
        for layer in config.linear_attention_layers:
            conv_state[layer] = torch.zeros(conv_shape, device=device, dtype=dtype)
            recurrent_state[layer] = torch.zeros(state_shape, device=device, dtype=torch.float32)
        return cls(num_blocks, block_size, num_state_slots, k_cache, v_cache, conv_state, recurrent_state)

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one KV block costs over all full-attention layers (K and V)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        per_layer = 2 * block_size * config.num_kv_heads * config.head_dim * itemsize
        return per_layer * len(config.full_attention_layers)

    @staticmethod
    def bytes_per_state_slot(config: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one sequence's GDN state costs over all linear-attention layers (conv state in dtype, recurrent in float32)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        conv = config.linear_conv_dim * (config.linear_conv_kernel_dim - 1) * itemsize
        recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
        return (conv + recurrent) * len(config.linear_attention_layers)

    def total_bytes(self) -> int:
        tensors = [*self.k_cache.values(), *self.v_cache.values(), *self.conv_state.values(), *self.recurrent_state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
