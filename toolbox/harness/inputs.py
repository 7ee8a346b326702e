"""Binding a case to concrete values: axes, params, dtypes, shapes; fresh seeded inputs; output buffers."""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from toolbox.documents.contract import CASE_DTYPE, Contract, TensorSpec
from toolbox.expressions import ExpressionError, evaluate
from toolbox.harness.loading import LoadedContract
from toolbox.harness.statuses import ContractError


@dataclass(frozen=True)
class Binding:
    """The concrete values one case (or error case, or benchmark) runs with."""

    axes: dict[str, int]
    params: dict[str, Any]
    dtype: torch.dtype
    device: str
    seed: int


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ContractError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_axes(contract: Contract, overrides: Mapping[str, int], where: str) -> dict[str, int]:
    """Defaults from `axes.<name>.value`, overridden by the case; every axis must be bound."""
    unknown = sorted(set(overrides) - set(contract.axes))
    if unknown:
        raise ContractError(f"{where} sets axes {', '.join(unknown)}, which {contract.id} does not declare")
    axes = {name: axis.value for name, axis in contract.axes.items() if axis.value is not None}
    axes.update(overrides)
    unbound = sorted(set(contract.axes) - set(axes))
    if unbound:
        raise ContractError(f"{where} leaves axes {', '.join(unbound)} unbound (give them in the case's `axes`)")
    return axes


def expression_env(axes: Mapping[str, int], params: Mapping[str, Any]) -> dict[str, int | float]:
    """Names an expression (shape, constraint, roofline) may use: numeric params, then axes (axes win)."""
    env: dict[str, int | float] = {
        name: value for name, value in params.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    env.update(axes)
    return env


def check_constraints(contract: Contract, env: Mapping[str, int | float], where: str) -> None:
    for constraint in contract.constraints:
        try:
            holds = evaluate(constraint, env)
        except ExpressionError as error:
            raise ContractError(f"constraint {constraint!r} cannot be evaluated for {where}: {error}") from None
        if not holds:
            shown = {k: v for k, v in env.items() if k in constraint}
            raise ContractError(f"{where} violates constraint {constraint!r} with {shown}")


def resolve_params(contract: Contract, overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(contract.params))
    if unknown:
        raise ContractError(f"{where} sets params {', '.join(unknown)}, which {contract.id} does not declare")
    params = {name: spec.default for name, spec in contract.params.items()}
    params.update(overrides)
    missing = sorted(name for name, value in params.items() if value is None)
    if missing:
        raise ContractError(f"{where} leaves params {', '.join(missing)} without a value (no default, not set by the case)")
    return params


def bind(
    contract: Contract, axes: Mapping[str, int], params: Mapping[str, Any], dtype: str, device: str, seed: int, where: str,
    constraints: bool = True,
) -> Binding:
    """Resolve a case. Error cases pass `constraints=False`: their params may be invalid on purpose."""
    bound_axes, bound_params = resolve_axes(contract, axes, where), resolve_params(contract, params, where)
    if constraints:
        check_constraints(contract, expression_env(bound_axes, bound_params), where)
    return Binding(bound_axes, bound_params, torch_dtype(dtype), device, seed)


def spec_shape(spec: TensorSpec, binding: Binding, name: str) -> tuple[int, ...]:
    axes = expression_env(binding.axes, binding.params)
    shape = []
    for entry in spec.shape:
        try:
            value = evaluate(entry, axes)
        except ExpressionError as error:
            raise ContractError(f"shape of {name!r}: {error}") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ContractError(f"shape of {name!r}: {entry!r} gives {value!r}, not a size")
        shape.append(value)
    return tuple(shape)


def spec_dtype(spec: TensorSpec, case_dtype: torch.dtype) -> torch.dtype:
    return case_dtype if spec.dtype == CASE_DTYPE else torch_dtype(spec.dtype)


def generator_for(binding: Binding) -> torch.Generator:
    """A CPU generator seeded with the case's seed, whatever the case's device: make_inputs draws on the CPU
    and moves the tensors to `device`, so one seed gives the same inputs on every device (every contract
    in contracts/ is written this way; a few draw on `generator.device`, which also works)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(binding.seed)
    return generator


def make_inputs(loaded: LoadedContract, binding: Binding) -> dict[str, torch.Tensor]:
    """Call the contract's make_inputs and check it returned every declared input with its shape, dtype and device."""
    function = loaded.function(loaded.contract.make_inputs)
    try:
        inputs = function(dict(binding.axes), dict(binding.params), binding.dtype, binding.device, generator_for(binding))
    except Exception as error:
        text = traceback.format_exception_only(type(error), error)[-1].strip()
        hint = ""
        if "generator" in text and "device" in text:
            hint = " (the generator is a CPU generator: draw on the CPU, then move the tensors with .to(device))"
        raise ContractError(f"make_inputs raised {text}{hint}") from None
    if not isinstance(inputs, dict):
        raise ContractError(f"make_inputs of {loaded.id} returned {type(inputs).__name__}, not a dict")
    check_tensors(loaded.contract.inputs, inputs, binding, "make_inputs", strict_names=True)
    return inputs


def check_tensors(specs: Mapping[str, TensorSpec], tensors: Mapping[str, Any], binding: Binding, what: str, strict_names: bool) -> None:
    missing = sorted(set(specs) - set(tensors))
    extra = sorted(set(tensors) - set(specs))
    if missing or (strict_names and extra):
        raise ContractError(f"{what} returned names {sorted(tensors)}; declared {sorted(specs)} (missing {missing}, extra {extra})")
    for name, spec in specs.items():
        tensor = tensors[name]
        if not isinstance(tensor, torch.Tensor):
            raise ContractError(f"{what}: {name!r} is {type(tensor).__name__}, not a tensor")
        shape, dtype = spec_shape(spec, binding, name), spec_dtype(spec, binding.dtype)
        if tuple(tensor.shape) != shape:
            raise ContractError(f"{what}: {name!r} has shape {tuple(tensor.shape)}, declared {shape} ({spec.shape})")
        if tensor.dtype != dtype:
            raise ContractError(f"{what}: {name!r} has dtype {dtype_name(tensor.dtype)}, declared {dtype_name(dtype)}")
        if tensor.device.type != torch.device(binding.device).type:
            raise ContractError(f"{what}: {name!r} is on {tensor.device}, the case runs on {binding.device}")


def clone_all(tensors: Mapping[str, torch.Tensor], device: str | None = None) -> dict[str, torch.Tensor]:
    return {name: (t.detach().to(device).clone() if device else t.detach().clone()) for name, t in tensors.items()}


def is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def fill(buffer: torch.Tensor, pattern: int) -> torch.Tensor:
    """Poison a buffer in place. Floating: pattern 0 -> NaN, 1 -> the dtype's largest finite value.
    Integer and bool: pattern 0 -> the dtype's max (True), 1 -> its min (False)."""
    if buffer.dtype == torch.bool:
        buffer.fill_(pattern == 0)
    elif is_floating(buffer.dtype):
        if pattern == 0:
            if buffer.dtype == torch.float8_e4m3fn:
                buffer.view(torch.uint8).fill_(0x7F)
            else:
                buffer.fill_(float("nan"))
        else:
            buffer.fill_(torch.finfo(buffer.dtype).max)
    else:
        info = torch.iinfo(buffer.dtype)
        buffer.fill_(info.max if pattern == 0 else info.min)
    return buffer


def allocate_outputs(loaded: LoadedContract, binding: Binding, pattern: int) -> dict[str, torch.Tensor]:
    """Fresh poisoned buffers for every non-aliased output."""
    outputs = {}
    for name, spec in loaded.contract.outputs.items():
        if spec.aliases is not None:
            continue
        shape, dtype = spec_shape(spec, binding, name), spec_dtype(spec, binding.dtype)
        outputs[name] = fill(torch.empty(shape, dtype=dtype, device=binding.device), pattern)
    return outputs


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (bitwise comparisons that treat NaN == NaN and work for float8)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))
