"""Presets: deterministic, well-conditioned, NVFP4 variant close to the dense one, full size on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hf_oracle import max_rel_error_per_position

from reference_engine.contract_entries.simple_driver import SimpleDriver
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear
from reference_engine.presets import FULL, build_preset, preset_state_dict

PROMPT = [1, 40, 300, 7, 99, 2, 150, 8]


def _logits(model) -> torch.Tensor:
    return SimpleDriver(model, 1, 16).step([0], [PROMPT])[0]


def test_tiny_is_deterministic_and_seeded():
    a, b, c = _logits(build_preset("tiny", seed=5)), _logits(build_preset("tiny", seed=5)), _logits(build_preset("tiny", seed=6))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_tiny_is_well_conditioned():
    logits = _logits(build_preset("tiny", seed=0))
    assert torch.isfinite(logits).all()
    spread = logits.std(dim=-1)
    assert (spread > 0.3).all() and (spread < 5).all(), spread
    # different positions predict different tokens (the model is not degenerate)
    assert logits.argmax(-1).unique().numel() >= len(PROMPT) // 2


def test_state_dict_matches_the_built_model():
    state = preset_state_dict("tiny", seed=2)
    model = build_preset("tiny", seed=2)
    assert torch.equal(state["model.embed_tokens.weight"], model.embed_tokens)
    assert torch.equal(state["model.layers.0.mlp.experts.gate_up_proj"], model.layers[0].mlp.experts.gate_up_proj)
    assert torch.equal(state["lm_head.weight"], model.lm_head.weight)


def _dequantised_copy(model):
    """The same model with every NVFP4 linear replaced by its dequantised dense weight."""

    def dense(value):
        if isinstance(value, Linear):
            return Linear.dense(value.dense_weight(torch.float32))
        if isinstance(value, RoutedExperts) and not value.is_fused_dense:
            gate_up = torch.stack([torch.cat([g.dense_weight(torch.float32), u.dense_weight(torch.float32)]) for g, u in zip(value.gate, value.up)])
            down = torch.stack([d.dense_weight(torch.float32) for d in value.down])
            return RoutedExperts(value.num_experts, value.hidden_size, value.intermediate_size, gate_up_proj=gate_up, down_proj=down)
        return value

    def replace_all(obj):
        changes = {f.name: dense(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)

    layers = tuple(
        dataclasses.replace(layer, mixer=replace_all(layer.mixer), mlp=replace_all(layer.mlp)) for layer in model.layers
    )
    return dataclasses.replace(model, layers=layers, lm_head=dense(model.lm_head))


@pytest.mark.parametrize("lm_head_quantize", [False, True])
def test_nvfp4_tiny_runs_the_quantised_weights(lm_head_quantize):
    quantised_model = build_preset("tiny", seed=4, quantize="nvfp4", lm_head_quantize=lm_head_quantize)
    assert quantised_model.layers[0].mixer.in_proj_qkv.is_nvfp4 and not quantised_model.layers[0].mlp.gate.is_nvfp4
    assert quantised_model.lm_head.is_nvfp4 == lm_head_quantize
    quantised = _logits(quantised_model)
    # Exactly the model with the dequantised weights (W4A16 is dequantise-then-matmul) ...
    assert max_rel_error_per_position(quantised, _logits(_dequantised_copy(quantised_model))) < 1e-5
    # ... and visibly, boundedly different from the unquantised preset: about 10% error per linear
    # compounds to about 50% relative error in the logits of this random (untrained) tiny model.
    dense = _logits(build_preset("tiny", seed=4))
    relative = float((quantised - dense).norm() / dense.norm())
    assert 0.02 < relative < 0.9, relative
    assert quantised_model.nbytes() < 0.5 * build_preset("tiny", seed=4).nbytes()


def test_unknown_names_fail():
    with pytest.raises(ValueError, match="preset"):
        build_preset("huge")
    with pytest.raises(ValueError, match="quantize"):
        build_preset("tiny", quantize="int4")


@pytest.mark.cuda
def test_full_preset_on_gpu_nvfp4():
    model = build_preset("full", device="cuda", dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    assert model.config == FULL and len(model.layers) == 40
    logits = SimpleDriver(model, 1, 16).step([0], [PROMPT])[0]
    assert logits.shape == (len(PROMPT), FULL.vocab_size) and torch.isfinite(logits).all()
