"""Measured kernel settings per device: GEMV tiles per shape and the MoE decode kernels' tiles and loop form.

A tuning file is JSON written by the timing scripts in `benchmarks/kernels/` on the device itself:

    {"device": "NVIDIA H200",
     "nvfp4_gemv": [{"tokens": 1, "rows": 12288, "k_bytes": 1024, "config": [1, 16, 256, 1, 4, 1]}, ...],
     "moe_decode": {"LOOP": 1, "GATE_UP_BLOCK_N": 8, "GATE_UP_BLOCK_K": 256, "DOWN_BLOCK_H": 8, "DOWN_BLOCK_I": 256, "WORDS": 1},
     "moe_decode_batch_one": {...the same keys, for one token},
     "moe_decode_small_batches": [{"max_tokens": 2, ...the same keys}, ...],
     "gemv_words": 1, "gemm_min_tokens": 16, "gdn_step_split_below": 128, "fused_router_max_tokens": 4,
     "dense_gemv_max_tokens": 4, "gemm_decode": 1,
     "small_m_gemm": [{"block_m": 32, "rows": 2048, "k": 4096, "config": [64, 4, 16]}, ...],
     "moe_grouped_decode": {"min_tokens": 16, "gate_up_block_n": 32, ...the other GroupedPlan fields}}

GEMV configs have 6 or 7 entries (the 7th: 1 for int32 word reads, 2 for packed float16 pairs at batch 1, 3 for those pairs
with the codes widened through E4M3, `nvfp4_half_dot`'s FP8 decode; the MoE settings' `WORDS` the same).
`moe_decode_small_batches` gives the per-pair MoE kernels settings by batch ceiling from 2 tokens up, the first entry
that covers a batch winning (`benchmarks/kernels/time_moe_decode.py --small-batches`). The MoE
settings' `DOWN_SPLIT` is the programs a token's down slots are dealt over; `gdn_step_split` the programs per split GDN
decode head, `gdn_step_fused_conv` 1 the step in one launch (the conv inside the recurrent kernel;
`benchmarks/kernels/time_gdn_fused_conv.py`) at every batch, `gdn_step_fused_conv_max_batch` up to that batch,
`gdn_step_state_first` 1 its recurrent launch issuing the state tile's load first (`benchmarks/kernels/time_gdn_state_first.py`).
`gdn_ba_side_max_batch` runs the GDN b/a projection on a side stream up to that decode batch (`kernels/side_stream.py`). `gdn_step_ba_fold_max_batch`: up to that decode batch the GDN step computes b and a itself, with no b/a launch (`gdn_decode_step.py`, "b/a fold"; `benchmarks/kernels/time_ba_fold.py`). `gemv_words` sets the word reads
for shapes without an entry; `gemv_tiled` 1 keeps tile-major copies of the batch-1 GEMVs' weights (`benchmarks/kernels/time_gemv_tiled.py`), `gemv_x_pairs` 1 or 2
the kernels before the batch-1 GEMVs (the norm before each mixer, the GDN step, the paged decode) writing x as float16 pairs
for them (`kernels/gemv_pairs.py`; 0 off), `moe_act_pairs` 1 or 2 the decode MoE's gate/up kernel storing the
activation as the down kernel's float16 pairs, `moe_x_pairs` 1 or 2 the fused router's norm (`router_add_norm`) writing x
as the gate/up kernel's pairs (0 off; the three timed by `benchmarks/kernels/time_float16_pairs.py`), `moe_gate_up_topk_max_tokens` up to that batch
the fused router writing logits only and the decode MoE's gate/up launch picking the experts (`moe_decode.topk_in_experts`; 0 off), `pdl` 1 or 2
the decode kernels launched with programmatic dependent launch, the next one released at the start or after the main loop (`kernels/pdl.py`; 0 off), `gemm_tiled` 1 tile-major copies for
the decode-batch GEMM's tiles (`benchmarks/kernels/time_gemm_tiled.py`); `gemm_min_tokens` the batch from which the linears run the tensor-core GEMM
instead of the GEMV (at most 65); the next three switch the decode launch savings of the GDN decode step (split
heads below this many rows x heads), the MoE router (one launch up to this batch) and the small dense linears
(`benchmarks/kernels/time_decode_pieces.py` measures them at batches 1 to 64); `router_rows` / `router_warps` that one
launch's logits rows and warps per program (`benchmarks/kernels/time_router.py`), `moe_expert_prefetch` 1 that launch
prefetching the selected experts' weights into L2 (`benchmarks/kernels/time_moe_expert_prefetch.py`), `router_add_norm` 1
that launch doing the add + RMSNorm before the MoE block as well (`benchmarks/kernels/time_router_add_norm.py`);
`sampling_fused_select` 1 the sampling op's top-k selection path in two Triton launches (`kernels/sampling_select.py`,
`benchmarks/time_sampling.py`).
`gemm_decode` picks the weight decode of the tensor-core GEMMs (prefill linears and experts, decode batches from
`gemm_min_tokens`), `gemm_prefetch_linear` / `gemm_prefetch_moe` whether they load the next K step's activation tile
and block scales a step ahead, `gemm_swap_linear` / `gemm_swap_moe` whether the decoded weight tile is the dot's
first operand (wgmma reads it from registers; the tokens become the dot's N), `gemm_decode_moe` 2 the routed experts'
prefill GEMMs decoding straight into wgmma's register operand (K-permuted x, `nvfp4_gemm._register_products`),
`moe_prefill_fused_gate_up` 1 their gate/up launch running one dot over interleaved gate and up rows, `moe_prefill_gluon` 1
that launch running the Gluon kernel (`kernels/moe_prefill_gluon.py`: the decoded weights as wgmma's register operand),
`moe_prefill_gluon_down` 1 their down launch likewise, `moe_prefill_gluon_max_registers` a register cap for both Gluon
launches (ptxas's maxnreg; 0 none), `moe_prefill_gluon_split_m` their blocks of at most that many tokens in a launch of
that width (0 none), `gdn_prefill_scan_stages` how the
chunked GDN prefill's second launch walks the chunks (0 a while loop, else a range loop pipelined with that many stages;
`benchmarks/kernels/time_gdn_prefill.py`), `gdn_prefill_prepare_warps` the warps of its first launch,
`moe_prefill_block_m_max` the routed experts' largest token block and
`moe_prefill_gate_up_block_n` their gate/up rows per program
(`benchmarks/kernels/time_moe_prefill.py`), `small_m_gemm` their tiles per shape at decode batches (`benchmarks/kernels/time_gemm_tiles.py`);
`moe_grouped_decode` the batch from which the decode MoE block runs grouped by expert, and its tiles
(`benchmarks/kernels/time_moe_grouped.py`); `moe_grouped_half` the batch range grouped by expert in packed float16 on
CUDA cores (checked first), and its tiles; `dequant_min_tokens` the prompt length from which the NVFP4 linears
decode their weights once into bfloat16 and call cuBLAS (`benchmarks/kernels/time_dequant_gemm.py`), `dequant_cache`
whether those copies are kept between prefills;
`paged_min_tokens_per_split` and `paged_waves` the split plan of the paged decode attention
(`benchmarks/kernels/time_paged_decode.py`); `l2_prefetch` ("off", "mixer", "moe") whether and where each decode
layer warms the next layer's weights in L2 (`kernels/l2_prefetch.py`, `benchmarks/kernels/time_l2_prefetch.py`);
`norm_row_elements` the elements one RMSNorm program covers, so that short rows (the Gated DeltaNet output norm's 128)
share a program (`benchmarks/kernels/time_norm_rows.py`); `moe_grouped_half.tiled` 1 keeps tile-major copies of the experts
for those kernels (`benchmarks/kernels/time_moe_tiled.py`); `moe_block_persistent` the batch-1 MoE block in one persistent
launch (`on` 1) and its plan (`kernels/moe_block_persistent.py`, `benchmarks/kernels/time_moe_persistent.py`);
`moe_pairs_fused_max_tokens` the decode batches whose per-pair experts run gate/up and down in one launch, and
`moe_pairs_fused_down_rows` / `moe_pairs_fused_warps` / `moe_pairs_fused_spin_ns` that launch's output rows per down program,
warps and sleep between two reads of a waiting program's counter, `moe_pairs_fused_block` 1
the router in that launch too (`kernels/moe_pairs_fused.py`,
`benchmarks/kernels/time_moe_pairs_fused.py`).

`apply_tuning(path)` validates it (pydantic, at this edge) and installs it: GEMV shapes listed there use
their measured configuration (others keep `nvfp4_gemv.plan`), the MoE settings replace the module
defaults. `apply_for_device(name, capability)` applies `reference_engine/kernels/tuned/<device>.json` when one exists
for that device, else the file of a card of the same compute capability (`SAME_ARCHITECTURE`: an H100 takes the H200's);
the Triton op set calls it. Settings change speed only: every configuration computes
the same function (the scripts check each output against the torch op before timing it).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TUNED_DIR = Path(__file__).resolve().parent / "tuned"


class GemvEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: int = Field(ge=1)
    rows: int = Field(ge=1)
    k_bytes: int = Field(ge=1)
    config: tuple[int, int, int, int, int, int] | tuple[int, int, int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_KB, SPLIT_K, num_warps, LOOP[, WORDS]


class MoeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    LOOP: int = Field(ge=0, le=8)
    GATE_UP_BLOCK_N: int = Field(ge=1, le=128)
    GATE_UP_BLOCK_K: int = Field(ge=16, le=2048)
    DOWN_BLOCK_H: int = Field(ge=1, le=128)
    DOWN_BLOCK_I: int = Field(ge=16, le=2048)
    WORDS: int = Field(default=0, ge=0, le=3)  # 3: packed float16 pairs with the E4M3 decode
    DOWN_SPLIT: int = Field(default=1, ge=1, le=16)


class MoeSmallBatchSettings(MoeSettings):
    """Per-pair MoE decode settings for batches of 2 to `max_tokens` tokens (the first entry that covers a batch wins)."""

    max_tokens: int = Field(ge=2, le=64)


class SmallGemmEntry(BaseModel):
    """A decode batch's tensor-core GEMM tiles for one shape (`nvfp4_gemm.SMALL_M_TUNED`)."""

    model_config = ConfigDict(extra="forbid")
    block_m: int = Field(ge=16, le=64)
    rows: int = Field(ge=1)
    k: int = Field(ge=16)  # K in elements
    config: tuple[int, int, int]  # BLOCK_N, num_warps, SPLIT_K


class MoeGroupedSettings(BaseModel):
    """From which batch the decode MoE block runs grouped by expert, and the tiles (`moe_grouped_decode.GroupedPlan`)."""

    model_config = ConfigDict(extra="forbid")
    min_tokens: int = Field(ge=1)
    block_m: int = Field(default=16, ge=16, le=64)
    gate_up_block_n: int = Field(default=32, ge=16, le=128)
    gate_up_block_kb: int = Field(default=32, ge=8, le=256)
    down_block_n: int = Field(default=64, ge=16, le=256)
    down_block_kb: int = Field(default=32, ge=8, le=256)
    num_warps: int = Field(default=4, ge=1, le=16)
    num_stages: int = Field(default=3, ge=1, le=8)
    decode: int = Field(default=1, ge=0, le=1)
    swap: int = Field(default=0, ge=0, le=1)  # the weight tile as the dot's first operand (wgmma from 64 rows)


class MoeGroupedHalfSettings(BaseModel):
    """The batches the decode MoE block runs grouped by expert in packed float16 (`moe_grouped_half`), and the tiles."""

    model_config = ConfigDict(extra="forbid")
    min_tokens: int = Field(ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    gate_up_block_n: int = Field(default=32, ge=1, le=256)
    gate_up_block_b: int = Field(default=8, ge=1, le=64)
    down_block_n: int = Field(default=32, ge=1, le=256)
    down_block_b: int = Field(default=8, ge=1, le=64)
    num_warps: int = Field(default=4, ge=1, le=16)
    pairs: int = Field(default=0, ge=0, le=1)  # x and the activation converted once into float16 pairs
    fp8: int = Field(default=0, ge=0, le=1)  # codes widened through E4M3 (`nvfp4_half_dot`'s FP8 decode)
    tiled: int = Field(default=0, ge=0, le=1)  # 1: the engine keeps tile-major copies of the experts for these kernels (`ops.tiled_experts`)


class MoePersistentSettings(BaseModel):
    """The batch-1 MoE block in one persistent launch (`moe_block_persistent.PersistentPlan`) and whether it runs."""

    model_config = ConfigDict(extra="forbid")
    on: int = Field(ge=0, le=1)  # 1: `moe_decode.moe_block_decode` sends one-token blocks there
    programs_per_sm: int = Field(default=1, ge=1, le=8)
    router_rows: Literal[1, 2, 4, 8] = 2
    gate_up_block_n: Literal[4, 8, 16, 32, 64] = 8
    gate_up_block_k: Literal[64, 128, 256, 512] = 256
    down_block_h: Literal[4, 8, 16, 32, 64] = 8
    down_block_i: Literal[64, 128, 256] = 256
    loop: int = Field(default=3, ge=0, le=4)
    words: int = Field(default=2, ge=0, le=2)
    num_warps: Literal[1, 2, 4, 8] = 4


class TuningFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str
    nvfp4_gemv: list[GemvEntry] = []
    moe_decode: MoeSettings | None = None
    moe_decode_batch_one: MoeSettings | None = None  # one token (the tiles that fill the GPU at batch 1 differ)
    moe_decode_small_batches: list[MoeSmallBatchSettings] | None = None  # 2 tokens and up, by batch ceiling (run80)
    gemv_words: int | None = Field(default=None, ge=0, le=3)
    gemv_tiled: int | None = Field(default=None, ge=0, le=1)  # 1: the engine keeps tile-major copies of the batch-1 GEMVs' weights
    gemm_tiled: int | None = Field(default=None, ge=0, le=1)  # 1: ... and of the linears for the decode-batch GEMM's tiles
    gemm_min_tokens: int | None = Field(default=None, ge=2, le=65)
    gdn_step_split_below: int | None = Field(default=None, ge=0)  # split GDN decode heads below this many (row, head) pairs (0: never)
    gdn_step_split: int | None = Field(default=None, ge=2, le=32)  # programs per split head
    gdn_step_fused_conv: int | None = Field(default=None, ge=0, le=1)  # GDN decode step: the conv inside the recurrent launch
    gdn_step_state_first: int | None = Field(default=None, ge=0, le=1)  # GDN decode step: the state tile's load issued first
    gdn_step_fused_conv_max_batch: int | None = Field(default=None, ge=0)  # ... up to this batch (0: never)
    gdn_ba_side_max_batch: int | None = Field(default=None, ge=0)  # GDN b/a projection on a side stream up to this batch (0: never)
    gdn_step_ba_fold_max_batch: int | None = Field(default=None, ge=0)  # GDN decode step computing b/a itself up to this batch (0: never)
    fused_router_max_tokens: int | None = Field(default=None, ge=0)  # router logits + top-k in one launch up to this batch (0: never)
    dense_gemv_max_tokens: int | None = Field(default=None, ge=0)  # Triton dense GEMV up to this batch (0: always torch)
    router_rows: Literal[1, 2, 4, 8] | None = None  # fused router: logits rows per program
    router_warps: Literal[1, 2, 4, 8] | None = None  # fused router: warps per program
    moe_expert_prefetch: int | None = Field(default=None, ge=0, le=1)  # fused router: bulk L2 prefetch of the selected experts
    router_add_norm: int | None = Field(default=None, ge=0, le=1)  # fused router: the norm before the MoE block in the same launch
    gemv_x_pairs: int | None = Field(default=None, ge=0, le=2)  # batch-1 GEMVs: x as float16 pairs from its producer (0 off; 1, 2 load forms)
    moe_act_pairs: int | None = Field(default=None, ge=0, le=2)  # decode MoE: the activation as the down kernel's float16 pairs (0 off; 1, 2)
    moe_x_pairs: int | None = Field(default=None, ge=0, le=2)  # decode MoE: x as the gate/up kernel's pairs from the fused router's norm
    moe_gate_up_topk_max_tokens: int | None = Field(default=None, ge=0)  # decode MoE: the gate/up launch picks the experts up to this batch (0: never)
    pdl: int | None = Field(default=None, ge=0, le=2)  # decode kernels: programmatic dependent launch (0 off; 1, 2 where the release sits)
    sampling_fused_select: int | None = Field(default=None, ge=0, le=1)  # sampling's top-k selection path in two Triton launches
    gemm_decode: int | None = Field(default=None, ge=0, le=1)  # tensor-core GEMMs' weight decode: 0 bytes, 1 int32 words (PTX)
    gemm_prefetch_linear: int | None = Field(default=None, ge=0, le=1)  # tensor-core linears: next K step's x and scales loaded ahead
    gemm_prefetch_moe: int | None = Field(default=None, ge=0, le=1)  # the same for the routed experts' prefill GEMMs
    gemm_swap_linear: int | None = Field(default=None, ge=0, le=1)  # tensor-core linears: weight tile as the dot's first operand
    gemm_swap_moe: int | None = Field(default=None, ge=0, le=1)  # the same for the routed experts' prefill GEMMs
    gemm_decode_moe: int | None = Field(default=None, ge=1, le=2)  # the routed experts' prefill GEMMs: 2 decodes into the register operand
    moe_prefill_fused_gate_up: int | None = Field(default=None, ge=0, le=1)  # their gate/up launch: 1 one dot over interleaved gate and up rows
    moe_prefill_gluon: int | None = Field(default=None, ge=0, le=1)  # their gate/up launch: 1 the Gluon kernel (`moe_prefill_gluon`)
    moe_prefill_gluon_down: int | None = Field(default=None, ge=0, le=1)  # their down launch: 1 its Gluon kernel
    moe_prefill_gluon_max_registers: int | None = Field(default=None, ge=0, le=255)  # both Gluon launches: ptxas register cap (0 none)
    moe_prefill_gluon_split_m: Literal[0, 32] | None = None  # both Gluon launches: blocks of at most 32 tokens in a 32-wide launch (0 none)
    gdn_prefill_scan_stages: int | None = Field(default=None, ge=0, le=4)  # chunked GDN prefill's launch 2: 0 while loop, else pipelined stages
    gdn_prefill_prepare_warps: Literal[4, 8] | None = None  # its launch 1's warps at the real head shape
    moe_prefill_block_m_max: Literal[16, 32, 64] | None = None  # the routed experts' prefill GEMMs: largest token block
    moe_prefill_gate_up_block_n: Literal[64, 128] | None = None  # their first launch: gate (and up) rows per program
    dequant_cache: bool | None = None  # keep those bfloat16 copies between prefills (2.8 GB at the real size)
    dequant_min_tokens: int | None = Field(default=None, ge=65)  # prefill linears from this many tokens: bfloat16 weight copy + cuBLAS
    paged_min_tokens_per_split: int | None = Field(default=None, ge=16, le=1024)  # paged decode: tokens walked by one split at least
    paged_waves: int | None = Field(default=None, ge=1, le=64)  # paged decode: splits to fill the multiprocessors this many times
    l2_prefetch: Literal["off", "mixer", "moe"] | None = None  # CUDA-graph decode: where layer l issues layer l + 1's L2 prefetch
    norm_row_elements: Literal[1, 1024, 2048, 4096] | None = None  # RMSNorm kernels: elements per program (short rows share one)
    small_m_gemm: list[SmallGemmEntry] = []
    moe_grouped_decode: MoeGroupedSettings | None = None
    moe_grouped_half: MoeGroupedHalfSettings | None = None
    moe_block_persistent: MoePersistentSettings | None = None
    moe_pairs_fused_max_tokens: int | None = Field(default=None, ge=0, le=64)  # decode MoE: gate/up and down in one launch up to this batch (0: never)
    moe_pairs_fused_down_rows: Literal[4, 8, 16, 32] | None = None  # that launch's output rows per down program
    moe_pairs_fused_warps: Literal[4, 8] | None = None  # that launch's warps per program
    moe_pairs_fused_spin_ns: int | None = Field(default=None, ge=0, le=100_000)  # its waiting programs' sleep between counter reads (0: spin)
    moe_pairs_fused_block: int | None = Field(default=None, ge=0, le=1)  # 1: the router in that launch too


def device_file(device_name: str) -> Path:
    return TUNED_DIR / (re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + ".json")


def apply_tuning(path: str | Path) -> TuningFile:
    """Validate and install a tuning file; returns it. ValueError naming the file on bad content."""
    from reference_engine.kernels import (
        dense_gemv,
        gdn_chunked_prefill,
        gdn_decode_step,
        gemv_pairs,
        l2_prefetch,
        moe_decode,
        moe_grouped_decode,
        moe_grouped_half,
        norms,
        nvfp4_dequant,
        nvfp4_gemm,
        nvfp4_gemv,
        paged_decode,
        pdl,
        router,
        sampling_select,
        side_stream,
    )

    path = Path(path)
    try:
        tuning = TuningFile.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise ValueError(f"tuning file {path}: {error}") from None
    for entry in tuning.nvfp4_gemv:
        nvfp4_gemv.TUNED[(entry.tokens, entry.rows, entry.k_bytes)] = entry.config
    if tuning.gemv_words is not None:
        nvfp4_gemv.WORDS = tuning.gemv_words
    if tuning.gemv_tiled is not None:
        nvfp4_gemv.TILED_COPIES = bool(tuning.gemv_tiled)
    if tuning.gemv_x_pairs is not None:
        gemv_pairs.X_PAIRS = tuning.gemv_x_pairs
    if tuning.moe_act_pairs is not None:
        moe_decode.ACT_PAIRS = tuning.moe_act_pairs
    if tuning.moe_x_pairs is not None:
        moe_decode.X_PAIRS = tuning.moe_x_pairs
    if tuning.moe_gate_up_topk_max_tokens is not None:
        moe_decode.GATE_UP_TOPK_MAX_TOKENS = tuning.moe_gate_up_topk_max_tokens
    if tuning.pdl is not None:
        pdl.MODE = tuning.pdl
    if tuning.gemm_tiled is not None:
        nvfp4_gemm.TILED_SMALL_M = bool(tuning.gemm_tiled)
    for value, module, name in ((tuning.gdn_step_split_below, gdn_decode_step, "STEP_SPLIT_BELOW"), (tuning.gdn_step_split, gdn_decode_step, "STEP_SPLIT"),
                                (None if tuning.gdn_step_fused_conv is None else bool(tuning.gdn_step_fused_conv), gdn_decode_step, "FUSED_CONV"),
                                (tuning.gdn_step_fused_conv_max_batch, gdn_decode_step, "FUSED_CONV_MAX_BATCH"),
                                (None if tuning.gdn_step_state_first is None else bool(tuning.gdn_step_state_first), gdn_decode_step, "STATE_FIRST"),
                                (tuning.gdn_ba_side_max_batch, side_stream, "BA_MAX_BATCH"),
                                (tuning.gdn_step_ba_fold_max_batch, gdn_decode_step, "BA_FOLD_MAX_BATCH"),
                                (tuning.fused_router_max_tokens, router, "FUSED_ROUTER_MAX_TOKENS"),
                                (tuning.dense_gemv_max_tokens, dense_gemv, "MAX_TOKENS"), (tuning.router_rows, router, "ROUTER_ROWS"),
                                (tuning.router_warps, router, "ROUTER_WARPS"),
                                (None if tuning.moe_expert_prefetch is None else bool(tuning.moe_expert_prefetch), router, "PREFETCH_EXPERTS"),
                                (None if tuning.router_add_norm is None else bool(tuning.router_add_norm), router, "ADD_NORM"),
                                (None if tuning.sampling_fused_select is None else bool(tuning.sampling_fused_select), sampling_select, "FUSED")):  # fmt: skip
        if value is not None:
            setattr(module, name, value)
    if tuning.gemm_min_tokens is not None:
        nvfp4_gemv.GEMM_MIN_TOKENS = tuning.gemm_min_tokens
    for value, name in ((tuning.gemm_decode, "DECODE"), (tuning.gemm_prefetch_linear, "PREFETCH_LINEAR"), (tuning.gemm_prefetch_moe, "PREFETCH_MOE"),
                        (tuning.gemm_swap_linear, "SWAP_LINEAR"), (tuning.gemm_swap_moe, "SWAP_MOE"), (tuning.gemm_decode_moe, "DECODE_MOE"),
                        (tuning.moe_prefill_fused_gate_up, "FUSE_GATE_UP"), (tuning.moe_prefill_gluon, "GLUON_GATE_UP"),
                        (tuning.moe_prefill_gluon_down, "GLUON_DOWN"), (tuning.moe_prefill_gluon_max_registers, "GLUON_MAX_REGISTERS"),
                        (tuning.moe_prefill_gluon_split_m, "GLUON_SPLIT_M"),
                        (tuning.moe_prefill_block_m_max, "MOE_BLOCK_M_MAX"), (tuning.moe_prefill_gate_up_block_n, "MOE_GATE_UP_BLOCK_N")):  # fmt: skip
        if value is not None:
            setattr(nvfp4_gemm, name, value)
    if tuning.gdn_prefill_scan_stages is not None:
        gdn_chunked_prefill.SCAN_STAGES = tuning.gdn_prefill_scan_stages
    if tuning.gdn_prefill_prepare_warps is not None:
        gdn_chunked_prefill.PREPARE_WARPS = tuning.gdn_prefill_prepare_warps
    if tuning.l2_prefetch is not None:
        l2_prefetch.POINT = None if tuning.l2_prefetch == "off" else tuning.l2_prefetch
    if tuning.norm_row_elements is not None:
        norms.ROW_ELEMENTS = tuning.norm_row_elements
    if tuning.dequant_min_tokens is not None:
        nvfp4_dequant.MIN_TOKENS = tuning.dequant_min_tokens
    if tuning.dequant_cache is not None:
        nvfp4_dequant.CACHE = tuning.dequant_cache
    for value, name in ((tuning.paged_min_tokens_per_split, "MIN_TOKENS_PER_SPLIT"), (tuning.paged_waves, "WAVES")):
        if value is not None:
            setattr(paged_decode, name, value)
    for small in tuning.small_m_gemm:
        nvfp4_gemm.SMALL_M_TUNED[(small.block_m, small.rows, small.k)] = small.config
    if tuning.moe_decode is not None:
        for name, value in tuning.moe_decode.model_dump().items():
            setattr(moe_decode, name, value)
    if tuning.moe_grouped_decode is not None:
        settings = tuning.moe_grouped_decode.model_dump()
        moe_grouped_decode.MIN_TOKENS = settings.pop("min_tokens")
        moe_grouped_decode.PLAN = moe_grouped_decode.GroupedPlan(**settings)
    if tuning.moe_grouped_half is not None:
        settings = tuning.moe_grouped_half.model_dump()
        moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = settings.pop("min_tokens"), settings.pop("max_tokens")
        moe_grouped_half.PLAN = moe_grouped_half.HalfGroupedPlan(**settings)
    if tuning.moe_decode_batch_one is not None:
        moe_decode.BATCH_ONE = tuple(tuning.moe_decode_batch_one.model_dump().values())
    if tuning.moe_decode_small_batches is not None:
        moe_decode.SMALL_BATCHES = tuple(
            (entry.max_tokens, tuple(entry.model_dump(exclude={"max_tokens"}).values())) for entry in sorted(tuning.moe_decode_small_batches, key=lambda e: e.max_tokens)
        )  # fmt: skip
    fused = {"MAX_TOKENS": tuning.moe_pairs_fused_max_tokens, "DOWN_BLOCK_H": tuning.moe_pairs_fused_down_rows, "NUM_WARPS": tuning.moe_pairs_fused_warps,
             "SPIN_NS": tuning.moe_pairs_fused_spin_ns, "BLOCK": None if tuning.moe_pairs_fused_block is None else bool(tuning.moe_pairs_fused_block)}  # fmt: skip
    if any(value is not None for value in fused.values()):
        from reference_engine.kernels import moe_pairs_fused  # it imports moe_decode

        for name, value in fused.items():
            if value is not None:
                setattr(moe_pairs_fused, name, value)
    if tuning.moe_block_persistent is not None:
        from reference_engine.kernels import moe_block_persistent

        settings = tuning.moe_block_persistent.model_dump()
        moe_decode.PERSISTENT = bool(settings.pop("on"))
        moe_block_persistent.PLAN = moe_block_persistent.PersistentPlan(**settings)
    return tuning


# A card with no file of its own takes the file measured on a card of the same architecture (compute capability): the
# same multiprocessors, shared memory and instructions, another memory system. benchmarks/NOTES.md, run55 and run57: on
# an H100 the batch-1 decode graph took 4.01 ms with the untuned defaults and 2.61 ms with the H200's file.
SAME_ARCHITECTURE = {(9, 0): "nvidia-h200.json"}


def tuning_path(device_name: str, capability: tuple[int, int] | None = None) -> Path | None:
    """The tuning file for this card: its own (`device_file`), else its architecture's (`SAME_ARCHITECTURE`), else None."""
    own = device_file(device_name)
    if own.exists():
        return own
    shared = SAME_ARCHITECTURE.get(tuple(capability)) if capability is not None else None
    return TUNED_DIR / shared if shared is not None and (TUNED_DIR / shared).exists() else None


def apply_for_device(device_name: str, capability: tuple[int, int] | None = None) -> TuningFile | None:
    """Install `tuning_path(device_name, capability)`; None (nothing changed) when there is none."""
    path = tuning_path(device_name, capability)
    return apply_tuning(path) if path is not None else None


def apply_for_cuda() -> Path | None:
    """Install the current CUDA device's file (its own or its architecture's, as the op set does); returns its path."""
    import torch

    path = tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    if path is not None:
        apply_tuning(path)
    return path


def switch_wins(rows: list[dict], new: str, old: str, margin: float = 0.02) -> tuple[bool, float]:
    """(take, summed new / old) for a timing script's switch: take it when the new form is faster summed over the rows
    by more than `margin` and slower in none by more than `margin`."""
    total = sum(row[new] for row in rows) / sum(row[old] for row in rows)
    return total < 1 - margin and all(row[new] < row[old] * (1 + margin) for row in rows), total


def finish_switch_timing(out: str | Path, records: dict, rows: list[dict], agree: str, new: str, old: str, key: str,
                         tuning_file: str | Path | None, margin: float = 0.02) -> int:
    """The end of a switch-timing script (benchmarks/kernels/time_*): write `records` as JSON to `out`; exit status 1
    when a row's `agree` flag is false (the two forms computed different things); else, with `tuning_file`, write
    `key` = 1 or 0 there as `switch_wins(rows, new, old, margin)` decides. Returns the exit status."""
    Path(out).write_text(json.dumps(records, indent=1))
    if not all(row[agree] for row in rows):
        print(f"the two forms disagree ({agree} false): {key} not written", file=sys.stderr)
        return 1
    if tuning_file is not None:
        take, total = switch_wins(rows, new, old, margin)
        write_setting(tuning_file, key, int(take))
        print(f"tuning: {key} = {int(take)} ({new} / {old} summed over the rows: {total:.3f})")
    return 0


def write_setting(path: str | Path, key: str, value) -> None:
    """Set one key of a tuning file in place; the result must still validate."""
    path = Path(path)
    document = json.loads(path.read_text())
    document[key] = value
    TuningFile.model_validate(document)
    path.write_text(json.dumps(document, indent=1))
