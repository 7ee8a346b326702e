"""Which implementation an eager (not CUDA-graph) op of the model runs: the torch op or its Triton kernel.

`eager_op(name, tensor)` returns a callable with the torch op's destination-passing signature:
- CUDA tensor on a GPU of compute capability >= 9.0 (the kernels are written for sm_90, as in
  `ops.backend.select_ops`) and the kernel module importable (Triton installed): the Triton kernel
  of `reference_engine/kernels/`;
- otherwise (CPU, older GPU, no Triton): the torch op.
`backend="triton"` forces the kernel whatever the device (tests run it on CPU tensors under
TRITON_INTERPRET=1; ImportError when Triton is missing), `backend="torch"` forces the torch op.
`forced_backend(...)` applies the same to every call made inside a `with` block (how a test runs a whole
layer or model on the kernels, or a caller keeps the torch ops everywhere). The kernel is looked up on every call (a
module attribute read), so a test can replace it. The CUDA-graph decode path does not come here: it
calls the OpSet of `ops.backend.select_ops`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

from reference_engine.ops import linear_attention, moe, norms

BACKENDS = ("torch", "triton")

# op name -> (torch op, kernel module under reference_engine.kernels, kernel function); same signatures.
EAGER_OPS: dict[str, tuple[Callable, str, str]] = {
    "gdn_chunked_prefill": (linear_attention.gdn_chunked_prefill, "gdn_chunked_prefill", "gdn_chunked_prefill"),
    "causal_conv1d": (linear_attention.causal_conv1d, "causal_conv1d", "causal_conv1d"),
    "gdn_gates": (linear_attention.gdn_gates, "gdn_gates", "gdn_gates"),
    "gated_rms_norm": (norms.gated_rms_norm, "norms", "gated_rms_norm"),
    "rms_norm": (norms.rms_norm, "norms", "rms_norm"),
    "fused_add_rms_norm": (norms.fused_add_rms_norm, "norms", "fused_add_rms_norm"),
    "router_topk": (moe.router_topk, "router", "router_topk"),
}

_FORCED: ContextVar[str | None] = ContextVar("reference_engine_eager_backend", default=None)


def _check_backend(backend: str | None) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None (automatic), got {backend!r}")


@contextlib.contextmanager
def forced_backend(backend: str | None) -> Iterator[None]:
    """Inside the block, `eager_op` calls without an explicit backend use `backend` ("torch", "triton"; None: automatic)."""
    _check_backend(backend)
    token = _FORCED.set(backend)
    try:
        yield
    finally:
        _FORCED.reset(token)


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def _kernel(name: str, required: bool) -> Callable | None:
    _, module_name, function_name = EAGER_OPS[name]
    try:
        module = importlib.import_module(f"reference_engine.kernels.{module_name}")
    except ImportError as error:  # no Triton
        if required:
            raise ImportError(f"the Triton kernel of {name!r} was forced but reference_engine.kernels.{module_name} does not import: {error}") from error
        return None
    return getattr(module, function_name)


def triton_allowed(tensor: torch.Tensor) -> bool:
    """Whether eager code may run Triton kernels on data like `tensor` (forced choice, else CUDA on sm_90+);
    the eager NVFP4 GEMM and grouped MoE prefill of `model/linear.py` and `model/experts.py` ask this."""
    forced = _FORCED.get()
    if forced is not None:
        return forced == "triton"
    return tensor.is_cuda and _capable(tensor.device.index if tensor.device.index is not None else torch.cuda.current_device())


def eager_backend(name: str, tensor: torch.Tensor, backend: str | None = None) -> str:
    """What `eager_op(name, tensor, backend)` runs: "torch" or "triton"."""
    if name not in EAGER_OPS:
        raise ValueError(f"unknown eager op {name!r}; expected one of {sorted(EAGER_OPS)}")
    _check_backend(backend)
    choice = backend if backend is not None else _FORCED.get()
    if choice is not None:
        return choice
    if not tensor.is_cuda:
        return "torch"
    if not _capable(tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()):
        return "torch"
    return "triton" if _kernel(name, required=False) is not None else "torch"


def eager_op(name: str, tensor: torch.Tensor, backend: str | None = None) -> Callable:
    """The op `name` for data like `tensor`: its Triton kernel on CUDA where available, else the torch op (see the module doc)."""
    if eager_backend(name, tensor, backend) == "triton":
        return _kernel(name, required=True)
    return EAGER_OPS[name][0]
