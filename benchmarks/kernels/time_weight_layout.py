"""Does the expert weights' layout cap the grouped MoE decode's bandwidth? Streams the same bytes in two orders.

    PYTHONPATH=. python3 benchmarks/kernels/time_weight_layout.py OUT.json

The grouped decode kernels (`moe_grouped_half`) read an expert's row-major NVFP4 codes in tiles of 32 rows by 4 scale
blocks: per K step, 32 bytes from each of 32 rows that lie 1 KiB apart (gate/up), and a 4-byte scale run per row.
Nsight Compute puts the gate/up kernel at about 50% of DRAM peak at batch 32 with long-scoreboard stalls first
(run71). This script separates the access pattern from the kernel's arithmetic: a kernel with the grouped kernel's
grid, tile and loop, whose only work is an integer sum of what it loads, reads

- layout 0, row-major (today's): block (row r, block k) of expert e at word (e * rows + r) * K + k;
- layout 1, tile-major: the same tile's words stored in the order the loop reads them, [expert, row tile, K step,
  (gate, up), row in tile, block in step], so each K step reads one contiguous run (2 KiB for gate/up at 32 x 4);

with the scales in the same order as their codes, over 162 of 256 experts (batch 32's expected count at 8 slots per
token) and one layer copy per call, so nothing is reused from the L2. The batch-1 GEMVs' shapes and committed tiles
(256 or 64 rows by 8 blocks a step, split-K 8 or 16, one matrix, 16 or 32 copies cycled) are streamed the same way. Before timing, each layout's per-program sums are
checked against the other's on a tensor permuted by torch into tile-major order (the index maths is what is tested).
The bandwidth of `copy_` over 1 GiB is measured in the same run. No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from reference_engine.bench.timing import graph_seconds


@triton.jit
def _stream_kernel(codes_ptr, scales_ptr, experts_ptr, out_ptr, ROWS: tl.constexpr, HALF: tl.constexpr, K_WORDS: tl.constexpr, BN: tl.constexpr,
                   BB: tl.constexpr, LAYOUT: tl.constexpr, TWO: tl.constexpr, SCALES: tl.constexpr, SPLIT: tl.constexpr = 1):
    """Grid (experts, row tiles, SPLIT). TWO: the tile is gate rows tile*BN.. and up rows HALF + tile*BN.. (ROWS = 2 * HALF);
    otherwise rows tile*BN.. of ROWS. SPLIT > 1: program z takes K steps z * STEPS/SPLIT.. (the GEMVs' split-K). Sums
    every int64 code word and scale byte it reads into out[program]."""
    expert = tl.load(experts_ptr + tl.program_id(0)).to(tl.int64)
    tile = tl.program_id(1)
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BB)
    PARTS: tl.constexpr = 2 if TWO else 1
    STEPS: tl.constexpr = K_WORDS // BB
    TILES: tl.constexpr = ROWS // (BN * PARTS)
    acc = tl.zeros((BN, BB), dtype=tl.int64)
    PER_SPLIT: tl.constexpr = STEPS // SPLIT
    for offset in range(PER_SPLIT):
        step = tl.program_id(2) * PER_SPLIT + offset
        for part in tl.static_range(PARTS):
            if LAYOUT == 0:
                row = expert * ROWS + part * HALF + tile * BN + rows
                words = row[:, None] * K_WORDS + step * BB + cols[None, :]
            else:
                run = ((expert * TILES + tile) * STEPS + step) * PARTS + part
                words = run * (BN * BB) + rows[:, None] * BB + cols[None, :]
            acc += tl.load(codes_ptr + words)
            if SCALES:
                acc += tl.load(scales_ptr + words).to(tl.int64)
    total = tl.sum(tl.sum(acc, axis=1), axis=0)
    tl.store(out_ptr + (tl.program_id(0) * tl.num_programs(1) + tile) * SPLIT + tl.program_id(2), total)


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int  # rows per expert (gate and up together for TWO)
    k_words: int  # int64 code words (16 codes) per row
    two: bool
    experts: int = 256  # matrices in a layer's stack (1: a dense linear)
    active: int = 162  # matrices read per call (batch 32's expected experts: 256 * (1 - (255/256)^256))
    split: int = 1  # programs along K per row tile (the batch-1 GEMVs' split-K)
    calls: int = 4  # layer copies per CUDA graph, one per call (enough to leave the L2)


GATE_UP = Shape("gate_up", 1024, 128, True)  # 2 x 512 rows of 2048 codes
DOWN = Shape("down", 2048, 32, False)  # 2048 rows of 512 codes
# The batch-1 GEMVs' committed tiles (tuned/nvidia-h200.json: 256 or 64 rows, 8 scale blocks = 64 bytes a row a step)
GDN_IN_PROJ = Shape("gemv_12288x2048", 12288, 128, False, experts=1, active=1, split=8, calls=16)
ATTN_QKV = Shape("gemv_9216x2048", 9216, 128, False, experts=1, active=1, split=8, calls=16)
OUT_PROJ = Shape("gemv_2048x4096", 2048, 256, False, experts=1, active=1, split=16, calls=32)
# The per-pair MoE kernels of batches 2 to 15 (`moe_decode` tiles: 32 rows by 64 bytes a step), batch 8: about 57
# distinct experts of 256 for 64 pairs
PAIR_GATE_UP_B8 = Shape("pair_gate_up_b8", 1024, 128, True, active=57, calls=8)
SHAPES = (GATE_UP, DOWN, GDN_IN_PROJ, ATTN_QKV, OUT_PROJ, PAIR_GATE_UP_B8)


def tile_major(words: torch.Tensor, shape: Shape, bn: int, bb: int) -> torch.Tensor:
    """[E, rows, K] row-major -> the same values in layout 1's order, flat."""
    parts = 2 if shape.two else 1
    tiles = shape.rows // (bn * parts)
    steps = shape.k_words // bb
    # rows = part * HALF + tile * BN + r -> [E, part, tile, r, step, b] -> [E, tile, step, part, r, b]
    view = words.reshape(words.shape[0], parts, tiles, bn, steps, bb)
    return view.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1)


def launch(codes, scales, experts, out, shape: Shape, bn: int, bb: int, layout: int, use_scales: bool, warps: int = 4) -> None:
    parts = 2 if shape.two else 1
    grid = (experts.numel(), shape.rows // (bn * parts), shape.split)
    _stream_kernel[grid](codes, scales, experts, out, ROWS=shape.rows, HALF=shape.rows // 2, K_WORDS=shape.k_words, BN=bn, BB=bb,
                         LAYOUT=layout, TWO=shape.two, SCALES=use_scales, SPLIT=shape.split, num_warps=warps)  # fmt: skip


def check(shape: Shape, bn: int, bb: int, device: str) -> None:
    """Each program's sum, in both layouts (layout 1 over the permuted tensor), equals the sum of the words it should
    read: its tile's rows (gate and up) and, with split-K, its K slice."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    experts = min(4, shape.experts)
    codes = torch.randint(-(2**62), 2**62, (experts, shape.rows, shape.k_words), generator=gen, dtype=torch.int64).to(device)
    scales = torch.randint(0, 256, (experts, shape.rows, shape.k_words), generator=gen, dtype=torch.uint8).to(device)
    chosen = torch.tensor([experts - 1, 0, 1][: min(3, experts)], dtype=torch.int32, device=device)
    tiles = shape.rows // (bn * (2 if shape.two else 1))
    parts = 2 if shape.two else 1
    sums = []
    for layout, c, s in ((0, codes, scales), (1, tile_major(codes, shape, bn, bb), tile_major(scales, shape, bn, bb))):
        out = torch.full((chosen.numel() * tiles * shape.split,), -1, dtype=torch.int64, device=device)
        launch(c, s, chosen, out, shape, bn, bb, layout, True)
        sums.append(out.cpu())
    words = (codes.cpu()[chosen.cpu().long()] + scales.cpu()[chosen.cpu().long()].long())  # [n, rows, K]
    words = words.reshape(chosen.numel(), parts, tiles, bn, shape.split, shape.k_words // shape.split)  # split z: its K slice
    expected = words.sum(dim=(1, 3, 5)).reshape(-1)  # per program (expert, tile, split)
    if not (torch.equal(sums[0], expected) and torch.equal(sums[1], expected)):
        raise SystemExit(f"{shape.name} BN={bn} BB={bb}: a layout's sums differ from the reference")


def copy_bandwidth() -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    seconds = graph_seconds(lambda: dst.copy_(src))
    return 2 * src.numel() / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSON file for the records")
    parser.add_argument("--shapes", default=",".join(s.name for s in SHAPES), help="comma-separated shape names (default: all)")
    args = parser.parse_args()
    shapes = [s for s in SHAPES if s.name in args.shapes.split(",")]
    plans = [  # (shape, BN, BB, layout, scales)
        (GATE_UP, 32, 4, 0, True), (GATE_UP, 32, 4, 1, True), (GATE_UP, 32, 8, 0, True), (GATE_UP, 32, 8, 1, True),
        (GATE_UP, 32, 16, 0, True), (GATE_UP, 32, 4, 0, False), (GATE_UP, 32, 4, 1, False),
        (DOWN, 32, 4, 0, True), (DOWN, 32, 4, 1, True), (DOWN, 32, 8, 0, True), (DOWN, 32, 8, 1, True),
        (GDN_IN_PROJ, 256, 8, 0, True), (GDN_IN_PROJ, 256, 8, 1, True), (ATTN_QKV, 256, 8, 0, True), (ATTN_QKV, 256, 8, 1, True),
        (OUT_PROJ, 64, 8, 0, True), (OUT_PROJ, 64, 8, 1, True), (PAIR_GATE_UP_B8, 32, 8, 0, True), (PAIR_GATE_UP_B8, 32, 8, 1, True),
    ]  # fmt: skip
    plans = [plan for plan in plans if plan[0] in shapes]
    for shape, bn, bb, _, _ in plans:
        check(shape, bn, bb, "cuda")
    print("index maths checked: both layouts give the reference sums", flush=True)
    copy = copy_bandwidth()
    print(f"copy_ bandwidth {copy / 1e12:.3f} TB/s", flush=True)
    records = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for shape in shapes:
        layers = [(torch.empty(shape.experts * shape.rows * shape.k_words, dtype=torch.int64, device="cuda").random_(),
                   torch.empty(shape.experts * shape.rows * shape.k_words, dtype=torch.uint8, device="cuda").random_()) for _ in range(shape.calls)]  # fmt: skip
        chosen = [torch.randperm(shape.experts, generator=gen)[: shape.active].sort().values.to(torch.int32).cuda() for _ in range(shape.calls)]
        for plan_shape, bn, bb, layout, use_scales in plans:
            if plan_shape is not shape:
                continue
            parts = 2 if shape.two else 1
            out = torch.empty(shape.active * shape.rows // (bn * parts) * shape.split, dtype=torch.int64, device="cuda")

            def step(bn=bn, bb=bb, layout=layout, use_scales=use_scales, out=out, layers=layers, chosen=chosen, shape=shape):
                for (codes, scales), experts in zip(layers, chosen, strict=True):
                    launch(codes, scales, experts, out, shape, bn, bb, layout, use_scales)

            rounds = [graph_seconds(step, replays=15) / shape.calls for _ in range(3)]
            seconds = min(rounds)
            nbytes = shape.active * shape.rows * shape.k_words * (8 + (1 if use_scales else 0))
            record = {"shape": asdict(shape), "bn": bn, "bb": bb, "layout": layout, "scales": use_scales, "us": seconds * 1e6,
                      "rounds_us": [r * 1e6 for r in rounds], "bytes": nbytes, "tb_per_s": nbytes / seconds / 1e12,
                      "of_copy": nbytes / seconds / copy}  # fmt: skip
            records.append(record)
            print(f"{shape.name:8s} BN={bn} BB={bb:2d} layout {layout} scales {int(use_scales)}: {seconds * 1e6:8.2f} us  "
                  f"{record['tb_per_s']:.3f} TB/s  {record['of_copy']:.3f} of copy", flush=True)  # fmt: skip
        del layers
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_bytes_per_s": copy, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
