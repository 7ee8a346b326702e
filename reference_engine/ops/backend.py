"""Which implementation of each decode-step op the model calls: torch ops or Triton kernels.

`select_ops(device, use_triton)` returns a frozen `OpSet` of callables with the torch ops'
destination-passing signatures (the model and the CUDA-graph runner call them by field name):
- default (CPU, or `use_triton=False`, or Triton not importable): the torch ops, using the
  static-shape variants (`ops.static_moe`, `ops.static_attention`) where the plain op would
  synchronise with the host, so the same OpSet can be captured in a CUDA graph;
- CUDA with Triton: each field whose kernel module imports (`reference_engine.kernels.*`) is
  replaced by the Triton kernel; the others stay torch. Kernels are written for sm_90 (Hopper,
  H200). On sm_100 (Blackwell) the same Triton code runs, but an sm_100 engine would replace
  `w4a16_linear` and the NVFP4 experts by native FP4 x FP4 (`tl.dot_scaled`) kernels: not
  written, not verified; the selection below takes the sm_90 kernels for any capability >= 9.0.
`OpSet.backends` records, per field, "torch" or "triton" (print it to see what a run used).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from reference_engine.ops.dense_linear import dense_linear
from reference_engine.ops.linear_attention import (  # capturable
    causal_conv1d_update,
    gdn_decode_step,
    gdn_recurrent_decode,
)
from reference_engine.ops.moe import router_topk, shared_expert
from reference_engine.ops.norms import fused_add_rms_norm, gated_rms_norm, rms_norm
from reference_engine.ops.static_attention import (
    attention_decode_prep,
    paged_decode,
    paged_decode_gated,
)
from reference_engine.ops.static_moe import (
    moe_block_decode,
    moe_block_decode_add_norm,
    nvfp4_routed_experts,
    routed_experts,
)
from reference_engine.quant.linear import w4a16_linear, w4a16_linear_rows


@dataclass(frozen=True)
class OpSet:
    """The decode-step ops, each with the signature of the torch op of the same name."""

    rms_norm: Callable
    fused_add_rms_norm: Callable
    gated_rms_norm: Callable
    router_topk: Callable
    routed_experts: Callable  # dense weights [E, 2I, H] / [E, H, I]
    nvfp4_routed_experts: Callable  # (x, topk_weights, topk_ids, experts: StackedNvfp4Experts, out)
    moe_block_decode: Callable  # (x, router_weight [E+1, H], experts, shared: SharedNvfp4Expert, top_k, out): the whole MoE block
    moe_block_decode_add_norm: Callable  # (x, add_norm: AddNorm, router_weight, experts, shared, top_k, out): the norm before it too
    shared_expert: Callable
    w4a16_linear: Callable
    paged_decode: Callable
    gdn_recurrent_decode: Callable
    gdn_decode_step: Callable  # the whole GDN decode step, states in place in the pools
    causal_conv1d_update: Callable
    w4a16_linear_rows: Callable  # stacked NVFP4 linears, one tensor scale per output row
    attention_decode_prep: Callable  # q/k norms, partial RoPE, K/V cache write
    paged_decode_gated: Callable  # paged decode times sigmoid(output gate)
    dense_linear: Callable  # (x [T, K], weight [N, K], out [T, N]): small dense linears (a GDN layer's in_proj_b/a)
    backends: dict[str, str] = field(default_factory=dict, compare=False)


# OpSet field -> (kernel module under reference_engine.kernels, function name).
TRITON_KERNELS: dict[str, tuple[str, str]] = {
    "w4a16_linear": ("nvfp4_gemv", "w4a16_linear"),
    "routed_experts": ("moe_decode", "routed_experts"),
    "nvfp4_routed_experts": ("moe_decode", "nvfp4_routed_experts"),
    "moe_block_decode": ("moe_decode", "moe_block_decode"),
    "moe_block_decode_add_norm": ("moe_decode", "moe_block_decode_add_norm"),
    "router_topk": ("router", "router_topk"),
    "gdn_recurrent_decode": ("gdn_decode", "gdn_recurrent_decode"),
    "gdn_decode_step": ("gdn_decode_step", "gdn_decode_step"),
    "paged_decode": ("paged_decode", "paged_decode"),
    "rms_norm": ("norms", "rms_norm"),
    "fused_add_rms_norm": ("norms", "fused_add_rms_norm"),
    "gated_rms_norm": ("norms", "gated_rms_norm"),
    "w4a16_linear_rows": ("nvfp4_gemv", "w4a16_linear_rows"),
    "attention_decode_prep": ("attention_prep", "attention_decode_prep"),
    "paged_decode_gated": ("paged_decode", "paged_decode_gated"),
    "dense_linear": ("dense_gemv", "dense_linear"),
}


def torch_ops() -> OpSet:
    """The plain torch ops (static-shape variants where they exist): the CPU path and the fallback."""
    ops = OpSet(
        rms_norm=rms_norm,
        fused_add_rms_norm=fused_add_rms_norm,
        gated_rms_norm=gated_rms_norm,
        router_topk=router_topk,
        routed_experts=routed_experts,
        nvfp4_routed_experts=nvfp4_routed_experts,
        moe_block_decode=moe_block_decode,
        moe_block_decode_add_norm=moe_block_decode_add_norm,
        shared_expert=shared_expert,
        w4a16_linear=w4a16_linear,
        paged_decode=paged_decode,
        gdn_recurrent_decode=gdn_recurrent_decode,
        gdn_decode_step=gdn_decode_step,
        causal_conv1d_update=causal_conv1d_update,
        w4a16_linear_rows=w4a16_linear_rows,
        attention_decode_prep=attention_decode_prep,
        paged_decode_gated=paged_decode_gated,
        dense_linear=dense_linear,
    )
    return replace(ops, backends={name: "torch" for name in TRITON_KERNELS} | {"shared_expert": "torch", "causal_conv1d_update": "torch"})


def triton_available() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _cuda_capability(device: str) -> tuple[int, int] | None:
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(torch.device(device))


def triton_kernels() -> dict[str, Callable]:
    """OpSet field -> Triton kernel, for every kernel module that imports (missing ones are skipped)."""
    found: dict[str, Callable] = {}
    for name, (module_name, function_name) in TRITON_KERNELS.items():
        try:
            module = importlib.import_module(f"reference_engine.kernels.{module_name}")
        except ImportError:
            continue
        function = getattr(module, function_name, None)
        if function is not None:
            found[name] = function
    return found


def select_ops(device: str, use_triton: bool = True) -> OpSet:
    """Torch ops, with the Triton kernels that exist swapped in on CUDA (compute capability >= 9.0), and the
    card's measured kernel settings (`kernels/tuned/<device>.json`, else its architecture's file) applied where one exists."""
    import torch

    ops = torch_ops()
    capability = _cuda_capability(device)
    if not use_triton or capability is None or capability < (9, 0) or not triton_available():
        return ops
    kernels = triton_kernels()
    from reference_engine.kernels.tuning import apply_for_device

    apply_for_device(torch.cuda.get_device_name(torch.device(device)), capability)  # measured tiles for this card or its architecture
    backends = dict(ops.backends) | {name: "triton" for name in kernels}
    return replace(ops, **kernels, backends=backends)
