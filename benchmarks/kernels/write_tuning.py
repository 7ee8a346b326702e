"""Turn the GPU timing records into a tuning file (`reference_engine/kernels/tuning.py` reads it).

    PYTHONPATH=. python3 benchmarks/kernels/write_tuning.py gemv_sweep.json moe_times.json OUT.json [--base EARLIER.json]

GEMV: per shape, the fastest configuration whose output matched the torch op, kept only when it beats
the default `plan` by more than 3% (smaller differences are within run-to-run spread). MoE: the setting
with the least sum over batch sizes of (time / that batch size's best time), i.e. good at every batch
size above 1 rather than best at one; at one token, the fastest (`moe_decode_batch_one`). The device name is read from the GPU this runs on. With `--base`, settings
these records do not measure (shapes not swept, the batch crossover when only batch 1 was swept) come
from the earlier file.
"""

from __future__ import annotations

import json
import math
import sys

import torch


def gemv_entries(records: list[dict]) -> list[dict]:
    entries = []
    records = [r for r in records if r.get("kernel", "gemv") == "gemv" and r["tokens"] == 1]
    for key in sorted({(r["tokens"], r["N"], r["K"]) for r in records}):
        rows = [r for r in records if (r["tokens"], r["N"], r["K"]) == key and r["us"] == r["us"] and r["rel_error"] < 1e-2]
        if not rows:
            continue
        best = min(rows, key=lambda r: r["us"])
        default = next((r for r in rows if r["default"]), None)
        if default is None or best["us"] < 0.97 * default["us"]:
            entries.append({"tokens": key[0], "rows": key[1], "k_bytes": key[2] // 2, "config": list(best["config"])})
    return entries


def moe_setting(records: list[dict], batch_one: bool = False) -> dict | None:
    """batch_one: the fastest setting at one token; otherwise the best over the larger batches measured."""
    ok = [r for r in records if r.get("setting") is not None and r["us"] == r["us"] and r["rel_error"] < 1e-2 and (r["tokens"] == 1) == batch_one]
    if not ok:
        return None
    best_per_batch = {t: min(r["us"] for r in ok if r["tokens"] == t) for t in {r["tokens"] for r in ok}}
    settings = {tuple(r["setting"]) for r in ok}
    complete = [s for s in settings if all(any(tuple(r["setting"]) == s and r["tokens"] == t for r in ok) for t in best_per_batch)]
    choice = min(complete, key=lambda s: sum(r["us"] / best_per_batch[r["tokens"]] for r in ok if tuple(r["setting"]) == s))
    return dict(zip(("LOOP", "GATE_UP_BLOCK_N", "GATE_UP_BLOCK_K", "DOWN_BLOCK_H", "DOWN_BLOCK_I", "WORDS", "DOWN_SPLIT"), choice))


def _summed(records: list[dict], tokens: int, keep) -> float:
    """Summed microseconds over the shapes measured at `tokens` for the records `keep` selects (nan if a shape lacks one)."""
    total = 0.0
    for shape in {r["shape"] for r in records if r["tokens"] == tokens}:
        times = [r["us"] for r in records if r["shape"] == shape and r["tokens"] == tokens and keep(r) and r["us"] == r["us"] and r["rel_error"] < 1e-2]
        total += min(times) if times else float("nan")
    return total


def batch_choices(records: list[dict]) -> dict:
    """gemv_words: word reads for the untuned shapes when they beat byte reads at the smallest batch above 1
    (summed over shapes); gemm_min_tokens: the smallest batch from which the tensor-core GEMM beats the best
    GEMV at every larger batch measured."""
    choices: dict = {}
    batches = sorted({r["tokens"] for r in records if r.get("kernel") == "gemm"})
    if not batches:
        return choices
    words = _summed(records, batches[0], lambda r: r["kernel"] == "gemv" and r["config"][-1] == 1)
    plain = _summed(records, batches[0], lambda r: r["kernel"] == "gemv" and r["config"][-1] == 0)
    if not (math.isnan(words) or math.isnan(plain)):
        choices["gemv_words"] = int(words < plain)
    wins = [t for t in batches if _summed(records, t, lambda r: r["kernel"] == "gemm") < _summed(records, t, lambda r: r["kernel"] == "gemv")]
    crossover = next((t for t in batches if all(b in wins for b in batches if b >= t)), None)
    if crossover is not None:
        choices["gemm_min_tokens"] = crossover
    return choices


if __name__ == "__main__":
    if len(sys.argv) not in (4, 6) or (len(sys.argv) == 6 and sys.argv[4] != "--base"):
        print(__doc__)
        raise SystemExit(2)
    tuning: dict = {"device": torch.cuda.get_device_name(0)}
    base: dict = {}
    if len(sys.argv) == 6:  # an earlier tuning file: what these records do not measure is kept from it
        with open(sys.argv[5]) as handle:
            base = json.load(handle)
    jobs = ((sys.argv[1], "nvfp4_gemv", gemv_entries), (sys.argv[2], "moe_decode", moe_setting),
            (sys.argv[2], "moe_decode_batch_one", lambda records: moe_setting(records, batch_one=True)))
    for path, key, build in jobs:
        try:
            with open(path) as handle:
                records = json.load(handle)
        except (OSError, ValueError) as error:
            print(f"{path}: {error}; {key} left untuned")
            continue
        value = build(records)
        if value:
            tuning[key] = value
        if key == "nvfp4_gemv":
            tuning |= batch_choices(records)
    if base:
        measured = {(e["tokens"], e["rows"], e["k_bytes"]) for e in tuning.get("nvfp4_gemv", [])}
        kept = [e for e in base.get("nvfp4_gemv", []) if (e["tokens"], e["rows"], e["k_bytes"]) not in measured]
        tuning = {key: value for key, value in base.items() if key != "device"} | tuning
        tuning["nvfp4_gemv"] = kept + tuning.get("nvfp4_gemv", [])
    with open(sys.argv[3], "w") as handle:
        json.dump(tuning, handle, indent=1)
    print(json.dumps(tuning))
