"""Deterministic random-weight models of the real architecture: "tiny" (CPU tests) and "full" (the 35B-A3B sizes).

No weights can be downloaded here, so the default model is seeded random weights with scales that
keep activations well-conditioned: linears ~ N(0, 1/in), zero-centred norm weights ~ N(0, 0.1^2),
GDN gated-norm weights ~ 1 + N(0, 0.1^2), embeddings ~ N(0, 1), A_log = log U(1, 8), dt_bias ~ U(-1, 1).
Weights are drawn parameter by parameter, in a fixed order, from one generator ON the target device
(the full model never passes through host memory); `quantize="nvfp4"` quantises each linear and
expert as soon as it is drawn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from reference_engine.config import ModelConfig
from reference_engine.model.build import build_model
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear
from reference_engine.model.qwen3_5_moe import Qwen35MoeModel
from reference_engine.model.spec import expected_parameters
from reference_engine.quant.nvfp4 import quantize_nvfp4

TINY = ModelConfig(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=32,
    partial_rotary_factor=0.25,
    rope_theta=1e7,
    rms_norm_eps=1e-6,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    max_position_embeddings=4096,
    eos_token_ids=(0,),
)
FULL = ModelConfig()  # eos ids come from the tokenizer that goes with real weights
PRESETS = {"tiny": TINY, "full": FULL}
QUANTIZE_CHOICES = (None, "nvfp4")
# Kept in the model dtype even when quantising (as published NVFP4 checkpoints keep them).
_NEVER_QUANTISED = ("mlp.gate", "mlp.shared_expert_gate", "linear_attn.in_proj_a", "linear_attn.in_proj_b")


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]


def random_parameters(config: ModelConfig, seed: int, device: str | torch.device, dtype: torch.dtype) -> Iterator[tuple[str, str, Any]]:
    """Yield (canonical name, kind, value) in a fixed order; value is a tensor, or (gate_up, down) for experts."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def normal(shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        tensor = torch.empty(shape, device=device, dtype=torch.float32).normal_(mean, std, generator=generator)
        return tensor.to(dtype)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        return torch.empty(shape, device=device, dtype=torch.float32).uniform_(low, high, generator=generator)

    for name, spec in expected_parameters(config).items():
        if spec.kind == "linear":
            yield name, "linear", normal(spec.shape, spec.shape[1] ** -0.5)
        elif spec.kind == "experts":
            E, two_i, H = spec.shape
            yield name, "experts", (normal((E, two_i, H), H**-0.5), normal((E, H, two_i // 2), (two_i // 2) ** -0.5))
        elif name == "embed_tokens.weight":
            yield name, "tensor", normal(spec.shape, 1.0)
        elif name.endswith("linear_attn.norm.weight"):
            yield name, "tensor", normal(spec.shape, 0.1, mean=1.0)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            yield name, "tensor", normal(spec.shape, 0.1)
        elif name.endswith("conv1d.weight"):
            yield name, "tensor", normal(spec.shape, spec.shape[-1] ** -0.5)
        elif name.endswith("A_log"):
            yield name, "tensor", uniform(spec.shape, 1.0, 8.0).log()
        elif name.endswith("dt_bias"):
            yield name, "tensor", uniform(spec.shape, -1.0, 1.0)
        else:
            raise AssertionError(f"no initialiser for {name}")


def quantized_linear(weight: torch.Tensor) -> Linear:
    packed, scale, scale_2 = quantize_nvfp4(weight)
    return Linear(int(weight.shape[0]), int(weight.shape[1]), weight_packed=packed, weight_scale=scale, weight_scale_2=scale_2)


def _quantise(name: str, quantize: str | None, lm_head_quantize: bool) -> bool:
    if quantize is None or name.endswith(_NEVER_QUANTISED):
        return False
    return lm_head_quantize if name == "lm_head" else True


def build_preset(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    quantize: str | None = None,
    lm_head_quantize: bool = False,
) -> Qwen35MoeModel:
    """The named preset with seeded random weights, built on `device` (linears NVFP4 with quantize="nvfp4")."""
    config = preset_config(name)
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"unknown quantize {quantize!r}; expected one of {QUANTIZE_CHOICES}")
    params: dict[str, Any] = {}
    for param_name, kind, value in random_parameters(config, seed, device, dtype):
        quantise = _quantise(param_name, quantize, lm_head_quantize)
        if kind == "tensor":
            params[param_name] = value.float() if param_name.endswith(("A_log", "dt_bias")) else value
        elif kind == "linear":
            params[param_name] = quantized_linear(value) if quantise else Linear.dense(value)
        else:
            gate_up, down = value
            E, two_i, H = gate_up.shape
            if quantise:
                half = two_i // 2
                gates = tuple(quantized_linear(gate_up[e, :half]) for e in range(E))
                ups = tuple(quantized_linear(gate_up[e, half:]) for e in range(E))
                downs = tuple(quantized_linear(down[e]) for e in range(E))
                params[param_name] = RoutedExperts(E, H, two_i // 2, gate=gates, up=ups, down=downs)
            else:
                params[param_name] = RoutedExperts(E, H, two_i // 2, gate_up_proj=gate_up, down_proj=down)
    return build_model(config, params)


def preset_state_dict(name: str, seed: int = 0, dtype: torch.dtype = torch.float32, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The preset's weights as a dense Hugging Face state dict (CPU), the same values `build_preset` uses."""
    config = preset_config(name)
    state: dict[str, torch.Tensor] = {}
    for param_name, kind, value in random_parameters(config, seed, "cpu", dtype):
        full_name = param_name if param_name == "lm_head" else prefix + param_name
        if kind == "tensor":
            state[full_name] = value
        elif kind == "linear":
            state[full_name + ".weight"] = value
        else:
            state[full_name + ".gate_up_proj"], state[full_name + ".down_proj"] = value
    return state


def save_preset_checkpoint(name: str, directory: str | Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """Write the preset as an HF-layout checkpoint (config.json + model.safetensors, prefix `model.`)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = preset_state_dict(name, seed, dtype)
    save_file({key: value.contiguous() for key, value in state.items()}, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf_config = preset_config(name).to_hf()
    hf_config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    return directory
