"""Checkpoint export: a tiny random Qwen3.5-MoE checkpoint written in both NVFP4 layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from reference_engine.quant.export import quantize_checkpoint
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

EXPERTS, LAYERS = 4, 4


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3_5MoeTextConfig(
        hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        vocab_size=256,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForCausalLM(config).to(torch.bfloat16)
    folder = tmp_path_factory.mktemp("bf16")
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text("{}\n")
    return folder


@pytest.fixture(scope="module")
def fused_source(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights in the published layout: prefix model.language_model., fused experts, two shards."""
    tensors = _read_all(source)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if ".mlp.experts." in name:
            continue
        out[name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name] = tensor
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}.mlp.experts"
        gate_up = [torch.cat([tensors[f"{prefix}.{j}.gate_proj.weight"], tensors[f"{prefix}.{j}.up_proj.weight"]]) for j in range(EXPERTS)]
        fused = f"model.language_model.layers.{layer}.mlp.experts"
        out[f"{fused}.gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, H]
        out[f"{fused}.down_proj"] = torch.stack([tensors[f"{prefix}.{j}.down_proj.weight"] for j in range(EXPERTS)])  # [E, H, I]
    folder = tmp_path_factory.mktemp("fused")
    names = sorted(out)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file_name, part in halves.items():
        save_file({name: out[name].contiguous() for name in part}, str(folder / file_name))
    weight_map = {name: file_name for file_name, part in halves.items() for name in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text((source / "config.json").read_text())
    return folder


def _module_names(tensors: dict[str, torch.Tensor], suffix: str) -> set[str]:
    return {name[: -len(suffix)] for name in tensors if name.endswith(suffix)}


def test_modelopt_layout(source: Path, tmp_path: Path) -> None:
    report = quantize_checkpoint(source, tmp_path / "out", "modelopt", progress=False)
    written, original = _read_all(tmp_path / "out"), _read_all(source)
    quantized = _module_names(written, ".weight_scale_2")
    assert quantized == set(report.quantized_modules)
    assert f"model.layers.3.mlp.experts.{EXPERTS - 1}.down_proj" in quantized and "model.layers.0.linear_attn.in_proj_qkv" in quantized
    for module in quantized:
        weight = original[f"{module}.weight"]
        assert written[f"{module}.weight"].dtype == torch.uint8 and written[f"{module}.weight"].shape == (weight.shape[0], weight.shape[1] // 2)
        assert written[f"{module}.weight_scale"].dtype == torch.float8_e4m3fn and written[f"{module}.weight_scale"].shape == (weight.shape[0], weight.shape[1] // 16)
        assert written[f"{module}.weight_scale_2"].shape == () and written[f"{module}.weight_scale_2"].dtype == torch.float32
        assert written[f"{module}.input_scale"].shape == () and float(written[f"{module}.input_scale"]) == 1.0
        packed, scale, scale_2 = quantize_nvfp4(weight)
        assert torch.equal(written[f"{module}.weight"], packed) and torch.equal(written[f"{module}.weight_scale"].view(torch.uint8), scale.view(torch.uint8))
        assert torch.equal(
            dequantize_nvfp4(written[f"{module}.weight"], written[f"{module}.weight_scale"], written[f"{module}.weight_scale_2"]),
            dequantize_nvfp4(packed, scale, scale_2),
        )
    kept = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.shared_expert_gate.weight",
            "model.layers.0.linear_attn.in_proj_a.weight", "model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.conv1d.weight",
            "model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias", "model.layers.3.self_attn.q_norm.weight"]
    for name in kept:
        assert written[name].dtype == torch.bfloat16 and torch.equal(written[name], original[name]), name
    hf_quant = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())
    assert hf_quant["quantization"]["quant_algo"] == "NVFP4" and hf_quant["quantization"]["group_size"] == 16
    assert "lm_head" in hf_quant["quantization"]["exclude_modules"] and "model.layers.0.mlp.gate" in hf_quant["quantization"]["exclude_modules"]
    assert not set(hf_quant["quantization"]["exclude_modules"]) & quantized
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt" and config["model_type"] == "qwen3_5_moe_text"
    assert (tmp_path / "out" / "tokenizer_config.json").exists() and (tmp_path / "out" / "generation_config.json").exists()


def test_compressed_tensors_layout(source: Path, tmp_path: Path) -> None:
    report = quantize_checkpoint(source, tmp_path / "out", "compressed-tensors", progress=False, input_amax=100.0)
    written, original = _read_all(tmp_path / "out"), _read_all(source)
    quantized = _module_names(written, ".weight_packed")
    assert quantized == set(report.quantized_modules) and len(quantized) == LAYERS * (3 * EXPERTS + 3) + 3 * 3 + 4  # experts + shared; 3 GDN layers x 3; q, k, v, o
    for module in quantized:
        packed, scale, scale_2 = quantize_nvfp4(original[f"{module}.weight"])
        assert f"{module}.weight" not in written
        assert torch.equal(written[f"{module}.weight_packed"], packed)
        assert torch.equal(written[f"{module}.weight_scale"].view(torch.uint8), scale.view(torch.uint8))
        global_scale = written[f"{module}.weight_global_scale"]
        assert global_scale.shape == (1,) and global_scale.dtype == torch.float32
        assert float(global_scale) == float(1.0 / scale_2)
        assert float(written[f"{module}.input_global_scale"]) == pytest.approx(2688.0 / 100.0, rel=1e-6)
    config = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "nvfp4-pack-quantized"
    assert "lm_head" in config["ignore"] and not (tmp_path / "out" / "hf_quant_config.json").exists()
    ct = pytest.importorskip("compressed_tensors.quantization")
    parsed = ct.QuantizationConfig.model_validate(config)
    assert parsed.config_groups["group_0"].weights.strategy == "tensor_group" and parsed.config_groups["group_0"].weights.group_size == 16


def test_fused_published_layout_gives_the_same_tensors(source: Path, fused_source: Path, tmp_path: Path) -> None:
    quantize_checkpoint(source, tmp_path / "a", "modelopt", progress=False)
    report = quantize_checkpoint(fused_source, tmp_path / "b", "modelopt", progress=False, max_shard_bytes=20_000)
    assert len(report.shards) > 1 and (tmp_path / "b" / "model.safetensors.index.json").exists()
    from_unfused = _read_all(tmp_path / "a")
    from_fused = {name.replace("model.language_model.", "model.", 1): tensor for name, tensor in _read_all(tmp_path / "b").items()}
    assert set(from_fused) == set(from_unfused)
    for name, tensor in from_unfused.items():
        assert torch.equal(tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor, from_fused[name].view(torch.uint8) if tensor.element_size() == 1 else from_fused[name]), name
    weight_map = json.loads((tmp_path / "b" / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map) == set(_read_all(tmp_path / "b"))


def test_lm_head_can_be_quantized(source: Path, tmp_path: Path) -> None:
    report = quantize_checkpoint(source, tmp_path / "out", "modelopt", exclude=("*embed_tokens", "*.mlp.gate"), progress=False)
    assert "lm_head" in report.quantized_modules and "model.layers.0.linear_attn.in_proj_a" in report.quantized_modules


def test_bad_requests_raise(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown format"):
        quantize_checkpoint(source, tmp_path / "x", "gguf", progress=False)  # type: ignore[arg-type]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        quantize_checkpoint(source, tmp_path / "full", "modelopt", progress=False)
    with pytest.raises(ValueError, match="config.json"):
        quantize_checkpoint(tmp_path / "full", tmp_path / "y", "modelopt", progress=False)


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_engine_loader_reads_what_we_write(source: Path, tmp_path: Path, fmt: str) -> None:
    from reference_engine.loader import inspect_checkpoint, load_model

    quantize_checkpoint(source, tmp_path / "out", fmt, progress=False)
    _, scheme, _ = inspect_checkpoint(tmp_path / "out")
    assert scheme.kind == fmt and scheme.is_excluded("model.layers.0.mlp.gate")
    assert not scheme.is_excluded("model.layers.0.mlp.experts.0.gate_proj")
    assert load_model(tmp_path / "out") is not None
