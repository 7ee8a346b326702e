"""Time the chunked Gated DeltaNet prefill at the real head shape on a GPU: Triton kernel, torch op, fla.

    PYTHONPATH=. python3 benchmarks/kernels/time_gdn_prefill.py results.json

One layer, Hk=16, Hv=32, Dk=Dv=128, bfloat16 q/k/v, float32 gates and state, prompt lengths 1024 and
4096 (one sequence) and 4 x 256 (ragged batch). Each implementation's output and final state are
compared with the torch op (relative Frobenius error) before it is timed; the Triton kernel (tf32 dots, the
blocked inverse) runs launch 2 as a while loop (`SCAN_STAGES` 0) or as a range loop software-pipelined with 2 stages,
and launch 1 with 8 or 4 warps (`PREPARE_WARPS`). (run19 timed the dot precisions and the inverses; run34 also 3
stages and 16 value columns per program.) fla (flash-linear-attention's
`chunk_gated_delta_rule`, the kernels transformers calls) is timed where it imports, with q/k repeated
to the value heads as transformers does. Medians of CUDA-event timings of eager calls (host launch
cost included, as a prefill pays it). No speed is asserted.
"""

# ruff: noqa: B023 - the closures run within the loop iteration that made them
from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import time_call
from reference_engine.kernels import gdn_chunked_prefill as triton_gdn
from reference_engine.ops.linear_attention import gdn_chunked_prefill as torch_gdn

HK, HV, D = 16, 32, 128
VARIANTS = ((0, 0), (2, 0), (2, 4))  # (launch 2's pipelining stages, launch 1's warps; 0: the module's 8)


def inputs(lengths: list[int]):
    tokens = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    q = torch.randn(tokens, HK, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(tokens, HK, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(tokens, HV, D, device="cuda", generator=g).bfloat16()
    gate = -torch.rand(tokens, HV, device="cuda", generator=g) * 0.5 - 0.01
    beta = torch.rand(tokens, HV, device="cuda", generator=g) * 0.9 + 0.05
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    state = torch.randn(len(lengths), HV, D, D, device="cuda", generator=g) * 0.1
    return q, k, v, gate, beta, cu, state


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main(path: str) -> None:
    records = []
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as error:
        chunk_gated_delta_rule = None
        print(f"fla not importable: {error}")
    for lengths in ([1024], [4096], [256] * 4):
        q, k, v, gate, beta, cu, state = inputs(lengths)
        tokens, seqs = q.shape[0], len(lengths)
        out_ref, state_ref = torch.empty_like(v), torch.empty_like(state)
        torch_gdn(q, k, v, gate, beta, cu, state, out=out_ref, final_state=state_ref)

        def run_torch():
            torch_gdn(q, k, v, gate, beta, cu, state, out=torch.empty_like(v), final_state=torch.empty_like(state))

        candidates = {"torch op": run_torch}
        for stages, warps in VARIANTS:  # tf32, blocked inverse, 32 value columns per program of launch 2

            def run_triton(stages=stages, warps=warps, out=None, final=None):
                triton_gdn.SCAN_STAGES, triton_gdn.PREPARE_WARPS = stages, warps
                triton_gdn.gdn_chunked_prefill(q, k, v, gate, beta, cu, state, out=torch.empty_like(v) if out is None else out,
                                               final_state=torch.empty_like(state) if final is None else final)  # fmt: skip

            candidates[f"triton stages {stages} prepare warps {warps or 8}"] = run_triton
        if chunk_gated_delta_rule is not None:

            def run_fla(result=None):
                o, s = chunk_gated_delta_rule(
                    q.repeat_interleave(HV // HK, dim=1)[None], k.repeat_interleave(HV // HK, dim=1)[None], v[None], gate[None], beta[None],
                    scale=D**-0.5, initial_state=state, output_final_state=True, cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True,
                )  # fmt: skip
                if result is not None:
                    result.extend([o[0], s])

            candidates["fla"] = run_fla
        for name, fn in candidates.items():
            try:
                if name.startswith("triton"):
                    out, final = torch.full_like(v, float("nan")), torch.full_like(state, float("nan"))
                    fn(out=out, final=final)
                elif name == "fla":
                    result = []
                    fn(result)
                    out, final = result
                else:
                    out, final = out_ref, state_ref
                errors = (rel(out, out_ref), rel(final, state_ref))
                seconds = time_call(fn, torch.device("cuda"), warmup=2, repeat=7)
            except Exception as failure:  # noqa: BLE001 - recorded, not raised
                errors, seconds = (float("nan"), float("nan")), float("nan")
                print(f"{name} T={tokens}: {type(failure).__name__}: {str(failure)[:200]}")
            records.append({"impl": name, "lengths": lengths, "tokens": tokens, "seqs": seqs, "ms": seconds * 1e3,
                            "out_rel_vs_torch": errors[0], "state_rel_vs_torch": errors[1]})  # fmt: skip
            print(f"T={tokens:5d} B={seqs} {name:22s} {seconds * 1e3:8.3f} ms  out rel {errors[0]:.1e}  state rel {errors[1]:.1e}", flush=True)
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)
    triton_gdn.SCAN_STAGES, triton_gdn.PREPARE_WARPS = 0, 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1])
