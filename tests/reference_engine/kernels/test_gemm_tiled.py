"""Tile-major copies read by the decode-batch tensor-core GEMM (`nvfp4_gemm.w4a16_gemm`, `TILED`).

A copy holds the same codes and scales in the order one program's K loop reads them, so the GEMM must give the bits it
gives from the row-major weight: byte and word decode, with and without the one-step-ahead loads, swapped operands,
split-K, one tensor scale or one per row. A copy in the wrong (row-major) order must miss by far, which shows the
kernel reads the copy. The engine's route (`register_tiled_copies` under `TILED_SMALL_M`) serves a copy only for the
very tensor it was made from, only while the switch is on, and frees it with the weight; a copy that does not fit the
plan's tiles is refused. Interpreter on the CPU; on CUDA the real shapes, bit-equal.
"""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = """
import torch
from reference_engine.kernels import nvfp4_gemm, nvfp4_gemv
from reference_engine.kernels.nvfp4_gemm import GemmPlan, w4a16_gemm
from reference_engine.quant.nvfp4 import quantize_nvfp4

def nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)

def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

g = torch.Generator().manual_seed(17)
packed, scale, scale_2 = quantize_nvfp4(torch.randn(64, 256, generator=g))  # 64 rows, 128 bytes a row
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(5, 256, generator=g).to(dtype)
    for block_n, block_kb, split, decode, prefetch, swap in ((16, 32, 1, 0, 0, 0), (32, 32, 2, 1, 1, 0), (16, 64, 2, 1, 0, 1), (64, 16, 4, 0, 1, 1)):
        plan = GemmPlan(16, block_n, block_kb, 4, 2, split, decode=decode, prefetch=prefetch, swap=swap)
        tiled = nvfp4_gemv.tiled_gemv_weight(packed, scale, block_n, block_kb // 8)
        for scale_2_in in (scale_2, torch.rand(64, generator=g) + 0.5):
            rows_out = nan((5, 64), dtype)
            w4a16_gemm(x, packed, scale, scale_2_in, rows_out, plan)
            tile_out = nan((5, 64), dtype)
            w4a16_gemm(x, packed, scale, scale_2_in, tile_out, plan, tiled=tiled)
            assert torch.isfinite(rows_out).all() and torch.equal(tile_out, rows_out), (dtype, block_n, block_kb, split, decode, prefetch, swap)
        wrong = (packed.view(torch.int64).reshape(-1), scale.reshape(-1))  # the right words in row-major order
        missed = nan((5, 64), dtype)
        w4a16_gemm(x, packed, scale, scale_2, missed, plan, tiled=wrong)
        assert rel(missed, rows_out) > 0.1, (block_n, block_kb, rel(missed, rows_out))

# The engine's route: decode batches of bfloat16 x through `nvfp4_gemv.w4a16_linear` (the GEMM from GEMM_MIN_TOKENS).
nvfp4_gemv.GEMM_MIN_TOKENS = 2
assert nvfp4_gemm.small_m_tiles(64, 256, 8) == {(64, 4)}, nvfp4_gemm.small_m_tiles(64, 256, 8)
assert nvfp4_gemm.small_m_tiles(64, 256, 1) == set()  # no batch reaches the GEMM: no copy
x = torch.randn(5, 256, generator=g).bfloat16()
expected = nan((5, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, expected)
assert nvfp4_gemm.register_tiled_copies(packed, scale, 8) == packed.numel() + scale.numel()
assert nvfp4_gemm.register_tiled_copies(packed, scale, 8) == 0, "a second copy of the same tile was made"
nvfp4_gemm.TILED_SMALL_M = True
through_copy = nan((5, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, through_copy)
assert torch.equal(through_copy, expected), "the registered copy gives other bits"
key = (id(packed), 64, 4)
entry = nvfp4_gemv._COPIES[key]  # poison the copy: the op must now miss, which shows it reads the copy
nvfp4_gemv._COPIES[key] = nvfp4_gemv._TiledCopy(entry.weight, packed.view(torch.int64).reshape(-1), scale.reshape(-1), 64, 4)
poisoned = nan((5, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, poisoned)
assert rel(poisoned, expected) > 0.1, "the registered copy was not read"
twin = packed.clone()  # equal values, another tensor: never served the copy
other = nan((5, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, twin, scale, scale_2, other)
assert torch.equal(other, expected)
nvfp4_gemv.TILED_COPIES = True  # the batch-1 GEMV's switch does not serve the GEMM's tile to the GEMV (no GEMV tile registered)
one = nan((1, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x[:1], packed, scale, scale_2, one)
nvfp4_gemv.TILED_COPIES = False
one_rows = nan((1, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x[:1], packed, scale, scale_2, one_rows)
assert torch.equal(one, one_rows)
nvfp4_gemm.TILED_SMALL_M = False
off = nan((5, 64), torch.bfloat16)
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, off)
assert torch.equal(off, expected), "a copy was read with TILED_SMALL_M off"
nvfp4_gemv.clear_tiled_copies()
dying = packed.clone()  # a registered weight that dies takes its copy with it
assert nvfp4_gemm.register_tiled_copies(dying, scale, 8) > 0 and len(nvfp4_gemv._COPIES) == 1
del dying
assert len(nvfp4_gemv._COPIES) == 0, "a dead weight's copy is still held"
try:
    w4a16_gemm(x, packed, scale, scale_2, nan((5, 64), torch.bfloat16), GemmPlan(16, 64, 32, 4, 2, 1),
               tiled=nvfp4_gemv.tiled_gemv_weight(packed[:32], scale[:32], 32, 4))
    raise AssertionError("a copy of another size was accepted")
except ValueError as refused:
    print(f"refused: {refused}")
print("ok")
"""


def test_tile_major_copies_give_the_row_major_bits():
    assert_script_ok(interpreter_run({}, SCRIPT, timeout=900))


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns"), [(8, 12288, 2048), (32, 9216, 2048), (32, 2048, 4096), (64, 12288, 2048)])
@pytest.mark.parametrize("decode", [0, 1])
def test_tile_major_gemm_is_bit_identical_on_cuda(tokens, rows, columns, decode, monkeypatch):
    """The real decode-batch shapes under the card's tuning: the tile-major copy gives the row-major bits."""
    from reference_engine.kernels import nvfp4_gemm, nvfp4_gemv
    from reference_engine.kernels.tuning import apply_for_cuda
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    apply_for_cuda()
    monkeypatch.setattr(nvfp4_gemm, "DECODE", decode)
    generator = torch.Generator().manual_seed(rows + tokens)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, columns, generator=generator) * 0.02))
    x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
    plan = nvfp4_gemm.plan("linear", tokens, rows, columns, torch.cuda.get_device_properties(0).multi_processor_count)
    tiled = nvfp4_gemv.tiled_gemv_weight(packed, scale, plan.block_n, plan.block_kb // 8)
    outs = []
    for copy in (None, tiled):
        out = torch.full((tokens, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, tiled=copy)
        outs.append(out)
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
