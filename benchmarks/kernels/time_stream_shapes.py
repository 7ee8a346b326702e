"""How fast can one launch read the bytes of a batch-1 decode kernel? A sweep of pure-read grid shapes.

    PYTHONPATH=. python3 benchmarks/kernels/time_stream_shapes.py OUT.json [--quick]

Every batch-1 kernel of the decode step reads a few MB and is latency-bound (run71's Nsight Compute: the GEMVs at 19 to
35% of DRAM peak, 17 to 22% occupancy, long-scoreboard stalls first), and a pure read with the GEMV's own grid and tile
took 8.1 us for the 14.2 MB GDN in_proj where its GEMV takes 9.7 (run76). This script asks what the fastest read of the
same bytes is when the grid is free: a kernel whose only work is an int64 sum of what it loads reads `BYTES[name]`
(the exact codes + scales of each batch-1 GEMV, the nine-slot MoE gate/up and down, the router's bf16 weight) with

- `programs`: 0.5 to 32 programs per SM;
- `block`: int64 words per program per step (256 to 4096: 16 to 256 bytes per thread at 4 warps);
- `warps`: 4 or 8; `stages`: the K loop plain (1) or software-pipelined (2, 3);
- `order`: 0, each program reads one contiguous slab; 1, step s of the whole read goes to program s % programs, so
  programs that run at the same time read neighbouring bytes.

Each buffer is padded up to whole steps of every program (the bytes read are recorded). Before it is timed, every
shape's per-program sums are checked against torch's sum of the same buffer (the index maths is what is tested). Each
shape is timed as a CUDA graph of calls cycling over buffer copies of `STREAMED` bytes in all (nothing is read from the L2), two rounds, the
faster counts. The real GEMVs (this card's tuning file, tile-major copies as the engine reads them) are timed in the
same run, so the record gives best read / real kernel for each GEMV shape. No speed is asserted.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import copies_for
from time_weight_layout import copy_bandwidth

from reference_engine.bench.timing import graph_seconds

CALLS = 16  # calls per graph, at least; more where the copies that stream STREAMED bytes number more
STREAMED = 160_000_000  # bytes of buffer copies cycled per graph, over three times the H100's and H200's 50 MB L2
ROUNDS = 2
H, I, SLOTS, EXPERTS = 2048, 512, 9, 256  # hidden, expert intermediate, top-8 + shared, router rows


def nvfp4_bytes(rows: int, cols: int) -> int:
    """Codes (two per byte) plus E4M3 block scales (one per 16 values) of a [rows, cols] NVFP4 weight."""
    return rows * cols // 2 + rows * cols // 16


BYTES = {
    "gdn_in_proj_12288x2048": nvfp4_bytes(12288, H),
    "attn_qkv_9216x2048": nvfp4_bytes(9216, H),
    "out_proj_2048x4096": nvfp4_bytes(H, 4096),
    "moe_gate_up_9_slots": SLOTS * nvfp4_bytes(2 * I, H),
    "moe_down_9_slots": SLOTS * nvfp4_bytes(H, I),
    "router_bf16_256x2048": EXPERTS * H * 2,
}
GEMV_SHAPES = {"gdn_in_proj_12288x2048": (12288, 1024), "attn_qkv_9216x2048": (9216, 1024), "out_proj_2048x4096": (2048, 2048)}
PER_SM = (0.5, 1, 2, 3, 4, 6, 8, 12, 16, 32)
BLOCKS = (256, 512, 1024, 2048, 4096)
WARPS = (4, 8)
STAGES = (1, 2, 3)
ORDERS = (0, 1)


@triton.jit
def _read_kernel(src_ptr, out_ptr, steps, BLOCK: tl.constexpr, STAGES: tl.constexpr, ORDER: tl.constexpr):
    """out[program] = sum of the int64 words it reads: `steps` steps of BLOCK words. ORDER 0: the program's slab
    (words program * steps * BLOCK ..); ORDER 1: global step s = i * programs + program for its i-th step."""
    program = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int64)
    for i in tl.range(0, steps, num_stages=STAGES):  # STAGES 1: no software pipelining
        if ORDER == 0:
            start = (program * steps + i) * BLOCK
        else:
            start = (i * programs + program) * BLOCK
        acc += tl.load(src_ptr + start + lanes)
    tl.store(out_ptr + program, tl.sum(acc))


def steps_for(nbytes: int, programs: int, block: int) -> int:
    """Steps per program so that programs * steps * block words cover nbytes."""
    return max(1, -(-nbytes // (8 * programs * block)))


def read_sums(buffer: torch.Tensor, programs: int, block: int, warps: int, stages: int, order: int, steps: int, out: torch.Tensor) -> torch.Tensor:
    _read_kernel[(programs,)](buffer, out, steps, BLOCK=block, STAGES=stages, ORDER=order, num_warps=warps)
    return out


def shapes(sms: int, quick: bool) -> list[tuple[int, int, int, int, int]]:
    per_sm = (1, 2, 4, 8, 16) if quick else PER_SM
    blocks = (512, 2048) if quick else BLOCKS
    stages = (1, 3) if quick else STAGES
    return [(max(1, int(p * sms)), b, w, s, o) for p, b, w, s, o in itertools.product(per_sm, blocks, WARPS, stages, ORDERS)]


def time_reads(nbytes: int, sms: int, quick: bool) -> list[dict]:
    """Every shape's best-of-rounds microseconds for one read of nbytes, checked first."""
    records = []
    todo = shapes(sms, quick)
    most = max(programs * steps_for(nbytes, programs, block) * block for programs, block, *_ in todo)
    count = max(2, -(-STREAMED // nbytes))
    calls = max(CALLS, count)
    buffers = [torch.randint(-(2**40), 2**40, (most,), device="cuda", dtype=torch.int64) for _ in range(count)]  # each shape reads a prefix
    for programs, block, warps, stages, order in todo:
        steps = steps_for(nbytes, programs, block)
        words = programs * steps * block
        out = torch.full((programs,), -1, device="cuda", dtype=torch.int64)
        total = int(read_sums(buffers[0], programs, block, warps, stages, order, steps, out).sum())
        if total != int(buffers[0][:words].sum()):
            raise SystemExit(f"{nbytes} B, shape {(programs, block, warps, stages, order)}: per-program sums miss words")

        def step():
            for index in range(calls):
                read_sums(buffers[index % count], programs, block, warps, stages, order, steps, out)

        us = min(graph_seconds(step) * 1e6 / calls for _ in range(ROUNDS))
        records.append({"programs": programs, "block": block, "warps": warps, "stages": stages, "order": order, "steps": steps,
                        "bytes_read": 8 * words, "us": us, "tb_s": 8 * words / us / 1e6})  # fmt: skip
    return records


def time_gemvs(tuning_path: Path | None) -> dict[str, dict]:
    """The real batch-1 GEMV at each GEMV_SHAPES shape, committed config, on its tile-major copy where the tuning keeps them."""
    from time_gemv_tiled import bit_equal

    from reference_engine.kernels import nvfp4_gemv, tuning
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    path = tuning_path or tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    document = json.loads(Path(path).read_text())
    tiled_on = bool(document.get("gemv_tiled", 0))
    found = {}
    for name, (rows, k_bytes) in GEMV_SHAPES.items():
        entry = next((e for e in document["nvfp4_gemv"] if e["tokens"] == 1 and e["rows"] == rows and e["k_bytes"] == k_bytes), None)
        if entry is None or len(entry["config"]) < 7 or entry["config"][6] not in (2, 3):
            continue
        _, block_n, block_kb, split_k, warps, loop, words = entry["config"][:7]
        cols = 2 * k_bytes
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        count = copies_for(packed.numel() + scale.numel())
        weights = [(packed, scale)] + [(packed.clone(), scale.clone()) for _ in range(count - 1)]
        copies = [nvfp4_gemv.tiled_gemv_weight(p, s, block_n, block_kb // 8) if tiled_on else None for p, s in weights]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        out = torch.full((1, rows), float("nan"), device="cuda", dtype=torch.bfloat16)
        if tiled_on and not bit_equal(x, packed, scale, scale_2, entry["config"][:7], copies[0]):
            raise SystemExit(f"GEMV {name}: the tile-major copy gives other bits")

        def step():
            for index in range(CALLS):
                p, s = weights[index % count]
                nvfp4_gemv._launch_half(x, p, s, scale_2, out, block_n, block_kb // 8, split_k, warps, loop, fp8=words == 3, tiled=copies[index % count])

        us = min(graph_seconds(step) * 1e6 / CALLS for _ in range(ROUNDS))
        found[name] = {"config": entry["config"], "tile_major": tiled_on, "us": us}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true", help="fewer shapes (5 grid sizes, 2 blocks, 2 loop forms)")
    parser.add_argument("--tuning", type=Path, default=None, help="tuning file for the real GEMVs (default: this card's, else the H200's)")
    args = parser.parse_args()
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    document = {"device": torch.cuda.get_device_name(), "sms": sms, "copy_tb_s": copy_bandwidth() / 1e12, "reads": {}, "gemvs": {}}
    document["gemvs"] = time_gemvs(args.tuning)
    for name, nbytes in BYTES.items():
        records = time_reads(nbytes, sms, args.quick)
        records.sort(key=lambda r: r["us"])
        document["reads"][name] = {"bytes": nbytes, "best": records[0], "shapes": records}
        best = records[0]
        line = (f"{name}: {nbytes / 1e6:6.2f} MB, best read {best['us']:6.2f} us ({best['tb_s']:.2f} TB/s) at {best['programs']} programs, "
                f"block {best['block']}, {best['warps']} warps, stages {best['stages']}, order {best['order']}")  # fmt: skip
        if name in document["gemvs"]:
            gemv = document["gemvs"][name]["us"]
            document["gemvs"][name]["best_read_over_gemv"] = best["us"] / gemv
            line += f"; real GEMV {gemv:6.2f} us (best read / GEMV {best['us'] / gemv:.3f})"
        print(line, flush=True)
        for r in records[1:5]:
            print(f"   {r['us']:6.2f} us  programs {r['programs']:5d} block {r['block']:4d} warps {r['warps']} stages {r['stages']} order {r['order']}", flush=True)
    print(f"copy_ (read + write) {document['copy_tb_s']:.3f} TB/s", flush=True)
    Path(args.out).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
