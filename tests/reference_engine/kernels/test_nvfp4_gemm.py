"""NVFP4 tensor-core GEMMs for prefill (`kernels/nvfp4_gemm.py`): the plain W4A16 GEMM and the grouped
routed-experts pair, against independent float64 references.

Interpreter (one subprocess): weights quantised here, dequantised in float64 by a table (element 2j in
the low nibble, one E4M3 scale per 16 elements, tensor scale per matrix / per row / per expert).
- `w4a16_gemm`: M = 1, 3, 70, 97, 130 (several token blocks, a partial last block, padding rows that
  duplicate one row), N = 48, K = 64 and 80 (K not a multiple of the K step: masked loads), one tensor
  scale or one per row, float32 and bfloat16, an output that is a column slice of a wider buffer (the
  columns outside it must stay untouched); every output poisoned with NaN first.
- The M > 64 branches of `nvfp4_gemv.w4a16_linear` / `w4a16_linear_rows` (now the GEMM).
- `nvfp4_moe_prefill`: E = 8, H = 64, I = 32, T = 1..40, top_k 2..4; ids never use expert 7 (an
  expert with no token); one case routes every token's slot 0 to expert 2 (a group of more than
  BLOCK_M pairs: two blocks) and token 0 twice to expert 2; one case ends with padding rows that copy
  the last real row and its routing; against the float64 reference (activation rounded to x's dtype,
  as the model does) and, for float32, the torch op `ops.moe.routed_experts` on dequantised weights.
- Known-wrong variants (the real kernels fed one deliberate mistake) must fail the same comparison.
Error = ||out - ref||_F / ||ref||_F; bounds in BOUNDS with the measured values next to them.
CUDA (`@pytest.mark.cuda`): the real shapes against the torch ops, relative error < 1e-2.
"""

from __future__ import annotations

import json

import pytest
import torch
from kernel_interpreter import run_script

# measured under the Triton 3.6 interpreter: gemm float32 <= 1.1e-7, bf16 <= 1.7e-3 (the output
# rounding); moe float32 <= 1.6e-7 (3.3e-7 against the torch op), bf16 <= 1.8e-3; the wrong variants
# miss by 0.73 or more, or leave NaN.
BOUNDS = {"float32": 1e-5, "bfloat16": 5e-3}

# Ahead-of-time compilation for sm_90 (no GPU needed: Triton's bundled ptxas), at the tiles the wrappers
# pick for the real shapes: catches what the interpreter cannot (layouts, dot shapes) and register spills.
COMPILE_SCRIPT = r'''
import json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from reference_engine.kernels import nvfp4_gemm as m

ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
common = {"packed_ptr": "*u8", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32"}
configs = []
for tokens, rows, k in ((1024, 8192, 2048), (1024, 2048, 4096), (1024, 32, 2048), (32, 12288, 2048), (32, 2048, 4096), (8, 9216, 2048)):
    p = m.plan("linear", tokens, rows, k)
    sig = common | {"x_ptr": "*bf16", "out_ptr": "*bf16", "workspace_ptr": "*fp32", "counter_ptr": "*i32", "M": "i32", "N": "i32", "stride_xm": "i32", "stride_om": "i32"}
    split_bytes = -(-(k // 2) // (p.split_k * p.block_kb)) * p.block_kb
    for decode in (0, 1):
        words = {"packed_ptr": "*i32"} if decode else {}
        for prefetch in (0, 1) if decode else (0,):
            configs.append((f"linear {tokens}x{rows}x{k} decode {decode} prefetch {prefetch} split {p.split_k}", m._w4a16_gemm_kernel, sig | words, {"K_BYTES": k // 2, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "ROW_SCALES": True, "DOT_KIND": m.DOT_BFLOAT16, "SPLIT_K": p.split_k, "SPLIT_BYTES": split_bytes, "DECODE": decode, "PREFETCH": prefetch}, p))
for pairs, gate_up_rows in ((8192, 64), (800, 64), (4096, 64), (8192, 128), (4096, 128)):  # block_m 64, 16, 32; 128 gate/up rows
    m.MOE_GATE_UP_BLOCK_N = gate_up_rows
    combos = ((0, 0), (1, 0), (1, 1)) if gate_up_rows == 64 else ((1, 0), (1, 1))  # 128 rows: word decode only (bytes spill at 32 tokens)
    p = m.plan("moe_gate_up", pairs, 512, 2048, num_experts=256)
    sig = common | {"x_ptr": "*bf16", "order_ptr": "*i32", "blocks_ptr": "*i32", "act_ptr": "*bf16", "MAX_BLOCKS": "i32", "stride_xm": "i32"}
    for decode, prefetch in combos:
        words = {"packed_ptr": "*i32"} if decode else {}
        configs.append((f"moe gate_up pairs={pairs} rows={p.block_n} decode {decode} prefetch {prefetch}", m._moe_gate_up_kernel, sig | words, {"I": 512, "H_BYTES": 1024, "TOP_K": 8, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "DOT_KIND": m.DOT_BFLOAT16, "DECODE": decode, "PREFETCH": prefetch}, p))
    p = m.plan("moe_down", pairs, 2048, 512, num_experts=256)
    sig = common | {"act_ptr": "*bf16", "order_ptr": "*i32", "weights_ptr": "*fp32", "blocks_ptr": "*i32", "pair_out_ptr": "*fp32", "MAX_BLOCKS": "i32"}
    for decode, prefetch in combos:
        words = {"packed_ptr": "*i32"} if decode else {}
        configs.append((f"moe down pairs={pairs} gate_up_rows={gate_up_rows} decode {decode} prefetch {prefetch}", m._moe_down_kernel, sig | words, {"H": 2048, "I_BYTES": 256, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "DOT_KIND": m.DOT_BFLOAT16, "DECODE": decode, "PREFETCH": prefetch}, p))
for tokens, rows, k in ((32, 12288, 2048), (64, 9216, 2048)):  # swap: wgmma with the decoded weights in registers
    p = m.plan("linear", tokens, rows, k)
    sig = common | {"x_ptr": "*bf16", "out_ptr": "*bf16", "workspace_ptr": "*fp32", "counter_ptr": "*i32", "M": "i32", "N": "i32", "stride_xm": "i32", "stride_om": "i32", "packed_ptr": "*i32"}
    split_bytes = -(-(k // 2) // (p.split_k * p.block_kb)) * p.block_kb
    configs.append((f"swap linear {tokens}x{rows}x{k} split {p.split_k}", m._w4a16_gemm_kernel, sig, {"K_BYTES": k // 2, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "ROW_SCALES": True, "DOT_KIND": m.DOT_BFLOAT16, "SPLIT_K": p.split_k, "SPLIT_BYTES": split_bytes, "DECODE": 1, "PREFETCH": 1, "SWAP": 1}, p))
for pairs in (4096, 8192):
    p = m.plan("moe_gate_up", pairs, 512, 2048, num_experts=256)
    sig = common | {"x_ptr": "*bf16", "order_ptr": "*i32", "blocks_ptr": "*i32", "act_ptr": "*bf16", "MAX_BLOCKS": "i32", "stride_xm": "i32", "packed_ptr": "*i32"}
    configs.append((f"swap moe gate_up pairs={pairs} rows={p.block_n}", m._moe_gate_up_kernel, sig, {"I": 512, "H_BYTES": 1024, "TOP_K": 8, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "DOT_KIND": m.DOT_BFLOAT16, "DECODE": 1, "PREFETCH": 1, "SWAP": 1}, p))
    p = m.plan("moe_down", pairs, 2048, 512, num_experts=256)
    sig = common | {"act_ptr": "*bf16", "order_ptr": "*i32", "weights_ptr": "*fp32", "blocks_ptr": "*i32", "pair_out_ptr": "*fp32", "MAX_BLOCKS": "i32", "packed_ptr": "*i32"}
    configs.append((f"swap moe down pairs={pairs}", m._moe_down_kernel, sig, {"H": 2048, "I_BYTES": 256, "BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_KB": p.block_kb, "EVEN_K": True, "DOT_KIND": m.DOT_BFLOAT16, "DECODE": 1, "PREFETCH": 1, "SWAP": 1}, p))
report = {}
for name, kernel, sig, consts, p in configs:
    compiled = triton.compile(ASTSource(kernel, sig | {key: "constexpr" for key in consts}, constexprs=consts),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": p.num_warps, "num_stages": p.num_stages})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(compiled.asm["ptx"])
    info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", handle.name, "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    os.unlink(handle.name)
    ptx = compiled.asm["ptx"]
    report[name] = {"spill_bytes": int(re.search(r"(\d+) bytes spill stores", info).group(1)), "tensor_cores": "wgmma" in ptx or "mma.sync" in ptx,
                    "wgmma_register_a": bool(re.search(r"wgmma\.mma_async\S* \{[^}]*\}, \{", ptx))}
print("JSON" + json.dumps(report))
'''

SCRIPT = r"""
import json
import torch
from reference_engine.kernels import nvfp4_gemm, nvfp4_gemv
from reference_engine.kernels.moe_decode import stack_nvfp4_experts
from reference_engine.ops.moe import routed_experts
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(5)
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
results = {"gemm": {}, "gemm_wrong": {}, "moe": {}, "moe_torch_op": {}, "moe_wrong": {}, "checks": []}

def deq64(packed, scale, scale_2):
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    scale_2 = torch.as_tensor(scale_2).double()
    per_row = scale_2.reshape(-1, 1) if scale_2.numel() > 1 else scale_2
    return LUT[codes] * scale.double().repeat_interleave(16, dim=-1) * per_row

def split_plan_fields(p):
    return (p.block_m, p.block_n, p.block_kb, p.num_warps, p.num_stages, p.split_k)

def prefetch_one_step_late(x, packed, scale, scale_2, out):
    # known wrong: the prefetching loop multiplies each K step's weights by the previous step's x tile
    real = nvfp4_gemm._x_tile
    def late(x_ptr, rows, K_BYTES, byte0, BLOCK_KB, EVEN_K, DOT_KIND):
        return real(x_ptr, rows, K_BYTES, byte0 - BLOCK_KB if byte0 >= BLOCK_KB else byte0, BLOCK_KB, EVEN_K, DOT_KIND)
    nvfp4_gemm.PREFETCH_LINEAR = 1
    try:
        nvfp4_gemm._x_tile = late
        nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out)
    finally:
        nvfp4_gemm._x_tile = real
        nvfp4_gemm.PREFETCH_LINEAR = 0

def rel(out, ref):
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")  # an unwritten (NaN) element
    return float((out - ref).norm() / ref.norm())

def quantized(rows, cols, std):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * std)

# ---- plain GEMM
def run_gemm(x, packed, scale, scale_2, fn=nvfp4_gemm.w4a16_gemm):
    out = torch.full((x.shape[0], packed.shape[0]), float("nan"), dtype=x.dtype)
    fn(x, packed, scale, scale_2, out)
    return out

GEMM_CASES = {  # name: (M, N, K, dtype, per-row scale_2)
    "m1-f32": (1, 48, 64, "float32", False),
    "m3-bf16": (3, 48, 64, "bfloat16", True),
    "m70-f32": (70, 48, 64, "float32", False),
    "m70-rows-bf16": (70, 48, 64, "bfloat16", True),
    "m97-k80-rows-f32": (97, 48, 80, "float32", True),
    "m130-bf16": (130, 48, 64, "bfloat16", False),
}
weights = {}
for name, (M, N, K, dtype, per_row) in GEMM_CASES.items():
    packed, scale, scale_2 = quantized(N, K, 0.5)
    if per_row:  # stacked linears: three parts with their own tensor scale
        scale_2 = torch.cat([torch.full((16,), float(scale_2) * f) for f in (1.0, 0.37, 2.9)])
    x = torch.randn(M, K, generator=g).to(DTYPES[dtype])
    if M > 3:
        x[-2:] = x[-3]  # padding rows duplicate one real row
    ref = x.double() @ deq64(packed, scale, scale_2).t()
    results["gemm"][name] = (dtype, rel(run_gemm(x, packed, scale, scale_2), ref))
    weights[name] = (x, packed, scale, scale_2, ref)

# a column slice of a wider output: strided rows, the other columns untouched
x, packed, scale, scale_2, ref = weights["m70-rows-bf16"]
wide = torch.full((70, 64), float("nan"), dtype=torch.bfloat16)
wide[:, 48:] = 7.0
nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, wide[:, :48])
results["gemm"]["m70-strided-out-bf16"] = ("bfloat16", rel(wide[:, :48], ref))
results["checks"].append(["strided out: other columns untouched", bool((wide[:, 48:] == 7.0).all())])

# the M > 64 branches of the nvfp4_gemv wrappers (prefill) now run the GEMM
x, packed, scale, scale_2, ref = weights["m70-f32"]
results["gemm"]["gemv-wrapper-m70-f32"] = ("float32", rel(run_gemm(x, packed, scale, scale_2, nvfp4_gemv.w4a16_linear), ref))
x, packed, scale, scale_2, ref = weights["m130-bf16"]
out3d = torch.full((2, 65, 48), float("nan"), dtype=torch.bfloat16)
nvfp4_gemv.w4a16_linear(x.view(2, 65, 64), packed, scale, scale_2, out3d)
results["gemm"]["gemv-wrapper-m130-3d-bf16"] = ("bfloat16", rel(out3d.view(130, 48), ref))
x, packed, scale, scale_2, ref = weights["m70-rows-bf16"]
results["gemm"]["gemv-rows-wrapper-m70-bf16"] = ("bfloat16", rel(run_gemm(x, packed, scale, scale_2, nvfp4_gemv.w4a16_linear_rows), ref))

# split-K (decode batches): K slices summed in the kernel by the program drawing a tile's last ticket
SPLIT_CASES = {  # name: (M, N, K, dtype, per-row scale_2, GemmPlan fields)
    "split2-m20-k320-rows-bf16": (20, 48, 320, "bfloat16", True, (16, 32, 32, 4, 3, 2)),
    "split3-uneven-m20-k320-f32": (20, 48, 320, "float32", False, (16, 16, 32, 4, 3, 3)),
    "split4-m5-k512-rows-f32": (5, 40, 512, "float32", True, (16, 32, 32, 4, 3, 4)),
}
for name, (M, N, K, dtype, per_row, fields) in SPLIT_CASES.items():
    packed, scale, scale_2 = quantized(N, K, 0.5)
    if per_row:
        scale_2 = torch.linspace(0.5, 2.0, N) * float(scale_2)
    x = torch.randn(M, K, generator=g).to(DTYPES[dtype])
    ref = x.double() @ deq64(packed, scale, scale_2).t()
    split_plan = nvfp4_gemm.GemmPlan(*fields)
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, gemm_plan=split_plan)
    results["gemm"][name] = (dtype, rel(out, ref))
    weights[name] = (x, packed, scale, scale_2, ref, split_plan)
counters = nvfp4_gemm.ticket_counters(torch.device("cpu"), 1)
results["checks"].append(["split-K leaves every ticket counter at zero", int(counters.abs().sum()) == 0])
auto = nvfp4_gemm.plan("linear", 32, 2048, 4096)
results["checks"].append(["a 32-token out_proj plan splits K (fills the SMs)", auto.split_k > 1 and auto.block_m == 32])

def stale_ticket_counter(x, packed, scale, scale_2, out, split_plan):
    # a counter left at 1 by a bad reset: the first slice to finish sums the workspace before the others wrote
    nvfp4_gemm.ticket_counters(x.device, 64)[:64] = 1
    try:
        nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, gemm_plan=split_plan)
    finally:
        nvfp4_gemm.ticket_counters(x.device, 64)[:64] = 0

x, packed, scale, scale_2, ref, split_plan = weights["split2-m20-k320-rows-bf16"]
out = torch.full(ref.shape, float("nan"), dtype=x.dtype)
stale_ticket_counter(x, packed, scale, scale_2, out, split_plan)
results["gemm_wrong"]["stale_ticket_counter"] = ("bfloat16", rel(out, ref))

gemm_inputs = weights  # `weights` is reused for routing weights below

# known-wrong GEMM variants
def nibbles_swapped(x, packed, scale, scale_2, out):
    nvfp4_gemm.w4a16_gemm(x, ((packed >> 4) | (packed << 4)).to(torch.uint8), scale, scale_2, out)

def row_scales_reversed(x, packed, scale, scale_2, out):
    nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2.flip(0), out)

def last_token_block_unwritten(x, packed, scale, scale_2, out):
    block_m = nvfp4_gemm.plan("linear", x.shape[0], packed.shape[0], x.shape[1]).block_m
    keep = (x.shape[0] - 1) // block_m * block_m
    nvfp4_gemm.w4a16_gemm(x[:keep], packed, scale, scale_2, out[:keep])

for wrong in (nibbles_swapped, row_scales_reversed, last_token_block_unwritten):
    x, packed, scale, scale_2, ref = weights["m70-rows-bf16"]
    results["gemm_wrong"][wrong.__name__] = ("bfloat16", rel(run_gemm(x, packed, scale, scale_2, wrong), ref))

# ---- routed experts
E, H, I = 8, 64, 32
STD = [0.1 * (1 + e) for e in range(E)]  # distinct tensor scales per expert
experts = stack_nvfp4_experts([quantized(I, H, STD[e]) for e in range(E)], [quantized(I, H, 0.3) for e in range(E)], [quantized(H, I, STD[-1 - e]) for e in range(E)])
gate_up64 = torch.stack([torch.cat([deq64(experts.gate_up_packed[e, :I], experts.gate_up_scale[e, :I], experts.gate_up_scale_2[e, 0]),
                                    deq64(experts.gate_up_packed[e, I:], experts.gate_up_scale[e, I:], experts.gate_up_scale_2[e, 1])]) for e in range(E)])
down64 = torch.stack([deq64(experts.down_packed[e], experts.down_scale[e], experts.down_scale_2[e]) for e in range(E)])

def moe_reference(x, weights, ids):
    out = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = gate_up64[e] @ x[t].double()
            act = (torch.nn.functional.silu(h[:I]) * h[I:]).to(x.dtype).double()  # the model rounds the activation
            out[t] += float(weights[t, j]) * (down64[e] @ act)
    return out

def routing(T, k):
    ids = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(T)]).int()  # distinct per row, expert 7 unused
    weights = torch.rand(T, k, generator=g) + 0.1
    return weights / weights.sum(dim=1, keepdim=True), ids

MOE_CASES = {}  # name: (dtype, x, weights, ids)
for name, T, k, dtype in (("t1-k2-bf16", 1, 2, "bfloat16"), ("t3-k4-f32", 3, 4, "float32"), ("t5-k2-f32", 5, 2, "float32"), ("t40-k4-bf16", 40, 4, "bfloat16")):
    MOE_CASES[name] = (dtype, torch.randn(T, H, generator=g).to(DTYPES[dtype]), *routing(T, k))
weights, ids = routing(40, 2)
ids[:, 0] = 2  # expert 2 gets >= 40 pairs: more than one block of BLOCK_M = 32
ids[0, 1] = 2  # token 0 routed twice to expert 2
for dtype in ("float32", "bfloat16"):
    MOE_CASES["t40-k2-skew-" + ("f32" if dtype == "float32" else "bf16")] = (dtype, torch.randn(40, H, generator=g).to(DTYPES[dtype]), weights, ids)
plan_skew = nvfp4_gemm.plan("moe_gate_up", 80, I, H, num_experts=E)
results["checks"].append(["skew case spans two blocks of one expert", plan_skew.block_m == 32 and int((ids == 2).sum()) > 32])
weights, ids = routing(24, 3)
x = torch.randn(24, H, generator=g).to(torch.bfloat16)
x[18:], weights[18:], ids[18:] = x[17], weights[17], ids[17]  # 6 padding rows copy the last real row
MOE_CASES["t24-k3-padding-bf16"] = ("bfloat16", x, weights, ids)

def run_moe(x, weights, ids, stack=experts):
    out = torch.full((x.shape[0], H), float("nan"), dtype=x.dtype)
    nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, stack, out)
    return out

references = {}
for name, (dtype, x, weights, ids) in MOE_CASES.items():
    references[name] = moe_reference(x, weights, ids)
    results["moe"][name] = (dtype, rel(run_moe(x, weights, ids), references[name]))
    if dtype == "float32":
        all_ids = torch.arange(E)
        op = torch.full((x.shape[0], H), float("nan"))
        routed_experts(x, weights, ids, experts.dequantize_gate_up(all_ids, torch.float32), experts.dequantize_down(all_ids, torch.float32), op)
        results["moe_torch_op"][name] = (dtype, rel(run_moe(x, weights, ids), op.double()))
# the shared expert's output and sigmoid gate added in the slot-sum launch (the MoE block's eager path)
dtype, x, weights, ids = MOE_CASES["t40-k4-bf16"]
shared_out = torch.randn(x.shape[0], H, generator=g).to(x.dtype)
shared_logit = (2.0 * torch.randn(x.shape[0], 3, generator=g))[:, 1:2]  # a column view, as the block passes it
with_shared = references["t40-k4-bf16"] + shared_out.double() * torch.sigmoid(shared_logit.double())
out = torch.full((x.shape[0], H), float("nan"), dtype=x.dtype)
nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, out, shared=(shared_out, shared_logit))
results["moe"]["t40-k4-bf16-shared"] = (dtype, rel(out, with_shared))
results["moe_wrong"]["shared_not_added|t40-k4-bf16"] = (dtype, rel(run_moe(x, weights, ids), with_shared))
out = torch.full((x.shape[0], H), float("nan"), dtype=x.dtype)
nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, out, shared=(shared_out, torch.zeros_like(shared_logit) + 30.0))
results["moe_wrong"]["shared_gate_not_applied|t40-k4-bf16"] = (dtype, rel(out, with_shared))  # sigmoid(30) = 1: the bare output
try:
    nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, out, shared=(shared_out[:-1], shared_logit))
    results["shared_shape_error"] = ""
except ValueError as error:
    results["shared_shape_error"] = str(error)

# the block table: every pair exactly once, blocks within one expert's group
order, table = nvfp4_gemm.block_table(ids, E, 16)
flat = ids.reshape(-1).long()
covered = []
for b in range(table.shape[1]):
    expert, first, end = (int(v) for v in table[:, b])
    if expert < 0:
        continue
    rows = order[first:min(first + 16, end)].long()
    covered += rows.tolist()
    assert (flat[rows] == expert).all()
results["checks"].append(["block table covers every pair once", sorted(covered) == list(range(flat.numel()))])
# the counting sort (Triton) against the torch reference: identical order and table, on skewed, uniform and
# single-expert routings, with more pairs than one counting step (1024) and block sizes 16 and 64
gen_ids = torch.Generator().manual_seed(23)
for label, routing, experts_n, block_m in (
    ("case ids", ids, E, 16),
    ("uniform 2600 pairs", torch.randint(0, 256, (325, 8), generator=gen_ids, dtype=torch.int32), 256, 64),
    ("skewed", (torch.rand(300, 4, generator=gen_ids) ** 4 * 40).to(torch.int32), 40, 16),
    ("one expert", torch.full((70, 2), 3, dtype=torch.int32), 5, 16),
):
    got, want = nvfp4_gemm.block_table(routing, experts_n, block_m), nvfp4_gemm.block_table_torch(routing, experts_n, block_m)
    results["checks"].append([f"counting-sort block table equals the torch one ({label})", torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])])

# known-wrong MoE variants
swap_nibbles = lambda p: ((p >> 4) | (p << 4)).to(torch.uint8)
fields = vars(experts)
WRONG_STACKS = {
    "gate_up_halves_swapped": type(experts)(**(fields | {
        "gate_up_packed": torch.cat([experts.gate_up_packed[:, I:], experts.gate_up_packed[:, :I]], dim=1),
        "gate_up_scale": torch.cat([experts.gate_up_scale[:, I:], experts.gate_up_scale[:, :I]], dim=1),
        "gate_up_scale_2": experts.gate_up_scale_2.flip(1)})),
    "nibbles_swapped": type(experts)(**(fields | {"gate_up_packed": swap_nibbles(experts.gate_up_packed), "down_packed": swap_nibbles(experts.down_packed)})),
    "down_scale_2_of_expert_0": type(experts)(**(fields | {"down_scale_2": experts.down_scale_2[:1].expand(E).contiguous()})),
}
for case in ("t5-k2-f32", "t40-k2-skew-bf16"):
    dtype, x, weights, ids = MOE_CASES[case]
    for name, stack in WRONG_STACKS.items():
        results["moe_wrong"][f"{name}|{case}"] = (dtype, rel(run_moe(x, weights, ids, stack), references[case]))
    results["moe_wrong"][f"routing_weight_not_applied|{case}"] = (dtype, rel(run_moe(x, torch.ones_like(weights), ids), references[case]))

# DECODE 1 (int32 words; here the portable form of its PTX decode): outputs identical to DECODE 0's
results["words_identical"] = {}
for name in ("m3-bf16", "m70-rows-bf16", "m97-k80-rows-f32", "m130-bf16"):
    x, packed, scale, scale_2, ref = gemm_inputs[name]
    nvfp4_gemm.DECODE = 0
    bytes_out = run_gemm(x, packed, scale, scale_2)
    nvfp4_gemm.DECODE = 1
    results["words_identical"][name] = bool(torch.equal(run_gemm(x, packed, scale, scale_2), bytes_out))
x, packed, scale, scale_2, ref, split_plan = gemm_inputs["split3-uneven-m20-k320-f32"]
out_bytes, out_words = (torch.full(ref.shape, float("nan")) for _ in range(2))
nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out_bytes, gemm_plan=split_plan)
nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out_words, gemm_plan=nvfp4_gemm.GemmPlan(*SPLIT_CASES["split3-uneven-m20-k320-f32"][5], decode=1))
results["words_identical"]["split3-uneven"] = bool(torch.equal(out_bytes, out_words))
for name in ("t3-k4-f32", "t40-k2-skew-bf16", "t24-k3-padding-bf16"):
    dtype, x, weights_, ids = MOE_CASES[name]
    nvfp4_gemm.DECODE = 0
    bytes_out = run_moe(x, weights_, ids)
    nvfp4_gemm.DECODE = 1
    results["words_identical"]["moe-" + name] = bool(torch.equal(run_moe(x, weights_, ids), bytes_out))
nvfp4_gemm.DECODE = 0

# prefetch (the next K step's x tile and block scales loaded a step ahead): outputs identical to the plain loop's,
# with K a multiple of the K step and not (K 80: the last step masked), split-K (the last slice uneven) and the MoE
results["prefetch_identical"] = {}
for decode in (0, 1):
    nvfp4_gemm.DECODE = decode
    for name in ("m3-bf16", "m70-rows-bf16", "m97-k80-rows-f32", "m130-bf16"):
        x, packed, scale, scale_2, ref = gemm_inputs[name]
        nvfp4_gemm.PREFETCH_LINEAR = 0
        plain = run_gemm(x, packed, scale, scale_2)
        nvfp4_gemm.PREFETCH_LINEAR = 1
        results["prefetch_identical"][f"{name}-decode{decode}"] = bool(torch.equal(run_gemm(x, packed, scale, scale_2), plain))
    for name in ("split3-uneven-m20-k320-f32", "split2-m20-k320-rows-bf16"):
        x, packed, scale, scale_2, ref, split_plan = gemm_inputs[name]
        outs = [torch.full(ref.shape, float("nan"), dtype=x.dtype) for _ in range(2)]
        for prefetch, out in enumerate(outs):
            nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, gemm_plan=nvfp4_gemm.GemmPlan(*split_plan_fields(split_plan), decode=decode, prefetch=prefetch))
        results["prefetch_identical"][f"{name}-decode{decode}"] = bool(torch.equal(outs[0], outs[1]))
    for name in ("t3-k4-f32", "t40-k2-skew-bf16", "t24-k3-padding-bf16"):
        dtype, x, weights_, ids = MOE_CASES[name]
        nvfp4_gemm.PREFETCH_MOE = 0
        plain = run_moe(x, weights_, ids)
        nvfp4_gemm.PREFETCH_MOE = 1
        results["prefetch_identical"][f"moe-{name}-decode{decode}"] = bool(torch.equal(run_moe(x, weights_, ids), plain))
nvfp4_gemm.DECODE = nvfp4_gemm.PREFETCH_LINEAR = nvfp4_gemm.PREFETCH_MOE = 0
# swap (the weight tile as the dot's first operand, accumulator transposed once at the end): the same float64
# references and bounds, plain loop and prefetch, split-K, the MoE pair of launches
results["swap"] = {}
for prefetch in (0, 1):
    nvfp4_gemm.SWAP_LINEAR = nvfp4_gemm.SWAP_MOE = 1
    nvfp4_gemm.PREFETCH_LINEAR = nvfp4_gemm.PREFETCH_MOE = prefetch
    for name in ("m3-bf16", "m70-rows-bf16", "m97-k80-rows-f32", "m130-bf16"):
        x, packed, scale, scale_2, ref = gemm_inputs[name]
        results["swap"][f"{name}-prefetch{prefetch}"] = (GEMM_CASES[name][3], rel(run_gemm(x, packed, scale, scale_2), ref))
    for name in ("split3-uneven-m20-k320-f32", "split2-m20-k320-rows-bf16"):
        x, packed, scale, scale_2, ref, split_plan = gemm_inputs[name]
        out = torch.full(ref.shape, float("nan"), dtype=x.dtype)
        nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, gemm_plan=nvfp4_gemm.GemmPlan(*split_plan_fields(split_plan), prefetch=prefetch, swap=1))
        results["swap"][f"{name}-prefetch{prefetch}"] = (SPLIT_CASES[name][3], rel(out, ref))
    for name in ("t3-k4-f32", "t40-k2-skew-bf16", "t24-k3-padding-bf16"):
        dtype, x, weights_, ids = MOE_CASES[name]
        results["swap"][f"moe-{name}-prefetch{prefetch}"] = (dtype, rel(run_moe(x, weights_, ids), references[name]))
nvfp4_gemm.SWAP_LINEAR = nvfp4_gemm.SWAP_MOE = nvfp4_gemm.PREFETCH_LINEAR = nvfp4_gemm.PREFETCH_MOE = 0
# fused gate/up (one dot over interleaved gate and up rows, split after): the same float64 references
for prefetch in (0, 1):
    nvfp4_gemm.FUSE_GATE_UP, nvfp4_gemm.PREFETCH_MOE = 1, prefetch
    for name in ("t3-k4-f32", "t40-k2-skew-bf16", "t24-k3-padding-bf16"):
        dtype, x, weights_, ids = MOE_CASES[name]
        results["swap"][f"moe-fused-{name}-prefetch{prefetch}"] = (dtype, rel(run_moe(x, weights_, ids), references[name]))
nvfp4_gemm.FUSE_GATE_UP = nvfp4_gemm.PREFETCH_MOE = 0
# decode 2 (register operand; x and the activation K-permuted in blocks of 128): experts with H 256 (two K steps) and
# I 128, against float64 experts; H = 64 falls back to the word decode; a plan pair mixing decode 2 is refused
E2, H2, I2 = 4, 256, 128
experts2 = stack_nvfp4_experts([quantized(I2, H2, 0.05 * (1 + e)) for e in range(E2)], [quantized(I2, H2, 0.1) for e in range(E2)],
                               [quantized(H2, I2, 0.08) for e in range(E2)])  # fmt: skip
up2 = [torch.cat([deq64(experts2.gate_up_packed[e, :I2], experts2.gate_up_scale[e, :I2], experts2.gate_up_scale_2[e, 0]),
                  deq64(experts2.gate_up_packed[e, I2:], experts2.gate_up_scale[e, I2:], experts2.gate_up_scale_2[e, 1])]) for e in range(E2)]  # fmt: skip
down2 = [deq64(experts2.down_packed[e], experts2.down_scale[e], experts2.down_scale_2[e]) for e in range(E2)]
results["register"] = {}
results["permute_k"] = bool(torch.equal(nvfp4_gemm.permute_k(torch.arange(256.0).view(1, 256))[0, :20],
                                        torch.tensor([0.0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 1, 9, 17, 25])))
nvfp4_gemm.DECODE_MOE = 2
def no_permutation(t):  # known wrong: x left in natural K order while the codes are split by position in the word
    return t.contiguous()

for name, T, k, dtype in (("t9-k2-bf16", 9, 2, torch.bfloat16), ("t30-k3-bf16", 30, 3, torch.bfloat16)):  # float32 x keeps the word decode
    ids = torch.stack([torch.randperm(E2, generator=g)[:k] for _ in range(T)]).int()
    ids[:, 0] = 1 if T > 20 else ids[:, 0]  # one busy expert: two token blocks
    w2 = torch.rand(T, k, generator=g) + 0.1
    w2 = w2 / w2.sum(dim=1, keepdim=True)
    x2 = torch.randn(T, H2, generator=g).to(dtype)
    ref2 = torch.zeros(T, H2, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = up2[e] @ x2[t].double()
            ref2[t] += float(w2[t, j]) * (down2[e] @ (torch.nn.functional.silu(h[:I2]) * h[I2:]).to(dtype).double())
    out2 = torch.full((T, H2), float("nan"), dtype=dtype)
    nvfp4_gemm.nvfp4_moe_prefill(x2, w2, ids, experts2, out2)
    results["register"][name] = ("bfloat16", rel(out2, ref2))
    real_permute, nvfp4_gemm.permute_k = nvfp4_gemm.permute_k, no_permutation
    out2 = torch.full((T, H2), float("nan"), dtype=dtype)
    nvfp4_gemm.nvfp4_moe_prefill(x2, w2, ids, experts2, out2)
    nvfp4_gemm.permute_k = real_permute
    results["moe_wrong"][f"register_without_permutation|{name}"] = ("bfloat16", rel(out2, ref2))
dtype, x, weights_, ids = MOE_CASES["t40-k2-skew-bf16"]
results["register"]["fallback-h64-bf16"] = (dtype, rel(run_moe(x, weights_, ids), references["t40-k2-skew-bf16"]))
nvfp4_gemm.DECODE_MOE = -1
try:
    mixed = (nvfp4_gemm.GemmPlan(16, 32, 64, 4, 1, decode=2), nvfp4_gemm.GemmPlan(16, 64, 32, 4, 3, decode=1))
    nvfp4_gemm.nvfp4_moe_prefill(*MOE_CASES["t3-k4-f32"][1:], experts, torch.empty(3, H), plans=mixed)
    results["register_mixed_error"] = ""
except ValueError as error:
    results["register_mixed_error"] = str(error)
x, packed, scale, scale_2, ref = gemm_inputs["m97-k80-rows-f32"]  # three K steps
results["gemm_wrong"]["prefetch_one_step_late"] = ("float32", rel(run_gemm(x, packed, scale, scale_2, prefetch_one_step_late), ref))
try:
    nvfp4_gemm.nvfp4_moe_prefill(*MOE_CASES["t3-k4-f32"][1:], experts, torch.empty(3, H), plans=(nvfp4_gemm.GemmPlan(16, 32, 32, 4, 3), nvfp4_gemm.GemmPlan(32, 64, 16, 4, 3)))
    results["plans_mismatch_error"] = ""
except ValueError as error:
    results["plans_mismatch_error"] = str(error)
print("JSON" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def results():
    output = run_script(SCRIPT, timeout=300)
    return json.loads(output[output.rindex("JSON") + 4:])


def test_gemm_matches_the_float64_product(results):
    assert len(results["gemm"]) == 13
    for name, (dtype, error) in results["gemm"].items():
        assert error < BOUNDS[dtype], (name, error)


def test_gemm_rejects_known_wrong_variants(results):
    assert len(results["gemm_wrong"]) == 5
    for name, (dtype, error) in results["gemm_wrong"].items():
        assert error > 10 * BOUNDS[dtype], (name, error)


def test_moe_matches_the_float64_experts(results):
    assert len(results["moe"]) == 8
    for name, (dtype, error) in results["moe"].items():
        assert error < BOUNDS[dtype], (name, error)


def test_moe_matches_the_torch_op_in_float32(results):
    assert sorted(results["moe_torch_op"]) == ["t3-k4-f32", "t40-k2-skew-f32", "t5-k2-f32"]
    for name, (dtype, error) in results["moe_torch_op"].items():
        assert error < BOUNDS[dtype], (name, error)


def test_moe_rejects_known_wrong_variants(results):
    assert len(results["moe_wrong"]) == 12
    for name, (dtype, error) in results["moe_wrong"].items():
        assert error > 10 * BOUNDS[dtype], (name, error)


def test_word_decode_matches_byte_decode_exactly(results):
    """Both decodes give the same dot operands up to a power of two, so the outputs are bit-identical."""
    assert len(results["words_identical"]) == 8 and all(results["words_identical"].values()), results["words_identical"]


def test_prefetch_matches_the_plain_loop_exactly(results):
    """Loading the next K step's x tile and block scales ahead changes no bit: both decodes, masked last step, split-K, MoE."""
    assert len(results["prefetch_identical"]) == 18
    assert all(results["prefetch_identical"].values()), results["prefetch_identical"]


def test_swapped_operands_match_the_float64_references(results):
    """The weight tile as the dot's first operand: linears (masked K, per-row scales, split-K) and the routed experts;
    the experts' gate/up launch as one dot over interleaved gate and up rows."""
    assert len(results["swap"]) == 24
    for name, (dtype, error) in results["swap"].items():
        assert error < BOUNDS[dtype], (name, error)


def test_register_decode_matches_the_float64_experts(results):
    """Decode 2: codes split by position in the word, x and the activation K-permuted (`permute_k`), 8 dots per K step."""
    assert results["permute_k"]
    assert sorted(results["register"]) == ["fallback-h64-bf16", "t30-k3-bf16", "t9-k2-bf16"]
    for name, (dtype, error) in results["register"].items():
        assert error < BOUNDS[dtype], (name, error)
    assert "must be both MoE plans' decode" in results["register_mixed_error"]


def test_moe_shared_addend_must_match_the_output(results):
    assert "shared expert output must be" in results["shared_shape_error"], results["shared_shape_error"]


def test_moe_plans_must_share_the_token_block(results):
    assert "must share block_m" in results["plans_mismatch_error"]


def test_structural_checks(results):
    failed = [name for name, ok in results["checks"] if not ok]
    assert not failed and len(results["checks"]) == 9, results["checks"]


def test_kernels_compile_for_sm90_without_spills():
    from kernel_interpreter import sm90_compile_report

    report = sm90_compile_report(COMPILE_SCRIPT)
    assert len(report) == 18 + 26 + 6  # linears: 6 shapes x 3 (decode 0; decode 1 with prefetch 0 and 1); MoE: 3 plans x 2 kernels x 3 + 2 x 2 x 2; swap: 2 + 2 x 2
    assert sum(not name.endswith(" split 1") for name in report if name.startswith("linear")) == 9  # decode batches split K
    for name, info in report.items():
        assert info["spill_bytes"] == 0 and info["tensor_cores"], (name, info)
        if name.startswith("swap"):  # the decoded weight tile is wgmma's register operand
            assert info["wgmma_register_a"], (name, info)


def test_cpu_eager_paths_keep_the_torch_ops():
    from reference_engine.model.linear import eager_w4a16
    from reference_engine.quant.linear import w4a16_linear, w4a16_linear_rows

    x = torch.randn(128, 16)  # prefill-sized, but on the CPU
    assert eager_w4a16(x) is w4a16_linear
    assert eager_w4a16(x, stacked=True) is w4a16_linear_rows


@pytest.mark.cuda
def test_cuda_eager_path_takes_the_triton_op_for_a_few_rows():
    """A prefill's LM head (one row per sequence) in the eager path: the Triton op (run67: the torch op dequantised the
    whole NVFP4 LM head, 8 ms of a 1024-token prefill), within the torch op's tolerance."""
    from reference_engine.kernels import nvfp4_gemv
    from reference_engine.model.linear import Linear, eager_w4a16
    from reference_engine.quant import linear as torch_linear
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(67)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(4096, 2048, generator=generator) * 0.02))
    head = Linear(4096, 2048, weight_packed=packed, weight_scale=scale, weight_scale_2=scale_2)
    for rows in (1, 3, 64):
        x = torch.randn(rows, 2048, generator=generator).to(torch.bfloat16).cuda()
        assert eager_w4a16(x) is nvfp4_gemv.w4a16_linear
        expected = torch.empty(rows, 4096, dtype=torch.float32, device="cuda")
        torch_linear.w4a16_linear(x.float(), packed, scale, scale_2, expected)
        assert _rel(head(x), expected) < 1e-2, rows


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns", "per_row"), [(1024, 8192, 2048, False), (1024, 2048, 4096, False), (65, 512, 2048, True), (1024, 32, 2048, False), (300, 12288, 2048, True)])
def test_gemm_matches_the_torch_op_on_cuda(tokens, rows, columns, per_row):
    from reference_engine.kernels.nvfp4_gemv import w4a16_linear, w4a16_linear_rows
    from reference_engine.quant import linear as torch_linear
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(rows + tokens)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, columns, generator=generator) * 0.02))
    x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
    expected = torch.empty(tokens, rows, dtype=torch.float32, device="cuda")
    out = torch.full((tokens, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    if per_row:
        row_scale_2 = scale_2 * torch.linspace(0.5, 2.0, rows, device="cuda")
        torch_linear.w4a16_linear_rows(x.float(), packed, scale, row_scale_2, expected)
        w4a16_linear_rows(x, packed, scale, row_scale_2, out)
    else:
        torch_linear.w4a16_linear(x.float(), packed, scale, scale_2, expected)
        w4a16_linear(x, packed, scale, scale_2, out)
    assert _rel(out, expected) < 1e-2


def _cuda_experts(num_experts: int, hidden: int, inter: int, generator: torch.Generator):
    from reference_engine.kernels.moe_decode import stack_nvfp4_experts
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    def part(rows, cols):
        return [quantize_nvfp4((torch.randn(rows, cols, generator=generator) * 0.02).cuda()) for _ in range(num_experts)]

    return stack_nvfp4_experts(part(inter, hidden), part(inter, hidden), part(hidden, inter))


@pytest.mark.cuda
@pytest.mark.parametrize(("swap", "decode_moe", "fused"), [(0, -1, 0), (1, -1, 0), (0, 2, 0), (0, -1, 1)])
def test_moe_prefill_matches_the_torch_op_on_cuda(swap, decode_moe, fused, monkeypatch):
    from reference_engine.kernels import nvfp4_gemm
    from reference_engine.kernels.nvfp4_gemm import nvfp4_moe_prefill
    from reference_engine.ops.moe import routed_experts

    monkeypatch.setattr(nvfp4_gemm, "SWAP_MOE", swap)
    monkeypatch.setattr(nvfp4_gemm, "DECODE_MOE", decode_moe)
    monkeypatch.setattr(nvfp4_gemm, "FUSE_GATE_UP", fused)

    E, H, I, k, T = 256, 2048, 512, 8, 1024
    generator = torch.Generator().manual_seed(3)
    experts = _cuda_experts(E, H, I, generator)
    x = torch.randn(T, H, generator=generator).to(torch.bfloat16).cuda()
    logits = torch.randn(T, E, generator=generator) * 2.0
    logits[:, 7] += 3.0  # one popular expert (several blocks)
    top = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    weights = (top.values / top.values.sum(dim=-1, keepdim=True)).cuda()
    ids = top.indices.int().cuda()
    all_ids = torch.arange(E, device="cuda")
    expected = torch.empty(T, H, dtype=torch.float32, device="cuda")
    routed_experts(x.float(), weights, ids, experts.dequantize_gate_up(all_ids, torch.float32), experts.dequantize_down(all_ids, torch.float32), expected)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_moe_prefill(x, weights, ids, experts, out)
    assert _rel(out, expected) < 1e-2
    shared = torch.randn(T, H, generator=generator).to(torch.bfloat16).cuda() * expected.abs().mean()  # the routed sum's size
    logit = torch.randn(T, 2, generator=generator).cuda()[:, :1]
    with_shared = torch.full_like(out, float("nan"))
    nvfp4_moe_prefill(x, weights, ids, experts, with_shared, shared=(shared, logit))
    assert _rel(with_shared, expected + shared.float() * torch.sigmoid(logit)) < 1e-2
    assert _rel(out, expected + shared.float() * torch.sigmoid(logit)) > 5e-2  # the check sees a missing shared term


@pytest.mark.cuda
def test_model_wiring_on_cuda():
    """RoutedExperts (stacked NVFP4, no ops) and Linear (NVFP4 W4A16, M > 64) reach the Triton GEMMs on CUDA."""
    from reference_engine.model.experts import RoutedExperts
    from reference_engine.model.linear import Linear
    from reference_engine.ops.moe import routed_experts
    from reference_engine.quant.linear import w4a16_linear
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    E, H, I, k, T = 16, 256, 64, 4, 200
    generator = torch.Generator().manual_seed(9)

    def linear(rows, cols):
        packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, cols, generator=generator) * 0.05))
        return Linear(rows, cols, weight_packed=packed, weight_scale=scale, weight_scale_2=scale_2)

    block = RoutedExperts(E, H, I, gate=tuple(linear(I, H) for _ in range(E)), up=tuple(linear(I, H) for _ in range(E)), down=tuple(linear(H, I) for _ in range(E)))
    assert block.stacked is not None
    x = torch.randn(T, H, generator=generator).to(torch.bfloat16).cuda()
    top = torch.rand(T, E, generator=generator).topk(k, dim=-1)
    weights, ids = (top.values / top.values.sum(-1, keepdim=True)).cuda(), top.indices.int().cuda()
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    block(x, weights, ids, out=out)
    all_ids = torch.arange(E, device="cuda")
    expected = torch.empty(T, H, dtype=torch.float32, device="cuda")
    routed_experts(x.float(), weights, ids, block.stacked.dequantize_gate_up(all_ids, torch.float32), block.stacked.dequantize_down(all_ids, torch.float32), expected)
    assert _rel(out, expected) < 1e-2

    layer = linear(384, H)
    expected = torch.empty(T, 384, dtype=torch.float32, device="cuda")
    w4a16_linear(x.float(), layer.weight_packed, layer.weight_scale, layer.weight_scale_2, expected)
    assert _rel(layer(x), expected) < 1e-2


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns"), [(8, 12288, 2048), (32, 12288, 2048), (32, 2048, 4096), (64, 9216, 2048), (17, 2048, 4096)])
@pytest.mark.parametrize("swap", [0, 1])
def test_small_batch_split_k_gemm_on_cuda(tokens, rows, columns, swap, monkeypatch):
    """Decode batches take the split-K plan; the in-kernel reduction is deterministic and resets its counters."""
    from reference_engine.kernels import nvfp4_gemm
    from reference_engine.kernels.launch import ticket_counters

    monkeypatch.setattr(nvfp4_gemm, "SWAP_LINEAR", swap)
    from reference_engine.kernels.nvfp4_gemm import plan, w4a16_gemm
    from reference_engine.quant import linear as torch_linear
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(rows + tokens)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, columns, generator=generator) * 0.02))
    x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
    expected = torch.empty(tokens, rows, dtype=torch.float32, device="cuda")
    torch_linear.w4a16_linear(x.float(), packed, scale, scale_2, expected)
    assert plan("linear", tokens, rows, columns, torch.cuda.get_device_properties(0).multi_processor_count).split_k > 1
    outs = []
    for _ in range(2):
        out = torch.full((tokens, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        w4a16_gemm(x, packed, scale, scale_2, out)
        outs.append(out)
    assert _rel(outs[0], expected) < 1e-2
    assert torch.equal(outs[0], outs[1])
    assert int(ticket_counters(x.device, 1).abs().sum()) == 0


def _assert_decodes_agree(run, shape: tuple[int, int], monkeypatch) -> None:
    """`run(out)` with DECODE 0 and with DECODE 1 (outputs poisoned first): finite and bit-identical."""
    from reference_engine.kernels import nvfp4_gemm

    outs = []
    for decode in (0, 1):
        monkeypatch.setattr(nvfp4_gemm, "DECODE", decode)
        out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        run(out)
        outs.append(out)
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.cuda
@pytest.mark.parametrize(("tokens", "rows", "columns"), [(1024, 8192, 2048), (1024, 2048, 4096), (32, 12288, 2048), (8, 2048, 4096)])
def test_word_decode_in_ptx_is_bit_identical_on_cuda(tokens, rows, columns, monkeypatch):
    """DECODE 1 on the GPU runs the PTX bfloat16 decode (subnormal 0.5 codes included): the same bits as DECODE 0."""
    from reference_engine.kernels import nvfp4_gemm
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(rows + columns)
    packed, scale, scale_2 = (t.cuda() for t in quantize_nvfp4(torch.randn(rows, columns, generator=generator) * 0.02))
    assert int(((packed & 7) == 1).sum()) > 0  # codes 0.5 occur (the bfloat16 subnormal)
    x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
    _assert_decodes_agree(lambda out: nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out), (tokens, rows), monkeypatch)


@pytest.mark.cuda
def test_word_decode_moe_is_bit_identical_on_cuda(monkeypatch):
    from real_moe_layer import cuda_experts

    from reference_engine.kernels import nvfp4_gemm

    generator = torch.Generator().manual_seed(11)
    experts_count, hidden, inter, top_k, tokens = 16, 2048, 512, 8, 300
    experts = cuda_experts(experts_count, hidden, inter, generator)
    x = torch.randn(tokens, hidden, generator=generator).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(experts_count, generator=generator)[:top_k] for _ in range(tokens)]).int().cuda()
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator), -1).cuda()
    _assert_decodes_agree(lambda out: nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, out), (tokens, hidden), monkeypatch)


@pytest.mark.cuda
@pytest.mark.parametrize("block_m_max", [64, 32])
def test_prefetch_matches_the_plain_loop_on_cuda(block_m_max, monkeypatch):
    """The one-step-ahead loads on the GPU against the plain loop, for a prefill linear, a split-K decode-batch linear
    and the routed experts: the same values up to summation order (run26 on the H200: linears and 16-token MoE blocks
    on mma.sync differ in the last bits, relative 2e-4), and the same bits for the MoE on wgmma (64-token blocks)."""
    from real_moe_layer import cuda_experts, cuda_quantized

    from reference_engine.kernels import nvfp4_gemm

    monkeypatch.setattr(nvfp4_gemm, "DECODE", 1)
    monkeypatch.setattr(nvfp4_gemm, "MOE_BLOCK_M_MAX", block_m_max)
    generator = torch.Generator().manual_seed(17)

    def both(run, shape, name, identical=False):
        outs = []
        for prefetch in (0, 1):
            monkeypatch.setattr(nvfp4_gemm, name, prefetch)
            out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            run(out)
            outs.append(out)
        assert _rel(outs[1], outs[0]) < 1e-3, name
        assert torch.equal(outs[0], outs[1]) or not identical, name

    for tokens, rows, columns in ((300, 2048, 4096), (32, 12288, 2048)):
        packed, scale, scale_2 = cuda_quantized(rows, columns, generator)
        x = torch.randn(tokens, columns, generator=generator).to(torch.bfloat16).cuda()
        both(lambda out, x=x, w=(packed, scale, scale_2): nvfp4_gemm.w4a16_gemm(x, *w, out), (tokens, rows), "PREFETCH_LINEAR")
    experts_count, hidden, inter, top_k, tokens = 32, 2048, 512, 8, 512
    experts = cuda_experts(experts_count, hidden, inter, generator)
    x = torch.randn(tokens, hidden, generator=generator).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(experts_count, generator=generator)[:top_k] for _ in range(tokens)]).int().cuda()
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator), -1).cuda()
    assert nvfp4_gemm.plan("moe_gate_up", tokens * top_k, inter, hidden, num_experts=experts_count).block_m == block_m_max
    both(lambda out: nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, out), (tokens, hidden), "PREFETCH_MOE", identical=block_m_max == 64)
