"""Triton W4A16 NVFP4 GEMV against quantization/w4a16-linear: CPU (interpreter) and CUDA."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "quantization/w4a16-linear"
IMPL = "reference_engine.kernels.nvfp4_gemv:w4a16_linear"
# tiny-f32: one K step, no split; small-f32: split-K (two steps) and the reduce kernel; small-bf16:
# N not a multiple of the row block. The 2048 x 512 case is left to CUDA (40 s in the interpreter).
CPU_CASES = ["tiny-f32", "small-f32", "small-bf16", "wrong-in-features", "scale-not-fp8"]
WRONG = ["w4a16_nibbles_swapped", "w4a16_last_tile_unwritten", "w4a16_scale_2_ignored"]
WRONG_CASES = ["small-f32"]
CAUGHT = {"INCORRECT_NUMERICAL", "UNWRITTEN_OUTPUT"}


# The batch-1 configuration (128 bytes per row per step, split-K over 4 steps, N not a multiple of 16)
# against the torch op, float32 and bfloat16.
BATCH_ONE_SCRIPT = """
import torch
from reference_engine.kernels import launch, nvfp4_gemv
from reference_engine.quant.linear import w4a16_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

assert nvfp4_gemv.plan(1, 40, 512, 132)[2] == 128 and nvfp4_gemv.plan(1, 40, 512, 132)[3] > 1
g = torch.Generator().manual_seed(11)
packed, scale, scale_2 = quantize_nvfp4(torch.randn(40, 1024, generator=g))
for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 5e-3)):
    x = torch.randn(1, 1024, generator=g).to(dtype)
    expected = torch.empty(1, 40, dtype=dtype)
    w4a16_linear(x.float(), packed, scale, scale_2, expected) if dtype == torch.float32 else w4a16_linear(x, packed, scale, scale_2, expected)
    out = torch.full((1, 40), float("nan"), dtype=dtype)
    nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, out)
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert error < bound, (dtype, error)

# int32 word reads (two codes per shift and mask), with split-K, several tokens and per-row tensor scales,
# against the byte-read kernel on the same inputs (float32 sums: same values up to summation order).
for tokens, config in ((1, (1, 16, 64, 2, 4, 0, 1)), (3, (4, 8, 32, 1, 4, 1, 1)), (2, (2, 16, 128, 1, 4, 3, 1))):
    row_scales = torch.rand(40, generator=g) + 0.5
    for scale_2_in in (scale_2, row_scales):
        x = torch.randn(tokens, 1024, generator=g)
        byte_out = torch.full((tokens, 40), float("nan"))
        nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2_in, byte_out, config=config[:6] + (0,))
        word_out = torch.full((tokens, 40), float("nan"))
        nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2_in, word_out, config=config)
        assert torch.isfinite(word_out).all()
        error = float((word_out.double() - byte_out.double()).norm() / byte_out.double().norm())
        assert error < 1e-6, (tokens, config, error)
        swapped = torch.full((tokens, 40), float("nan"))  # known-wrong: nibbles swapped in the packed bytes
        nvfp4_gemv.launch_w4a16_gemv(x, (packed >> 4) | (packed << 4), scale, scale_2_in, swapped, config=config)
        assert float((swapped.double() - byte_out.double()).norm() / byte_out.double().norm()) > 0.1

# Packed float16 pairs (WORDS 2: one bfloat16 token, int64 scale blocks; the interpreter runs its integer
# form) against the byte-read kernel, with split-K (reduced in-kernel by the last program of a row block),
# per-row tensor scales, N not a multiple of the row block and the K loop plain, pipelined or unrolled; a float32 token falls back to word reads. Known-wrong: nibbles swapped.
# WORDS 3: the same pairs with the codes widened through E4M3 (the interpreter places the bits as the PTX does and reads
# them through float8e4nv).
for config in ((1, 16, 64, 2, 4, 0, 2), (1, 32, 32, 1, 4, 3, 2), (1, 64, 16, 4, 4, 0, 2), (1, 16, 64, 2, 4, 1, 2),  # the last unrolled
               (1, 16, 64, 2, 4, 0, 3), (1, 32, 32, 1, 4, 3, 3), (1, 64, 16, 4, 4, 1, 3)):
    for scale_2_in in (scale_2, torch.rand(40, generator=g) + 0.5):
        x = torch.randn(1, 1024, generator=g).bfloat16()
        byte_out = torch.full((1, 40), float("nan"))
        nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2_in, byte_out, config=config[:6] + (0,))
        half_out = torch.full((1, 40), float("nan"))
        nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2_in, half_out, config=config)
        assert torch.isfinite(half_out).all()
        error = float((half_out.double() - byte_out.double()).norm() / byte_out.double().norm())
        assert error < 1e-5, (config, error)
        swapped = torch.full((1, 40), float("nan"))
        nvfp4_gemv.launch_w4a16_gemv(x, (packed >> 4) | (packed << 4), scale, scale_2_in, swapped, config=config)
        assert float((swapped.double() - byte_out.double()).norm() / byte_out.double().norm()) > 0.1
    again = torch.full((1, 40), float("nan"))  # the split-K tickets were put back to zero: a second call is complete and equal
    nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2_in, again, config=config)
    assert torch.equal(again, half_out) and int(launch._TICKETS[x.device].abs().sum()) == 0
    fallback = torch.full((1, 40), float("nan"))
    nvfp4_gemv.launch_w4a16_gemv(x.float(), packed, scale, scale_2, fallback, config=config)
    reference = torch.full((1, 40), float("nan"))
    nvfp4_gemv.launch_w4a16_gemv(x.float(), packed, scale, scale_2, reference, config=config[:6] + (0,))
    assert float((fallback.double() - reference.double()).norm() / reference.double().norm()) < 1e-6
print("ok")
"""


# Tile-major copies (`tiled_gemv_weight`) read by the packed-float16 batch-1 GEMV give the row-major reads' bits, with
# split-K, per-row tensor scales, both decodes and each loop form; a copy in row-major order (the wrong order) misses by
# far; ragged tiles are refused.
TILED_SCRIPT = """
import torch
from reference_engine.kernels import nvfp4_gemv
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(13)
packed, scale, scale_2 = quantize_nvfp4(torch.randn(64, 512, generator=g))  # 64 rows, 32 scale blocks
x = torch.randn(1, 512, generator=g).bfloat16()
for block_n, block_b, split_k, loop, fp8 in ((16, 4, 2, 0, False), (32, 8, 4, 1, False), (16, 8, 1, 3, True), (64, 2, 8, 0, True)):
    tiled = nvfp4_gemv.tiled_gemv_weight(packed, scale, block_n, block_b)
    for scale_2_in in (scale_2, torch.rand(64, generator=g) + 0.5):
        rows_out = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
        nvfp4_gemv._launch_half(x, packed, scale, scale_2_in, rows_out, block_n, block_b, split_k, 4, loop, fp8=fp8)
        tile_out = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
        nvfp4_gemv._launch_half(x, packed, scale, scale_2_in, tile_out, block_n, block_b, split_k, 4, loop, fp8=fp8, tiled=tiled)
        assert torch.isfinite(rows_out).all() and torch.equal(tile_out, rows_out), (block_n, block_b, split_k, loop, fp8)
    wrong = (packed.view(torch.int64).reshape(-1), scale.reshape(-1))  # the right words in row-major order
    missed = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, missed, block_n, block_b, split_k, 4, loop, fp8=fp8, tiled=wrong)
    error = float((missed.double() - rows_out.double()).norm() / rows_out.double().norm())
    assert error > 0.1, (block_n, block_b, error)
# Registered copies (what the engine does with the tuning's `gemv_tiled`): the op reads one only for the very tensor
# it was made from and for the tuned tile, and only while `TILED_COPIES` is on.
config = (1, 16, 32, 2, 4, 0, 2)  # 16 rows, 4 blocks a step, split-K 2
nvfp4_gemv.TUNED[(1, 64, 256)] = config
expected = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, expected)
assert nvfp4_gemv.register_tiled_copy(packed[:48], scale[:48]) == 0  # no tuned tile for 48 rows: no copy
assert nvfp4_gemv.register_tiled_copy(packed, scale) == packed.numel() + scale.numel()
assert nvfp4_gemv.register_tiled_copy(packed, scale, (32, 8)) > 0  # another tile of the same weight: held apart, not read here
nvfp4_gemv.TILED_COPIES = True
through_copy = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, through_copy)
assert torch.equal(through_copy, expected), "the registered copy gives other bits"
assert nvfp4_gemv.register_tiled_copy(packed, scale) == 0, "a second copy of the same tile was made"
entry = nvfp4_gemv._COPIES[(id(packed), 16, 4)]  # poison the copy: the op must now miss, which shows it reads the copy
nvfp4_gemv._COPIES[(id(packed), 16, 4)] = nvfp4_gemv._TiledCopy(entry.weight, packed.view(torch.int64).reshape(-1), scale.reshape(-1), entry.block_n, entry.block_b)
poisoned = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, poisoned)
assert float((poisoned.double() - expected.double()).norm() / expected.double().norm()) > 0.1, "the registered copy was not read"
twin = packed.clone()  # equal values, another tensor: never served the copy
other = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, twin, scale, scale_2, other)
assert torch.equal(other, expected)
nvfp4_gemv.TILED_COPIES = False
off = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, off)
assert torch.equal(off, expected), "a copy was read with TILED_COPIES off"
nvfp4_gemv.clear_tiled_copies()
dying = packed.clone()  # a registered weight that dies takes its copy with it
assert nvfp4_gemv.register_tiled_copy(dying, scale) > 0 and len(nvfp4_gemv._COPIES) == 1
del dying
assert len(nvfp4_gemv._COPIES) == 0, "a dead weight's copy is still held"
try:
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, rows_out, 48, 4, 1, 4, 0, tiled=nvfp4_gemv.tiled_gemv_weight(packed, scale, 16, 4))
    raise AssertionError("a ragged row tile was accepted")
except ValueError as refused:
    print(f"refused: {refused}")
print("ok")
"""


# x converted once into the block dot's float16 pairs (`x_half_pairs`) and read by the GEMV (`X_PAIRS`) gives the bits of
# the in-kernel conversion, for both decodes, row-major or tile-major weights, both load forms; pairs built in the other decode's order
# (a known-wrong input) miss by far; pairs of the wrong shape or dtype are refused.
X_PAIRS_SCRIPT = """
import torch
from reference_engine.kernels import nvfp4_gemv
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(17)
packed, scale, scale_2 = quantize_nvfp4(torch.randn(64, 512, generator=g))
x = torch.randn(1, 512, generator=g).bfloat16()
for block_n, block_b, split_k, loop, fp8, tiled, loads in ((16, 4, 2, 0, False, False, 1), (32, 8, 1, 1, True, True, 2), (16, 8, 4, 3, True, False, 1),
                                                          (64, 4, 2, 0, False, True, 2)):
    copy = nvfp4_gemv.tiled_gemv_weight(packed, scale, block_n, block_b) if tiled else None
    converted = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, converted, block_n, block_b, split_k, 4, loop, fp8=fp8, tiled=copy)
    given = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, given, block_n, block_b, split_k, 4, loop, fp8=fp8, tiled=copy, x_pairs=x_half_pairs(x, fp8),
                            pair_loads=loads)  # fmt: skip
    assert torch.isfinite(converted).all() and torch.equal(given, converted), (block_n, block_b, split_k, loop, fp8, tiled, loads)
    other_order = torch.full((1, 64), float("nan"), dtype=torch.bfloat16)
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, other_order, block_n, block_b, split_k, 4, loop, fp8=fp8, tiled=copy, x_pairs=x_half_pairs(x, not fp8),
                            pair_loads=loads)  # fmt: skip
    error = float((other_order.double() - converted.double()).norm() / converted.double().norm())
    assert error > 0.1, (fp8, error)
for bad in (x_half_pairs(x, False)[:, :128], x_half_pairs(x, False).float()):
    try:
        nvfp4_gemv._launch_half(x, packed, scale, scale_2, given, 16, 4, 1, 4, 0, x_pairs=bad)
        raise AssertionError("bad pairs were accepted")
    except ValueError as refused:
        print(f"refused: {refused}")
try:
    x_half_pairs(x.float(), False)
    raise AssertionError("float32 x was accepted")
except ValueError as refused:
    print(f"refused: {refused}")
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, BATCH_ONE_SCRIPT)


@pytest.fixture(scope="module")
def records(run):
    return {key.split("|", 1)[1]: value for key, value in run["records"].items()}


def test_batch_one_configuration_matches_the_torch_op(run):
    assert_script_ok(run)


def test_tile_major_copies_give_the_row_major_bits():
    assert_script_ok(interpreter_run({}, TILED_SCRIPT, timeout=900))


def test_x_converted_once_into_pairs_gives_the_in_kernel_bits():
    assert_script_ok(interpreter_run({}, X_PAIRS_SCRIPT, timeout=900))


def test_contract_cpu_cases_pass_under_the_interpreter(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert sorted(r["case"] for r in found) == sorted(WRONG_CASES)
    assert all(r["status"] in CAUGHT for r in found), [(r["case"], r["status"], r["message"]) for r in found]


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns"), [(1, 512, 2048), (1, 8192, 2048), (4, 2048, 4096), (32, 1024, 2048), (64, 4096, 2048), (65, 512, 2048)])
@pytest.mark.parametrize("words", [0, 1, 2, 3])
def test_matches_the_torch_op_on_cuda(tokens, rows, columns, words, monkeypatch):
    from reference_engine.kernels import nvfp4_gemv
    from reference_engine.kernels.nvfp4_gemv import w4a16_linear as triton_linear

    monkeypatch.setattr(nvfp4_gemv, "WORDS", words)  # 1: int32 word reads decoded in PTX; 2: packed float16 pairs (batch 1); 3: with the E4M3 decode
    monkeypatch.setattr(nvfp4_gemv, "TUNED", {})
    from reference_engine.quant.linear import w4a16_linear as torch_linear
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(rows + tokens)
    weight = torch.randn(rows, columns, generator=generator)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(weight))
    x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
    expected = torch.empty(tokens, rows, dtype=torch.bfloat16, device="cuda")
    torch_linear(x, packed, scale, scale_2, expected)
    out = torch.full_like(expected, float("nan"))
    triton_linear(x, packed, scale, scale_2, out)
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert error < 5e-3, error


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "columns"), [(12288, 2048), (2048, 4096)])
def test_e4m3_decode_is_as_accurate_as_the_bit_placement_on_cuda(rows, columns):
    """Batch-1 packed float16 pairs, WORDS 2 (bit placement) and 3 (E4M3 decode), float32 outputs against float64 sums
    of the dequantised weights: the E4M3 decode forms the same products (E2M1 * 2^-6 times 4x) and sums them in float16
    in another order, so its error must be of the same size; a wrong code, pair or half would be orders of magnitude off."""
    from reference_engine.kernels import nvfp4_gemv
    from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    generator = torch.Generator().manual_seed(rows)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, columns, generator=generator) * columns**-0.5))
    x = torch.randn(1, columns, generator=generator).to(torch.bfloat16).cuda()
    exact = x.double() @ dequantize_nvfp4(packed, scale, scale_2, torch.float32).double().T
    errors = {}
    for words in (2, 3):
        out = torch.full((1, rows), float("nan"), dtype=torch.float32, device="cuda")
        nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2, out, config=(1, 64, 64, 4, 4, 0, words))
        errors[words] = float((out.double() - exact).norm() / exact.norm())
    print(errors)
    assert errors[2] < 2e-3 and errors[3] < 1.5 * errors[2] + 1e-5, errors
