"""The transformers oracle: `Qwen3_5MoeForCausalLM` built from a config dict and a state dict in HF naming.

Used by the model tests (and the runner tests) to compare the engine's logits with Hugging Face's own
implementation of the architecture, in float32, eager attention.
"""

from __future__ import annotations

from typing import Any

import torch


def build_hf_model(hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32):
    """A transformers Qwen3_5MoeForCausalLM holding exactly `state_dict` (prefix `model.`, fused experts)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    fields = {key: value for key, value in hf_config.items() if key not in ("model_type", "architectures", "torch_dtype")}
    config = Qwen3_5MoeTextConfig(**fields)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(config).to(dtype).eval()
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, strict=False)
    missing = [name for name in missing if not name.endswith("inv_freq")]
    if missing or unexpected:
        raise AssertionError(f"HF oracle state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


@torch.inference_mode()
def hf_logits(model, prompt: list[int]) -> torch.Tensor:
    """Full-sequence logits [len, V] float32 of one prompt (no padding, no cache)."""
    ids = torch.tensor([prompt], dtype=torch.int64)
    return model(input_ids=ids, use_cache=False).logits[0].float()


def max_rel_error_per_position(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max over positions of max|a - b| / max|b| (each row of logits compared on its own scale)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"shape {list(actual.shape)} != {list(expected.shape)}")
    diff = (actual.double() - expected.double()).abs().amax(dim=-1)
    scale = expected.double().abs().amax(dim=-1)
    return float((diff / scale).max())
