"""What a checkpoint must provide for a given ModelConfig: every parameter's canonical name, kind and shape.

Canonical names are the Hugging Face names without the `model.` / `model.language_model.` prefix
(`lm_head` stays `lm_head`). Kinds: `tensor` (norms, conv, A_log, dt_bias, embedding), `linear`
(dense or quantised; shape [out, in]), `experts` (routed experts; shape [E, 2I, H] for the fused
gate_up view). The loader and the in-memory builders check against this before touching any data.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference_engine.config import ModelConfig


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    kind: str  # "tensor" | "linear" | "experts"
    shape: tuple[int, ...]


def expected_parameters(config: ModelConfig) -> dict[str, ParameterSpec]:
    c = config
    H = c.hidden_size
    specs: list[ParameterSpec] = [ParameterSpec("embed_tokens.weight", "tensor", (c.vocab_size, H)), ParameterSpec("norm.weight", "tensor", (H,))]
    if not c.tie_word_embeddings:
        specs.append(ParameterSpec("lm_head", "linear", (c.vocab_size, H)))
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        specs += [ParameterSpec(p + "input_layernorm.weight", "tensor", (H,)), ParameterSpec(p + "post_attention_layernorm.weight", "tensor", (H,))]
        if kind == "full_attention":
            q = c.num_attention_heads * c.head_dim
            kv = c.num_kv_heads * c.head_dim
            specs += [
                ParameterSpec(p + "self_attn.q_proj", "linear", (2 * q, H)),
                ParameterSpec(p + "self_attn.k_proj", "linear", (kv, H)),
                ParameterSpec(p + "self_attn.v_proj", "linear", (kv, H)),
                ParameterSpec(p + "self_attn.o_proj", "linear", (H, q)),
                ParameterSpec(p + "self_attn.q_norm.weight", "tensor", (c.head_dim,)),
                ParameterSpec(p + "self_attn.k_norm.weight", "tensor", (c.head_dim,)),
            ]
        else:
            Hv = c.linear_num_value_heads
            specs += [
                ParameterSpec(p + "linear_attn.in_proj_qkv", "linear", (c.linear_conv_dim, H)),
                ParameterSpec(p + "linear_attn.in_proj_z", "linear", (c.linear_value_dim, H)),
                ParameterSpec(p + "linear_attn.in_proj_b", "linear", (Hv, H)),
                ParameterSpec(p + "linear_attn.in_proj_a", "linear", (Hv, H)),
                ParameterSpec(p + "linear_attn.conv1d.weight", "tensor", (c.linear_conv_dim, 1, c.linear_conv_kernel_dim)),
                ParameterSpec(p + "linear_attn.A_log", "tensor", (Hv,)),
                ParameterSpec(p + "linear_attn.dt_bias", "tensor", (Hv,)),
                ParameterSpec(p + "linear_attn.norm.weight", "tensor", (c.linear_value_head_dim,)),
                ParameterSpec(p + "linear_attn.out_proj", "linear", (H, c.linear_value_dim)),
            ]
        Is = c.shared_expert_intermediate_size
        specs += [
            ParameterSpec(p + "mlp.gate", "linear", (c.num_experts, H)),
            ParameterSpec(p + "mlp.experts", "experts", (c.num_experts, 2 * c.moe_intermediate_size, H)),
            ParameterSpec(p + "mlp.shared_expert.gate_proj", "linear", (Is, H)),
            ParameterSpec(p + "mlp.shared_expert.up_proj", "linear", (Is, H)),
            ParameterSpec(p + "mlp.shared_expert.down_proj", "linear", (H, Is)),
            ParameterSpec(p + "mlp.shared_expert_gate", "linear", (1, H)),
        ]
    return {spec.name: spec for spec in specs}
