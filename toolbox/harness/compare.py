"""Comparing one implementation output with the reference output under the contract's tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.documents.contract import Tolerance
from toolbox.harness.inputs import bits, dtype_name
from toolbox.harness.statuses import ContractError

# Used when a contract gives no tolerance for a floating output (DESIGN section 6: bf16 about 1e-2, float32 1e-5).
DEFAULT_REL_FRO = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


@dataclass(frozen=True)
class Comparison:
    passed: bool
    message: str
    max_abs_error: float | None
    max_rel_error: float | None  # max |a - b| / max |b|


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    name = dtype_name(dtype)
    if name in DEFAULT_REL_FRO:
        return Tolerance(metric="rel_fro", bound=DEFAULT_REL_FRO[name], description="harness default")
    return Tolerance(metric="exact", description="harness default")


def pick(value: float | dict[str, float] | None, case_dtype: str, what: str) -> float:
    """A bound that may be per dtype: the case dtype's key, else `default`."""
    if isinstance(value, dict):
        if case_dtype in value:
            return float(value[case_dtype])
        if "default" in value:
            return float(value["default"])
        raise ContractError(f"{what} has no entry for dtype {case_dtype!r} and no `default` (keys: {sorted(value)})")
    if value is None:
        raise ContractError(f"{what} is missing")
    return float(value)


def error_sizes(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Max absolute and max relative (to max |reference|) error over positions where both are finite."""
    a, b = actual.to(torch.float64), expected.to(torch.float64)
    mask = torch.isfinite(a) & torch.isfinite(b)
    if not bool(mask.any()):
        return 0.0, 0.0
    diff = (a - b).abs()[mask]
    max_abs = float(diff.max())
    scale = float(b.abs()[mask].max())
    return max_abs, (max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf")))


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance | None, case_dtype: str) -> Comparison:
    """`actual` (on the CPU, the implementation's dtype) against `expected` (the reference, any dtype)."""
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    if tuple(expected.shape) != tuple(actual.shape):
        raise ContractError(f"reference output {name!r} has shape {tuple(expected.shape)}, the contract declares {tuple(actual.shape)}")
    tolerance = tolerance or default_tolerance(actual.dtype)
    what = f"tolerance of {name!r}"
    max_abs, max_rel = (None, None) if actual.dtype == torch.bool else error_sizes(actual, expected)
    if tolerance.metric == "exact":
        target = expected if expected.dtype == actual.dtype else expected.to(actual.dtype)
        if torch.equal(bits(actual), bits(target)):
            return Comparison(True, "", max_abs, max_rel)
        count = int((bits(actual).reshape(actual.numel(), -1) != bits(target).reshape(actual.numel(), -1)).any(dim=1).sum()) if actual.numel() else 0
        return Comparison(False, f"{name}: {count} of {actual.numel()} elements differ from the reference (exact)", max_abs, max_rel)

    a, b = actual.to(torch.float64), expected.to(torch.float64)
    bad = ~torch.isfinite(a) & torch.isfinite(b)
    if bool(bad.any()):
        return Comparison(False, f"{name}: NaN/Inf at {int(bad.sum())} positions where the reference is finite", max_abs, max_rel)
    both = torch.isfinite(a) & torch.isfinite(b)
    mismatched_nonfinite = ~both & ~torch.isfinite(b) & ~(torch.isnan(a) & torch.isnan(b)) & (a != b)
    if bool(mismatched_nonfinite.any()):
        return Comparison(False, f"{name}: {int(mismatched_nonfinite.sum())} non-finite reference values not matched", max_abs, max_rel)
    a, b = a[both], b[both]

    if tolerance.metric == "rel_fro":
        bound = pick(tolerance.bound, case_dtype, what)
        norm = float(torch.linalg.vector_norm(b))
        err = float(torch.linalg.vector_norm(a - b))
        value = err / norm if norm > 0 else err
        ok = value <= bound
        return Comparison(ok, "" if ok else f"{name}: rel_fro {value:.3e} > {bound:.3e}", max_abs, max_rel)
    if tolerance.metric == "max_abs":
        bound = pick(tolerance.bound, case_dtype, what)
        value = max_abs or 0.0
        ok = value <= bound
        return Comparison(ok, "" if ok else f"{name}: max_abs {value:.3e} > {bound:.3e}", max_abs, max_rel)
    atol, rtol = pick(tolerance.atol, case_dtype, what + " (atol)"), pick(tolerance.rtol, case_dtype, what + " (rtol)")
    outside = (a - b).abs() > atol + rtol * b.abs()
    count = int(outside.sum())
    ok = count == 0
    message = "" if ok else f"{name}: {count} of {a.numel()} elements outside atol {atol:.1e} + rtol {rtol:.1e} * |ref|"
    return Comparison(ok, message, max_abs, max_rel)
