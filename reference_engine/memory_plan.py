"""How the device memory splits between weights, KV blocks and GDN state slots: pure arithmetic, no tensors.

Weights are counted from the model shape per precision: bf16 (2 bytes a parameter) or NVFP4
linears (half a byte a parameter, one float8 scale per 16 parameters, two float32 scalars per
matrix). Norms, the router, `shared_expert_gate`, `in_proj_a/b`, the conv weights, `A_log` and
`dt_bias` stay bf16 (NVFP4 checkpoints keep them so); the embedding is always bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reference_engine.config import ModelConfig

Precision = Literal["bf16", "nvfp4"]
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def linear_bytes(out_features: int, in_features: int, precision: Precision) -> int:
    if precision == "bf16":
        return 2 * out_features * in_features
    if precision == "nvfp4":
        if in_features % 16:
            raise ValueError(f"NVFP4 needs in_features divisible by 16, got {in_features}")
        packed = out_features * in_features // 2  # two E2M1 codes per byte
        scales = out_features * in_features // 16  # float8_e4m3fn per block of 16
        return packed + scales + 4 + 4  # weight_scale_2 and input_scale, float32 each
    raise ValueError(f"unknown precision {precision!r}; expected 'bf16' or 'nvfp4'")


@dataclass(frozen=True)
class WeightBytes:
    embedding: int
    lm_head: int
    attention: int  # the 10 full-attention mixers
    linear_attention: int  # the 30 Gated DeltaNet mixers
    routed_experts: int
    shared_experts: int
    other: int  # norms, routers, shared-expert gates

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.attention + self.linear_attention + self.routed_experts + self.shared_experts + self.other


def weight_bytes(config: ModelConfig, linears: Precision = "bf16", lm_head: Precision = "bf16") -> WeightBytes:
    hidden = config.hidden_size
    q_out = 2 * config.num_attention_heads * config.head_dim  # query and gate
    kv_out = config.num_kv_heads * config.head_dim
    attention_out_in = config.num_attention_heads * config.head_dim
    attention_layer = (
        linear_bytes(q_out, hidden, linears) + 2 * linear_bytes(kv_out, hidden, linears) + linear_bytes(hidden, attention_out_in, linears)
        + 2 * 2 * config.head_dim  # q_norm, k_norm
    )
    key_dim, value_dim, value_heads = config.linear_key_dim, config.linear_value_dim, config.linear_num_value_heads
    conv_dim = config.linear_conv_dim
    gdn_layer = (
        linear_bytes(conv_dim, hidden, linears) + linear_bytes(value_dim, hidden, linears) + linear_bytes(hidden, value_dim, linears)
        + 2 * linear_bytes(value_heads, hidden, "bf16")  # in_proj_a, in_proj_b
        + 2 * conv_dim * config.linear_conv_kernel_dim + 2 * 2 * value_heads + 2 * config.linear_value_head_dim
    )
    del key_dim
    expert = config.moe_intermediate_size
    routed_layer = config.num_experts * (linear_bytes(2 * expert, hidden, linears) + linear_bytes(hidden, expert, linears))
    shared = config.shared_expert_intermediate_size
    shared_layer = 2 * linear_bytes(shared, hidden, linears) + linear_bytes(hidden, shared, linears)
    other_layer = linear_bytes(config.num_experts, hidden, "bf16") + linear_bytes(1, hidden, "bf16") + 2 * 2 * hidden
    layers = config.num_hidden_layers
    return WeightBytes(
        embedding=2 * config.vocab_size * hidden,
        lm_head=0 if config.tie_word_embeddings else linear_bytes(config.vocab_size, hidden, lm_head),
        attention=attention_layer * len(config.full_attention_layers),
        linear_attention=gdn_layer * len(config.linear_attention_layers),
        routed_experts=routed_layer * layers,
        shared_experts=shared_layer * layers,
        other=other_layer * layers + 2 * hidden,
    )


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str = "bfloat16") -> int:
    """K and V of one token over every full-attention layer."""
    return len(config.full_attention_layers) * 2 * config.num_kv_heads * config.head_dim * _ITEMSIZE[kv_dtype]


def state_bytes_per_sequence(config: ModelConfig, conv_dtype: str = "bfloat16") -> int:
    """Recurrent state (float32) and conv state of one sequence over every Gated DeltaNet layer."""
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    conv = config.linear_conv_dim * (config.linear_conv_kernel_dim - 1) * _ITEMSIZE[conv_dtype]
    return len(config.linear_attention_layers) * (recurrent + conv)


@dataclass(frozen=True)
class MemoryPlan:
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    state_bytes: int  # all state slots
    kv_bytes: int  # all KV blocks
    num_state_slots: int
    num_blocks: int
    block_size: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int

    @property
    def kv_token_capacity(self) -> int:
        return self.num_blocks * self.block_size

    def max_sequences_of(self, num_tokens: int) -> int:
        """How many sequences of `num_tokens` tokens fit at once (KV blocks and state slots both bound it)."""
        blocks_each = -(-num_tokens // self.block_size)
        return min(self.num_state_slots, self.num_blocks // blocks_each)


def plan(
    config: ModelConfig,
    gpu_bytes: int,
    *,
    memory_fraction: float = 0.9,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 8192,
    block_size: int = 16,
    linears: Precision = "bf16",
    lm_head: Precision = "bf16",
    kv_dtype: str = "bfloat16",
    activation_bytes: int | None = None,
    state_dtype: str = "bfloat16",
) -> MemoryPlan:
    """Weights first, then a workspace for one step's activations, one state slot per sequence, the rest KV blocks."""
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    usable = int(gpu_bytes * memory_fraction)
    weights = weight_bytes(config, linears, lm_head).total
    if activation_bytes is None:
        # hidden states, the widest projection output and the routed-expert intermediates of one step (bf16), and the
        # float32 logits of one row per sequence: a generous estimate, not a measurement.
        widest = max(config.linear_conv_dim + config.linear_value_dim, 2 * config.num_attention_heads * config.head_dim)
        per_token = 2 * (4 * config.hidden_size + widest + 2 * config.num_experts_per_tok * config.moe_intermediate_size)
        activation_bytes = max_num_batched_tokens * per_token + max_num_seqs * config.vocab_size * 4
    per_sequence = state_bytes_per_sequence(config, state_dtype)  # the conv state lives in the model dtype, not the KV dtype
    state = max_num_seqs * per_sequence
    per_token = kv_bytes_per_token(config, kv_dtype)
    left = usable - weights - activation_bytes - state
    if left < per_token * block_size:
        raise ValueError(
            f"the model does not fit: {usable / 1e9:.2f} GB usable, weights {weights / 1e9:.2f} GB, activations "
            f"{activation_bytes / 1e9:.2f} GB, {max_num_seqs} state slots {state / 1e9:.2f} GB leave no room for one KV block"
        )
    num_blocks = left // (per_token * block_size)
    return MemoryPlan(usable, weights, activation_bytes, state, num_blocks * per_token * block_size, max_num_seqs, num_blocks,
                      block_size, per_token, per_sequence)
