"""Round trip through the project's own exporter: preset -> bf16 checkpoint -> quantize_checkpoint -> loader.

The exported ModelOpt and compressed-tensors checkpoints must load to the same logits as the
preset quantised in memory (`build_preset(quantize="nvfp4")`): two independent paths to the same
NVFP4 weights (exporter + loader conventions vs direct quantisation).
"""

from __future__ import annotations

import pytest
import torch

from hf_oracle import max_rel_error_per_position
from reference_engine.contract_entries.simple_driver import SimpleDriver
from reference_engine.loader import inspect_checkpoint, load_model
from reference_engine.presets import build_preset, save_preset_checkpoint

SEED = 21
PROMPTS = [[3, 99, 250, 18, 7, 401], [64, 2, 300]]


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    return save_preset_checkpoint("tiny", tmp_path_factory.mktemp("bf16"), seed=SEED)


@pytest.fixture(scope="module")
def in_memory_logits():
    model = build_preset("tiny", seed=SEED, quantize="nvfp4")
    return SimpleDriver(model, 2, 16).step([0, 1], PROMPTS)


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_exported_checkpoint_loads_to_the_in_memory_quantised_model(tmp_path, bf16_checkpoint, in_memory_logits, fmt):
    from reference_engine.quant.export import quantize_checkpoint

    quantize_checkpoint(bf16_checkpoint, tmp_path / fmt, fmt=fmt, progress=False, device="cpu")
    _, scheme, plan = inspect_checkpoint(tmp_path / fmt)
    assert scheme.kind == fmt
    formats = {item.name: item.linear.format for item in plan if item.kind == "linear"}
    assert formats["layers.3.self_attn.q_proj"] == "nvfp4" and formats["lm_head"] == "dense"
    model = load_model(tmp_path / fmt, dtype=torch.float32, progress=False)
    logits = SimpleDriver(model, 2, 16).step([0, 1], PROMPTS)
    worst = max(max_rel_error_per_position(a, b) for a, b in zip(logits, in_memory_logits))
    assert worst < 1e-5, worst
