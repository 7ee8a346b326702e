"""Turn on, in a tuning file, the settings whose timing files (written earlier in the same GPU call) show them faster.

    PYTHONPATH=. python3 benchmarks/kernels/adopt_measured.py TUNING.json [--tiled TILED.json] [--gemv-tiled GEMV.json]
        [--gemm-tiled GEMM.json] [--sampling SAMPLING.json]

- `--tiled` (`time_moe_tiled.py`): `moe_grouped_half.tiled` = 1 when the tile-major reads were bit-equal (the script
  exits before writing otherwise) and at least 3% faster at every batch timed; with `--sweep` records and the copies on,
  the plan change that beat the committed tile-major time by 3% or more at every batch (the fastest in total); with
  `--per-pair` records, `min_tokens` lowered to the smallest batch from which the grouped kernels beat the per-pair
  ones by 3% or more at every batch timed below the old bound;
- `--gemv-tiled` (`time_gemv_tiled.py`): `gemv_tiled` = 1 when the batch-1 GEMVs on tile-major copies were bit-equal
  and took at most 0.97 of the time in total over the shapes timed, and no shape got slower; with `--sweep` records, a
  shape whose fastest tile-major neighbour beat the committed tile by 3% or more gets that config written too;
- `--gemm-tiled` (`time_gemm_tiled.py`): `gemm_tiled` = 1 when the decode-batch GEMMs on tile-major copies were
  bit-equal and took at most 0.97 of the time in total over the shapes and batches timed, and none got slower;
- `--sampling` (`benchmarks/time_sampling.py`): `sampling_fused_select` = 1 when the fused selection drew the same
  tokens as the torch selection path at every batch and took less device time in graphs at every batch.

Prints each decision with its ratios. A setting not shown faster is left as the file has it. Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reference_engine.kernels.tuning import write_setting

MARGIN = 0.97


def tiled_wins(path: Path) -> bool:
    records = json.loads(path.read_text())["records"]
    ratios = {r["tokens"]: round(r["ratio"], 3) for r in records}
    wins = bool(records) and all(r["ratio"] <= MARGIN for r in records)
    print(f"tile-major / row-major by batch {ratios}: {'adopted' if wins else 'not adopted'}")
    return wins


def gemv_tiled_choice(path: Path) -> tuple[bool, dict[tuple[int, int], list[int]]]:
    """(adopt the copies?, {(rows, k_bytes): a neighbour's config to write}). Each shape counts its fastest tile-major
    config: a `--sweep` neighbour only when it beat the committed tile by MARGIN, else the committed one."""
    records = [r for r in json.loads(path.read_text())["records"] if not r.get("lm_head")]  # the LM head: information only
    chosen: dict[tuple[int, int], list[int]] = {}
    tiles = 0.0
    ratios = {}
    for r in records:
        tile_us = r["tile_major_us"]
        best = r.get("best_tiled")
        if best is not None and best["config"] != list(r["config"][:7]) and best["tile_major_us"] <= MARGIN * tile_us:
            chosen[(r["rows"], r["k_bytes"])] = best["config"]
            tile_us = best["tile_major_us"]
        tiles += tile_us
        ratios[f"{r['rows']}x{2 * r['k_bytes']}"] = round(tile_us / r["row_major_us"], 3)
    rows = sum(r["row_major_us"] for r in records)
    wins = bool(records) and tiles <= MARGIN * rows and all(ratio <= 1.0 for ratio in ratios.values())
    print(f"GEMV tile-major / row-major by shape {ratios}, in total {tiles / rows if rows else float('nan'):.3f}: "
          f"{'adopted' if wins else 'not adopted'}; tiles changed: {chosen if wins else {}}")  # fmt: skip
    return wins, chosen if wins else {}


def tiled_variant(path: Path) -> dict | None:
    """The `--sweep` plan change whose tile-major time was at most MARGIN of the committed plan's at every batch timed
    (the fastest in total among those), else None."""
    records = json.loads(path.read_text())["records"]
    totals: dict[str, float] = {}
    changes: dict[str, dict] = {}
    for key in {json.dumps(item["change"], sort_keys=True) for r in records for item in r.get("sweep", [])}:
        times = []
        for r in records:
            found = [item["tile_major_us"] for item in r.get("sweep", []) if json.dumps(item["change"], sort_keys=True) == key]
            times.append(found[0] / r["tile_major_us"] if found else float("inf"))
        if records and all(t <= MARGIN for t in times):
            totals[key] = sum(item["tile_major_us"] for r in records for item in r["sweep"] if json.dumps(item["change"], sort_keys=True) == key)
            changes[key] = json.loads(key)
    choice = changes[min(totals, key=totals.get)] if totals else None
    print(f"grouped-half tile variants beating the committed plan by {1 - MARGIN:.0%} at every batch: {list(changes.values())}; taken: {choice}")
    return choice


def gemm_tiled_wins(path: Path) -> bool:
    records = json.loads(path.read_text())["records"]
    ratios = {f"{r['rows']}x{r['cols']}@{r['tokens']}": round(r["ratio"], 3) for r in records}
    rows = sum(r["row_major_us"] for r in records)
    tiles = sum(r["tile_major_us"] for r in records)
    wins = bool(records) and tiles <= MARGIN * rows and all(r["ratio"] <= 1.0 for r in records)
    print(f"GEMM tile-major / row-major by shape and batch {ratios}, in total {tiles / rows if rows else float('nan'):.3f}: "
          f"{'adopted' if wins else 'not adopted'}")  # fmt: skip
    return wins


def grouped_min_tokens(path: Path, current: int | None) -> int | None:
    """The smallest batch timed (`--per-pair` records) from which the grouped kernels on the tile-major copies took at
    most MARGIN of the per-pair kernels' time at every batch timed up to `current` (the file's `min_tokens`); None
    when no smaller batch qualifies."""
    records = sorted((r for r in json.loads(path.read_text())["records"] if "per_pair_us" in r), key=lambda r: r["tokens"])
    below = [r for r in records if current is None or r["tokens"] < current]
    ratios = {r["tokens"]: round(r["tile_major_us"] / r["per_pair_us"], 3) for r in records}
    choice = None
    for r in reversed(below):  # from the largest batch below `current` down, while each one wins
        if r["tile_major_us"] > MARGIN * r["per_pair_us"]:
            break
        choice = r["tokens"]
    print(f"grouped (tile-major) / per-pair by batch {ratios}: min_tokens {current} -> {choice if choice is not None else current}")
    return choice


def fused_wins(path: Path) -> bool:
    rows = json.loads(path.read_text())["rows"]
    ratios = {r["batch"]: round(r["fused_graph_seconds"] / r["selection_graph_seconds"], 3) for r in rows if "fused_graph_seconds" in r}
    same = all(r.get("fused_same_tokens", False) for r in rows)
    wins = bool(ratios) and same and all(ratio < 1.0 for ratio in ratios.values())
    print(f"fused / torch selection by batch {ratios}, same tokens {same}: {'adopted' if wins else 'not adopted'}")
    return wins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tuning", type=Path)
    parser.add_argument("--tiled", type=Path)
    parser.add_argument("--gemv-tiled", type=Path)
    parser.add_argument("--gemm-tiled", type=Path)
    parser.add_argument("--sampling", type=Path)
    args = parser.parse_args()
    if args.tiled is not None and args.tiled.exists():
        settings = json.loads(args.tuning.read_text())["moe_grouped_half"]
        if tiled_wins(args.tiled) or settings.get("tiled"):
            change = tiled_variant(args.tiled)
            lowest = grouped_min_tokens(args.tiled, settings.get("min_tokens"))
            write_setting(args.tuning, "moe_grouped_half", settings | (change or {}) | {"tiled": 1} | ({"min_tokens": lowest} if lowest else {}))
    if args.gemv_tiled is not None and args.gemv_tiled.exists():
        wins, chosen = gemv_tiled_choice(args.gemv_tiled)
        if wins:
            entries = json.loads(args.tuning.read_text())["nvfp4_gemv"]
            for entry in entries:
                config = chosen.get((entry["rows"], entry["k_bytes"])) if entry["tokens"] == 1 else None
                if config is not None:
                    entry["config"] = config
            write_setting(args.tuning, "nvfp4_gemv", entries)
            write_setting(args.tuning, "gemv_tiled", 1)
    if args.gemm_tiled is not None and args.gemm_tiled.exists() and gemm_tiled_wins(args.gemm_tiled):
        write_setting(args.tuning, "gemm_tiled", 1)
    if args.sampling is not None and args.sampling.exists() and fused_wins(args.sampling):
        write_setting(args.tuning, "sampling_fused_select", 1)


if __name__ == "__main__":
    main()
