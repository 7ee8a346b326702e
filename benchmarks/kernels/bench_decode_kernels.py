"""Time each Triton decode kernel against the torch op it replaces, at the real decode shapes.

Run on a GPU machine from the repository root:
    PYTHONPATH=. python benchmarks/kernels/bench_decode_kernels.py results.json [--quick]

Per kernel and shape (batch 1 and 32): median time of `triton.testing.do_bench` (L2 flushed between
runs, launch overhead included) and, where the call can be captured, of CUDA-graph replay (what the
decode step pays inside a graph); bytes moved (the minimum: every weight, cache and state byte read
once, outputs written once); achieved GB/s and the fraction of the 4.27 TB/s measured copy
bandwidth of an H200; the relative Frobenius difference of the Triton output from the torch op's.
Writes the records as JSON to the given path. No speed is asserted anywhere.
"""

# ruff: noqa: B023 - each lambda is called by `measure` within the loop iteration that made it
from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch
import triton
import triton.testing

from reference_engine.bench.timing import graph_seconds

COPY_BANDWIDTH = 4.27e12  # bytes/s, measured copy bandwidth of the H200 (shared/FACTS.md)
DEVICE = "cuda"


def median_us(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")) * 1e3


def graph_us(fn: Callable[[], object], replays: int = 50) -> float | None:
    """Median microseconds per replay of a CUDA graph holding one call; None when capture fails."""
    try:
        return graph_seconds(fn, replays) * 1e6
    except Exception as error:  # noqa: BLE001 - capture failures are reported, not fatal
        print(f"    (graph capture failed: {type(error).__name__}: {str(error)[:120]})")
        torch.cuda.synchronize()
        return None


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def measure(records: list[dict], kernel: str, shape: str, nbytes: int, triton_call, torch_call, outputs: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None) -> None:
    row = {"kernel": kernel, "shape": shape, "bytes": int(nbytes)}
    for name, call in (("torch", torch_call), ("triton", triton_call)):
        call()
        torch.cuda.synchronize()
        bench = median_us(call)
        graph = graph_us(call)
        best = min(t for t in (bench, graph) if t is not None)
        row[name] = {"do_bench_us": bench, "graph_us": graph, "gb_per_s": nbytes / best / 1e3, "fraction_of_copy": nbytes / (best * 1e-6) / COPY_BANDWIDTH}
    if outputs is not None:
        triton_out, torch_out = outputs()
        row["rel_diff_vs_torch"] = rel_diff(triton_out, torch_out)
    records.append(row)
    t, r = row["triton"], row["torch"]
    print(
        f"{kernel:22s} {shape:28s} {nbytes / 1e6:9.2f} MB | triton {t['do_bench_us']:8.1f} us bench {t['graph_us'] or float('nan'):8.1f} us graph "
        f"{t['gb_per_s']:7.0f} GB/s {t['fraction_of_copy']:5.1%} | torch {r['do_bench_us']:8.1f} / {r['graph_us'] or float('nan'):8.1f} us "
        f"{r['fraction_of_copy']:5.1%} | diff {row.get('rel_diff_vs_torch', float('nan')):.1e}",
        flush=True,
    )


def bench_w4a16(records, quick):
    from reference_engine.kernels.nvfp4_gemv import w4a16_linear as triton_op
    from reference_engine.quant.linear import w4a16_linear as torch_op

    shapes = [(512, 2048), (1024, 2048), (2048, 4096), (8192, 2048)] + ([] if quick else [(248320, 2048)])
    for rows, columns in shapes:
        packed = torch.randint(0, 256, (rows, columns // 2), dtype=torch.uint8, device=DEVICE)
        scale = torch.randint(0x28, 0x48, (rows, columns // 16), dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)
        scale_2 = torch.tensor(1e-3, device=DEVICE)
        for tokens in (1, 32):
            x = torch.randn(tokens, columns, device=DEVICE).bfloat16()
            a, b = torch.empty(tokens, rows, dtype=torch.bfloat16, device=DEVICE), torch.empty(tokens, rows, dtype=torch.bfloat16, device=DEVICE)
            nbytes = rows * columns // 2 + rows * columns // 16 + 2 * tokens * (rows + columns)
            measure(records, "w4a16_linear", f"M={tokens} N={rows} K={columns}", nbytes,
                    lambda: triton_op(x, packed, scale, scale_2, a), lambda: torch_op(x, packed, scale, scale_2, b), lambda: (a, b))


def bench_moe(records, quick):
    from reference_engine.kernels.moe_decode import nvfp4_routed_experts as triton_nvfp4
    from reference_engine.kernels.moe_decode import routed_experts as triton_dense
    from reference_engine.ops.static_moe import StackedNvfp4Experts
    from reference_engine.ops.static_moe import nvfp4_routed_experts as torch_nvfp4
    from reference_engine.ops.static_moe import routed_experts as torch_dense

    experts, hidden, inter, top_k = 256, 2048, 512, 8

    def codes(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=DEVICE)

    def scales(*shape):
        return torch.randint(0x28, 0x48, shape, dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)

    stacked = StackedNvfp4Experts(
        codes(experts, 2 * inter, hidden // 2), scales(experts, 2 * inter, hidden // 16), torch.full((experts, 2), 1e-3, device=DEVICE),
        codes(experts, hidden, inter // 2), scales(experts, hidden, inter // 16), torch.full((experts,), 1e-3, device=DEVICE),
    )
    dense_gate_up = (torch.randn(experts, 2 * inter, hidden, device=DEVICE) * hidden**-0.5).bfloat16()
    dense_down = (torch.randn(experts, hidden, inter, device=DEVICE) * inter**-0.5).bfloat16()
    for tokens in (1, 32):
        ids = torch.rand(tokens, experts, device=DEVICE).argsort(dim=1)[:, :top_k].to(torch.int32)
        weights = torch.softmax(torch.randn(tokens, top_k, device=DEVICE), dim=1)
        x = torch.randn(tokens, hidden, device=DEVICE).bfloat16()
        distinct = int(torch.unique(ids).numel())
        a, b = torch.empty_like(x), torch.empty_like(x)
        nvfp4_bytes = distinct * 3 * hidden * inter * 9 // 16 + 4 * tokens * hidden + tokens * top_k * 8
        measure(records, "nvfp4_routed_experts", f"T={tokens} distinct={distinct}", nvfp4_bytes,
                lambda: triton_nvfp4(x, weights, ids, stacked, a), lambda: torch_nvfp4(x, weights, ids, stacked, b), lambda: (a, b))
        dense_bytes = distinct * 3 * hidden * inter * 2 + 4 * tokens * hidden + tokens * top_k * 8
        measure(records, "routed_experts(bf16)", f"T={tokens} distinct={distinct}", dense_bytes,
                lambda: triton_dense(x, weights, ids, dense_gate_up, dense_down, a), lambda: torch_dense(x, weights, ids, dense_gate_up, dense_down, b), lambda: (a, b))


def bench_router(records, quick):
    from reference_engine.kernels.router import router_topk as triton_op
    from reference_engine.ops.moe import router_topk as torch_op

    for tokens in (1, 32):
        logits = torch.randn(tokens, 256, device=DEVICE).bfloat16()
        wa, wb = torch.empty(tokens, 8, device=DEVICE), torch.empty(tokens, 8, device=DEVICE)
        ia, ib = torch.empty(tokens, 8, dtype=torch.int32, device=DEVICE), torch.empty(tokens, 8, dtype=torch.int32, device=DEVICE)
        measure(records, "router_topk", f"T={tokens} E=256 k=8", tokens * 256 * 2 + tokens * 8 * 8,
                lambda: triton_op(logits, wa, ia, 8), lambda: torch_op(logits, wb, ib, 8), lambda: (wa, wb))


def bench_gdn(records, quick):
    from reference_engine.kernels.gdn_decode import gdn_recurrent_decode as triton_op
    from reference_engine.ops.linear_attention import gdn_recurrent_decode as torch_op

    for batch in (1, 32):
        q, k = torch.randn(batch, 16, 128, device=DEVICE).bfloat16(), torch.randn(batch, 16, 128, device=DEVICE).bfloat16()
        v = torch.randn(batch, 32, 128, device=DEVICE).bfloat16()
        g, beta = -torch.rand(batch, 32, device=DEVICE), torch.rand(batch, 32, device=DEVICE)
        state = torch.randn(batch, 32, 128, 128, device=DEVICE) * 0.1
        sa, sb = state.clone(), state.clone()
        oa, ob = torch.empty_like(v), torch.empty_like(v)
        nbytes = 2 * state.numel() * 4 + 2 * (q.numel() + k.numel() + 2 * v.numel()) + 8 * batch * 32
        # In place on the Triton side (as the engine runs it); the torch op writes a second buffer.
        measure(records, "gdn_recurrent_decode", f"B={batch} Hv=32 128x128", nbytes,
                lambda: triton_op(q, k, v, g, beta, sa, oa, sa), lambda: torch_op(q, k, v, g, beta, state, ob, sb), None)


def bench_paged(records, quick):
    from reference_engine.kernels.paged_decode import paged_decode as triton_op
    from reference_engine.ops.static_attention import paged_decode as torch_op

    for batch, length in ((1, 1024), (1, 16384), (32, 2048)):
        max_blocks = length // 16
        k_cache = torch.randn(batch * max_blocks, 16, 2, 256, device=DEVICE).bfloat16()
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(batch * max_blocks, device=DEVICE).reshape(batch, max_blocks).to(torch.int32)
        seq_lens = torch.full((batch,), length, dtype=torch.int32, device=DEVICE)
        query = torch.randn(batch, 16, 256, device=DEVICE).bfloat16()
        a, b = torch.empty_like(query), torch.empty_like(query)
        nbytes = 2 * batch * length * 2 * 256 * 2 + 2 * query.numel() * 2 + 4 * tables.numel()
        measure(records, "paged_decode", f"B={batch} len={length}", nbytes,
                lambda: triton_op(query, k_cache, v_cache, tables, seq_lens, a, 0.0625), lambda: torch_op(query, k_cache, v_cache, tables, seq_lens, b, 0.0625), lambda: (a, b))


def bench_norms(records, quick):
    from reference_engine.kernels import norms as kernels
    from reference_engine.ops import norms as torch_ops

    for tokens in (1, 32):
        x, residual = torch.randn(tokens, 2048, device=DEVICE).bfloat16(), torch.randn(tokens, 2048, device=DEVICE).bfloat16()
        weight = (torch.randn(2048, device=DEVICE) * 0.1).bfloat16()
        oa, ob, ra, rb = (torch.empty_like(x) for _ in range(4))
        measure(records, "fused_add_rms_norm", f"T={tokens} D=2048", 4 * x.numel() * 2 + 2 * 2048,
                lambda: kernels.fused_add_rms_norm(x, residual, weight, oa, ra), lambda: torch_ops.fused_add_rms_norm(x, residual, weight, ob, rb), lambda: (oa, ob))
        heads, z, hw = torch.randn(tokens * 32, 128, device=DEVICE).bfloat16(), torch.randn(tokens * 32, 128, device=DEVICE).bfloat16(), torch.rand(128, device=DEVICE).bfloat16()
        ga, gb = torch.empty_like(heads), torch.empty_like(heads)
        measure(records, "gated_rms_norm", f"T={tokens} 32 heads x 128", 3 * heads.numel() * 2 + 256,
                lambda: kernels.gated_rms_norm(heads, z, hw, ga), lambda: torch_ops.gated_rms_norm(heads, z, hw, gb), lambda: (ga, gb))


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    path, quick = argv[0], "--quick" in argv
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    torch.manual_seed(0)
    records: list[dict] = []
    failures: list[str] = []
    for bench in (bench_w4a16, bench_moe, bench_router, bench_gdn, bench_paged, bench_norms):
        try:
            bench(records, quick)
        except Exception as error:  # noqa: BLE001 - one failing kernel must not hide the others' timings
            failures.append(f"{bench.__name__}: {type(error).__name__}: {error}")
            print(f"FAILED {failures[-1]}", flush=True)
        torch.cuda.empty_cache()
    document = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "copy_bandwidth": COPY_BANDWIDTH,
                "records": records, "failures": failures}
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)
    print(f"wrote {len(records)} records to {path}; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
