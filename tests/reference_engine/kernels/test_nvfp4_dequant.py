"""Triton NVFP4 dequantisation (quantization/nvfp4-dequantize) and the prefill linear built on it
(`nvfp4_dequant.dequant_matmul`, behind `nvfp4_gemv.w4a16_linear` from `MIN_TOKENS`): CPU (interpreter) and CUDA."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "quantization/nvfp4-dequantize"
IMPL = "reference_engine.kernels.nvfp4_dequant:dequantize_nvfp4_into"
CPU_CASES = ["small-f32", "small-bf16", "rect-f32", "scale-block-count", "scale-not-fp8", "packed-not-uint8"]
WRONG = ["dequant_high_nibble_first", "dequant_scale_per_32"]
WRONG_CASES = ["rect-f32"]
CAUGHT = {"INCORRECT_NUMERICAL"}

# The linear through the dequantised copy: bfloat16 tokens from MIN_TOKENS take it (the tensor-core GEMM below), against
# the float32 torch op, with one tensor scale and with one per row (stacked linears), N and K not multiples of the tiles;
# the copy itself against the torch dequantisation rounded to bfloat16 (equal but for a rounding of the tensor scale
# product, at most one bfloat16 ulp). Outputs poisoned with NaN.
SCRIPT = """
import torch
from reference_engine.kernels import nvfp4_dequant, nvfp4_gemv
from reference_engine.quant.linear import w4a16_linear, w4a16_linear_rows
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

g = torch.Generator().manual_seed(21)
N, K, M = 40, 288, 70
packed, scale, scale_2 = quantize_nvfp4(torch.randn(N, K, generator=g) * 0.3)
rows = torch.rand(N, generator=g) + 0.5
copy = torch.full((N, K), float("nan"), dtype=torch.bfloat16)
nvfp4_dequant.launch_dequant(packed, scale, rows, copy)
exact = dequantize_nvfp4(packed, scale, torch.ones(()), torch.float64) * rows[:, None].double()
ulps = ((copy.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max()
assert torch.isfinite(copy.float()).all() and ulps <= 2.0**-8, float(ulps)

def rel(out, expected):
    assert torch.isfinite(out.float()).all(), "unwritten (NaN) output"
    return float((out.double() - expected.double()).norm() / expected.double().norm())

x = torch.randn(M, K, generator=g).bfloat16()
for name, op, s2 in (("tensor scale", w4a16_linear, scale_2), ("row scales", w4a16_linear_rows, rows)):
    expected = torch.empty(M, N, dtype=torch.bfloat16)
    op(x, packed, scale, s2, expected)
    results = {}
    for min_tokens in (None, 64):
        nvfp4_dequant.MIN_TOKENS = min_tokens
        calls = []
        real = nvfp4_dequant.dequant_matmul
        nvfp4_dequant.dequant_matmul = lambda *a, **k: calls.append(1) or real(*a, **k)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        (nvfp4_gemv.w4a16_linear if op is w4a16_linear else nvfp4_gemv.w4a16_linear_rows)(x, packed, scale, s2, out)
        nvfp4_dequant.dequant_matmul = real
        assert len(calls) == (min_tokens is not None), (name, min_tokens, calls)
        results[min_tokens] = rel(out, expected)
    print(name, results)
    assert results[64] < 5e-3 and results[None] < 5e-3, (name, results)
nvfp4_dequant.MIN_TOKENS = 64
few = torch.full((8, N), float("nan"), dtype=torch.bfloat16)  # 8 tokens: below MIN_TOKENS, the GEMV
nvfp4_gemv.w4a16_linear(x[:8], packed, scale, scale_2, few)
assert rel(few, w4a16_linear(x[:8], packed, scale, scale_2, torch.empty(8, N, dtype=torch.bfloat16))) < 5e-3

# CACHE: the first call keeps the copy, the second reuses it (no dequantisation launch) with the same output; another
# scale_2 object replaces it (one copy per weight, right output); a kept copy goes with its weight. Known wrong: reusing
# the copy made with the row scales for a call with the tensor scale is caught by the output.
launches = []
real_launch = nvfp4_dequant.launch_dequant
nvfp4_dequant.launch_dequant = lambda *a, **k: launches.append(1) or real_launch(*a, **k)
nvfp4_dequant.CACHE = True
plain = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
nvfp4_dequant.dequant_matmul(x, packed, scale, rows, plain)
again = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
nvfp4_dequant.dequant_matmul(x, packed, scale, rows, again)
assert len(launches) == 1 and torch.equal(plain, again), launches
rows_copy = next(iter(nvfp4_dequant._COPIES.values()))[3]
other = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2, other)  # the tensor scale: the copy is made again, replacing it
assert len(launches) == 2 and len(nvfp4_dequant._COPIES) == 1
expected_other = torch.empty(M, N, dtype=torch.bfloat16)
w4a16_linear(x, packed, scale, scale_2, expected_other)
assert rel(other, expected_other) < 5e-3
for _ in range(3):  # a fresh scale_2 object each call: still one copy, right output
    fresh = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2.clone(), fresh)
    assert len(nvfp4_dequant._COPIES) == 1 and rel(fresh, expected_other) < 5e-3
wrong = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
torch.mm(x, rows_copy.t(), out=wrong)  # the row-scale copy used for the tensor-scale call
assert rel(wrong, expected_other) > 0.1, rel(wrong, expected_other)
del packed, rows_copy
import gc
gc.collect()
assert len(nvfp4_dequant._COPIES) == 0, len(nvfp4_dequant._COPIES)
nvfp4_dequant.CACHE = False
nvfp4_dequant.launch_dequant = real_launch
nvfp4_dequant.MIN_TOKENS = None
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, SCRIPT)


@pytest.fixture(scope="module")
def records(run):
    return {key.split("|", 1)[1]: value for key, value in run["records"].items()}


def test_contract_cpu_cases_pass_under_the_interpreter(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert sorted(r["case"] for r in found) == sorted(WRONG_CASES)
    assert all(r["status"] in CAUGHT for r in found), [(r["case"], r["status"], r["message"]) for r in found]


def test_prefill_linear_through_the_dequantised_copy_matches_the_torch_op(run):
    assert_script_ok(run)


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns"), [(1024, 12288, 2048), (1024, 2048, 4096), (128, 1024, 2048), (1024, 2048, 512)])
def test_dequant_linear_matches_the_torch_op_on_cuda(tokens, rows, columns, monkeypatch):
    from reference_engine.kernels import nvfp4_dequant, nvfp4_gemv
    from reference_engine.quant.linear import w4a16_linear as torch_linear
    from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    monkeypatch.setattr(nvfp4_dequant, "MIN_TOKENS", 65)
    generator = torch.Generator(device="cuda").manual_seed(rows)
    packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, columns, generator=generator, device="cuda") * columns**-0.5)
    copy = torch.full((rows, columns), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_dequant.dequantize_nvfp4_into(packed, scale, scale_2, copy)
    assert torch.equal(copy, dequantize_nvfp4(packed, scale, scale_2, torch.bfloat16))  # both round the float32 product once
    x = torch.randn(tokens, columns, generator=generator, device="cuda").bfloat16()
    expected = torch.empty(tokens, rows, dtype=torch.bfloat16, device="cuda")
    torch_linear(x, packed, scale, scale_2, expected)
    out = torch.full_like(expected, float("nan"))
    nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, out)
    assert torch.isfinite(out).all()
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert error < 5e-3, error


@pytest.mark.cuda
def test_kept_copies_are_reused_and_skipped_in_capture_on_cuda(monkeypatch):
    """With CACHE, a prefill linear reuses its weight's copy (outputs bit-identical to the uncached call); inside a
    CUDA graph capture no copy is made (the call takes the uncached path and still matches)."""
    from reference_engine.kernels import nvfp4_dequant
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    monkeypatch.setattr(nvfp4_dequant, "_COPIES", {})
    generator = torch.Generator(device="cuda").manual_seed(5)
    packed, scale, scale_2 = quantize_nvfp4(torch.randn(2048, 4096, generator=generator, device="cuda") * 4096**-0.5)
    x = torch.randn(512, 4096, generator=generator, device="cuda").bfloat16()
    plain = torch.full((512, 2048), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2, plain)
    monkeypatch.setattr(nvfp4_dequant, "CACHE", True)
    captured = torch.full_like(plain, float("nan"))
    graph = torch.cuda.CUDAGraph()
    nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2, captured)  # warm-up outside: makes the copy
    nvfp4_dequant._COPIES.clear()
    with torch.cuda.graph(graph):
        nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2, captured)
    assert not nvfp4_dequant._COPIES
    graph.replay()
    torch.cuda.synchronize()
    cached = [torch.full_like(plain, float("nan")) for _ in range(2)]
    for out in cached:
        nvfp4_dequant.dequant_matmul(x, packed, scale, scale_2, out)
    assert len(nvfp4_dequant._COPIES) == 1
    assert torch.equal(captured, plain) and torch.equal(cached[0], plain) and torch.equal(cached[1], plain)
