"""Why the async-decoding CUDA test differs on the torch ops (run71, run72) but not on the Triton kernels (run72).

    python benchmarks/diagnose_async_torch.py OUT.json

Runs the test's workload (`tests/reference_engine/test_async_decode.py`, tiny bfloat16 NVFP4 model, graphs, one
decode bucket of 4) in pairs of engines and reports, per pair, the first request and token index where the outputs
part (or that they agree):
- sync vs sync: is the synchronous engine itself repeatable on these ops?
- sync vs async, and sync vs async with the device drained after every launch (a race would vanish there);
- the same two under `torch.use_deterministic_algorithms(True)` (atomic float adds, e.g. `index_add_`, ordered);
- sync vs async on the Triton kernels, for contrast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reference_engine"))

import test_async_decode as workload

from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer


def _first_difference(a: dict, b: dict) -> str:
    for request_id in a:
        left, right = a[request_id][0], b[request_id][0]
        if left != right:
            index = next((i for i, (x, y) in enumerate(zip(left, right)) if x != y), min(len(left), len(right)))
            return f"{request_id}[{index}]"
    return "same"


def main() -> None:
    out = Path(sys.argv[1])
    model = build_preset("tiny", device="cuda", dtype=torch.bfloat16, quantize="nvfp4", seed=3)
    tokenizer = load_tokenizer("tiny")
    reference, _ = workload._drive(workload._cuda_engine(model, tokenizer, False, False))
    stop_token = reference["stops"][0][5]
    report = {}

    def run(async_decode: bool, use_triton: bool, drain: bool = False) -> dict:
        return workload._drive(workload._cuda_engine(model, tokenizer, async_decode, use_triton, drain), stop_token)[0]

    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        tag = "deterministic" if deterministic else "default"
        sync = run(False, False)
        report[f"torch {tag}: sync vs sync"] = _first_difference(sync, run(False, False))
        report[f"torch {tag}: sync vs async"] = _first_difference(sync, run(True, False))
        report[f"torch {tag}: sync vs async drained"] = _first_difference(sync, run(True, False, drain=True))
    torch.use_deterministic_algorithms(False)
    sync = run(False, True)
    report["triton: sync vs async"] = _first_difference(sync, run(True, True))
    for name, result in report.items():
        print(f"{name}: {result}")
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
