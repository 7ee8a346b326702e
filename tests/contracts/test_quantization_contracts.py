"""Quantization contracts: the engine passes every CPU case and error case; a perturbed reference and
known-wrong implementations fail."""

from __future__ import annotations

import pytest
import torch

import driver_quant as driver
from reference_engine.quant import e2m1, linear, nvfp4, swizzle

ENGINE = {
    "quantization/nvfp4-quantize": nvfp4.quantize_nvfp4_into,
    "quantization/nvfp4-dequantize": nvfp4.dequantize_nvfp4_into,
    "quantization/nvfp4-scale-swizzle": swizzle.swizzle_scales_into,
    "quantization/w4a16-linear": linear.w4a16_linear,
    "quantization/w4a4-linear": linear.w4a4_linear,
}
CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).cpu_cases()]
ERRORS = [(cid, error.name) for cid in ENGINE for error in driver.load(cid).contract.errors]


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_engine_passes(contract_id: str, case_name: str) -> None:
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("contract_id,error_name", ERRORS)
def test_engine_raises_on_bad_input(contract_id: str, error_name: str) -> None:
    loaded = driver.load(contract_id)
    error_case = next(e for e in loaded.contract.errors if e.name == error_name)
    outcome = driver.run_error_case(loaded, ENGINE[contract_id], error_case)
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_perturbed_reference_fails(contract_id: str, case_name: str) -> None:
    loaded = driver.load(contract_id)
    assert driver.perturbed(loaded, loaded.case(case_name)).status == "INCORRECT_NUMERICAL"


# ---- known-wrong implementations -------------------------------------------------------------


def _quantize_variant(encode=e2m1.encode_e2m1, pack=e2m1.pack_e2m1, min_scale=nvfp4.MIN_BLOCK_SCALE, reciprocal=False):
    """The engine's quantizer with one step replaced; DPS like the contract."""

    def implementation(weight, weight_packed, weight_scale, weight_scale_2):
        work = weight.float().view(weight.shape[0], -1, 16)
        scale_2 = weight.float().abs().amax() / 2688.0
        block = work.abs().amax(-1) / (6.0 * scale_2)
        block = torch.where(block == 0, torch.ones_like(block), block).clamp(min_scale, 448.0).to(torch.float8_e4m3fn)
        divisor = (block.float() * scale_2).unsqueeze(-1)
        scaled = work * (1.0 / divisor) if reciprocal else work / divisor
        weight_packed.copy_(pack(encode(scaled).view(weight.shape)))
        weight_scale.copy_(block)
        weight_scale_2.copy_(scale_2)

    return implementation


def _encode_round_half_up(values):
    magnitude = values.float().abs()
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    index = torch.bucketize(magnitude, midpoints, right=True)  # a tie always goes up
    return index.to(torch.uint8) | ((values < 0).to(torch.uint8) << 3)


def _pack_swapped(codes):
    return (codes[..., 0::2] << 4) | codes[..., 1::2]


def _dequantize_swapped_nibbles(weight_packed, weight_scale, weight_scale_2, out):
    swapped = (weight_packed << 4) | (weight_packed >> 4)
    out.copy_(nvfp4.dequantize_nvfp4(swapped, weight_scale, weight_scale_2, out.dtype))


def _dequantize_without_tensor_scale(weight_packed, weight_scale, weight_scale_2, out):
    out.copy_(nvfp4.dequantize_nvfp4(weight_packed, weight_scale, torch.tensor(1.0), out.dtype))


def _swizzle_row_groups_and_columns_swapped(scale, swizzled):
    rows, columns = scale.shape
    padded_rows, padded_columns = swizzle.padded_shape(rows, columns)
    padded = torch.zeros(padded_rows, padded_columns, dtype=torch.uint8)
    padded[:rows, :columns] = scale
    tiles = padded.view(padded_rows // 128, 4, 32, padded_columns // 4, 4).permute(0, 3, 2, 4, 1)  # (c % 4) * 4 + r // 32
    swizzled.copy_(tiles.reshape(-1))


def _swizzle_tiles_column_major(scale, swizzled):
    rows, columns = scale.shape
    padded_rows, padded_columns = swizzle.padded_shape(rows, columns)
    padded = torch.zeros(padded_rows, padded_columns, dtype=torch.uint8)
    padded[:rows, :columns] = scale
    tiles = padded.view(padded_rows // 128, 4, 32, padded_columns // 4, 4).permute(3, 0, 2, 1, 4)
    swizzled.copy_(tiles.reshape(-1))


def _w4a16_without_tensor_scale(x, weight_packed, weight_scale, weight_scale_2, out):
    return linear.w4a16_linear(x, weight_packed, weight_scale, torch.tensor(1.0), out)


def _w4a4_without_activation_quantisation(x, weight_packed, weight_scale, weight_scale_2, input_scale, out):
    return linear.w4a16_linear(x, weight_packed, weight_scale, weight_scale_2, out)


def _to_e4m3_not_saturating(values):
    """Like CUDA's non-saturating float -> e4m3 conversion: values beyond 448 (+ half a step) become NaN."""
    return torch.where(values > 464.0, torch.full_like(values, float("nan")), values).to(torch.float8_e4m3fn)


def _w4a4_without_448_clamp(x, weight_packed, weight_scale, weight_scale_2, input_scale, out):
    blocks = x.float().view(x.shape[0], -1, 16)
    scale = blocks.abs().amax(-1) / (6.0 * input_scale)
    scale = _to_e4m3_not_saturating(torch.where(scale == 0, torch.ones_like(scale), scale).clamp(min=2.0**-9))
    divisor = (scale.float() * input_scale).unsqueeze(-1)
    codes = e2m1.encode_e2m1(blocks / divisor)
    seen = e2m1.decode_e2m1(codes) * divisor
    weight = nvfp4.dequantize_nvfp4(weight_packed, weight_scale, weight_scale_2, torch.float32)
    out.copy_((seen.view(x.shape) @ weight.t()).to(out.dtype))


WRONG = {
    "quantize: round half up instead of ties to even": ("quantization/nvfp4-quantize", _quantize_variant(encode=_encode_round_half_up)),
    "quantize: nibbles swapped": ("quantization/nvfp4-quantize", _quantize_variant(pack=_pack_swapped)),
    "quantize: tiny scales clamped at 2^-6 (torchao's rule)": ("quantization/nvfp4-quantize", _quantize_variant(min_scale=2.0**-6)),
    "quantize: multiply by the reciprocal of the scale": ("quantization/nvfp4-quantize", _quantize_variant(reciprocal=True)),
    "dequantize: nibbles swapped": ("quantization/nvfp4-dequantize", _dequantize_swapped_nibbles),
    "dequantize: ignores weight_scale_2": ("quantization/nvfp4-dequantize", _dequantize_without_tensor_scale),
    "swizzle: row group and column swapped": ("quantization/nvfp4-scale-swizzle", _swizzle_row_groups_and_columns_swapped),
    "swizzle: tiles column-major": ("quantization/nvfp4-scale-swizzle", _swizzle_tiles_column_major),
    "w4a16: ignores weight_scale_2": ("quantization/w4a16-linear", _w4a16_without_tensor_scale),
    "w4a4: activations not quantised": ("quantization/w4a4-linear", _w4a4_without_activation_quantisation),
    "w4a4: block scale without the 448 clamp": ("quantization/w4a4-linear", _w4a4_without_448_clamp),
}


@pytest.mark.parametrize("label", sorted(WRONG))
def test_known_wrong_implementation_is_caught(label: str) -> None:
    contract_id, implementation = WRONG[label]
    loaded = driver.load(contract_id)
    statuses = {}
    for case in loaded.cpu_cases():  # small cases first; stop at the first that catches it
        statuses[case.name] = driver.run_case(loaded, implementation, case).status
        if statuses[case.name] != "PASSED":
            return
    raise AssertionError(f"{label}: passed every case {statuses}")


def test_exact_tie_cases_really_hold_ties() -> None:
    """Odd-seed quantize cases put scaled elements exactly on every E2M1 midpoint."""
    loaded = driver.load("quantization/nvfp4-quantize")
    for case in loaded.cpu_cases():
        if case.seed % 2 == 0:
            continue
        _, _, inputs = driver.make_case_inputs(loaded, case)
        weight = inputs["weight"]
        packed, scale, scale_2 = nvfp4.quantize_nvfp4(weight)
        scaled = weight.float().view(weight.shape[0], -1, 16) / (scale.float() * scale_2).unsqueeze(-1)
        for midpoint in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
            assert bool((scaled.abs() == midpoint).any()), (case.name, midpoint)
        assert bool((scale.float() == 2.0**-9).any()), (case.name, "no clamped tiny block")
        assert bool((scale.float() == 1.0).any()), (case.name, "no all-zero block")
