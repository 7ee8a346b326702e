"""Compile every decode kernel for sm_90 ahead of time, without a GPU (Triton's bundled ptxas).

Catches what the CPU interpreter cannot: code the GPU compiler rejects (layouts, dot shapes,
bitcasts, constexpr use). Run from the repository root: `PYTHONPATH=. python benchmarks/kernels/compile_sm90.py [NAME-PART]
[--sass]`. Configurations are those the wrappers pick at the real decode shapes. `--sass` adds each kernel's static count
of sm_90 SASS instructions (the bundled `cuobjdump -sass` of the compiled cubin; loops counted once).
"""

from __future__ import annotations

import inspect
import itertools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from reference_engine.kernels import (
    attention_prep,
    causal_conv1d,
    dense_gemv,
    gdn_decode,
    gdn_decode_step,
    gdn_gates,
    l2_prefetch,
    moe_block_persistent,
    moe_decode,
    moe_grouped_half,
    moe_pairs_fused,
    norms,
    nvfp4_dequant,
    nvfp4_gemv,
    nvfp4_half_dot,
    paged_decode,
    router,
)

TARGET = GPUTarget("cuda", 90, 32)
# PTX a kernel must contain (name substring -> pattern): the fused MoE launches' spin waits read with acquire (run78:
# an unused `atomic_add(ptr, 0, sem="acquire")` never reached the PTX; tests/reference_engine/kernels/test_spin_wait_ptx.py)
PTX_REQUIRED = {"moe pairs fused": r"ld\.acquire\.gpu\.global", "moe block fused": r"ld\.acquire\.gpu\.global", "sleep=": r"nanosleep\.u32"}
# An acquiring instruction in PTX: `atom.global.gpu.acq_rel.add`, `ld.acquire.gpu.global`, ...
ACQUIRING_PTX = r"\b(atom|ld|red)\.[\w.]*\b(acquire|acq_rel)\b"
I32 = "i32"
SASS_LINE = r"^\s+/\*[0-9a-f]{4}\*/"  # an instruction line of `cuobjdump -sass`: its offset in a comment


# The batch-1 decode graph's kernels (configurations named so), compiled again with programmatic dependent launch
# (`kernels/pdl.py`, PDL 1 and 2): their PTX must hold the wait and the release.
PDL_KERNELS = ("w4a16 half tiled x_pairs=2 fp8=True", "moe gate_up x pairs=2 decode=5", "moe down act pairs=2 decode=5", "moe gate_up topk act pairs=True",
               "dense gemv", "router add_norm pairs=2", "router add_norm logits only pairs=2", "router", "gdn decode step fused conv pairs split=4",
               "gdn decode step fused conv pairs ba fold split=4", "paged split *bf16", "paged combine gated pairs", "norm mode 1 pairs=3", "attention prep")
PDL_PTX = (r"griddepcontrol\.wait", r"griddepcontrol\.launch_dependents")
PDL_RELEASE_BY_ENDING = ("dense gemv pdl=2", "router pdl=2")  # kernels this small have no release of their own in PDL 2


def configs():
    """Every configuration, then the batch-1 graph's kernels again with PDL 1 and 2."""
    listed = list(base_configs())
    yield from listed
    for name, kernel, signature, constants in listed:
        if name in PDL_KERNELS:
            for mode in (1, 2):
                yield f"{name} pdl={mode}", kernel, signature, dict(constants) | {"PDL": mode}


def base_configs():
    gemv_sig = {"x_ptr": "*bf16", "packed_ptr": "*u8", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16", "M": I32, "N": I32, "K_BYTES": I32, "stride_xm": I32, "stride_om": I32}
    for tokens, rows, k_bytes in ((1, 8192, 1024), (32, 2048, 2048), (1, 512, 1024)):
        block_m, block_n, block_kb, split_k = nvfp4_gemv.plan(tokens, rows, k_bytes, 132)
        steps = triton.cdiv(triton.cdiv(k_bytes, block_kb), split_k)
        out = "*bf16" if split_k == 1 else "*fp32"
        for loop in (0, 1, 3):  # plain, unrolled, pipelined K loop
            yield f"w4a16 M={tokens} N={rows} split={split_k} loop={loop}", nvfp4_gemv._w4a16_gemv_kernel, gemv_sig | {"out_ptr": out}, {"STEPS_PER_SPLIT": steps, "SPLIT_K": split_k, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_KB": block_kb, "ROW_SCALES": tokens == 1, "LOOP": loop}
            yield f"w4a16 words M={tokens} N={rows} split={split_k} loop={loop}", nvfp4_gemv._w4a16_gemv_kernel, gemv_sig | {"out_ptr": out, "packed_ptr": "*i32"}, {"STEPS_PER_SPLIT": steps, "SPLIT_K": split_k, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_KB": block_kb, "ROW_SCALES": tokens == 1, "LOOP": loop, "WORDS": True, "ASM": True}
    half_sig = {"x32_ptr": "*i32", "blocks_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16", "workspace_ptr": "*fp32", "counter_ptr": "*i32", "N": I32, "K_BLOCKS": I32}
    for block_n, block_b, split, loop in ((128, 4, 1, 0), (256, 8, 2, 3), (64, 4, 4, 3), (256, 8, 8, 1)):
        for fp8 in (False, True):  # the bit-placement decode and the E4M3 one
            yield f"w4a16 half N-block={block_n} blocks={block_b} split={split} loop={loop} fp8={fp8}", nvfp4_half_dot._w4a16_gemv_half_kernel, half_sig, {
                "STEPS_PER_SPLIT": 4, "SPLIT_K": split, "BLOCK_N": block_n, "BLOCK_B": block_b, "ROW_SCALES": split == 1, "LOOP": loop, "ASM": True, "FP8": fp8}
    for x_pairs, fp8 in itertools.product((1, 2), (False, True)):  # x given as float16 pairs (`x_half_pairs`), the two load forms
        yield f"w4a16 half tiled x_pairs={x_pairs} fp8={fp8}", nvfp4_half_dot._w4a16_gemv_half_kernel, half_sig, {
            "STEPS_PER_SPLIT": 2, "SPLIT_K": 8, "BLOCK_N": 256, "BLOCK_B": 8, "ROW_SCALES": False, "LOOP": 1, "ASM": True, "FP8": fp8, "TILED": True,
            "X_PAIRS": x_pairs}
    for row_scales in (False, True):
        yield f"nvfp4 dequant row_scales={row_scales}", nvfp4_dequant._dequant_kernel, {"packed_ptr": "*u8", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16", "N": I32, "K_BYTES": I32}, {
            "ROW_SCALES": row_scales, "BLOCK_N": nvfp4_dequant.BLOCK_N, "BLOCK_KB": nvfp4_dequant.BLOCK_KB}
    yield "split-k reduce", nvfp4_gemv._split_k_reduce_kernel, {"workspace_ptr": "*fp32", "out_ptr": "*bf16", "M": I32, "N": I32, "stride_om": I32}, {"SPLIT_K": 4, "BLOCK": 256}
    for (nvfp4, weight, scale, scale_2), loop in itertools.product(((True, "*u8", "*fp8e4nv", "*fp32"), (False, "*bf16", "*bf16", "*bf16")), (0, 1, 3)):
        unshared = {"SHARED": False, "LOOP": loop, "DECODE": 0, "shared_w_ptr": None, "shared_scale_ptr": None, "shared_scale_2_ptr": None}
        yield f"moe gate_up nvfp4={nvfp4} loop={loop}", moe_decode._gate_up_kernel, {"x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": weight, "scale_ptr": scale, "scale_2_ptr": scale_2, "act_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": nvfp4, "BLOCK_N": 16, "BLOCK_K": 128} | unshared
        yield f"moe down nvfp4={nvfp4} loop={loop}", moe_decode._down_kernel, {"act_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32", "w_ptr": weight, "scale_ptr": scale, "scale_2_ptr": scale_2, "out_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": nvfp4, "BLOCK_H": 16, "BLOCK_I": 128} | unshared
    words_unshared = {"SHARED": False, "LOOP": 3, "DECODE": 2, "shared_w_ptr": None, "shared_scale_ptr": None, "shared_scale_2_ptr": None}
    yield "moe gate_up words", moe_decode._gate_up_kernel, {"x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": "*i32", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 8, "BLOCK_K": 256} | words_unshared
    yield "moe down words", moe_decode._down_kernel, {"act_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32", "w_ptr": "*i32", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_H": 8, "BLOCK_I": 256} | words_unshared
    half_unshared = words_unshared | {"DECODE": 3}
    for block in (8, 32):
        yield f"moe gate_up half rows={block}", moe_decode._gate_up_kernel, {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": block, "BLOCK_K": 64} | half_unshared
        yield f"moe down half rows={block}", moe_decode._down_kernel, {"act_ptr": "*i32", "ids_ptr": "*i32", "weights_ptr": "*fp32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_H": block, "BLOCK_I": 64} | half_unshared
    shared_sig = {"shared_w_ptr": "*i64", "shared_scale_ptr": "*fp8e4nv", "shared_scale_2_ptr": "*fp32"}
    down_sig = {"act_ptr": "*i32", "ids_ptr": "*i32", "weights_ptr": "*fp32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "out_ptr": "*bf16"}
    for decode in (3, 5):  # the batch-one tiles with the bit-placement and the E4M3 decode
        yield f"moe gate_up half 8x256 decode={decode}", moe_decode._gate_up_kernel, {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*bf16"} | shared_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 8, "BLOCK_K": 256, "SHARED": True, "LOOP": 3, "DECODE": decode}
        yield f"moe down half 8x256 decode={decode}", moe_decode._down_kernel, down_sig | shared_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_H": 8, "BLOCK_I": 256, "SHARED": True, "LOOP": 3, "DECODE": decode}
        # the activation handed over as the down kernel's float16 pairs (`moe_decode.ACT_PAIRS`), both load forms
        yield f"moe gate_up act pairs decode={decode}", moe_decode._gate_up_kernel, {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*i32"} | shared_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 8, "BLOCK_K": 256, "SHARED": True, "LOOP": 3, "DECODE": decode, "ACT_PAIRS": True}
        for pairs in (1, 2):
            yield f"moe gate_up x pairs={pairs} decode={decode}", moe_decode._gate_up_kernel, {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*i32"} | shared_sig, {
                "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 8, "BLOCK_K": 256, "SHARED": True, "LOOP": 3, "DECODE": decode, "ACT_PAIRS": True, "X_PAIRS": pairs}
            yield f"moe down act pairs={pairs} decode={decode}", moe_decode._down_kernel, down_sig | shared_sig, {
                "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_H": 8, "BLOCK_I": 256, "SHARED": True, "LOOP": 3, "DECODE": decode, "X_PAIRS": pairs}
    for act_pairs in (False, True):  # the top-k in the experts' launch (`moe_decode.GATE_UP_TOPK_MAX_TOKENS`), E4M3 decode
        yield f"moe gate_up topk act pairs={act_pairs}", moe_decode._gate_up_kernel, {
            "x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*i32" if act_pairs else "*bf16",
            "logits_ptr": "*bf16", "weights_ptr": "*fp32", "E": I32} | shared_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 8, "BLOCK_K": 256, "SHARED": True, "LOOP": 3, "DECODE": 5,
            "ACT_PAIRS": act_pairs, "BLOCK_E": 256, "BLOCK_TOPK": 8, "TOPK": True}  # fmt: skip
    for split, decode in ((9, 3), (3, 2)):  # the down slots dealt over programs, ticket-ordered sum
        yield f"moe down half split={split} decode={decode}", moe_decode._down_kernel, down_sig | shared_sig | {"workspace_ptr": "*fp32", "counter_ptr": "*i32"}, {
            "H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_H": 8, "BLOCK_I": 256, "SHARED": True, "LOOP": 3, "DECODE": decode, "SPLIT": split}
    yield "moe gate_up half shared", moe_decode._gate_up_kernel, {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*i64", "scale_ptr": "*fp8e4nv", "scale_2_ptr": "*fp32", "act_ptr": "*bf16", "shared_w_ptr": "*i64", "shared_scale_ptr": "*fp8e4nv", "shared_scale_2_ptr": "*fp32"}, {"H": 2048, "I": 512, "TOP_K": 8, "WEIGHT_NVFP4": True, "BLOCK_N": 32, "BLOCK_K": 64, "SHARED": True, "LOOP": 3, "DECODE": 3}
    half_grouped = {"counts_ptr": "*i32", "pairs_ptr": "*i32", "P": I32, "T": I32, "w_ptr": "*i64", "s_ptr": "*fp8e4nv", "s2_ptr": "*fp32",
                    "shared_w_ptr": "*i64", "shared_s_ptr": "*fp8e4nv", "shared_s2_ptr": "*fp32"}  # fmt: skip
    for rows, blocks, warps, pairs, fp8 in ((32, 8, 4, 0, False), (64, 16, 8, 0, False), (32, 4, 4, 1, False), (32, 4, 4, 1, True), (32, 8, 4, 0, True)):
        yield f"moe half grouped gate_up {rows}x{blocks} pairs={pairs} fp8={fp8}", moe_grouped_half._gate_up_kernel, half_grouped | {"x32_ptr": "*i32", "act_ptr": "*i32" if pairs else "*bf16"}, {
            "I": 512, "H_WORDS": 1024, "K_BLOCKS": 128, "SLOTS": 9, "SHARED_CHUNKS": 8, "BN": rows, "BB": blocks, "ASM": True, "PAIRS": pairs, "FP8": fp8, "num_warps": warps}
        yield f"moe half grouped down {rows}x{blocks} pairs={pairs} fp8={fp8}", moe_grouped_half._down_kernel, half_grouped | {"act32_ptr": "*i32", "weights_ptr": "*fp32", "y_ptr": "*fp32"}, {
            "H": 2048, "I_WORDS": 256, "K_BLOCKS": 32, "SLOTS": 9, "SHARED_CHUNKS": 8, "BN": rows, "BB": min(blocks, 32), "ASM": True, "PAIRS": pairs, "FP8": fp8, "num_warps": warps}
    for fp8 in (False, True):
        yield f"moe half grouped x pairs fp8={fp8}", moe_grouped_half._pairs_kernel, {"x32_ptr": "*i32", "out_ptr": "*i32"}, {"WORDS": 1024, "K_BLOCKS": 128, "BLOCK_B": 32, "ASM": True, "FP8": fp8}
    yield "l2 prefetch", l2_prefetch._l2_prefetch_kernel, {"table_ptr": "*i64", "n": I32}, {"BLOCK": l2_prefetch.BLOCK}
    yield "dense gemv", dense_gemv._dense_gemv_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "N": I32, "stride_xm": I32, "stride_om": I32}, {"K": 2048, "TOKENS": 1, "BLOCK_N": 2, "BLOCK_K": 2048}
    yield "router logits + top-k", router._router_gemv_topk_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "logits_ptr": "*bf16", "counter_ptr": "*i32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "E": I32}, {"H": 2048, "TOP_K": 8, "BLOCK_E": 256, "BLOCK_K": 8, "BLOCK_R": 4, "BLOCK_H": 512, "ROW_BLOCKS": 65}
    yield "router logits + top-k + expert prefetch", router._router_gemv_topk_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "logits_ptr": "*bf16", "counter_ptr": "*i32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "E": I32,
        "gate_up_base": "i64", "gate_up_scale_base": "i64", "down_base": "i64", "down_scale_base": "i64"}, {"H": 2048, "TOP_K": 8, "BLOCK_E": 256, "BLOCK_K": 8, "BLOCK_R": 2, "BLOCK_H": 2048, "ROW_BLOCKS": 129,
        "PREFETCH": 1, "GU_BYTES": 1 << 20, "GUS_BYTES": 1 << 17, "D_BYTES": 1 << 19, "DS_BYTES": 1 << 16, "CHUNK": 1 << 16, "NCH_GU": 16, "NCH_GUS": 2, "NCH_D": 8, "NCH_DS": 1, "record_ptr": None}  # fmt: skip
    add_norm_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "logits_ptr": "*bf16", "counter_ptr": "*i32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "E": I32,
                    "residual_ptr": "*bf16", "norm_w_ptr": "*bf16", "normed_ptr": "*bf16", "residual_out_ptr": "*bf16", "eps": "fp32"}
    for pairs in (0, 1, 2):  # the norm before the MoE block in the router launch; with the normed x's float16 pairs for the gate/up kernel
        yield f"router add_norm pairs={pairs}", router._router_gemv_topk_kernel, add_norm_sig | ({"pairs_ptr": "*i32"} if pairs else {}), {
            "H": 2048, "TOP_K": 8, "BLOCK_E": 256, "BLOCK_K": 8, "BLOCK_R": router.ROUTER_ROWS, "BLOCK_H": 2048, "ROW_BLOCKS": -(-257 // router.ROUTER_ROWS),
            "ADD_NORM": True, "BF16": True, "PAIRS": pairs, "ASM": True, "num_warps": router.ROUTER_WARPS}
    for pairs in (0, 2):  # the logits-only launch (no ticket, no top-k) for the top-k in the experts' launch
        yield f"router add_norm logits only pairs={pairs}", router._router_gemv_topk_kernel, add_norm_sig | ({"pairs_ptr": "*i32"} if pairs else {}), {
            "H": 2048, "TOP_K": 1, "BLOCK_E": 256, "BLOCK_K": 1, "BLOCK_R": router.ROUTER_ROWS, "BLOCK_H": 2048, "ROW_BLOCKS": -(-257 // router.ROUTER_ROWS),
            "ADD_NORM": True, "BF16": True, "PAIRS": pairs, "ASM": True, "TOPK": False, "num_warps": router.ROUTER_WARPS}  # fmt: skip
    yield "router", router._router_topk_kernel, {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32", "E": I32, "stride_t": I32}, {"TOP_K": 8, "BLOCK_E": 256, "BLOCK_K": 8}
    step_sig = {"conv_out_ptr": "*fp32", "z_ptr": "*bf16", "b_ptr": "*bf16", "a_ptr": "*bf16", "a_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "norm_w_ptr": "*bf16",
                "state_ptr": "*fp32", "slots_ptr": "*i64", "init_ptr": "*u8", "out_ptr": "*bf16", "o_ptr": "*fp32", "counter_ptr": "*i32",
                **{name: I32 for name in ("stride_zb", "stride_zc", "stride_bb", "stride_bh", "stride_ab", "stride_ah", "stride_ss", "stride_sh", "stride_sk", "stride_sv", "stride_ob", "stride_oc")},
                "q_scale": "fp32", "eps": "fp32"}  # fmt: skip
    for split, warps in ((1, 8), (4, 4), (16, 4)):
        yield f"gdn decode step split={split}", gdn_decode_step._recurrent_norm_kernel, step_sig, {"HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 128 // split, "L2_EPS": 1e-6, "SPLIT": split, "BLOCK_DV": 128}
    fused_sig = step_sig | {"x_ptr": "*bf16", "conv_w_ptr": "*bf16", "conv_state_ptr": "*bf16", "conv_counter_ptr": "*i32",
                            **{name: I32 for name in ("stride_xb", "stride_xc", "stride_cs", "stride_cc", "stride_ck")}}  # fmt: skip
    for split in (1, 4):
        yield f"gdn decode step fused conv split={split}", gdn_decode_step._recurrent_norm_kernel, fused_sig, {
            "HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 128 // split, "L2_EPS": 1e-6, "SPLIT": split, "BLOCK_DV": 128,
            "FUSED_CONV": True, "KW": 4, "BLOCK_KW": 4, "QK_WRITER": -1}
    for split in (1, 4):  # the batch-1 graph's step writing out_proj's float16 pairs (`kernels/gemv_pairs.py`)
        yield f"gdn decode step fused conv pairs split={split}", gdn_decode_step._recurrent_norm_kernel, fused_sig | {"pairs_ptr": "*i32"}, {
            "HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 128 // split, "L2_EPS": 1e-6, "SPLIT": split, "BLOCK_DV": 128,
            "FUSED_CONV": True, "KW": 4, "BLOCK_KW": 4, "QK_WRITER": -1, "PAIRS": True}
    for split in (1, 4):  # the step computing b and a itself (`ba_from`, the b/a fold), with the batch-1 graph's pairs
        yield f"gdn decode step fused conv pairs ba fold split={split}", gdn_decode_step._recurrent_norm_kernel, fused_sig | {
            "pairs_ptr": "*i32", "ba_x_ptr": "*bf16", "ba_w_ptr": "*bf16", "stride_bax": I32}, {
            "HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 128 // split, "L2_EPS": 1e-6, "SPLIT": split, "BLOCK_DV": 128,
            "FUSED_CONV": True, "KW": 4, "BLOCK_KW": 4, "QK_WRITER": -1, "PAIRS": True, "BA_DOT": True, "BA_H": 2048, "BA_BLOCK": 2048, "BA_BF16": True}
    yield "gdn decode", gdn_decode._gdn_decode_kernel, {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*fp32", "state_ptr": "*fp32", "out_ptr": "*bf16", "state_out_ptr": "*fp32", "q_scale": "fp32"}, {"HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 32, "EPS": 1e-6}
    for dtype, ieee in (("*bf16", False), ("*fp32", True)):
        yield f"paged split {dtype}", paged_decode._paged_split_kernel, {"q_ptr": dtype, "k_ptr": dtype, "v_ptr": dtype, "tables_ptr": "*i32", "lens_ptr": "*i32", "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "scale": "fp32", "MAX_BLOCKS": I32, "SPLITS": I32}, {"HQ": 16, "HKV": 2, "D": 256, "BS": 16, "TOKENS_PER_SPLIT": 64, "BLOCK_T": 16, "BLOCK_G": 16, "BLOCK_D": 256, "IEEE": ieee}
    yield "attention prep", attention_prep._attention_prep_kernel, {
        "q_gate_ptr": "*bf16", "key_ptr": "*bf16", "value_ptr": "*bf16", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "positions_ptr": "*i64",
        "inv_freq_ptr": "*fp64", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slots_ptr": "*i64", "query_out_ptr": "*bf16",
        "stride_qg": I32, "stride_k": I32, "stride_v": I32, "eps": "fp32"}, {"HQ": 16, "HKV": 2, "D": 256, "ROTARY": 64, "BLOCK_D": 256}  # fmt: skip
    yield "paged combine", paged_decode._combine_kernel, {"part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "out_ptr": "*bf16", "SPLITS": I32}, {"HQ": 16, "HKV": 2, "D": 256, "BLOCK_S": 64, "BLOCK_G": 16, "BLOCK_D": 256}
    yield "paged combine gated pairs", paged_decode._combine_kernel, {"part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "out_ptr": "*bf16", "gate_ptr": "*bf16",
        "stride_gate": I32, "SPLITS": I32, "pairs_ptr": "*i32"}, {"HQ": 16, "HKV": 2, "D": 256, "BLOCK_S": 64, "BLOCK_G": 16, "BLOCK_D": 256, "GATED": True, "PAIRS": True}  # fmt: skip
    conv_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "cu_ptr": "*i32", "state_ptr": "*bf16", "out_ptr": "*bf16", "slots_ptr": "*i64", "has_ptr": "*i1", "T": I32, "C": I32, "num_seqs": I32, "stride_xt": I32, "stride_ot": I32, "stride_sb": I32, "stride_sc": I32, "stride_sk": I32}
    for steps, pool in ((0, False), (1, False), (2, False), (6, False), (0, True), (6, True)):  # B = 1 (no search), 2, 3 or 4, up to 64; states in pools
        yield f"causal conv1d steps={steps} pool={pool}", causal_conv1d._conv_kernel, conv_sig, {"K": 4, "STEPS": steps, "BLOCK_T": causal_conv1d.BLOCK_T, "BLOCK_C": causal_conv1d.BLOCK_C, "LIBDEVICE_EXP": True, "POOL": pool}
    state_sig = {"x_ptr": "*bf16", "cu_ptr": "*i32", "state_ptr": "*bf16", "final_ptr": "*bf16", "slots_ptr": "*i64", "has_ptr": "*i1", "valid_ptr": "*i64", "C": I32, "stride_xt": I32, "stride_sb": I32, "stride_sc": I32, "stride_sk": I32, "stride_fb": I32, "stride_fc": I32, "stride_fk": I32}
    for pool, valid in ((False, False), (True, True)):
        yield f"causal conv1d final state pool={pool} valid={valid}", causal_conv1d._final_state_kernel, state_sig, {"K": 4, "BLOCK_K": 4, "BLOCK_C": causal_conv1d.BLOCK_C, "POOL": pool, "HAS_VALID": valid}
    gates_sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "a_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "g_ptr": "*fp32", "beta_ptr": "*fp32", "valid_ptr": "*i64", "T": I32, "stride_a": I32, "stride_b": I32}
    for has_valid in (False, True):
        yield f"gdn gates valid={has_valid}", gdn_gates._gdn_gates_kernel, gates_sig, {"HV": 32, "BLOCK_T": gdn_gates.BLOCK_T, "BLOCK_H": 32, "HAS_VALID": has_valid, "LIBDEVICE": True}
    norm_sig = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "z_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": "*bf16", "residual_out_ptr": "*bf16", "steps_ptr": "*bf16", "n_rows": I32, "D": I32, "eps": "fp32", "z_heads": I32, "stride_zt": I32}
    for mode, steps in ((norms.PLAIN, 0), (norms.FUSED_ADD, 0), (norms.FUSED_ADD, 1), (norms.GATED, 0)):
        yield f"norm mode {mode} steps={steps}", norms._rms_norm_kernel, norm_sig, {"MODE": mode, "BF16": True, "BLOCK_D": 2048, "STEPS": steps, "ROWS": 1}
    for mode, pairs in ((norms.PLAIN, 3), (norms.FUSED_ADD, 3), (norms.FUSED_ADD, 1), (norms.FUSED_ADD, 2)):  # float16 pairs for the GEMV
        yield f"norm mode {mode} pairs={pairs}", norms._rms_norm_kernel, norm_sig | {"pairs_ptr": "*i32"}, {
            "MODE": mode, "BF16": True, "BLOCK_D": 2048, "STEPS": 0, "ROWS": 1, "PAIRS": pairs}
    for rows in (8, 16, 32):  # the Gated DeltaNet output norm's 128-wide rows, several per program
        yield f"gated norm rows={rows}", norms._rms_norm_kernel, norm_sig, {"MODE": norms.GATED, "BF16": True, "BLOCK_D": 128, "STEPS": 0, "ROWS": rows}
    persistent_sig = {"x_ptr": "*bf16", "x_in_ptr": "*i32", "router_w_ptr": "*bf16", "logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32",
                      **{f"{prefix}{name}": kind for prefix in ("gu", "down", "sh_gu", "sh_down") for name, kind in (("_ptr", "*i64"), ("_scale_ptr", "*fp8e4nv"), ("_scale_2_ptr", "*fp32"))},
                      "act_ptr": "*bf16", "act_in_ptr": "*i32", "out_ptr": "*bf16", "sync_ptr": "*i32"}  # fmt: skip
    for gbn, dbh, loop, warps in ((8, 8, 3, 4), (16, 16, 3, 4), (4, 4, 3, 4), (8, 8, 1, 4), (8, 8, 2, 4), (8, 8, 3, 8)):  # time_moe_persistent's plans
        yield f"moe block persistent {gbn}/{dbh} loop={loop} warps={warps}", moe_block_persistent._moe_block_persistent_kernel, persistent_sig, {
            "E": 256, "H": 2048, "I": 512, "TOP_K": 8, "BLOCK_E": 256, "BLOCK_K": 8, "ROUTER_ROWS": 2, "ROUTER_BLOCK_H": 2048, "GU_BLOCK_N": gbn, "GU_BLOCK_K": 256,
            "DOWN_BLOCK_H": dbh, "DOWN_BLOCK_I": 256, "LOOP": loop, "DECODE": 3, "PHASE": 0, "PROGRAMS": 132, "num_warps": warps}  # fmt: skip

    fused_sig = {"x32_ptr": "*i32", "ids_ptr": "*i32", "weights_ptr": "*fp32",
                 **{f"{prefix}{name}": kind for prefix in ("gu", "d", "sgu", "sd") for name, kind in (("_w_ptr", "*i64"), ("_scale_ptr", "*fp8e4nv"), ("_s2_ptr", "*fp32"))},
                 "act_ptr": "*bf16", "act32_ptr": "*i32", "out_ptr": "*bf16", "counter_ptr": "*i32", "T": I32}  # fmt: skip
    for gbn, gbk, loop, rows, warps, sleep in ((8, 256, 3, 8, 4, 0), (8, 256, 3, 4, 4, 0), (8, 256, 3, 16, 4, 0), (32, 64, 0, 8, 4, 0), (8, 256, 3, 8, 8, 0),
                                               (8, 256, 3, 4, 4, 200), (8, 256, 3, 8, 8, 1000)):  # time_moe_pairs_fused's forms
        yield f"moe pairs fused {gbn}/{gbk} loop={loop} down rows={rows} warps={warps}" + (f" sleep={sleep}" if sleep else ""), moe_pairs_fused._fused_pairs_kernel, fused_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "BLOCK_K": 8, "GU_BLOCK_N": gbn, "GU_BLOCK_K": gbk, "LOOP": loop, "DECODE": 5, "BLOCK_H": rows,
            "ROUND_BF16": False, "SLEEP_NS": sleep, "num_warps": warps}  # fmt: skip

    block_sig = {"rx_ptr": "*bf16", "router_w_ptr": "*bf16", "logits_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32", "x32_ptr": "*i32",
                 **{f"{prefix}{name}": kind for prefix in ("gu", "d", "sgu", "sd") for name, kind in (("_w_ptr", "*i64"), ("_scale_ptr", "*fp8e4nv"), ("_s2_ptr", "*fp32"))},
                 "act_ptr": "*bf16", "act32_ptr": "*i32", "out_ptr": "*bf16", "counter_ptr": "*i32", "T": I32, "E": I32,
                 "residual_ptr": "*bf16", "norm_w_ptr": "*bf16", "normed_ptr": "*bf16", "residual_out_ptr": "*bf16", "eps": "fp32"}  # fmt: skip
    for add_norm, sleep in ((True, 0), (False, 0), (True, 200)):
        yield f"moe block fused add_norm={add_norm}" + (f" sleep={sleep}" if sleep else ""), moe_pairs_fused._fused_block_kernel, block_sig, {
            "H": 2048, "I": 512, "TOP_K": 8, "BLOCK_K": 8, "BLOCK_E": 256, "ROUTER_ROWS": 2, "ROUTER_BLOCK_H": 2048, "ROUTER_BLOCKS": 129, "GU_BLOCK_N": 8,
            "GU_BLOCK_K": 256, "LOOP": 3, "DECODE": 5, "BLOCK_H": 8, "ROUND_BF16": False, "ADD_NORM": add_norm, "BF16": True, "NORM_WRITER": 0,
            "SLEEP_NS": sleep, "num_warps": 4}  # fmt: skip


def _acquires(compiled) -> tuple[int, int]:
    """(atomics with acquire or acq_rel semantics in the TTGIR, acquiring instructions in the PTX). Lowering can drop an
    atomic whose result is unused (run78); one that orders later loads must survive."""
    asked = len(re.findall(r"tt\.atomic_rmw \w+, (acquire|acq_rel)", compiled.asm["ttgir"]))
    kept = len(re.findall(ACQUIRING_PTX, compiled.asm["ptx"]))
    return asked, kept


def _registers(compiled) -> str:
    """", N registers, S spill bytes" from the bundled ptxas's report on the kernel's PTX ("" if it gives none)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(Path(folder) / "kernel.cubin")],
                                capture_output=True, text=True, check=False).stderr  # fmt: skip
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return f"  registers {registers.group(1)}, spill stores {spills.group(1) if spills else '?'} B" if registers else ""


def _sass_count(compiled) -> str:
    """", N SASS instructions" in the compiled cubin, counted from the bundled cuobjdump's listing."""
    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump = Path(get_ptxas(90).path).with_name("cuobjdump")
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        listing = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    count = len(re.findall(SASS_LINE, listing, flags=re.MULTILINE))
    return f", {count} SASS instructions"


def main() -> int:
    arguments = [argument for argument in sys.argv[1:] if argument != "--sass"]
    sass = "--sass" in sys.argv[1:]
    only = arguments[0] if arguments else ""  # a substring of the configurations' names: compile those alone
    failures = 0
    for name, kernel, signature, constants in configs():
        if only not in name:
            continue
        start = time.perf_counter()
        options = {"num_warps": constants.pop("num_warps")} if "num_warps" in constants else {}
        constants = {param.name: param.default for param in kernel.params  # parameters left at their defaults (None pointers, SPLIT 1, ...)
                     if param.name not in signature and param.name not in constants and param.default is not inspect.Parameter.empty} | constants
        full = dict(signature) | {key: "constexpr" for key in constants}
        try:
            compiled = triton.compile(ASTSource(kernel, full, constexprs=constants), target=TARGET, options=options)
            shared = compiled.metadata.shared
            missing = [pattern for part, pattern in PTX_REQUIRED.items() if part in name and not re.search(pattern, compiled.asm["ptx"])]
            if " pdl=" in name:  # the wait and the release
                wanted = PDL_PTX[:1] if name in PDL_RELEASE_BY_ENDING else PDL_PTX
                missing += [pattern for pattern in wanted if not re.search(pattern, compiled.asm["ptx"])]
            if missing:
                raise AssertionError(f"PTX lacks {missing}")
            asked, kept = _acquires(compiled)
            if kept < asked:
                raise AssertionError(f"{asked} acquiring atomics in the TTGIR, {kept} acquiring instructions in the PTX: one was dropped")
            print(f"ok   {name:32s} {time.perf_counter() - start:5.1f} s  shared {shared} B  warps {compiled.metadata.num_warps}{_registers(compiled)}{_sass_count(compiled) if sass else ''}", flush=True)
        except Exception as error:  # noqa: BLE001 - report every kernel
            failures += 1
            print(f"FAIL {name}: {type(error).__name__}: {str(error)[:600]}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
