"""The comparison metrics on random data: each must pass what is within its bound and fail what is not."""

from __future__ import annotations

import pytest
import torch

from toolbox.documents.contract import Tolerance
from toolbox.harness.compare import compare, pick
from toolbox.harness.inputs import fill
from toolbox.harness.statuses import ContractError


@pytest.fixture
def reference() -> torch.Tensor:
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def test_rel_fro_uses_the_case_dtype_bound_then_default(reference: torch.Tensor) -> None:
    tolerance = Tolerance(metric="rel_fro", bound={"bfloat16": 1e-2, "default": 1e-6})
    as_bf16 = reference.to(torch.bfloat16)
    assert compare("o", as_bf16, reference, tolerance, "bfloat16").passed
    as_f32 = reference.to(torch.float32)
    assert compare("o", as_f32, reference, tolerance, "float32").passed
    # bf16 rounding is too much for the float32 (default) bound
    result = compare("o", as_bf16.float(), reference, tolerance, "float32")
    assert not result.passed and "rel_fro" in result.message


def test_rel_fro_value_is_the_frobenius_ratio(reference: torch.Tensor) -> None:
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    actual = (reference + 0.02 * noise).float()
    expected_ratio = float(torch.linalg.norm(actual.double() - reference) / torch.linalg.norm(reference))
    assert compare("o", actual, reference, Tolerance(metric="rel_fro", bound=expected_ratio * 1.01), "float32").passed
    assert not compare("o", actual, reference, Tolerance(metric="rel_fro", bound=expected_ratio * 0.99), "float32").passed


def test_max_abs_and_reported_errors(reference: torch.Tensor) -> None:
    actual = reference.clone().float()
    actual[3, 4] += 0.25
    result = compare("o", actual, reference, Tolerance(metric="max_abs", bound=0.2), "float32")
    assert not result.passed
    assert result.max_abs_error == pytest.approx(0.25, rel=1e-5)
    assert result.max_rel_error == pytest.approx(0.25 / float(reference.abs().max()), rel=1e-5)
    assert compare("o", actual, reference, Tolerance(metric="max_abs", bound=0.3), "float32").passed


def test_allclose_is_elementwise(reference: torch.Tensor) -> None:
    tolerance = Tolerance(metric="allclose", atol=1e-3, rtol={"float32": 1e-2, "default": 0.0})
    actual = (reference * 1.005).float()
    assert compare("o", actual, reference, tolerance, "float32").passed
    result = compare("o", actual, reference, tolerance, "float16")  # rtol 0 for other dtypes
    assert not result.passed and "outside atol" in result.message


def test_exact_float8_bitwise() -> None:
    values = torch.randn(128, generator=torch.Generator().manual_seed(9)) * 10
    reference = values.to(torch.float8_e4m3fn)
    actual = reference.clone()
    assert compare("s", actual, reference, Tolerance(metric="exact"), "float32").passed
    actual.view(torch.uint8)[5] ^= 1
    result = compare("s", actual, reference, Tolerance(metric="exact"), "float32")
    assert not result.passed and "1 of 128" in result.message


def test_exact_integer_is_the_default_for_integers() -> None:
    reference = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    actual = reference.to(torch.int32)
    assert compare("i", actual, reference, None, "float32").passed
    actual[0] += 1
    assert not compare("i", actual, reference, None, "float32").passed


def test_infinite_output_fails_where_reference_is_finite(reference: torch.Tensor) -> None:
    actual = reference.clone().float()
    actual[0, 0] = float("inf")
    result = compare("o", actual, reference, Tolerance(metric="max_abs", bound=1e9), "float32")
    assert not result.passed and "NaN/Inf" in result.message


def test_matching_nan_in_reference_is_allowed(reference: torch.Tensor) -> None:
    reference = reference.clone()
    reference[1, 1] = float("nan")
    actual = reference.clone().float()
    assert compare("o", actual, reference, Tolerance(metric="rel_fro", bound=1e-6), "float32").passed


def test_missing_dtype_bound_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="no entry for dtype 'float16'"):
        pick({"bfloat16": 1e-2}, "float16", "tolerance of 'o'")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32, torch.uint8, torch.bool])
def test_the_two_poison_patterns_differ_everywhere(dtype: torch.dtype) -> None:
    first, second = fill(torch.empty(16, dtype=dtype), 0), fill(torch.empty(16, dtype=dtype), 1)
    if dtype == torch.bool:
        assert (first != second).all()
    else:
        per_element = first.view(torch.uint8).reshape(16, -1) != second.view(torch.uint8).reshape(16, -1)
        assert per_element.any(dim=1).all()
    if dtype.is_floating_point:
        assert torch.isnan(first.float()).all() and torch.isfinite(second.float()).all()
