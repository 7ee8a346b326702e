"""A linear layer's weight, dense or NVFP4, and the one call that applies it (`y = x @ W^T`, no bias).

Dense: `weight [N, K]` in the model dtype. NVFP4 (ModelOpt multiplier convention inside the engine):
`weight_packed [N, K/2]` uint8, `weight_scale [N, K/16]` float8_e4m3fn, `weight_scale_2` float32
scalar, optional `input_scale` float32 scalar. With `activation_nvfp4` (and an input scale) the layer
runs W4A4 (`w4a4_linear`), otherwise weight-only W4A16 (`w4a16_linear`); the quant module picks the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.model.eager_ops import triton_allowed
from reference_engine.quant.linear import w4a4_linear, w4a16_linear, w4a16_linear_rows
from reference_engine.quant.nvfp4 import dequantize_nvfp4


def eager_w4a16(x: torch.Tensor, stacked: bool = False):
    """The eager W4A16 op for x [M, K] (`stacked`: the one for stacked linears with a tensor scale per output row,
    `w4a16_linear_rows`): on CUDA with Triton allowed the Triton one for every M (the tensor-core GEMM or the bfloat16
    copy + cuBLAS for a prefill, the GEMV for the few rows of a prefill's LM head); otherwise (CPU, no Triton, the plain
    path) the torch op. Until run67 rows up to 64 took the torch op, which dequantises the whole weight: an NVFP4 LM head
    (248,320 x 2,048) after a 1024-token prefill cost 8 ms that way (TTFT 38.6 ms against 30.3 with the bf16 head)."""
    torch_op = w4a16_linear_rows if stacked else w4a16_linear
    if x.is_cuda and x.shape[0] > 0 and triton_allowed(x):
        try:
            from reference_engine.kernels import nvfp4_gemv
        except ImportError:  # no Triton
            return torch_op
        return nvfp4_gemv.w4a16_linear_rows if stacked else nvfp4_gemv.w4a16_linear
    return torch_op


@dataclass(frozen=True)
class Linear:
    out_features: int
    in_features: int
    weight: torch.Tensor | None = None  # [N, K] dense
    weight_packed: torch.Tensor | None = None  # [N, K/2] uint8
    weight_scale: torch.Tensor | None = None  # [N, K/16] float8_e4m3fn
    weight_scale_2: torch.Tensor | None = None  # [] float32
    input_scale: torch.Tensor | None = None  # [] float32
    activation_nvfp4: bool = False

    def __post_init__(self) -> None:
        if (self.weight is None) == (self.weight_packed is None):
            raise ValueError("Linear needs exactly one of a dense weight or NVFP4 weight_packed")
        if self.weight is not None:
            if tuple(self.weight.shape) != (self.out_features, self.in_features):
                raise ValueError(f"dense weight has shape {list(self.weight.shape)}, expected [{self.out_features}, {self.in_features}]")
            return
        if self.in_features % 16:
            raise ValueError(f"NVFP4 needs in_features divisible by 16, got {self.in_features}")
        expected = {
            "weight_packed": ((self.out_features, self.in_features // 2), torch.uint8),
            "weight_scale": ((self.out_features, self.in_features // 16), torch.float8_e4m3fn),
            "weight_scale_2": ((), torch.float32),
        }
        for name, (shape, dtype) in expected.items():
            tensor = getattr(self, name)
            if tensor is None or tuple(tensor.shape) != shape or tensor.dtype != dtype:
                got = "missing" if tensor is None else f"{list(tensor.shape)} {tensor.dtype}"
                raise ValueError(f"NVFP4 {name}: expected {list(shape)} {dtype}, got {got}")
        if self.activation_nvfp4 and self.input_scale is None:
            raise ValueError("activation_nvfp4 (W4A4) needs an input_scale")

    @property
    def is_nvfp4(self) -> bool:
        return self.weight_packed is not None

    @classmethod
    def dense(cls, weight: torch.Tensor) -> Linear:
        return cls(int(weight.shape[0]), int(weight.shape[1]), weight=weight)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a dense [N, K] tensor (dequantised for NVFP4)."""
        if self.weight is not None:
            return self.weight.to(dtype)
        return dequantize_nvfp4(self.weight_packed, self.weight_scale, self.weight_scale_2, dtype)

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype; `ops` (an ops.backend.OpSet, static decode only) supplies the W4A16 kernel."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects inputs of width {self.in_features}, got {list(x.shape)}")
        if self.weight is not None:
            return torch.nn.functional.linear(x, self.weight)
        flat = x.reshape(-1, self.in_features)  # [M, K]
        out = torch.empty(flat.shape[0], self.out_features, dtype=x.dtype, device=x.device)  # [M, N]
        if self.activation_nvfp4:
            w4a4_linear(flat, self.weight_packed, self.weight_scale, self.weight_scale_2, self.input_scale, out=out)
        elif ops is not None:
            ops.w4a16_linear(flat, self.weight_packed, self.weight_scale, self.weight_scale_2, out=out)
        else:
            eager_w4a16(flat)(flat, self.weight_packed, self.weight_scale, self.weight_scale_2, out=out)
        return out.view(*x.shape[:-1], self.out_features)

    def nbytes(self) -> int:
        parts = (self.weight, self.weight_packed, self.weight_scale, self.weight_scale_2, self.input_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)
