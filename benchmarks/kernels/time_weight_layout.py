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
token) and one layer copy per call, so nothing is reused from the L2. Before timing, each layout's per-program sums are
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

EXPERTS = 256
ACTIVE = 162  # experts touched by 32 tokens x 8 slots with uniform routing: 256 * (1 - (255/256)^256)
CALLS = 4  # one layer copy per call in a graph


@triton.jit
def _stream_kernel(codes_ptr, scales_ptr, experts_ptr, out_ptr, ROWS: tl.constexpr, HALF: tl.constexpr, K_WORDS: tl.constexpr, BN: tl.constexpr,
                   BB: tl.constexpr, LAYOUT: tl.constexpr, TWO: tl.constexpr, SCALES: tl.constexpr):
    """Grid (experts, row tiles). TWO: the tile is gate rows tile*BN.. and up rows HALF + tile*BN.. (ROWS = 2 * HALF);
    otherwise rows tile*BN.. of ROWS. Sums every int64 code word and scale byte it reads into out[program]."""
    expert = tl.load(experts_ptr + tl.program_id(0)).to(tl.int64)
    tile = tl.program_id(1)
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BB)
    PARTS: tl.constexpr = 2 if TWO else 1
    STEPS: tl.constexpr = K_WORDS // BB
    TILES: tl.constexpr = ROWS // (BN * PARTS)
    acc = tl.zeros((BN, BB), dtype=tl.int64)
    for step in range(STEPS):
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
    tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + tile, total)


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int  # rows per expert (gate and up together for TWO)
    k_words: int  # int64 code words (16 codes) per row
    two: bool


GATE_UP = Shape("gate_up", 1024, 128, True)  # 2 x 512 rows of 2048 codes
DOWN = Shape("down", 2048, 32, False)  # 2048 rows of 512 codes


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
    grid = (experts.numel(), shape.rows // (bn * parts))
    _stream_kernel[grid](codes, scales, experts, out, ROWS=shape.rows, HALF=shape.rows // 2, K_WORDS=shape.k_words, BN=bn, BB=bb,
                         LAYOUT=layout, TWO=shape.two, SCALES=use_scales, num_warps=warps)  # fmt: skip


def check(shape: Shape, bn: int, bb: int, device: str, experts: int = 4) -> None:
    """Layout 1's sums over the permuted tensor equal layout 0's over the row-major one, program by program."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    codes = torch.randint(-(2**62), 2**62, (experts, shape.rows, shape.k_words), generator=gen, dtype=torch.int64).to(device)
    scales = torch.randint(0, 256, (experts, shape.rows, shape.k_words), generator=gen, dtype=torch.uint8).to(device)
    chosen = torch.tensor([experts - 1, 0, 1][: min(3, experts)], dtype=torch.int32, device=device)
    parts = 2 if shape.two else 1
    sums = []
    for layout, c, s in ((0, codes, scales), (1, tile_major(codes, shape, bn, bb), tile_major(scales, shape, bn, bb))):
        out = torch.full((chosen.numel() * (shape.rows // (bn * parts)),), -1, dtype=torch.int64, device=device)
        launch(c, s, chosen, out, shape, bn, bb, layout, True)
        sums.append(out.cpu())
    expected = (codes.cpu()[chosen.cpu().long()].reshape(chosen.numel(), parts, -1, bn, shape.k_words)
                + scales.cpu()[chosen.cpu().long()].reshape(chosen.numel(), parts, -1, bn, shape.k_words).long())  # fmt: skip
    expected = expected.sum(dim=(1, 3, 4)).reshape(-1)
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
    args = parser.parse_args()
    plans = [  # (shape, BN, BB, layout, scales)
        (GATE_UP, 32, 4, 0, True), (GATE_UP, 32, 4, 1, True), (GATE_UP, 32, 8, 0, True), (GATE_UP, 32, 8, 1, True),
        (GATE_UP, 32, 16, 0, True), (GATE_UP, 32, 4, 0, False), (GATE_UP, 32, 4, 1, False),
        (DOWN, 32, 4, 0, True), (DOWN, 32, 4, 1, True), (DOWN, 32, 8, 0, True), (DOWN, 32, 8, 1, True),
    ]  # fmt: skip
    for shape, bn, bb, _, _ in plans:
        check(shape, bn, bb, "cuda")
    print("index maths checked: both layouts give the reference sums", flush=True)
    copy = copy_bandwidth()
    print(f"copy_ bandwidth {copy / 1e12:.3f} TB/s", flush=True)
    records = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for shape in (GATE_UP, DOWN):
        layers = [(torch.empty(EXPERTS * shape.rows * shape.k_words, dtype=torch.int64, device="cuda").random_(),
                   torch.empty(EXPERTS * shape.rows * shape.k_words, dtype=torch.uint8, device="cuda").random_()) for _ in range(CALLS)]  # fmt: skip
        chosen = [torch.randperm(EXPERTS, generator=gen)[:ACTIVE].sort().values.to(torch.int32).cuda() for _ in range(CALLS)]
        for plan_shape, bn, bb, layout, use_scales in plans:
            if plan_shape is not shape:
                continue
            parts = 2 if shape.two else 1
            out = torch.empty(ACTIVE * shape.rows // (bn * parts), dtype=torch.int64, device="cuda")

            def step(bn=bn, bb=bb, layout=layout, use_scales=use_scales, out=out, layers=layers, chosen=chosen, shape=shape):
                for (codes, scales), experts in zip(layers, chosen, strict=True):
                    launch(codes, scales, experts, out, shape, bn, bb, layout, use_scales)

            rounds = [graph_seconds(step, replays=15) / CALLS for _ in range(3)]
            seconds = min(rounds)
            nbytes = ACTIVE * shape.rows * shape.k_words * (8 + (1 if use_scales else 0))
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
