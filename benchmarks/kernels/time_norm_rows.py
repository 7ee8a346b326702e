"""The Gated DeltaNet output norm with several 128-wide rows per program against one row per program (prefill shapes).

    PYTHONPATH=. python3 benchmarks/kernels/time_norm_rows.py OUT.json [--tuning FILE]

A prefill of T tokens normalises T x 32 rows of 128 (`norms.gated_rms_norm`, z a token-strided view of the stacked
in_proj output as the model passes it); with one row per program that is 32,768 programs of 128 elements at 1024
tokens. Per prompt length (37, 128, 1024 tokens) and per `norms.ROW_ELEMENTS` (1, 1024, 2048, 4096: 1, 8, 16, 32 rows
a program) the outputs are compared with one row per program (to bf16 rounding, else exit 1), then timed in a CUDA
graph over copies that together exceed the L2. With --tuning, `norm_row_elements` is written: the setting with the
least time summed over the lengths when it beats one row per program by more than 2% there and loses by more than 2%
at no length, else 1. No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import norms, tuning

HEADS, WIDTH = 32, 128
LENGTHS = (37, 128, 1024)
SETTINGS = (1, 1024, 2048, 4096)
CALLS = 16
MARGIN = 0.02


def one_length(tokens: int) -> dict:
    copies = max(2, (96 << 20) // (3 * tokens * HEADS * WIDTH * 2))  # x, z and out of every copy: more than the L2
    g = torch.Generator(device="cuda").manual_seed(tokens)
    sets = []
    for _ in range(copies):
        x = torch.randn(tokens, HEADS, WIDTH, device="cuda", generator=g).bfloat16()
        stacked = torch.randn(tokens, 3 * HEADS * WIDTH, device="cuda", generator=g).bfloat16()
        z = stacked[:, HEADS * WIDTH : 2 * HEADS * WIDTH].view(tokens, HEADS, WIDTH)
        sets.append((x, z, torch.full_like(x, float("nan"))))
    weight = (torch.rand(WIDTH, device="cuda", generator=g) + 0.5).bfloat16()
    record: dict = {"tokens": tokens, "copies": copies}
    reference = None
    for setting in SETTINGS:
        norms.ROW_ELEMENTS = setting
        x, z, out = sets[0]
        out.fill_(float("nan"))
        norms.gated_rms_norm(x, z, weight, out)
        if reference is None:
            reference = out.clone()
        difference = float((out.float() - reference.float()).abs().max())
        record[f"rows_{setting}_max_difference"] = difference
        record.setdefault("close", True)
        record["close"] = record["close"] and bool(torch.isfinite(out).all()) and difference <= 2e-2

        def step():
            for index in range(CALLS):
                x, z, out = sets[index % copies]
                norms.gated_rms_norm(x, z, weight, out)

        record[f"rows_{setting}_us"] = graph_seconds(step) * 1e6 / CALLS
    norms.ROW_ELEMENTS = 1
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    path = tuning.apply_for_cuda()
    records: dict = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path), "settings": list(SETTINGS)}
    rows = []
    for tokens in LENGTHS:
        row = one_length(tokens)
        rows.append(row)
        records[f"tokens_{tokens}"] = row
        print(tokens, json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    if not all(row["close"] for row in rows):
        print("a setting disagrees with one row per program: norm_row_elements not written", file=sys.stderr)
        return 1
    if args.tuning is not None:
        totals = {setting: sum(row[f"rows_{setting}_us"] for row in rows) for setting in SETTINGS}
        best = min(SETTINGS[1:], key=totals.__getitem__)
        take, ratio = tuning.switch_wins(rows, f"rows_{best}_us", "rows_1_us", MARGIN)
        tuning.write_setting(args.tuning, "norm_row_elements", best if take else 1)
        print(f"tuning: norm_row_elements = {best if take else 1} (rows_{best} / rows_1 summed over the lengths: {ratio:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
