"""Model and engine configuration: frozen dataclasses, read from a Hugging Face `config.json` at the edge.

`ModelConfig.from_hf` accepts the multimodal `qwen3_5_moe` config (the text part under
`text_config`) and the text-only `qwen3_5_moe_text` config, with rotary settings either inside
`rope_parameters` (transformers 5) or at the top level (older files).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

LAYER_TYPES = ("linear_attention", "full_attention")
_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


class ConfigError(ValueError):
    """A configuration that this engine cannot run, with the field that does not fit."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 248320
    hidden_size: int = 2048
    num_hidden_layers: int = 40
    layer_types: tuple[str, ...] = ()  # empty: full attention at i % 4 == 3, else linear attention
    num_attention_heads: int = 16
    num_kv_heads: int = 2
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7
    rms_norm_eps: float = 1e-6
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_types:
            pattern = tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", pattern)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        self.validate()

    # Derived sizes -------------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "full_attention")

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")

    def validate(self) -> None:
        positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "max_position_embeddings"]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(f"ModelConfig.layer_types has {len(self.layer_types)} entries, expected num_hidden_layers={self.num_hidden_layers}")
        unknown = sorted({kind for kind in self.layer_types if kind not in LAYER_TYPES})
        if unknown:
            raise ConfigError(f"ModelConfig.layer_types: unknown layer types {unknown}; expected {list(LAYER_TYPES)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of linear_num_key_heads={self.linear_num_key_heads}"
            )
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2 or self.rotary_dim < 2:
            raise ConfigError(
                f"partial_rotary_factor={self.partial_rotary_factor} gives rotary_dim={self.rotary_dim}; it must be even, >= 2 and <= head_dim"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ConfigError(f"linear_conv_kernel_dim={self.linear_conv_kernel_dim} must be at least 2 (the conv state holds K-1 inputs)")
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError(f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ConfigError(f"rope_theta ({self.rope_theta}) and rms_norm_eps ({self.rms_norm_eps}) must be positive")

    # Edges ---------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, source: dict[str, Any] | str | Path) -> ModelConfig:
        """Read a Hugging Face config (a dict, a config.json path, or a checkpoint directory)."""
        if not isinstance(source, dict):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ConfigError(f"no config.json at {path}")
            try:
                source = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise ConfigError(f"{path} is not valid JSON: {error}") from None
        model_type = source.get("model_type")
        text = source.get("text_config", source) if model_type == "qwen3_5_moe" or "text_config" in source else source
        text_type = text.get("model_type", model_type)
        if text_type not in _MODEL_TYPES and model_type not in _MODEL_TYPES:
            raise ConfigError(f"model_type {model_type!r} is not supported; expected one of {list(_MODEL_TYPES)}")
        if text.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {text.get('hidden_act')!r} is not supported; expected 'silu'")
        if text.get("attention_bias", False):
            raise ConfigError("attention_bias=True is not supported (Qwen3.5 attention has no bias)")
        rope = dict(text.get("rope_parameters") or {})
        rope_type = rope.get("rope_type") or (text.get("rope_scaling") or {}).get("rope_type") or "default"
        if rope_type not in ("default", "mrope"):
            raise ConfigError(f"rope_type {rope_type!r} is not supported; expected 'default'")
        eos = text.get("eos_token_id", source.get("eos_token_id"))
        eos_ids = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
        defaults = cls.__dataclass_fields__
        kwargs: dict[str, Any] = {}
        for name in defaults:
            if name in ("layer_types", "num_kv_heads", "partial_rotary_factor", "rope_theta", "eos_token_ids"):
                continue
            if name in text:
                kwargs[name] = text[name]
        kwargs["num_kv_heads"] = text.get("num_key_value_heads", defaults["num_kv_heads"].default)
        kwargs["partial_rotary_factor"] = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
        kwargs["rope_theta"] = float(rope.get("rope_theta", text.get("rope_theta", 1e7)))
        kwargs["layer_types"] = tuple(text.get("layer_types") or ())
        if not kwargs["layer_types"] and "full_attention_interval" in text:
            interval = int(text["full_attention_interval"])
            count = int(text.get("num_hidden_layers", defaults["num_hidden_layers"].default))
            kwargs["layer_types"] = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(count))
        kwargs["eos_token_ids"] = eos_ids
        kwargs["tie_word_embeddings"] = bool(text.get("tie_word_embeddings", source.get("tie_word_embeddings", False)))
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """The text-only `qwen3_5_moe_text` config.json dict (what transformers' Qwen3_5MoeTextConfig reads)."""
        values = asdict(self)
        out: dict[str, Any] = {"model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"]}
        for name, value in values.items():
            if name in ("num_kv_heads", "partial_rotary_factor", "rope_theta", "eos_token_ids", "layer_types"):
                continue
            out[name] = value
        out["num_key_value_heads"] = self.num_kv_heads
        out["layer_types"] = list(self.layer_types)
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor}
        out["hidden_act"] = "silu"
        out["attention_bias"] = False
        if self.eos_token_ids:
            out["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_ids[0]
        return out


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    max_num_seqs: int = 8
    max_model_len: int = 4096
    block_size: int = 16
    num_blocks: int | None = None  # None: size the pool from gpu_memory_utilization (or a CPU default)
    gpu_memory_utilization: float = 0.85
    max_num_batched_tokens: int = 2048  # chunked prefill: at most this many tokens per step
    seed: int = 0
    # launch a decode step before the previous one's tokens reach the host, so host work overlaps device work
    # (static and graph decode steps; `runner.last_logits` then holds the latest launched step's logits)
    async_decode: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"EngineConfig.dtype {self.dtype!r} is not supported; expected one of {list(_DTYPES)}")
        for name in ("max_num_seqs", "max_model_len", "block_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"EngineConfig.num_blocks must be positive, got {self.num_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.device.startswith(("cpu", "cuda")):
            raise ConfigError(f"EngineConfig.device {self.device!r} is not supported; expected 'cpu' or 'cuda[:N]'")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]
