"""Assemble the model from canonical parameters (tensors, Linears, RoutedExperts), checking every one first.

`build_model(config, params)` takes the canonical names of `spec.expected_parameters`; the loader
and presets produce them. `params_from_state_dict` turns a dense Hugging Face state dict (any
prefix, fused or per-expert experts) into canonical parameters.
"""

from __future__ import annotations

from typing import Any

import torch

from reference_engine.config import ModelConfig
from reference_engine.model.attention import GatedAttention
from reference_engine.model.decoder import DecoderLayer
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.gated_deltanet import GatedDeltaNet
from reference_engine.model.linear import Linear
from reference_engine.model.moe_block import SparseMoeBlock
from reference_engine.model.qwen3_5_moe import Qwen35MoeModel
from reference_engine.model.spec import expected_parameters
from reference_engine.model.stacked_linear import stack_linears


def check_parameters(config: ModelConfig, params: dict[str, Any]) -> None:
    """Raise ValueError naming the first parameter that is missing or has the wrong kind or shape."""
    for name, spec in expected_parameters(config).items():
        if name not in params:
            raise ValueError(f"missing parameter {name!r} ({spec.kind} of shape {list(spec.shape)})")
        value = params[name]
        if spec.kind == "tensor":
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != spec.shape:
                got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"parameter {name!r}: expected a tensor of shape {list(spec.shape)}, got {got}")
        elif spec.kind == "linear":
            if not isinstance(value, Linear) or (value.out_features, value.in_features) != spec.shape:
                got = [value.out_features, value.in_features] if isinstance(value, Linear) else type(value).__name__
                raise ValueError(f"parameter {name!r}: expected a linear of shape {list(spec.shape)}, got {got}")
        else:
            E, two_i, H = spec.shape
            if not isinstance(value, RoutedExperts) or (value.num_experts, 2 * value.intermediate_size, value.hidden_size) != (E, two_i, H):
                raise ValueError(f"parameter {name!r}: expected routed experts [E={E}, 2I={two_i}, H={H}]")


def build_model(config: ModelConfig, params: dict[str, Any]) -> Qwen35MoeModel:
    check_parameters(config, params)
    c, eps = config, config.rms_norm_eps
    layers = []
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        if kind == "full_attention":
            a = p + "self_attn."
            projections = (params[a + "q_proj"], params[a + "k_proj"], params[a + "v_proj"])
            stacked = stack_linears(projections)  # one decode GEMV; the three Linears become views of it
            qkv, projections = (None, projections) if stacked is None else stacked
            mixer: GatedAttention | GatedDeltaNet = GatedAttention(
                i, *projections, params[a + "o_proj"],
                params[a + "q_norm.weight"], params[a + "k_norm.weight"], c.num_attention_heads, c.num_kv_heads,
                c.head_dim, c.rotary_dim, c.rope_theta, eps, qkv=qkv,
            )  # fmt: skip
        else:
            g = p + "linear_attn."
            qkv_z = stack_linears((params[g + "in_proj_qkv"], params[g + "in_proj_z"]))  # decode GEMVs stacked; Linears become views
            qkv, z = (params[g + "in_proj_qkv"], params[g + "in_proj_z"]) if qkv_z is None else qkv_z[1]
            b_a = stack_linears((params[g + "in_proj_b"], params[g + "in_proj_a"]))
            b, a_proj = (params[g + "in_proj_b"], params[g + "in_proj_a"]) if b_a is None else b_a[1]
            mixer = GatedDeltaNet(
                i, qkv, z, b, a_proj,
                params[g + "conv1d.weight"][:, 0, :].contiguous(), params[g + "A_log"], params[g + "dt_bias"],
                params[g + "norm.weight"], params[g + "out_proj"], c.linear_num_key_heads, c.linear_num_value_heads,
                c.linear_key_head_dim, c.linear_value_head_dim, eps,
                in_proj_qkvz=None if qkv_z is None else qkv_z[0], in_proj_ba=None if b_a is None else b_a[0],
            )  # fmt: skip
        m = p + "mlp."
        mlp = SparseMoeBlock(
            params[m + "gate"], params[m + "experts"], params[m + "shared_expert.gate_proj"], params[m + "shared_expert.up_proj"],
            params[m + "shared_expert.down_proj"], params[m + "shared_expert_gate"], c.num_experts_per_tok,
        )  # fmt: skip
        layers.append(DecoderLayer(i, params[p + "input_layernorm.weight"], params[p + "post_attention_layernorm.weight"], mixer, mlp, eps))
    embed = params["embed_tokens.weight"]
    lm_head = Linear.dense(embed) if c.tie_word_embeddings else params["lm_head"]
    return Qwen35MoeModel(c, embed, tuple(layers), params["norm.weight"], lm_head)


def strip_prefix(name: str) -> str | None:
    """Canonical name of a checkpoint tensor name, or None for tensors the text model does not use."""
    if name.startswith(("model.visual.", "mtp.", "visual.")):
        return None
    for prefix in ("model.language_model.", "language_model.model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def params_from_state_dict(
    config: ModelConfig, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Dense HF state dict (prefix `model.` or `model.language_model.`, experts fused or per expert) -> canonical params."""
    canonical: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        short = strip_prefix(name)
        if short is not None:
            canonical[short] = tensor
    params: dict[str, Any] = {}
    for name, spec in expected_parameters(config).items():
        if spec.kind == "tensor":
            if name in canonical:
                params[name] = canonical[name].to(device=device, dtype=dtype)
        elif spec.kind == "linear":
            if name + ".weight" in canonical:
                params[name] = Linear.dense(canonical[name + ".weight"].to(device=device, dtype=dtype))
        else:
            params[name] = _dense_experts(config, canonical, name, dtype, device)
    for name, value in params.items():
        if isinstance(value, torch.Tensor) and name.endswith(("A_log", "dt_bias")):
            params[name] = value.float()  # the gates compute in float32 from float32 parameters
    return {name: value for name, value in params.items() if value is not None}


def _dense_experts(config: ModelConfig, canonical: dict[str, torch.Tensor], name: str, dtype, device) -> RoutedExperts | None:
    E, I, H = config.num_experts, config.moe_intermediate_size, config.hidden_size
    if name + ".gate_up_proj" in canonical and name + ".down_proj" in canonical:
        gate_up, down = canonical[name + ".gate_up_proj"], canonical[name + ".down_proj"]
    elif name + ".0.gate_proj.weight" in canonical:
        try:
            gate_up = torch.stack([torch.cat([canonical[f"{name}.{j}.gate_proj.weight"], canonical[f"{name}.{j}.up_proj.weight"]]) for j in range(E)])
            down = torch.stack([canonical[f"{name}.{j}.down_proj.weight"] for j in range(E)])
        except KeyError as error:
            raise ValueError(f"missing tensor {error.args[0]!r} (per-expert weights of {name})") from None
    else:
        return None
    if tuple(gate_up.shape) != (E, 2 * I, H) or tuple(down.shape) != (E, H, I):
        raise ValueError(f"{name}: expected gate_up_proj [{E}, {2 * I}, {H}] and down_proj [{E}, {H}, {I}], got {list(gate_up.shape)} and {list(down.shape)}")
    return RoutedExperts(E, H, I, gate_up_proj=gate_up.to(device=device, dtype=dtype).contiguous(), down_proj=down.to(device=device, dtype=dtype).contiguous())
