"""Floors: the bytes (and FLOPs) a step must move at the least, over the ceilings measured on the card.

Pure arithmetic from the model shape. A decode step of B sequences reads
- the dense weights of every layer (attention / Gated DeltaNet projections, shared experts, routers,
  norms), in the precision they are stored in (`memory_plan.linear_bytes`);
- the routed experts actually touched: with top_k of E experts drawn per token, the expected number of
  distinct experts among B tokens is E * (1 - (1 - top_k/E)^B) per MoE layer (each token's experts
  treated as independent uniform draws; exactly top_k at B = 1);
- the LM head and B embedding rows;
- every sequence's Gated DeltaNet state (recurrent float32 + conv), read and written;
- the KV cache of every sequence (context tokens x bytes per token), read, plus the new K/V written.
Activations are left out (they are small next to the weights at decode). The floor time is
max(bytes / copy bandwidth, FLOPs / matrix rate).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from reference_engine.config import ModelConfig
from reference_engine.memory_plan import (
    Precision,
    kv_bytes_per_token,
    linear_bytes,
    state_bytes_per_sequence,
    weight_bytes,
)


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """E * (1 - (1 - k/E)^B), computed exactly in fractions then rounded to float."""
    if not 1 <= top_k <= num_experts or num_tokens < 0:
        raise ValueError(
            f"need 1 <= top_k <= num_experts and num_tokens >= 0, got E={num_experts}, k={top_k}, B={num_tokens}"
        )
    miss = (1 - Fraction(top_k, num_experts)) ** num_tokens
    return float(num_experts * (1 - miss))


def expert_bytes(config: ModelConfig, linears: Precision) -> int:
    """One routed expert: gate and up [I, H] and down [H, I]."""
    I, H = config.moe_intermediate_size, config.hidden_size
    return 2 * linear_bytes(I, H, linears) + linear_bytes(H, I, linears)


def active_parameters_per_token(config: ModelConfig) -> int:
    """Weights one token multiplies through (excluding the embedding lookup): dense linears, top_k + shared experts, LM head."""
    H, I, Is = (
        config.hidden_size,
        config.moe_intermediate_size,
        config.shared_expert_intermediate_size,
    )
    attention = (
        2 * config.num_attention_heads * config.head_dim * H
        + 2 * config.num_kv_heads * config.head_dim * H
        + H * config.num_attention_heads * config.head_dim
    )
    gdn = (
        config.linear_conv_dim * H
        + config.linear_value_dim * H
        + H * config.linear_value_dim
        + 2 * config.linear_num_value_heads * H
    )
    moe = (
        (config.num_experts_per_tok * 3 * I * H)
        + 3 * Is * H
        + config.num_experts * H
        + H
    )
    return (
        attention * len(config.full_attention_layers)
        + gdn * len(config.linear_attention_layers)
        + moe * config.num_hidden_layers
        + config.vocab_size * H
    )


@dataclass(frozen=True)
class StepBytes:
    dense_weights: int
    routed_experts: float
    lm_head: int
    embedding_rows: int
    state: int  # GDN states read + written
    kv: int  # KV read (context) + written (new tokens)

    @property
    def total(self) -> float:
        return (
            self.dense_weights
            + self.routed_experts
            + self.lm_head
            + self.embedding_rows
            + self.state
            + self.kv
        )


def step_bytes(
    config: ModelConfig,
    num_seqs: int,
    context_tokens: int,
    new_tokens_per_seq: int = 1,
    linears: Precision = "nvfp4",
    lm_head: Precision = "bf16",
) -> StepBytes:
    """Bytes a step of `num_seqs` sequences with `context_tokens` cached tokens each (before the step) must move."""
    weights = weight_bytes(config, linears, lm_head)
    dense = (
        weights.attention
        + weights.linear_attention
        + weights.shared_experts
        + weights.other
    )
    tokens = num_seqs * new_tokens_per_seq
    distinct = expected_distinct_experts(
        config.num_experts, config.num_experts_per_tok, tokens
    )
    routed = distinct * expert_bytes(config, linears) * config.num_hidden_layers
    state = 2 * num_seqs * state_bytes_per_sequence(config)
    kv_token = kv_bytes_per_token(config)
    kv = num_seqs * (context_tokens * kv_token + new_tokens_per_seq * kv_token)
    return StepBytes(
        dense, routed, weights.lm_head, tokens * 2 * config.hidden_size, state, kv
    )


def step_flops(
    config: ModelConfig,
    num_seqs: int,
    context_tokens: int,
    new_tokens_per_seq: int = 1,
    sampled_rows: int | None = None,
) -> float:
    """Matrix FLOPs of a step: 2 x active parameters per token (LM head only for sampled rows) plus attention scores and values."""
    sampled_rows = num_seqs if sampled_rows is None else sampled_rows
    tokens = num_seqs * new_tokens_per_seq
    lm_head = config.vocab_size * config.hidden_size
    linear = (
        2 * tokens * (active_parameters_per_token(config) - lm_head)
        + 2 * sampled_rows * lm_head
    )
    # attention: each new token attends to the context plus the new tokens before it (causal)
    keys_per_token = context_tokens + (new_tokens_per_seq + 1) / 2
    attention = (
        4
        * tokens
        * keys_per_token
        * config.num_attention_heads
        * config.head_dim
        * len(config.full_attention_layers)
    )
    return float(linear + attention)


@dataclass(frozen=True)
class Floor:
    bytes: float
    flops: float
    seconds: float
    bound: str  # "memory" or "compute"


def floor_seconds(
    bytes_moved: float, flops: float, copy_bandwidth: float, matmul_rate: float
) -> Floor:
    """max(bytes / bandwidth, flops / rate); bandwidth in bytes/s (read + written), rate in FLOP/s."""
    if copy_bandwidth <= 0 or matmul_rate <= 0:
        raise ValueError(
            f"ceilings must be positive, got bandwidth {copy_bandwidth} and rate {matmul_rate}"
        )
    memory, compute = bytes_moved / copy_bandwidth, flops / matmul_rate
    return Floor(
        bytes_moved,
        flops,
        max(memory, compute),
        "memory" if memory >= compute else "compute",
    )


def decode_floor(
    config: ModelConfig,
    num_seqs: int,
    context_tokens: int,
    copy_bandwidth: float,
    matmul_rate: float,
    linears: Precision = "nvfp4",
    lm_head: Precision = "bf16",
) -> Floor:
    moved = step_bytes(config, num_seqs, context_tokens, 1, linears, lm_head).total
    return floor_seconds(
        moved, step_flops(config, num_seqs, context_tokens), copy_bandwidth, matmul_rate
    )


def prefill_floor(
    config: ModelConfig,
    prompt_tokens: int,
    copy_bandwidth: float,
    matmul_rate: float,
    linears: Precision = "nvfp4",
    lm_head: Precision = "bf16",
) -> Floor:
    """One sequence's prompt in one step (TTFT): every touched weight once, the KV and state written."""
    moved = step_bytes(config, 1, 0, prompt_tokens, linears, lm_head)
    total = (
        moved.total - moved.state / 2
    )  # a first chunk writes the state, reads nothing
    return floor_seconds(
        total,
        step_flops(config, 1, 0, prompt_tokens, sampled_rows=1),
        copy_bandwidth,
        matmul_rate,
    )
