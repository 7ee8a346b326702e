"""Decode launch savings measured on the GPU, each against the path it replaces, and the tuning switches they imply.

    PYTHONPATH=. python3 benchmarks/kernels/time_decode_pieces.py OUT.json [TUNING.json]

- GDN decode step (Hk 16, Hv 32, Dk = Dv = 128) at batches 1, 8, 32, 64: each head's value columns over 4, 8 or
  16 programs (the last applies the norm) vs one program per head (`gdn_decode_step.STEP_SPLIT_BELOW`, and
  `STEP_SPLIT`: the count best summed over the batches that split; run22 picked 8 from batch 1 alone, 2% faster
  there and 21% slower at batch 8);
- MoE router (257 x 2048 bf16) at the same batches: logits and top-k in one launch vs cuBLAS logits + the
  top-k kernel (`router.FUSED_ROUTER_MAX_TOKENS`);
- a GDN layer's in_proj_b/a (64 x 2048 bf16): the Triton dense GEMV vs torch.mm (`dense_gemv.MAX_TOKENS` 4 vs 0).
Each is a CUDA graph of CALLS back-to-back calls on distinct weights or states (more bytes than the L2
holds, as in a step where every layer has its own); the figure is graph time / CALLS. Outputs of both
variants are compared first. With TUNING, the faster variant of each is written into that tuning file.
No speed is asserted.
"""

from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import dense_gemv, gdn_decode_step, moe_decode, router

CALLS = 32


def timed(call, count: int) -> float:
    def step():
        for index in range(CALLS):
            call(index % count)

    return graph_seconds(step) * 1e6 / CALLS


SPLITS = (4, 8, 16)  # programs per head of the split GDN step (`gdn_decode_step.STEP_SPLIT`; run21: 4 took 6.4 us at batch 1, 6.6% occupancy)
BATCHES = (1, 8, 32, 64)  # the GDN step and the router are timed at each; the switches take the largest batch of the
# prefix from batch 1 where the new path wins


def gdn_step_setup(batch: int, ba: str | None = None, ba_out: torch.Tensor | None = None):
    """(call(index), pools, out, copies): the fused GDN decode step at the real head shapes on pool copy `index`. `ba`:
    None, b and a given; "launch", b and a from the stacked b/a linear (64 x 2048 bf16, `dense_gemv.dense_linear`) run
    before the step; "fold", the step computes them itself (`ba_from`). Both write b and a into `ba_out` [B, 64] bf16."""
    hk, hv, d, kernel = 16, 32, 128, 4
    channels = 2 * hk * d + hv * d
    copies = max(2, 48 // batch)  # state pools of 2 MiB per sequence: more bytes than the L2 holds in every graph
    g = torch.Generator(device="cuda").manual_seed(0)
    mixed = torch.randn(batch, channels, device="cuda", generator=g).bfloat16()
    z = torch.randn(batch, hv * d, device="cuda", generator=g).bfloat16()
    b, a = torch.randn(batch, hv, device="cuda", generator=g).bfloat16(), torch.randn(batch, hv, device="cuda", generator=g).bfloat16()
    conv_weight = (torch.randn(channels, kernel, device="cuda", generator=g) * 0.5).bfloat16()
    a_log, dt_bias = torch.rand(hv, device="cuda", generator=g), torch.rand(hv, device="cuda", generator=g)
    norm_weight = torch.rand(d, device="cuda", generator=g).bfloat16() + 0.5
    pools = [(torch.randn(batch + 1, channels, kernel - 1, device="cuda", generator=g).bfloat16(), torch.randn(batch + 1, hv, d, d, device="cuda", generator=g) * 0.1)
             for _ in range(copies)]  # fmt: skip
    slots, init = torch.arange(1, batch + 1, device="cuda"), torch.ones(batch, dtype=torch.bool, device="cuda")
    out = torch.empty(batch, hv * d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, 2048, device="cuda", generator=g).bfloat16()  # the layer's normed input, for `ba`
    ba_weights = [(torch.randn(2 * hv, 2048, device="cuda", generator=g) * 2048**-0.5).bfloat16() for _ in range(copies)]
    if ba is not None:
        b, a = ba_out.split(hv, dim=1)

    def call(index):
        conv, rec = pools[index]
        fold = {}
        if ba == "launch":
            dense_gemv.dense_linear(x, ba_weights[index], ba_out)
        elif ba == "fold":
            fold = {"ba_from": (x, ba_weights[index])}
        gdn_decode_step.gdn_decode_step(mixed, z, b, a, conv_weight, a_log, dt_bias, norm_weight, conv, rec, slots, init, out, 1e-6, **fold)


    return call, pools, out, copies


def gdn_step(batch: int) -> dict:
    call, pools, out, copies = gdn_step_setup(batch)
    record, outputs = {}, {}
    saved = [(c.clone(), r.clone()) for c, r in pools[:1]]
    for name, below, split in (*((f"split {n}", 1 << 30, n) for n in SPLITS), ("one program per head", 0, 4)):
        gdn_decode_step.STEP_SPLIT_BELOW, gdn_decode_step.STEP_SPLIT = below, split
        pools[0][0].copy_(saved[0][0])
        pools[0][1].copy_(saved[0][1])
        call(0)
        outputs[name] = out.clone()
        record[name] = timed(call, copies)
    gdn_decode_step.STEP_SPLIT_BELOW, gdn_decode_step.STEP_SPLIT = 128, 4
    whole = outputs["one program per head"].double()
    record["rel_difference"] = max(float((outputs[f"split {n}"].double() - whole).norm() / whole.norm()) for n in SPLITS)
    record["best_split"] = min(SPLITS, key=lambda n: record[f"split {n}"])
    record["split"] = record[f"split {record['best_split']}"]
    return record


def router_block(batch: int) -> dict:
    copies = 64  # 64 x 1 MiB router weights
    g = torch.Generator(device="cuda").manual_seed(1)
    weights = [(torch.randn(257, 2048, device="cuda", generator=g) * 2048**-0.5).bfloat16() for _ in range(copies)]
    x = torch.randn(batch, 2048, device="cuda", generator=g).bfloat16()
    topk_w, topk_i = torch.empty(batch, 9, device="cuda"), torch.empty(batch, 9, dtype=torch.int32, device="cuda")

    def fused(index):
        router.router_gemv_topk_with_shared(x, weights[index], topk_w, topk_i, 8)

    def separate(index):
        router.router_topk_with_shared(torch.nn.functional.linear(x, weights[index]), topk_w, topk_i, 8)

    record, ids = {}, {}
    for name, call in (("fused", fused), ("cuBLAS + top-k", separate)):
        call(0)
        ids[name] = topk_i.clone()
        record[name] = timed(call, copies)
    # ids in common among the 8 routed slots per token (a logit rounded differently can swap a near-tie)
    record["shared_ids"] = sum(len(set(ids["fused"][t, :8].tolist()) & set(ids["cuBLAS + top-k"][t, :8].tolist())) for t in range(batch)) / batch
    assert moe_decode.router is router
    return record


def dense() -> dict:
    copies = 256  # 256 x 256 KiB
    g = torch.Generator(device="cuda").manual_seed(2)
    weights = [(torch.randn(64, 2048, device="cuda", generator=g) * 2048**-0.5).bfloat16() for _ in range(copies)]
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    out = torch.empty(1, 64, device="cuda", dtype=torch.bfloat16)
    record, outputs = {}, {}
    for name, limit in (("triton", 4), ("torch", 0)):
        dense_gemv.MAX_TOKENS = limit
        dense_gemv.dense_linear(x, weights[0], out)
        outputs[name] = out.clone()
        record[name] = timed(lambda index: dense_gemv.dense_linear(x, weights[index], out), copies)
    dense_gemv.MAX_TOKENS = 4
    record["rel_difference"] = float((outputs["triton"].double() - outputs["torch"].double()).norm() / outputs["torch"].double().norm())
    return record


def _prefix_max(wins) -> int:
    """The largest batch b of `BATCHES` such that `wins` holds at b and at every smaller batch measured (0: none)."""
    best = 0
    for n in BATCHES:
        if not wins(n):
            break
        best = n
    return best


def main(path: str, tuning_path: str | None) -> None:
    records = {}
    pieces = [(f"gdn_decode_step_us_batch_{n}", lambda n=n: gdn_step(n)) for n in BATCHES] + [(f"router_us_batch_{n}", lambda n=n: router_block(n)) for n in BATCHES]
    for name, piece in [*pieces, ("dense_in_proj_ba_us", dense)]:
        try:
            records[name] = piece()
        except Exception as failure:  # noqa: BLE001 - one failing piece leaves the others measured and its switch untouched
            records[name] = {"error": f"{type(failure).__name__}: {str(failure)[:300]}"}
    print(json.dumps(records, indent=1))
    with open(path, "w") as handle:
        json.dump(records, handle, indent=1)
    if tuning_path:
        with open(tuning_path) as handle:
            tuning = json.load(handle)
        ba = records["dense_in_proj_ba_us"]

        def split_wins(n):
            gdn = records[f"gdn_decode_step_us_batch_{n}"]
            return "error" not in gdn and gdn["split"] < gdn["one program per head"] and gdn["rel_difference"] < 1e-2

        def fused_wins(n):
            route = records[f"router_us_batch_{n}"]
            return "error" not in route and route["fused"] < route["cuBLAS + top-k"] and route["shared_ids"] >= 7.9

        split_upto = _prefix_max(split_wins)
        tuning["gdn_step_split_below"] = split_upto * 32 + 1 if split_upto else 0  # split while batch x Hv (32) is below this
        if split_upto:  # one split count for every batch that splits: the least sum of (time / that batch's best split time)
            gdns = [records[f"gdn_decode_step_us_batch_{n}"] for n in BATCHES if n <= split_upto]
            tuning["gdn_step_split"] = min(SPLITS, key=lambda m: sum(g[f"split {m}"] / g["split"] for g in gdns))
        tuning["fused_router_max_tokens"] = _prefix_max(fused_wins)
        if "error" not in ba:
            tuning["dense_gemv_max_tokens"] = 4 if ba["triton"] < ba["torch"] and ba["rel_difference"] < 1e-2 else 0
        with open(tuning_path, "w") as handle:
            json.dump(tuning, handle, indent=1)
        print("tuning:", {key: tuning.get(key) for key in ("gdn_step_split_below", "gdn_step_split", "fused_router_max_tokens", "dense_gemv_max_tokens")})


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
