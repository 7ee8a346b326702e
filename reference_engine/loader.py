"""Load a safetensors checkpoint into the engine model: bf16 (HF layout), ModelOpt NVFP4/FP8/mixed, compressed-tensors NVFP4.

    model = load_model("/path/to/checkpoint", dtype=torch.bfloat16, device="cuda")

Everything is checked against the config from the safetensors headers first (`plan_checkpoint`):
a checkpoint that does not fit raises CheckpointError naming the tensor before any data is read.
Then tensors stream one at a time (tqdm progress bar): dense tensors are cast to the model dtype,
FP8 linears are dequantised to it, NVFP4 linears stay packed (ModelOpt multiplier convention;
compressed-tensors global scales become `scale_2 = 1 / global_scale`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from reference_engine.checkpoint.files import CheckpointError, CheckpointFiles
from reference_engine.checkpoint.formats import QuantScheme, detect_scheme
from reference_engine.checkpoint.plan import LinearSource, PlanItem, plan_checkpoint
from reference_engine.config import ModelConfig
from reference_engine.model.build import build_model
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear
from reference_engine.model.qwen3_5_moe import Qwen35MoeModel

__all__ = ["CheckpointError", "inspect_checkpoint", "load_model"]


def _scalar(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.float32).reshape(())


def _read_linear(files: CheckpointFiles, source: LinearSource, dtype: torch.dtype, device, nvfp4_activations: bool) -> Linear:
    read = files.read
    if source.format == "dense":
        return Linear.dense(read(source.tensors["weight"]).to(device=device, dtype=dtype))
    if source.format == "fp8":
        weight = read(source.tensors["weight"]).to(device=device, dtype=torch.float32)  # [N, K]
        scale = read(source.tensors["weight_scale"]).to(device=device, dtype=torch.float32)
        scale = scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
        return Linear.dense((weight * scale).to(dtype))
    scale_2 = _scalar(read(source.tensors["weight_scale_2"]))
    input_scale = _scalar(read(source.tensors["input_scale"])) if "input_scale" in source.tensors else None
    if source.global_scale_divisor:
        scale_2 = 1.0 / scale_2
        input_scale = None if input_scale is None else 1.0 / input_scale
    packed = read(source.tensors["weight_packed"]).to(device)
    return Linear(
        int(packed.shape[0]),
        int(packed.shape[1]) * 2,
        weight_packed=packed,
        weight_scale=read(source.tensors["weight_scale"]).to(device),
        weight_scale_2=scale_2.to(device),
        input_scale=None if input_scale is None else input_scale.to(device),
        activation_nvfp4=nvfp4_activations and input_scale is not None,
    )


def _read_item(files: CheckpointFiles, item: PlanItem, config: ModelConfig, dtype, device, nvfp4_activations: bool) -> Any:
    if item.kind == "tensor":
        target = torch.float32 if item.name.endswith(("A_log", "dt_bias")) else dtype
        return files.read(item.tensor).to(device=device, dtype=target)
    if item.kind == "linear":
        return _read_linear(files, item.linear, dtype, device, nvfp4_activations)
    E, H, I = config.num_experts, config.hidden_size, config.moe_intermediate_size
    if item.fused_experts:
        gate_up, down = (files.read(name).to(device=device, dtype=dtype) for name in item.fused_experts)
        return RoutedExperts(E, H, I, gate_up_proj=gate_up, down_proj=down)
    triples = [tuple(_read_linear(files, s, dtype, device, nvfp4_activations) for s in triple) for triple in item.expert_linears]
    if all(not linear.is_nvfp4 for triple in triples for linear in triple):  # dense per-expert layout: fuse
        gate_up = torch.stack([torch.cat([gate.weight, up.weight]) for gate, up, _ in triples])  # [E, 2I, H]
        down = torch.stack([down.weight for _, _, down in triples])  # [E, H, I]
        return RoutedExperts(E, H, I, gate_up_proj=gate_up, down_proj=down)
    gates, ups, downs = zip(*triples)
    return RoutedExperts(E, H, I, gate=tuple(gates), up=tuple(ups), down=tuple(downs))


def inspect_checkpoint(path: str | Path, config: ModelConfig | None = None) -> tuple[ModelConfig, QuantScheme, list[PlanItem]]:
    """Config, declared quantisation and the checked load plan; reads headers only (raises CheckpointError)."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    config = config or ModelConfig.from_hf(directory)
    files = CheckpointFiles(path)
    scheme = detect_scheme(directory)
    return config, scheme, plan_checkpoint(config, files, scheme)


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    config: ModelConfig | None = None,
    nvfp4_activations: bool = False,
    progress: bool = True,
) -> Qwen35MoeModel:
    """Build the engine model from a checkpoint directory (config.json + safetensors shards).

    NVFP4 linears run weight-only (W4A16) unless `nvfp4_activations` is set and the checkpoint has
    input scales (then W4A4, as on Blackwell).
    """
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    config = config or ModelConfig.from_hf(directory)
    files = CheckpointFiles(path)
    scheme = detect_scheme(directory)
    plan = plan_checkpoint(config, files, scheme)  # every check happens here, before any data is read
    params: dict[str, Any] = {}
    try:
        for item in tqdm(plan, desc=f"loading {directory.name}", unit="param", disable=not progress):
            params[item.name] = _read_item(files, item, config, dtype, device, nvfp4_activations)
    finally:
        files.close()
    return build_model(config, params)
