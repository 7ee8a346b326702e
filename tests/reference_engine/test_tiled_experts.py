"""Tile-major expert copies (`ops/tiled_experts.py`) attached to a model's MoE blocks, on the CPU.

What the grouped decode kernels compute from the copies (the same bits as from the row-major stacks, and wrong copies
caught) is tested under the interpreter in `kernels/test_moe_grouped_half.py`. Here: `tile_major` against an explicit
index and its refusals, `SparseMoeBlock.attach_tiled` on the tiny NVFP4 preset (the stacks and their Linear views keep
their storage, the copies hold the same values in the new order, `nbytes` counts them), `wants_tiled` following the
plan and the batch range, and the engine attaching nothing off CUDA.
"""

from __future__ import annotations

import pytest
import torch

from reference_engine.engine import attach_tiled_copies
from reference_engine.kernels import moe_grouped_half as half
from reference_engine.ops.static_moe import expert_tensors
from reference_engine.ops.tiled_experts import tile_major
from reference_engine.presets import build_preset


def test_tile_major_puts_each_element_at_its_tile_position_and_refuses_ragged_tiles():
    blocks = torch.randint(-(2**40), 2**40, (3, 12, 8), dtype=torch.int64)
    flat = tile_major(blocks, parts=2, block_n=3, block_b=4)
    assert flat.shape == (blocks.numel(),) and torch.equal(flat.sort().values, blocks.reshape(-1).sort().values)
    half_rows = 6
    for e in range(3):
        for row in range(12):
            for k in range(8):
                part, r = divmod(row, half_rows)
                at = ((((e * 2 + r // 3) * 2 + k // 4) * 2 + part) * 3 + r % 3) * 4 + k % 4
                assert flat[at] == blocks[e, row, k]
    scales = torch.rand(2, 8, 4).to(torch.float8_e4m3fn)
    assert tile_major(scales, 1, 4, 2).dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="does not tile"):
        tile_major(blocks, parts=2, block_n=4, block_b=4)  # 12 rows are not 2 parts of 4-row tiles
    with pytest.raises(ValueError, match="does not tile"):
        tile_major(blocks, parts=1, block_n=3, block_b=3)


def test_attach_tiled_keeps_the_stacks_and_adds_a_copy_of_the_same_values():
    model = build_preset("tiny", dtype=torch.bfloat16, quantize="nvfp4", seed=11)
    before = model.nbytes()
    mlp = model.layers[0].mlp
    stacked, shared = mlp.experts.stacked, mlp.shared_nvfp4
    gate_view = mlp.experts.gate[1].weight_packed
    plan = half.HalfGroupedPlan(gate_up_block_n=16, gate_up_block_b=2, down_block_n=16, down_block_b=1)  # tiles smaller than the
    # tiny preset's rows (H=64: 4 words), so the tile-major order differs from the row-major one
    added = 0
    for layer in model.layers:
        assert layer.mlp.attach_tiled(lambda e, s: half.tile_experts(e, s, plan))
        added += layer.mlp.experts.stacked.tiled.nbytes() + layer.mlp.shared_nvfp4.tiled.nbytes()
    after = mlp.experts.stacked
    assert after.tiled is not None and mlp.shared_nvfp4.tiled is not None
    assert all(a is b for a, b in zip(expert_tensors(after), expert_tensors(stacked), strict=True)), "the row-major stack was replaced"
    assert mlp.shared_nvfp4.gate_up_packed is shared.gate_up_packed
    assert gate_view.data_ptr() == after.gate_up_packed[1].data_ptr(), "the experts' Linear views lost their storage"
    codes = stacked.gate_up_packed.view(torch.int64)
    assert torch.equal(after.tiled.gate_up_words.sort().values, codes.reshape(-1).sort().values)
    assert not torch.equal(after.tiled.gate_up_words, codes.reshape(-1)), "the copy is in row-major order"
    tiles = half.tiles_for(plan, codes.shape[2] * 16, codes.shape[1] // 2)
    assert after.tiled.tiles == tiles == mlp.shared_nvfp4.tiled.tiles
    per_layer = sum(t.numel() * t.element_size() for t in (stacked.gate_up_packed, stacked.gate_up_scale, stacked.down_packed, stacked.down_scale))
    assert after.tiled.nbytes() == per_layer
    assert model.nbytes() == before + added


def test_wants_tiled_follows_the_plan_and_the_batch_range(monkeypatch):
    monkeypatch.setattr(half, "PLAN", half.HalfGroupedPlan(tiled=1))
    monkeypatch.setattr(half, "MIN_TOKENS", 16)
    assert half.wants_tiled(32) and half.wants_tiled(16) and not half.wants_tiled(8)
    monkeypatch.setattr(half, "MIN_TOKENS", None)
    assert not half.wants_tiled(64)
    monkeypatch.setattr(half, "MIN_TOKENS", 16)
    monkeypatch.setattr(half, "PLAN", half.HalfGroupedPlan(tiled=0))
    assert not half.wants_tiled(64)


def test_engine_attaches_nothing_off_cuda():
    model = build_preset("tiny", dtype=torch.bfloat16, quantize="nvfp4", seed=2)
    assert attach_tiled_copies(model, 64) == 0
    assert all(layer.mlp.experts.stacked.tiled is None for layer in model.layers)


def test_gemv_copies_leave_out_an_nvfp4_lm_head():
    """The engine registers batch-1 GEMV copies for the layers' projections, not for an NVFP4 LM head (its GEMV on a
    copy is untimed): `_nvfp4_linears(lm_head=False)` lists every projection but the head."""
    from reference_engine.engine import _nvfp4_linears

    model = build_preset("tiny", dtype=torch.bfloat16, quantize="nvfp4", lm_head_quantize=True, seed=2)
    every = list(_nvfp4_linears(model))
    layers_only = list(_nvfp4_linears(model, lm_head=False))
    assert any(linear is model.lm_head for linear in every)
    assert not any(linear is model.lm_head for linear in layers_only)
    assert len(layers_only) == len(every) - 1 and len(layers_only) >= len(model.layers)
