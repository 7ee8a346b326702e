"""A small local driver for contract documents, used by the contract tests until (and besides) `toolbox.harness`.

It follows the calling convention in `toolbox/documents/contract.py`: fresh seeded inputs from
`make_inputs`, outputs preallocated and poisoned (NaN for floats; two fill patterns for integer
outputs), `impl(**inputs, **outputs, **params)`, comparison with `reference` under the contract's
tolerance, error cases through `mutate`. It returns a status word (the names of DESIGN.md's
result records) so tests can assert that a known-wrong implementation gets the status it should.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import yaml

from toolbox.documents.contract import Case, Contract, ErrorCase
from toolbox.expressions import evaluate

CONTRACTS_ROOT = Path(__file__).resolve().parents[2] / "contracts"
INTEGER_FILLS = (-7, 2**30 + 3)


@dataclass(frozen=True)
class Outcome:
    status: str  # PASSED, INCORRECT_SHAPE, INCORRECT_DTYPE, INCORRECT_NUMERICAL, UNWRITTEN_OUTPUT, MISSING_ERROR, RUNTIME_ERROR
    message: str = ""
    errors: tuple[tuple[str, float], ...] = ()  # (output name, measured error in the tolerance's metric)


@dataclass(frozen=True)
class LoadedContract:
    contract: Contract
    module: ModuleType

    def case(self, name: str) -> Case:
        for case in self.contract.cases:
            if case.name == name:
                return case
        raise KeyError(f"{self.contract.id} has no case {name!r}")

    def cpu_cases(self) -> list[Case]:
        return [case for case in self.contract.cases if case.device == "cpu"]


def load(contract_id: str) -> LoadedContract:
    """Read contracts/<id>.yaml through the pydantic model and import the sibling .py by path."""
    yaml_path = CONTRACTS_ROOT / f"{contract_id}.yaml"
    contract = Contract.model_validate(yaml.safe_load(yaml_path.read_text()))
    if contract.id != contract_id:
        raise AssertionError(f"{yaml_path} declares id {contract.id!r}")
    py_path = yaml_path.with_suffix(".py")
    spec = importlib.util.spec_from_file_location(f"contract_{contract_id.replace('/', '_').replace('-', '_')}", py_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return LoadedContract(contract, module)


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def resolve_axes(contract: Contract, axes: dict[str, int]) -> dict[str, int]:
    values = {name: axis.value for name, axis in contract.axes.items() if axis.value is not None}
    values.update(axes)
    missing = [name for name in contract.axes if name not in values]
    if missing:
        raise AssertionError(f"{contract.id}: axes {missing} have no value in this case")
    return values


def resolve_params(contract: Contract, params: dict[str, Any]) -> dict[str, Any]:
    values = {name: spec.default for name, spec in contract.params.items() if spec.default is not None}
    values.update(params)
    return values


def make_case_inputs(loaded: LoadedContract, case: Case | ErrorCase, device: str = "cpu") -> tuple[dict, dict, dict]:
    contract = loaded.contract
    axes = resolve_axes(contract, case.axes)
    params = resolve_params(contract, case.params)
    generator = torch.Generator(device="cpu").manual_seed(case.seed)
    make = getattr(loaded.module, contract.make_inputs)
    inputs = make(axes, dict(params), dtype_of(case.dtype), device, generator)
    return axes, params, inputs


_PREPARED: dict[tuple[str, str, str], tuple[dict, dict, dict, dict]] = {}


def prepared(loaded: LoadedContract, case: Case, device: str = "cpu") -> tuple[dict, dict, dict, dict]:
    """(axes, params, inputs, expected) for a case, memoised: the float64 reference runs once per case.

    Callers get fresh clones of the inputs each time, so an implementation that writes its inputs
    cannot spoil later runs.
    """
    key = (loaded.contract.id, case.name, device)
    if key not in _PREPARED:
        axes, params, inputs = make_case_inputs(loaded, case, device)
        expected = getattr(loaded.module, loaded.contract.reference)(**{k: v.cpu().clone() for k, v in inputs.items()}, **params)
        _PREPARED[key] = (axes, params, inputs, expected)
    axes, params, inputs, expected = _PREPARED[key]
    return dict(axes), dict(params), {k: v.clone() for k, v in inputs.items()}, expected


def expected_shape(contract: Contract, spec, axes: dict[str, int]) -> tuple[int, ...]:
    return tuple(int(evaluate(dim, axes)) for dim in spec.shape)


def expected_dtype(spec, case_dtype: str) -> torch.dtype:
    return dtype_of(case_dtype if spec.dtype == "$dtype" else spec.dtype)


def _bound(value, case_dtype: str) -> float:
    if isinstance(value, dict):
        return float(value[case_dtype])
    return float(value)


def measure(tolerance, actual: torch.Tensor, expected: torch.Tensor, case_dtype: str) -> tuple[bool, float]:
    """(within tolerance, measured error) for one output; float64 arithmetic."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if tolerance is None or tolerance.metric == "exact":
        mismatches = int((a != e).sum())
        return mismatches == 0, float(mismatches)
    if tolerance.metric == "rel_fro":
        error = float(torch.linalg.vector_norm(a - e) / max(float(torch.linalg.vector_norm(e)), 1e-300))
        return error <= _bound(tolerance.bound, case_dtype), error
    if tolerance.metric == "max_abs":
        error = float((a - e).abs().max()) if a.numel() else 0.0
        return error <= _bound(tolerance.bound, case_dtype), error
    atol, rtol = _bound(tolerance.atol, case_dtype), _bound(tolerance.rtol, case_dtype)
    excess = (a - e).abs() - (atol + rtol * e.abs())
    error = float(excess.max()) if a.numel() else 0.0
    return error <= 0, error


def compare(loaded: LoadedContract, case: Case, axes: dict, outputs: dict, expected: dict) -> Outcome:
    """Check shapes, dtypes, NaN left behind and tolerances of `outputs` against the reference's `expected`."""
    contract = loaded.contract
    errors = []
    for name, spec in contract.outputs.items():
        actual = outputs[name]
        shape = expected_shape(contract, spec, axes)
        if tuple(actual.shape) != shape:
            return Outcome("INCORRECT_SHAPE", f"{name}: shape {tuple(actual.shape)}, expected {shape}")
        if actual.dtype != expected_dtype(spec, case.dtype):
            return Outcome("INCORRECT_DTYPE", f"{name}: dtype {actual.dtype}, expected {expected_dtype(spec, case.dtype)}")
        reference = expected[name]
        if actual.is_floating_point() and bool((torch.isnan(actual.cpu()) & ~torch.isnan(reference.cpu())).any()):
            return Outcome("UNWRITTEN_OUTPUT", f"{name}: NaN left where the reference has a number")
        ok, error = measure(contract.tolerance.get(name), actual, reference, case.dtype)
        errors.append((name, error))
        if not ok:
            return Outcome("INCORRECT_NUMERICAL", f"{name}: error {error:.3g} beyond tolerance", tuple(errors))
    return Outcome("PASSED", "", tuple(errors))


def _allocate(loaded: LoadedContract, axes: dict, case: Case, inputs: dict, device: str, fill_index: int) -> dict:
    outputs = {}
    for name, spec in loaded.contract.outputs.items():
        if spec.aliases is not None:
            continue
        dtype = expected_dtype(spec, case.dtype)
        tensor = torch.empty(expected_shape(loaded.contract, spec, axes), dtype=dtype, device=device)
        tensor.fill_(float("nan") if dtype.is_floating_point else INTEGER_FILLS[fill_index])
        outputs[name] = tensor
    return outputs


def run_case(loaded: LoadedContract, impl: Callable, case: Case, device: str = "cpu") -> Outcome:
    """Run one case of a dps contract (or the `run` driver of a custom one) and judge it."""
    contract = loaded.contract
    if contract.interface == "custom":
        axes = resolve_axes(contract, case.axes)
        params = resolve_params(contract, case.params)
        generator = torch.Generator(device="cpu").manual_seed(case.seed)
        try:
            report = getattr(loaded.module, contract.run)(impl, axes, params, dtype_of(case.dtype), device, generator)
        except AssertionError as error:
            return Outcome("INCORRECT_NUMERICAL", str(error))
        except Exception as error:  # noqa: BLE001 - any crash of the implementation is its own status
            return Outcome("RUNTIME_ERROR", f"{type(error).__name__}: {error}")
        return Outcome("PASSED", str(report.get("message", "")))
    axes, params, inputs, expected = prepared(loaded, case, device)
    integer_outputs = any(not expected_dtype(s, case.dtype).is_floating_point for s in contract.outputs.values())
    results = []
    for fill_index in range(2 if integer_outputs else 1):
        call_inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        outputs = _allocate(loaded, axes, case, call_inputs, device, fill_index)
        try:
            impl(**call_inputs, **outputs, **params)
        except Exception as error:  # noqa: BLE001
            return Outcome("RUNTIME_ERROR", f"{type(error).__name__}: {error}")
        for name, spec in contract.outputs.items():
            if spec.aliases is not None:
                outputs[name] = call_inputs[spec.aliases]
        results.append(outputs)
    if len(results) == 2:
        for name in contract.outputs:
            if not torch.equal(results[0][name], results[1][name]):
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
    outputs = {}
    for name, spec in ([] if contract.interface == "custom" else contract.outputs.items()):  # custom: run's business
        if spec.aliases is None:
            dtype = expected_dtype(spec, error_case.dtype)
            outputs[name] = torch.full(expected_shape(contract, spec, axes), float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=device)
    expected = tuple(getattr(__import__("builtins"), name) for name in error_case.raises)
    try:
        impl(**inputs, **outputs, **params)
    except expected as error:
        return Outcome("PASSED", f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001
        return Outcome("RUNTIME_ERROR", f"raised {type(error).__name__} instead of {error_case.raises}: {error}")
    return Outcome("MISSING_ERROR", f"no error for {error_case.name}")


def perturbed(loaded: LoadedContract, case: Case, relative_noise: float = 0.01, seed: int = 1234) -> Outcome:
    """Judge the reference's own output with 1% relative Gaussian noise (floats) or one element changed (integers)."""
    axes, params, inputs, expected = prepared(loaded, case)
    generator = torch.Generator().manual_seed(seed)
    noisy = {}
    for name, spec in loaded.contract.outputs.items():
        dtype = expected_dtype(spec, case.dtype)
        value = expected[name].double()
        if dtype.is_floating_point:
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float64)
            noisy[name] = (value * (1 + relative_noise * noise)).to(dtype)
        else:
            changed = value.clone().flatten()
            changed[int(torch.randint(changed.numel(), (1,), generator=generator))] += 1
            noisy[name] = changed.view(value.shape).to(dtype)
    return compare(loaded, case, axes, noisy, expected)


def rounded_reference(loaded: LoadedContract, case: Case) -> Outcome:
    """Judge the reference's output rounded to the output dtypes: the floor any implementation pays."""
    axes, params, inputs, expected = prepared(loaded, case)
    rounded = {name: expected[name].to(expected_dtype(spec, case.dtype)) for name, spec in loaded.contract.outputs.items()}
    return compare(loaded, case, axes, rounded, expected)

