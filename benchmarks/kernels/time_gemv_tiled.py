"""Time the batch-1 NVFP4 GEMVs reading tile-major copies of their weights against the row-major weights.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemv_tiled.py OUT.json [--tuning FILE] [--sweep]

For each batch-1 GEMV of the tuning file (default: this card's, else the H200's; the NVFP4 LM head only with
`--lm-head`, recorded with `lm_head` true and left out of `adopt_measured.py`'s rule) that runs the
packed-float16 kernel (WORDS 2 or 3): random NVFP4 weights at that shape, copied until a graph of calls streams more
than the L2 (as in a decode step), and their tile-major copies for the committed tile (`nvfp4_gemv.tiled_gemv_weight`).
The outputs must be bit-equal before either form is timed. The two forms alternate over three rounds; each form's
fastest round counts. No speed is asserted. Where tile-major wins, the tuning's `gemv_tiled` 1 has the engine keep
such copies of its NVFP4 projections (`nvfp4_gemv.register_tiled_copy`, under 0.84 GB at full size).

`--sweep`: contiguous tiles may move the best tile, so each shape also times tile-major copies for a few neighbours of
the committed config (`neighbours`: K step doubled, rows halved, split-K doubled or halved, 8 warps, the other K loop),
each checked bit-equal to the row-major output first, in the same rounds. Records get `sweep` (config, us) and
`best_tiled` (the fastest tile-major config, the committed one included); `adopt_measured.py --gemv-tiled` takes a
neighbour only when it beats the committed tile by 3% or more.

`--stream-like`: instead of the neighbours, small row tiles (16, 32 or 64 rows, 64 or 128 bytes a step) with split-K 1
or 2 (`stream_like`), the shapes run80's pure reads favoured; each must agree with the committed config's output to
1e-2 relative (another tile sums in another order) as well as be bit-equal on its copy. Recorded as `--sweep` is.

`--x-pairs`: the committed tile on its copy with x given already as the block dot's float16 pairs
(`nvfp4_half_dot.x_half_pairs`, built once outside the timed calls, as a producer kernel would write them), in both
load forms, each bit-equal to converting x in the kernel first; records get `x_pairs` (time and its ratio to the
committed tile-major time). Nothing is adopted from it: `time_float16_pairs.py` times the engine's graph with the norms
writing the pairs (tuning key `gemv_x_pairs`).
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import CALLS, copies_for

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemv, tuning
from reference_engine.kernels.nvfp4_half_dot import x_half_pairs
from reference_engine.quant.nvfp4 import quantize_nvfp4

ROUNDS = 3


def neighbours(config: list[int], rows: int, k_blocks: int) -> list[list[int]]:
    """Configs (same layout as the tuning's) near `config` whose tiles fit the shape whole (rows by BLOCK_N, K blocks by
    BLOCK_B), split-K at most the K steps; the committed config excluded."""
    block_m, block_n, block_kb, split_k, warps, loop, words = config[:7]
    candidates = [
        [block_m, block_n, 2 * block_kb, split_k, warps, loop, words],
        [block_m, block_n, 2 * block_kb, max(1, split_k // 2), warps, loop, words],
        [block_m, block_n // 2, block_kb, split_k, warps, loop, words],
        [block_m, block_n // 2, block_kb, max(1, split_k // 2), warps, loop, words],
        [block_m, block_n, block_kb, 2 * split_k, warps, loop, words],
        [block_m, block_n, block_kb, max(1, split_k // 2), warps, loop, words],
        [block_m, block_n, block_kb, split_k, 8 if warps != 8 else 4, loop, words],
        [block_m, block_n, block_kb, split_k, warps, 0 if loop else 1, words],
    ]
    out = []
    for c in candidates:
        n, b, split = c[1], c[2] // 8, c[3]
        if n >= 16 and rows % n == 0 and k_blocks % b == 0 and split <= k_blocks // b and c != list(config[:7]) and c not in out:
            out.append(c)
    return out


def stream_like(config: list[int], rows: int, k_blocks: int) -> list[list[int]]:
    """`--stream-like` candidates: small row tiles read in 2 to 4 KB steps by many programs, with split-K 1 or 2
    (run80's pure reads of these bytes were fastest at 400 to 800 programs reading 2 KB a step), 4 warps, committed
    WORDS; whole tiles only, the committed config excluded."""
    block_m, words = config[0], config[6]
    out = []
    for block_n, (block_kb, loop), split in itertools.product((16, 32, 64), ((64, 0), (64, 3), (128, 1)), (1, 2)):
        c = [block_m, block_n, block_kb, split, 4, loop, words]
        b = block_kb // 8
        if rows % block_n == 0 and k_blocks % b == 0 and split <= k_blocks // b and c != list(config[:7]):
            out.append(c)
    return out


def half_out(x, packed, scale, scale_2, config, tiled=None, x_pairs=None, pair_loads=1) -> torch.Tensor:
    """The half kernel's output with `config`, on the row-major weight or on `tiled`, x converted in the kernel or given
    as `x_pairs`, into a NaN-poisoned buffer."""
    _, block_n, block_kb, split_k, warps, loop, words = config
    out = torch.full((1, packed.shape[0]), float("nan"), device="cuda", dtype=torch.bfloat16)
    nvfp4_gemv._launch_half(x, packed, scale, scale_2, out, block_n, block_kb // 8, split_k, warps, loop, fp8=words == 3, tiled=tiled,
                            x_pairs=x_pairs, pair_loads=pair_loads)  # fmt: skip
    return out


def bit_equal(x, packed, scale, scale_2, config, copy) -> bool:
    """The half kernel with `config` gives the same finite bits from the row-major weight and from its tile-major copy."""
    row_major, tile_major = half_out(x, packed, scale, scale_2, config), half_out(x, packed, scale, scale_2, config, copy)
    return bool(torch.isfinite(row_major).all()) and torch.equal(row_major, tile_major)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None, help="tuning file (default: this card's, else the H200's)")
    parser.add_argument("--sweep", action="store_true", help="also time tile-major copies for neighbouring tiles")
    parser.add_argument("--stream-like", action="store_true", help="sweep small row tiles with split-K 1 or 2 instead of the neighbours (records as --sweep)")
    parser.add_argument("--x-pairs", action="store_true", help="also time the committed tile with x given as float16 pairs (both load forms)")
    parser.add_argument("--lm-head", action="store_true", help="also time the NVFP4 LM head's shape (recorded apart: `lm_head`)")
    args = parser.parse_args()
    neighbours_too = args.sweep
    args.sweep = args.sweep or args.stream_like
    path = Path(args.tuning) if args.tuning else tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    entries = json.loads(Path(path).read_text())["nvfp4_gemv"]
    torch.manual_seed(0)
    records = []
    for entry in entries:
        tokens, rows, k_bytes, config = entry["tokens"], entry["rows"], entry["k_bytes"], entry["config"]
        if tokens != 1 or (rows > 65536 and not args.lm_head) or len(config) < 7 or config[6] not in (2, 3):
            continue
        cols = 2 * k_bytes
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        count = copies_for(packed.numel() + scale.numel())
        weights = [(packed, scale)] + [(packed.clone(), scale.clone()) for _ in range(count - 1)]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        out = torch.full((1, rows), float("nan"), device="cuda", dtype=torch.bfloat16)
        configs = [list(config[:7])] + (neighbours(config, rows, k_bytes // 8) if neighbours_too and rows <= 65536 else [])
        if args.stream_like and rows <= 65536:
            configs += [c for c in stream_like(config, rows, k_bytes // 8) if c not in configs]
        reference = half_out(x, packed, scale, scale_2, configs[0]).double()
        forms = [(False, configs[0], None, 0)]  # (tile-major, config, copies, x pair loads: 0 converts x in the kernel)
        for c in configs:
            copies = [nvfp4_gemv.tiled_gemv_weight(p, s, c[1], c[2] // 8) for p, s in weights]
            try:
                same = bit_equal(x, packed, scale, scale_2, c, copies[0])
            except Exception as error:  # a neighbour that does not compile or launch (resources) is skipped, not fatal
                if c is configs[0]:
                    raise
                print(f"  skipped {c}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                continue
            if not same:
                if c is configs[0]:
                    raise SystemExit(f"{rows} x {cols} {c}: the tile-major copy gives other bits than the row-major weights")
                print(f"  skipped {c}: tile-major bits differ from row-major", flush=True)
                continue
            error = float((half_out(x, packed, scale, scale_2, c).double() - reference).norm() / reference.norm())
            if not error < 1e-2:  # another tile sums in another order (bf16 output): a wrong index shows far above this
                print(f"  skipped {c}: {error:.3g} relative to the committed config's output", flush=True)
                continue
            forms.append((True, c, copies, 0))
        pairs = x_half_pairs(x, config[6] == 3)
        if args.x_pairs:
            for loads in (1, 2):
                given = half_out(x, packed, scale, scale_2, configs[0], forms[1][2][0], pairs, loads)
                if not torch.equal(given, half_out(x, packed, scale, scale_2, configs[0], forms[1][2][0])):
                    raise SystemExit(f"{rows} x {cols}: x given as pairs (loads {loads}) gives other bits than converting it in the kernel")
                forms.append((True, configs[0], forms[1][2], loads))
        rounds: list[list[float]] = [[] for _ in forms]
        for _ in range(ROUNDS):
            for form, (use_tiled, c, copies, loads) in enumerate(forms):
                _, block_n, block_kb, split_k, warps, loop, words = c

                def step(weights=weights, copies=copies, loads=loads):
                    for index in range(CALLS):
                        p, s = weights[index % count]
                        nvfp4_gemv._launch_half(x, p, s, scale_2, out, block_n, block_kb // 8, split_k, warps, loop, fp8=words == 3,
                                                tiled=copies[index % count] if use_tiled else None, x_pairs=pairs if loads else None,
                                                pair_loads=loads or 1)  # fmt: skip

                rounds[form].append(graph_seconds(step) * 1e6 / CALLS)
        best = [min(r) for r in rounds]
        row_major, tile_major = best[0], best[1]
        record = {"rows": rows, "k_bytes": k_bytes, "config": config, "lm_head": rows > 65536, "row_major_us": row_major, "tile_major_us": tile_major,
                  "ratio": tile_major / row_major, "rounds_us": {"row_major": rounds[0], "tile_major": rounds[1]}}  # fmt: skip
        print(f"GEMV {rows} x {cols} {config}: row-major {row_major:6.2f} us, tile-major {tile_major:6.2f} us, "
              f"ratio {tile_major / row_major:.3f} (bit-equal)", flush=True)  # fmt: skip
        if args.x_pairs:
            record["x_pairs"] = [{"loads": f[3], "tile_major_us": t, "over_converting": t / tile_major, "rounds_us": r}
                                 for f, t, r in zip(forms, best, rounds, strict=True) if f[3]]  # fmt: skip
            for item in record["x_pairs"]:
                print(f"  x given as pairs, loads {item['loads']}: {item['tile_major_us']:6.2f} us ({item['over_converting']:.3f} of converting x)", flush=True)
        if args.sweep:
            swept = [(f, t, r) for f, t, r in zip(forms[1:], best[1:], rounds[1:], strict=True) if not f[3]]
            record["sweep"] = [{"config": f[1], "tile_major_us": t, "rounds_us": r} for f, t, r in swept]
            fastest = min(record["sweep"], key=lambda item: item["tile_major_us"])
            record["best_tiled"] = {"config": fastest["config"], "tile_major_us": fastest["tile_major_us"]}
            for item in record["sweep"][1:]:
                print(f"  tile-major {item['config']}: {item['tile_major_us']:6.2f} us ({item['tile_major_us'] / tile_major:.3f} of the committed tile)", flush=True)
        records.append(record)
        del weights, forms
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "tuning": str(path), "records": records}, indent=1))


if __name__ == "__main__":
    main()
