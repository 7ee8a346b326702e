"""Time the MoE prefill block table: the counting sort (`nvfp4_gemm.block_table`, three Triton launches) against
the torch reference (`block_table_torch`: stable radix sort, scatter-add, cumsums, searchsorted).

    PYTHONPATH=. python3 benchmarks/kernels/time_block_table.py results.json

Top-8 of 256 experts, uniform random routing, 1024 and 4096 prompt tokens (BLOCK_M 64) and 32 tokens (BLOCK_M 16),
as the engine's prefill plans them. Both tables are checked equal first; then microseconds per call inside a CUDA
graph of 8 calls. No speed is asserted.
"""

from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemm

EXPERTS, TOP_K, CALLS = 256, 8, 8


def main(path: str) -> None:
    torch.manual_seed(0)
    records = []
    for tokens, block_m in ((32, 16), (1024, 64), (4096, 64)):
        ids = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
        counting, reference = nvfp4_gemm.block_table(ids, EXPERTS, block_m), nvfp4_gemm.block_table_torch(ids, EXPERTS, block_m)
        equal = torch.equal(counting[0], reference[0]) and torch.equal(counting[1], reference[1])
        record = {"tokens": tokens, "block_m": block_m, "equal": equal}
        for name, build in (("counting sort", nvfp4_gemm.block_table), ("torch", nvfp4_gemm.block_table_torch)):
            record[name + " us"] = graph_seconds(lambda build=build, ids=ids, block_m=block_m: [build(ids, EXPERTS, block_m) for _ in range(CALLS)]) * 1e6 / CALLS
        records.append(record)
        print(record, flush=True)
    with open(path, "w") as handle:
        json.dump(records, handle, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1])
