"""Loader: bf16 HF layouts, ModelOpt NVFP4 (+FP8 mixed precision), compressed-tensors NVFP4, and checkpoints that do not fit.

Quantised checkpoints are written here from the tiny preset's weights; the loaded model must give
the same logits (float32, max rel error per position < 1e-5) as the same model built with the
dequantised weights, so the loader's conventions (packing, scale_2 = 1/global_scale, FP8 scales,
expert layouts) are checked apart from quantisation error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_oracle import max_rel_error_per_position
from safetensors.torch import save_file

from reference_engine.checkpoint.files import CheckpointError
from reference_engine.contract_entries.simple_driver import SimpleDriver
from reference_engine.loader import inspect_checkpoint, load_model
from reference_engine.model.build import build_model, params_from_state_dict
from reference_engine.presets import (
    TINY,
    build_preset,
    preset_state_dict,
    save_preset_checkpoint,
)
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

SEED = 11
PROMPTS = [[5, 17, 300, 42, 9, 77, 128], [400, 3, 8]]
UNQUANTISED = ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight", "lm_head.weight")


def _logits(model) -> list[torch.Tensor]:
    return SimpleDriver(model, 2, 16).step([0, 1], PROMPTS)


def _assert_same_logits(model, reference_model, bound: float = 1e-5) -> float:
    worst = max(max_rel_error_per_position(a, b) for a, b in zip(_logits(model), _logits(reference_model)))
    assert worst < bound, worst
    return worst


def _write(directory: Path, tensors: dict[str, torch.Tensor], config: dict, extra_files: dict[str, dict] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, shard_names in shards.items():
        save_file({name: tensors[name].contiguous() for name in shard_names}, str(directory / file))
    index = {"metadata": {}, "weight_map": {name: file for file, shard_names in shards.items() for name in shard_names}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config))
    for name, content in (extra_files or {}).items():
        (directory / name).write_text(json.dumps(content))
    return directory


def _unfuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len(".gate_up_proj")]
            half = tensor.shape[1] // 2
            for j in range(tensor.shape[0]):
                out[f"{base}.{j}.gate_proj.weight"] = tensor[j, :half].clone()
                out[f"{base}.{j}.up_proj.weight"] = tensor[j, half:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len(".down_proj")]
            for j in range(tensor.shape[0]):
                out[f"{base}.{j}.down_proj.weight"] = tensor[j].clone()
        else:
            out[name] = tensor
    return out


@pytest.fixture(scope="module")
def dense_state() -> dict[str, torch.Tensor]:
    return preset_state_dict("tiny", seed=SEED)


@pytest.fixture(scope="module")
def preset_model():
    return build_preset("tiny", seed=SEED)


def test_saved_preset_loads_to_identical_logits(tmp_path, preset_model):
    save_preset_checkpoint("tiny", tmp_path, seed=SEED)
    loaded = load_model(tmp_path, dtype=torch.float32, progress=False)
    for a, b in zip(_logits(loaded), _logits(preset_model)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["language_model_fused", "language_model_per_expert", "model_per_expert_bf16"])
def test_bf16_layouts(tmp_path, dense_state, preset_model, layout):
    state = dict(dense_state)
    config = TINY.to_hf()
    if layout.startswith("language_model"):
        state = {name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name: t for name, t in state.items()}
        state["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(8, 8)  # skipped
        state["mtp.fc.weight"] = torch.randn(8, 16)  # skipped
        config = {"model_type": "qwen3_5_moe", "text_config": config, "vision_config": {"depth": 1}}
    if layout.endswith("per_expert") or layout.endswith("per_expert_bf16"):
        state = _unfuse_experts(state)
    dtype = torch.bfloat16 if layout.endswith("bf16") else torch.float32
    state = {name: t.to(dtype) for name, t in state.items()}
    loaded = load_model(_write(tmp_path, state, config), dtype=torch.float32, progress=False)
    if dtype == torch.float32:
        _assert_same_logits(loaded, preset_model, bound=1e-6)
    else:  # the reference holds the same bf16-rounded weights
        reference = build_model(TINY, params_from_state_dict(TINY, state, torch.float32))
        _assert_same_logits(loaded, reference, bound=1e-6)


_QUANTISED: dict[str, tuple[torch.Tensor, ...]] = {}


def _quantised(name: str, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """NVFP4 parts and dequantised weight of one tensor, computed once per module run (quantising is the slow part)."""
    key = f"{name}:{SEED}"
    if key not in _QUANTISED:
        packed, block_scale, scale_2 = quantize_nvfp4(tensor)
        _QUANTISED[key] = (packed, block_scale, scale_2, dequantize_nvfp4(packed, block_scale, scale_2, torch.float32))
    return _QUANTISED[key]


def _quantise_state(state: dict[str, torch.Tensor], fmt: str, fp8_attention: bool = False) -> tuple[dict, dict]:
    """(checkpoint tensors in `fmt`, dense state with the dequantised weights)."""
    stored, dequantised = {}, {}
    for name, tensor in _unfuse_experts(state).items():
        if not name.endswith(".weight") or tensor.dim() != 2 or name.endswith(UNQUANTISED) or "embed_tokens" in name:
            stored[name], dequantised[name] = tensor, tensor
            continue
        module = name[: -len(".weight")]
        if fp8_attention and ".self_attn." in name:
            scale = tensor.abs().amax() / 448.0
            weight = (tensor / scale).to(torch.float8_e4m3fn)
            stored[name], stored[module + ".weight_scale"] = weight, scale.reshape(())
            stored[module + ".input_scale"] = torch.tensor(0.02)
            dequantised[name] = weight.float() * scale
            continue
        packed, block_scale, scale_2, dequantised[name] = _quantised(name, tensor)
        input_scale = torch.tensor(0.05, dtype=torch.float32)
        if fmt == "modelopt":
            stored[name], stored[module + ".weight_scale"] = packed, block_scale
            stored[module + ".weight_scale_2"], stored[module + ".input_scale"] = scale_2.reshape(()), input_scale
        else:
            stored[module + ".weight_packed"], stored[module + ".weight_scale"] = packed, block_scale
            stored[module + ".weight_global_scale"] = (1.0 / scale_2).reshape(1)
            stored[module + ".input_global_scale"] = (1.0 / input_scale).reshape(1)
    return stored, dequantised


def _modelopt_files(algorithm: str) -> dict[str, dict]:
    exclude = ["lm_head", "model.layers.*.mlp.gate", "model.layers.*.mlp.shared_expert_gate", "*in_proj_a", "*in_proj_b"]
    return {"hf_quant_config.json": {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algorithm, "group_size": 16, "exclude_modules": exclude}}}


def _compressed_tensors_config() -> dict:
    group = {"targets": ["Linear"], "format": "nvfp4-pack-quantized", "weights": {"num_bits": 4, "type": "float", "group_size": 16}}
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": group}, "ignore": ["lm_head", "re:.*mlp\\.gate$"]}


@pytest.mark.parametrize("fmt", ["modelopt", "modelopt_mixed_fp8", "compressed-tensors"])
def test_nvfp4_checkpoints_match_dequantised_model(tmp_path, dense_state, fmt):
    stored, dequantised = _quantise_state(dense_state, "modelopt" if fmt.startswith("modelopt") else fmt, fp8_attention=fmt.endswith("fp8"))
    config = TINY.to_hf()
    extra = None
    if fmt.startswith("modelopt"):
        config["quantization_config"] = {"quant_method": "modelopt"}
        extra = _modelopt_files("MIXED_PRECISION" if fmt.endswith("fp8") else "NVFP4")
    else:
        config["quantization_config"] = _compressed_tensors_config()
    loaded = load_model(_write(tmp_path, stored, config, extra), dtype=torch.float32, progress=False)
    assert loaded.layers[0].mlp.experts.gate[0].is_nvfp4 and loaded.layers[0].mixer.in_proj_qkv.is_nvfp4
    assert not loaded.layers[0].mlp.gate.is_nvfp4
    reference = build_model(TINY, params_from_state_dict(TINY, dequantised, torch.float32))
    _assert_same_logits(loaded, reference, bound=1e-5)
    # The dequantised model really differs from the unquantised one (the comparison above is not vacuous).
    unquantised = build_model(TINY, params_from_state_dict(TINY, dense_state, torch.float32))
    assert max(max_rel_error_per_position(a, b) for a, b in zip(_logits(loaded), _logits(unquantised))) > 1e-3


def test_w4a4_uses_the_input_scales(tmp_path, dense_state):
    stored, _ = _quantise_state(dense_state, "modelopt")
    config = dict(TINY.to_hf(), quantization_config={"quant_method": "modelopt"})
    directory = _write(tmp_path, stored, config, _modelopt_files("NVFP4"))
    w4a16 = load_model(directory, dtype=torch.float32, progress=False)
    w4a4 = load_model(directory, dtype=torch.float32, progress=False, nvfp4_activations=True)
    assert w4a4.layers[0].mixer.in_proj_qkv.activation_nvfp4 and not w4a16.layers[0].mixer.in_proj_qkv.activation_nvfp4
    error = max(max_rel_error_per_position(a, b) for a, b in zip(_logits(w4a4), _logits(w4a16)))
    assert 1e-4 < error < 1.0


def _bf16_checkpoint(tmp_path: Path, state: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    return _write(tmp_path, state, config or TINY.to_hf())


@pytest.mark.parametrize(
    "mutation, message",
    [
        (lambda s: s.pop("model.layers.3.self_attn.k_norm.weight"), "model.layers.3.self_attn.k_norm.weight"),
        (lambda s: s.__setitem__("model.layers.1.linear_attn.in_proj_z.weight", torch.randn(64, 64)), "model.layers.1.linear_attn.in_proj_z.weight"),
        (lambda s: s.__setitem__("model.layers.2.mlp.experts.down_proj", torch.randn(16, 64, 31)), "model.layers.2.mlp.experts.down_proj"),
        (lambda s: s.__setitem__("model.layers.4.input_layernorm.weight", torch.randn(64)), "model.layers.4.input_layernorm.weight"),
        (lambda s: s.__setitem__("model.norm.weight", torch.randint(0, 3, (64,), dtype=torch.int32)), "model.norm.weight"),
        (lambda s: s.pop("lm_head.weight"), "lm_head.weight"),
    ],
    ids=["missing", "wrong_shape", "wrong_expert_shape", "unexpected_layer", "wrong_dtype", "missing_lm_head"],
)
def test_checkpoint_that_does_not_fit_fails_before_reading(tmp_path, dense_state, monkeypatch, mutation, message):
    state = dict(dense_state)
    mutation(state)
    directory = _bf16_checkpoint(tmp_path, state)
    from reference_engine.checkpoint import files as files_module

    def no_reads(self, name):  # any data read before the check would be a defect
        raise AssertionError(f"read {name} before the checkpoint was checked")

    monkeypatch.setattr(files_module.CheckpointFiles, "read", no_reads)
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
        load_model(directory, dtype=torch.float32, progress=False)


def test_unknown_formats_are_named(tmp_path, dense_state):
    config = dict(TINY.to_hf(), quantization_config={"quant_method": "gptq"})
    with pytest.raises(CheckpointError, match="gptq"):
        inspect_checkpoint(_bf16_checkpoint(tmp_path / "a", dense_state, config))
    config = dict(TINY.to_hf(), quantization_config={"quant_method": "compressed-tensors", "format": "pack-quantized"})
    with pytest.raises(CheckpointError, match="pack-quantized"):
        inspect_checkpoint(_bf16_checkpoint(tmp_path / "b", dense_state, config))
    stored, _ = _quantise_state(dense_state, "modelopt")
    with pytest.raises(CheckpointError, match="ModelOpt NVFP4 but the checkpoint declares 'none'|packed uint8"):
        inspect_checkpoint(_bf16_checkpoint(tmp_path / "c", stored))


def test_inspect_reports_formats(tmp_path, dense_state):
    stored, _ = _quantise_state(dense_state, "compressed-tensors")
    config = dict(TINY.to_hf(), quantization_config=_compressed_tensors_config())
    _, scheme, plan = inspect_checkpoint(_write(tmp_path, stored, config))
    assert scheme.kind == "compressed-tensors"
    formats = {item.name: item.linear.format for item in plan if item.kind == "linear"}
    assert formats["layers.0.linear_attn.in_proj_qkv"] == "nvfp4" and formats["layers.0.mlp.gate"] == "dense"


def test_transformers_save_pretrained_checkpoint(tmp_path):
    """A checkpoint written by transformers itself (text-only model: prefix `model.`) loads to its logits."""
    from hf_oracle import build_hf_model, hf_logits

    hf_model = build_hf_model(TINY.to_hf(), preset_state_dict("tiny", seed=SEED + 1))
    hf_model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype=torch.float32, progress=False)
    prompt = PROMPTS[0]
    logits = SimpleDriver(loaded, 1, 16).step([0], [prompt])[0]
    assert max_rel_error_per_position(logits, hf_logits(hf_model, prompt)) < 1e-4


def test_exclusion_list_that_disagrees_with_the_tensors_warns(tmp_path, dense_state):
    stored, _ = _quantise_state(dense_state, "modelopt")
    files = _modelopt_files("NVFP4")
    files["hf_quant_config.json"]["quantization"]["exclude_modules"].append("*.self_attn.q_proj")
    config = dict(TINY.to_hf(), quantization_config={"quant_method": "modelopt"})
    with pytest.warns(UserWarning, match=r"model\.layers\.3\.self_attn\.q_proj"):
        _, scheme, _ = inspect_checkpoint(_write(tmp_path, stored, config, files))
    assert scheme.is_excluded("model.layers.0.mlp.gate") and not scheme.is_excluded("model.layers.0.mlp.experts.0.gate_proj")
