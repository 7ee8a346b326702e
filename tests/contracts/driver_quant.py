"""Contract driver for the quantization contracts: the shared `contract_driver`, with poison fills
that fit one-byte integer outputs (uint8 weight_packed, swizzled scales).

The shared driver fills integer outputs with -7 and 2**30 + 3, which uint8 cannot hold; here
integer outputs get two patterns inside the dtype's range (0xA5 / 0x5A for uint8), floating
outputs NaN (float8_e4m3fn has a NaN).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from contract_driver import (
    LoadedContract,
    Outcome,
    compare,
    expected_dtype,
    expected_shape,
    load,
    make_case_inputs,
    perturbed,
    resolve_axes,
    resolve_params,
    dtype_of,
)
from toolbox.documents.contract import Case, ErrorCase

__all__ = ["load", "make_case_inputs", "run_case", "run_error_case", "perturbed", "Outcome", "LoadedContract"]


def _fills(dtype: torch.dtype) -> tuple[float | int, float | int]:
    if dtype.is_floating_point:
        return float("nan"), float("nan")
    if dtype == torch.bool:
        return True, False
    info = torch.iinfo(dtype)
    return (0xA5 if info.max >= 0xA5 else info.max), 0x5A


def _allocate(loaded: LoadedContract, axes: dict, case_dtype: str, device: str, fill_index: int) -> dict:
    outputs = {}
    for name, spec in loaded.contract.outputs.items():
        if spec.aliases is None:
            dtype = expected_dtype(spec, case_dtype)
            tensor = torch.empty(expected_shape(loaded.contract, spec, axes), dtype=dtype, device=device)
            outputs[name] = tensor.fill_(_fills(dtype)[fill_index])
    return outputs


def run_case(loaded: LoadedContract, impl: Callable, case: Case, device: str = "cpu") -> Outcome:
    contract = loaded.contract
    if contract.interface == "custom":
        axes, params = resolve_axes(contract, case.axes), resolve_params(contract, case.params)
        generator = torch.Generator(device="cpu").manual_seed(case.seed)
        try:
            report = getattr(loaded.module, contract.run)(impl, axes, params, dtype_of(case.dtype), device, generator)
        except AssertionError as error:
            return Outcome("INCORRECT_NUMERICAL", str(error))
        except Exception as error:  # noqa: BLE001 - a crash of the implementation is its own status
            return Outcome("RUNTIME_ERROR", f"{type(error).__name__}: {error}")
        return Outcome("PASSED", str(report.get("message", "")))
    axes, params, inputs = make_case_inputs(loaded, case, device)
    expected = getattr(loaded.module, contract.reference)(**copy.deepcopy({k: v.cpu() for k, v in inputs.items()}), **params)
    results = []
    for fill_index in range(2):
        call_inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        outputs = _allocate(loaded, axes, case.dtype, device, fill_index)
        try:
            impl(**call_inputs, **outputs, **params)
        except Exception as error:  # noqa: BLE001
            return Outcome("RUNTIME_ERROR", f"{type(error).__name__}: {error}")
        for name, spec in contract.outputs.items():
            if spec.aliases is not None:
                outputs[name] = call_inputs[spec.aliases]
        results.append(outputs)
    for name in contract.outputs:
        first, second = results[0][name], results[1][name]
        if first.shape == second.shape and not torch.equal(first.view(torch.uint8) if first.element_size() == 1 else first, second.view(torch.uint8) if second.element_size() == 1 else second):
            if not (first.is_floating_point() and torch.isnan(first.float()).any()):
                return Outcome("UNWRITTEN_OUTPUT", f"{name}: differs between two poison patterns (entries left unwritten)")
    outcome = compare(loaded, case, axes, results[0], expected)
    if outcome.status == "PASSED":
        for invariant in contract.invariants:
            try:
                getattr(loaded.module, invariant)(inputs, results[0], params)
            except AssertionError as error:
                return Outcome("INCORRECT_NUMERICAL", f"invariant {invariant}: {error}", outcome.errors)
    return outcome


def run_error_case(loaded: LoadedContract, impl: Callable, error_case: ErrorCase, device: str = "cpu") -> Outcome:
    contract = loaded.contract
    axes, params, inputs = make_case_inputs(loaded, error_case, device)
    inputs, params = getattr(loaded.module, error_case.mutate)(inputs, params)
    outputs = _allocate(loaded, axes, error_case.dtype, device, 0)
    expected = tuple(getattr(__import__("builtins"), name) for name in error_case.raises)
    try:
        impl(**inputs, **outputs, **params)
    except expected as error:
        return Outcome("PASSED", f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001
        return Outcome("RUNTIME_ERROR", f"raised {type(error).__name__} instead of {error_case.raises}: {error}")
    return Outcome("MISSING_ERROR", f"no error for {error_case.name}")
