"""Running one case of a contract against one implementation, in the current process.

`execute(loaded, kind, name, impl)` is what the isolated child calls; it never raises for a wrong
implementation: every failure becomes an `Outcome` with its status.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import torch

from toolbox.documents.contract import ErrorCase
from toolbox.harness.compare import compare
from toolbox.harness.inputs import (
    Binding,
    allocate_outputs,
    bind,
    bits,
    bitwise_equal,
    clone_all,
    dtype_name,
    generator_for,
    make_inputs,
    spec_dtype,
    spec_shape,
)
from toolbox.harness.loading import LoadedContract
from toolbox.harness.outcome import Outcome, last_line
from toolbox.harness.statuses import ContractError, Status


class _Failed(Exception):
    """Internal: stop checking a case with this outcome."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def execute(loaded: LoadedContract, kind: str, name: str, impl: Callable, device: str | None = None) -> Outcome:
    """Run case (kind "case") or error case (kind "error") `name`; `device` overrides an error case's device."""
    contract = loaded.contract
    binding: Binding | None = None
    try:
        if kind == "case":
            case = next(c for c in contract.cases if c.name == name)
            binding = bind(contract, case.axes, case.params, case.dtype, case.device, case.seed, f"case {name!r}")
            return _finish(_run_custom(loaded, binding, impl) if contract.interface == "custom" else _run_dps(loaded, binding, impl), binding)
        error_case = next(e for e in contract.errors if e.name == name)
        binding = bind(contract, error_case.axes, error_case.params, error_case.dtype, device or "cpu", error_case.seed, f"error case {name!r}", constraints=False)
        return _finish(_run_error_case(loaded, error_case, binding, impl), binding)
    except StopIteration:
        return Outcome(Status.RUNTIME_ERROR, f"{contract.id} has no {kind} named {name!r}")
    except ContractError as error:
        return _finish(Outcome(Status.RUNTIME_ERROR, f"contract bug in {contract.id}: {error}"), binding)
    except _Failed as failed:
        return _finish(Outcome(failed.status, failed.message), binding)


def _finish(outcome: Outcome, binding: Binding | None) -> Outcome:
    if binding is None:
        return outcome
    return Outcome(outcome.status, outcome.message, outcome.max_abs_error, outcome.max_rel_error, dict(binding.axes), dtype_name(binding.dtype), binding.device)


def _call(impl: Callable, kwargs: dict[str, Any]) -> Any:
    try:
        return impl(**kwargs)
    except Exception as error:
        raise _Failed(Status.RUNTIME_ERROR, f"implementation raised {last_line(error)}") from None


def _reference(loaded: LoadedContract, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
    function = loaded.function(loaded.contract.reference)
    try:
        result = function(**clone_all(inputs, "cpu"), **params)
    except Exception as error:
        raise ContractError(f"reference raised {last_line(error)}") from None
    if not isinstance(result, dict) or not set(loaded.contract.outputs) <= set(result):
        got = sorted(result) if isinstance(result, dict) else type(result).__name__
        raise ContractError(f"reference returned {got}; expected every output {sorted(loaded.contract.outputs)}")
    return result


def _dps_call(loaded: LoadedContract, binding: Binding, impl: Callable, inputs: dict[str, torch.Tensor], pattern: int):
    """One call on fresh clones of the inputs and fresh poisoned outputs; returns (call inputs, outputs by output name, returned)."""
    call_inputs = clone_all(inputs)
    buffers = allocate_outputs(loaded, binding, pattern)
    returned = _call(impl, {**call_inputs, **buffers, **binding.params})
    outputs = {}
    for name, spec in loaded.contract.outputs.items():
        outputs[name] = call_inputs[spec.aliases] if spec.aliases is not None else buffers[name]
    return call_inputs, outputs, returned


def _run_dps(loaded: LoadedContract, binding: Binding, impl: Callable) -> Outcome:
    contract = loaded.contract
    inputs = make_inputs(loaded, binding)
    reference = _reference(loaded, inputs, binding.params)
    for name, spec in contract.outputs.items():
        declared = spec_shape(spec, binding, name)
        if tuple(reference[name].shape) != declared:
            raise ContractError(f"reference output {name!r} has shape {tuple(reference[name].shape)}, declared {declared} ({spec.shape})")
    call_inputs, outputs, returned = _dps_call(loaded, binding, impl, inputs, pattern=0)
    if binding.device == "cuda":
        torch.cuda.synchronize()

    for name, spec in contract.outputs.items():
        expected = spec_shape(spec, binding, name)
        if tuple(outputs[name].shape) != expected:
            raise _Failed(Status.INCORRECT_SHAPE, f"{name}: shape {tuple(outputs[name].shape)} after the call, expected {expected}")
    for name, spec in contract.outputs.items():
        expected_dtype = spec_dtype(spec, binding.dtype)
        if outputs[name].dtype != expected_dtype:
            raise _Failed(Status.INCORRECT_DTYPE, f"{name}: dtype {dtype_name(outputs[name].dtype)} after the call, expected {dtype_name(expected_dtype)}")

    _check_unwritten(loaded, binding, impl, inputs, outputs, reference, returned)

    for name in contract.inputs:
        aliased = any(spec.aliases == name for spec in contract.outputs.values())
        if not aliased and not bitwise_equal(call_inputs[name], inputs[name]):
            raise _Failed(Status.INCORRECT_NUMERICAL, f"mutated input {name} (it is not an output; the implementation must not write it)")

    case_dtype = dtype_name(binding.dtype)
    max_abs, max_rel, failures = {}, {}, []
    for name in contract.outputs:
        result = compare(name, outputs[name], reference[name], contract.tolerance.get(name), case_dtype)
        max_abs[name], max_rel[name] = result.max_abs_error, result.max_rel_error
        if not result.passed:
            failures.append(result.message)
    if failures:
        return Outcome(Status.INCORRECT_NUMERICAL, "; ".join(failures), max_abs, max_rel)

    for invariant in contract.invariants:
        function = loaded.function(invariant)
        try:
            function(clone_all(inputs), outputs, dict(binding.params))
        except AssertionError as error:
            return Outcome(Status.INCORRECT_NUMERICAL, f"invariant {invariant} failed: {error}", max_abs, max_rel)
        except Exception as error:
            raise ContractError(f"invariant {invariant} raised {last_line(error)}") from None
    return Outcome(Status.PASSED, "", max_abs, max_rel)


def _check_unwritten(loaded, binding, impl, inputs, outputs, reference, returned) -> None:
    """NaN-poisoned floats still NaN (and not NaN when poisoned differently) where the reference is not NaN;
    integer outputs that differ between two runs with different fill patterns."""
    poisoned = [name for name, spec in loaded.contract.outputs.items() if spec.aliases is None]
    floating = [n for n in poisoned if outputs[n].dtype.is_floating_point]
    integer = [n for n in poisoned if not outputs[n].dtype.is_floating_point]
    suspicious = {}
    for name in floating:
        nan = torch.isnan(outputs[name].detach().cpu().float()) & ~torch.isnan(reference[name].detach().cpu().float())
        if bool(nan.any()):
            suspicious[name] = nan
    if not suspicious and not integer:
        return
    _, second, _ = _dps_call(loaded, binding, impl, inputs, pattern=1)
    hint = " (the implementation returned a value: destination-passing implementations write into the given outputs)" if returned is not None else ""
    for name, nan in suspicious.items():
        still = nan & ~torch.isnan(second[name].detach().cpu().float())
        if bool(still.any()):
            raise _Failed(Status.UNWRITTEN_OUTPUT, f"{name}: {int(still.sum())} of {still.numel()} elements left unwritten (still poisoned){hint}")
    for name in integer:
        a, b = outputs[name].detach().cpu(), second[name].detach().cpu()
        width = max(1, a.element_size()) if a.dtype != torch.bool else 1
        differs = (bits(a).reshape(-1, width) != bits(b).reshape(-1, width)).any(dim=1) if a.numel() else torch.zeros(0, dtype=torch.bool)
        if bool(differs.any()):
            raise _Failed(
                Status.UNWRITTEN_OUTPUT,
                f"{name}: {int(differs.sum())} of {a.numel()} elements differ between two runs with different fill patterns "
                f"(left unwritten, or not deterministic){hint}",
            )


def _run_custom(loaded: LoadedContract, binding: Binding, impl: Callable) -> Outcome:
    run = loaded.function(loaded.contract.run or "run")
    try:
        result = run(impl, dict(binding.axes), dict(binding.params), binding.dtype, binding.device, generator_for(binding))
    except AssertionError as error:
        return Outcome(Status.INCORRECT_NUMERICAL, str(error) or "assertion failed")
    except Exception as error:
        return Outcome(Status.RUNTIME_ERROR, f"raised {last_line(error)}")
    if not isinstance(result, dict):
        raise ContractError(f"run returned {type(result).__name__}, not a dict")
    return Outcome(Status.PASSED, str(result.get("message", "")), _per_output(result.get("max_abs_error")), _per_output(result.get("max_rel_error")))


def _per_output(value: Any) -> dict[str, float | None]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): (None if v is None else float(v)) for k, v in value.items()}
    return {"result": float(value)}


def _run_error_case(loaded: LoadedContract, error_case: ErrorCase, binding: Binding, impl: Callable) -> Outcome:
    contract = loaded.contract
    inputs = make_inputs(loaded, binding)
    mutate = loaded.function(error_case.mutate)
    try:
        inputs, params = mutate(clone_all(inputs), dict(binding.params))
    except Exception as error:
        raise ContractError(f"mutate function {error_case.mutate} raised {last_line(error)}") from None
    outputs = allocate_outputs(loaded, binding, pattern=0) if contract.interface == "dps" else {}
    expected = tuple(getattr(builtins, name) for name in error_case.raises)
    try:
        impl(**inputs, **outputs, **params)
    except expected as error:
        return Outcome(Status.PASSED, f"raised {last_line(error)}")
    except Exception as error:
        return Outcome(Status.MISSING_ERROR, f"raised {last_line(error)}, expected one of {', '.join(error_case.raises)}")
    return Outcome(Status.MISSING_ERROR, f"did not raise; expected one of {', '.join(error_case.raises)} ({error_case.description})")

