"""Match a checkpoint's tensors to the model's parameters before any data is read.

For every canonical parameter (`model.spec`), find the stored tensors and check their shapes and
dtypes from the safetensors headers. Linear formats are read per layer from the tensors:
dense (floating `weight`), ModelOpt NVFP4 (`weight` uint8 + `weight_scale` fp8 + `weight_scale_2`
[+ `input_scale`]), ModelOpt FP8 (`weight` float8_e4m3fn + `weight_scale`; dequantised on load) and
compressed-tensors NVFP4 (`weight_packed` + `weight_scale` + `weight_global_scale` [+ `input_global_scale`]).
Any mismatch raises CheckpointError naming the tensor and what was expected. A declared exclusion list
(ModelOpt `exclude_modules`, compressed-tensors `ignore`) that disagrees with the tensors only warns.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from reference_engine.checkpoint.files import CheckpointError, CheckpointFiles
from reference_engine.checkpoint.formats import QuantScheme
from reference_engine.config import ModelConfig
from reference_engine.model.spec import expected_parameters

PREFIXES = ("model.language_model.", "model.")
SKIPPED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")
SKIPPED_SUFFIXES = (".k_scale", ".v_scale", ".inv_freq")  # FP8 KV-cache scales (this engine keeps K/V in the model dtype)


@dataclass(frozen=True)
class LinearSource:
    module: str  # stored module name (no `.weight`)
    format: str  # "dense" | "nvfp4" | "fp8"
    tensors: dict[str, str]  # role -> stored tensor name
    global_scale_divisor: bool = False  # compressed-tensors: scale_2 = 1 / weight_global_scale


@dataclass(frozen=True)
class PlanItem:
    name: str  # canonical parameter name
    kind: str  # "tensor" | "linear" | "experts"
    tensor: str = ""  # stored name, for kind "tensor"
    linear: LinearSource | None = None
    fused_experts: tuple[str, str] = ()  # (gate_up_proj, down_proj) stored names
    expert_linears: tuple[tuple[LinearSource, LinearSource, LinearSource], ...] = ()  # per expert (gate, up, down)


def _expect(files: CheckpointFiles, name: str, shape: tuple[int, ...] | None, dtypes: tuple[torch.dtype, ...] | str, what: str) -> None:
    if name not in files:
        raise CheckpointError(f"missing tensor {name!r} ({what})")
    info = files.info(name)
    if shape is not None and info.shape != shape:
        if not (shape == () and info.shape in ((1,), ())):
            raise CheckpointError(f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)} ({what})")
    floating = dtypes == "floating"
    if floating and not (info.dtype.is_floating_point and info.dtype.itemsize >= 2):
        raise CheckpointError(f"tensor {name!r} has dtype {info.dtype}, expected a 16/32-bit floating dtype ({what})")
    if not floating and info.dtype not in dtypes:
        raise CheckpointError(f"tensor {name!r} has dtype {info.dtype}, expected one of {[str(d) for d in dtypes]} ({what})")


def plan_linear(files: CheckpointFiles, module: str, shape: tuple[int, int], scheme: QuantScheme) -> LinearSource:
    out_features, in_features = shape
    packed_shape, scale_shape = (out_features, in_features // 2), (out_features, in_features // 16)
    fp8 = (torch.float8_e4m3fn,)
    if module + ".weight_packed" in files:
        if scheme.kind != "compressed-tensors":
            raise CheckpointError(f"tensor {module + '.weight_packed'!r} is compressed-tensors NVFP4 but the checkpoint declares {scheme.kind!r}")
        what = "compressed-tensors NVFP4"
        _expect(files, module + ".weight_packed", packed_shape, (torch.uint8,), what)
        _expect(files, module + ".weight_scale", scale_shape, fp8, what)
        _expect(files, module + ".weight_global_scale", (), (torch.float32,), what)
        roles = {"weight_packed": module + ".weight_packed", "weight_scale": module + ".weight_scale", "weight_scale_2": module + ".weight_global_scale"}
        if module + ".input_global_scale" in files:
            _expect(files, module + ".input_global_scale", (), (torch.float32,), what)
            roles["input_scale"] = module + ".input_global_scale"
        source = LinearSource(module, "nvfp4", roles, global_scale_divisor=True)
    elif module + ".weight" not in files:
        raise CheckpointError(f"missing tensor {module + '.weight'!r} (linear of shape {list(shape)})")
    elif files.info(module + ".weight").dtype == torch.uint8:
        what = "ModelOpt NVFP4"
        if scheme.kind != "modelopt":
            raise CheckpointError(f"tensor {module + '.weight'!r} is packed uint8 (ModelOpt NVFP4) but the checkpoint declares {scheme.kind!r}")
        _expect(files, module + ".weight", packed_shape, (torch.uint8,), what)
        _expect(files, module + ".weight_scale", scale_shape, fp8, what)
        _expect(files, module + ".weight_scale_2", (), (torch.float32,), what)
        roles = {"weight_packed": module + ".weight", "weight_scale": module + ".weight_scale", "weight_scale_2": module + ".weight_scale_2"}
        if module + ".input_scale" in files:
            _expect(files, module + ".input_scale", (), (torch.float32,), what)
            roles["input_scale"] = module + ".input_scale"
        source = LinearSource(module, "nvfp4", roles)
    elif files.info(module + ".weight").dtype == torch.float8_e4m3fn:
        what = "FP8 weight with a per-tensor or per-channel weight_scale"
        _expect(files, module + ".weight", shape, fp8, what)
        _expect(files, module + ".weight_scale", None, (torch.float32, torch.bfloat16, torch.float16), what)
        if files.info(module + ".weight_scale").shape not in ((), (1,), (out_features,), (out_features, 1)):
            raise CheckpointError(
                f"tensor {module + '.weight_scale'!r} has shape {list(files.info(module + '.weight_scale').shape)}, expected [] or [{out_features}] (FP8 scale)"
            )
        source = LinearSource(module, "fp8", {"weight": module + ".weight", "weight_scale": module + ".weight_scale"})
    else:
        _expect(files, module + ".weight", shape, "floating", "dense linear")
        return LinearSource(module, "dense", {"weight": module + ".weight"})
    if scheme.is_excluded(module):  # the tensors decide; an over-broad exclusion pattern is only worth a warning
        warnings.warn(f"module {module!r} matches the checkpoint's exclusion list but its tensors are {source.format}; loading them as {source.format}", stacklevel=2)
    return source


def _prefix(files: CheckpointFiles) -> str:
    for prefix in PREFIXES:
        if prefix + "embed_tokens.weight" in files:
            return prefix
    raise CheckpointError("missing tensor 'model.language_model.embed_tokens.weight' (or 'model.embed_tokens.weight'): not a qwen3_5_moe checkpoint")


def plan_checkpoint(config: ModelConfig, files: CheckpointFiles, scheme: QuantScheme) -> list[PlanItem]:
    prefix = _prefix(files)
    items: list[PlanItem] = []
    for name, spec in expected_parameters(config).items():
        stored = name if name == "lm_head" else prefix + name
        if spec.kind == "tensor":
            _expect(files, stored, spec.shape, "floating", "parameter")
            items.append(PlanItem(name, "tensor", tensor=stored))
        elif spec.kind == "linear":
            items.append(PlanItem(name, "linear", linear=plan_linear(files, stored, spec.shape, scheme)))
        else:
            E, two_i, H = spec.shape
            I = two_i // 2
            if stored + ".gate_up_proj" in files:
                _expect(files, stored + ".gate_up_proj", (E, two_i, H), "floating", "fused experts, rows 0:I gate, I:2I up")
                _expect(files, stored + ".down_proj", (E, H, I), "floating", "fused experts")
                items.append(PlanItem(name, "experts", fused_experts=(stored + ".gate_up_proj", stored + ".down_proj")))
            else:
                per_expert = tuple(
                    (
                        plan_linear(files, f"{stored}.{j}.gate_proj", (I, H), scheme),
                        plan_linear(files, f"{stored}.{j}.up_proj", (I, H), scheme),
                        plan_linear(files, f"{stored}.{j}.down_proj", (H, I), scheme),
                    )
                    for j in range(E)
                )
                items.append(PlanItem(name, "experts", expert_linears=per_expert))
    _check_unexpected(config, files, items, prefix)
    return items


def _used_names(items: list[PlanItem]) -> set[str]:
    used: set[str] = set()
    for item in items:
        used.update([item.tensor, *item.fused_experts])
        linears = [item.linear] if item.linear else []
        linears += [linear for triple in item.expert_linears for linear in triple]
        for linear in linears:
            used.update(linear.tensors.values())
            used.add(linear.module + ".input_scale")  # FP8 layers may carry one; activations stay unquantised
    return used


def _check_unexpected(config: ModelConfig, files: CheckpointFiles, items: list[PlanItem], prefix: str) -> None:
    used = _used_names(items)
    unexpected = []
    for name in files.tensors:
        if name in used or name.startswith(SKIPPED_PREFIXES) or name.endswith(SKIPPED_SUFFIXES):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        unexpected.append(name)
    if unexpected:
        raise CheckpointError(
            f"unexpected tensor {unexpected[0]!r} ({len(unexpected)} in all) that the config does not account for "
            f"(num_hidden_layers={config.num_hidden_layers}, layer_types, num_experts={config.num_experts}); "
            "check that config.json matches the weights"
        )
