"""Write an NVFP4 checkpoint (ModelOpt or compressed-tensors layout) from a bf16 Qwen3.5/3.6-MoE checkpoint.

Streams tensor by tensor: only one source tensor and one output shard are in memory at a time.
Routed experts are written unfused as `mlp.experts.{j}.{gate,up,down}_proj.*` whichever layout the
source has (fused `gate_up_proj [E, 2I, H]` / `down_proj [E, H, I]`, or per expert).

Which tensors are quantized: every 2-D `*.weight` of a linear layer whose module name matches
none of the `exclude` glob patterns (fnmatch, on the module name without `.weight`) and whose
input size is a multiple of 16. Everything else is copied unchanged; the excluded linear modules
are listed by full name in the checkpoint's exclude/ignore list.

Activation scales: no calibration data is used. `input_amax` (default 2688, so input_scale = 1.0
and input_global_scale = 1.0) is written for every quantized linear, as both formats require.
For W4A16 use (Hopper) the value is ignored. For W4A4 it means activation blocks up to 2688 are
representable without clamping and block scales stay in E4M3's normal range for activation
blocks above about 0.09; calibrate and pass a measured amax for accurate W4A4.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from reference_engine.quant.export_config import (
    compressed_tensors_quantization_config,
    modelopt_hf_quant_config,
    modelopt_quantization_config,
)
from reference_engine.quant.nvfp4 import BLOCK_SIZE, global_scale_from_scale_2, quantize_nvfp4, tensor_scale_from_amax

Format = Literal["modelopt", "compressed-tensors"]
FORMATS = ("modelopt", "compressed-tensors")
DEFAULT_EXCLUDE = (
    "lm_head",
    "*embed_tokens",
    "*norm",
    "*.mlp.gate",
    "*.shared_expert_gate",
    "*.linear_attn.in_proj_a",
    "*.linear_attn.in_proj_b",
    "*.conv1d",
    "model.visual.*",
    "mtp.*",
)
DEFAULT_INPUT_AMAX = 2688.0  # 6 * 448: input_scale 1.0
DEFAULT_SHARD_BYTES = 4 * 1024**3
_FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


@dataclass(frozen=True)
class ExportReport:
    format: str
    quantized_modules: tuple[str, ...]
    excluded_modules: tuple[str, ...]
    shards: tuple[str, ...]
    input_scale: float


def _source_files(src_dir: Path) -> list[Path]:
    index = src_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [src_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(src_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src_dir} holds no *.safetensors files")
    return files


def _split_experts(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Fused expert tensors -> per-expert `...experts.{j}.{gate,up,down}_proj.weight` [out, in]."""
    prefix = name.rsplit(".", 1)[0]  # ...mlp.experts
    if tensor.ndim != 3:
        raise ValueError(f"{name}: expected a 3-D fused expert tensor, got shape {tuple(tensor.shape)}")
    if name.endswith("gate_up_proj"):
        if tensor.shape[1] % 2:
            raise ValueError(f"{name}: gate_up_proj [E, 2I, H] needs an even second axis, got {tuple(tensor.shape)}")
        intermediate = tensor.shape[1] // 2
        for expert in range(tensor.shape[0]):
            yield f"{prefix}.{expert}.gate_proj.weight", tensor[expert, :intermediate]
            yield f"{prefix}.{expert}.up_proj.weight", tensor[expert, intermediate:]
    else:
        for expert in range(tensor.shape[0]):
            yield f"{prefix}.{expert}.down_proj.weight", tensor[expert]


def _is_excluded(module: str, exclude: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in exclude)


def _quantizable(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".weight") and tensor.ndim == 2 and tensor.is_floating_point() and tensor.shape[1] % BLOCK_SIZE == 0


class _ShardWriter:
    """Collects output tensors and writes a shard whenever `limit` bytes have gathered."""

    def __init__(self, dst_dir: Path, limit: int) -> None:
        self.dst_dir, self.limit = dst_dir, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[tuple[str, list[str]]] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.pending or any(name in names for _, names in self.written):
            raise ValueError(f"tensor {name} would be written twice (the source holds both fused and per-expert experts?)")
        self.pending[name] = tensor.contiguous().clone()  # own storage: slices of fused experts share it
        self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        file_name = f"part-{len(self.written):05d}.safetensors"
        save_file(self.pending, str(self.dst_dir / file_name), metadata={"format": "pt"})
        self.written.append((file_name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> list[str]:
        self.flush()
        count = len(self.written)
        weight_map, names = {}, []
        for index, (file_name, tensors) in enumerate(self.written):
            final = "model.safetensors" if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"
            os.replace(self.dst_dir / file_name, self.dst_dir / final)
            names.append(final)
            weight_map.update({tensor: final for tensor in tensors})
        if count > 1:
            index_doc = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
            (self.dst_dir / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2) + "\n")
        return names


def _quantized_tensors(module: str, weight: torch.Tensor, fmt: str, input_scale: torch.Tensor, device: str) -> dict[str, torch.Tensor]:
    packed, block_scale, scale_2 = (tensor.cpu() for tensor in quantize_nvfp4(weight.to(device)))  # bit-identical on any device
    if fmt == "modelopt":
        return {
            f"{module}.weight": packed,
            f"{module}.weight_scale": block_scale,
            f"{module}.weight_scale_2": scale_2.reshape(()),
            f"{module}.input_scale": input_scale.reshape(()),
        }
    return {
        f"{module}.weight_packed": packed,
        f"{module}.weight_scale": block_scale,
        f"{module}.weight_global_scale": global_scale_from_scale_2(scale_2),
        f"{module}.input_global_scale": global_scale_from_scale_2(input_scale),
    }


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="quantizing", unit="tensor", disable=not enabled)


def quantize_checkpoint(
    src_dir: str | os.PathLike,
    dst_dir: str | os.PathLike,
    fmt: Format = "modelopt",
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    progress: bool = True,
    input_amax: float = DEFAULT_INPUT_AMAX,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    device: str | None = None,
) -> ExportReport:
    """Quantize the linear layers of `src_dir` to NVFP4 and write a `fmt` checkpoint to `dst_dir`.

    `device` runs the quantizer there (default: cuda when available, else cpu); the CPU path
    manages a few million weights per second, so the full 35B-parameter model wants a GPU.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not input_amax > 0:
        raise ValueError(f"input_amax must be positive, got {input_amax}")
    src, dst = Path(src_dir), Path(dst_dir)
    if not (src / "config.json").exists():
        raise ValueError(f"{src} has no config.json; expected a Hugging Face checkpoint folder")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not empty; choose a new folder")
    files = _source_files(src)
    dst.mkdir(parents=True, exist_ok=True)
    input_scale = tensor_scale_from_amax(input_amax)
    writer = _ShardWriter(dst, max_shard_bytes)
    quantized, excluded = [], []
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            total += len(list(handle.keys()))
    with _progress(total, progress) as bar:
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    tensor = handle.get_tensor(name)
                    parts = _split_experts(name, tensor) if name.endswith(_FUSED_EXPERTS) else [(name, tensor)]
                    for part_name, part in parts:
                        module = part_name[: -len(".weight")] if part_name.endswith(".weight") else part_name
                        if not _quantizable(part_name, part):
                            if part_name.endswith(".weight") and part.ndim == 2:
                                excluded.append(module)  # a linear whose K is not a multiple of 16
                            writer.add(part_name, part)
                        elif _is_excluded(module, exclude) or not bool(part.any()):
                            excluded.append(module)
                            writer.add(part_name, part)
                        else:
                            for out_name, out in _quantized_tensors(module, part, fmt, input_scale, device).items():
                                writer.add(out_name, out)
                            quantized.append(module)
                    bar.update(1)
    shards = writer.finish()
    _write_metadata(src, dst, fmt, excluded)
    return ExportReport(fmt, tuple(quantized), tuple(excluded), tuple(shards), float(input_scale))


def _write_metadata(src: Path, dst: Path, fmt: str, excluded: list[str]) -> None:
    skip = {"config.json", "model.safetensors.index.json", "hf_quant_config.json"}
    for path in src.iterdir():
        if path.is_file() and path.name not in skip and path.suffix != ".safetensors":
            shutil.copy2(path, dst / path.name)
    config = json.loads((src / "config.json").read_text())
    if fmt == "modelopt":
        config["quantization_config"] = modelopt_quantization_config(excluded)
        (dst / "hf_quant_config.json").write_text(json.dumps(modelopt_hf_quant_config(excluded), indent=2) + "\n")
    else:
        config["quantization_config"] = compressed_tensors_quantization_config(excluded)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
