"""NVFP4: E2M1 codes and packing, quantize/dequantize (ModelOpt multiplier convention), the Blackwell
128x4 swizzled scale layout, W4A16 / W4A4 linears, and checkpoint export (ModelOpt, compressed-tensors)."""

from __future__ import annotations

from reference_engine.quant.linear import w4a4_linear, w4a16_linear
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

__all__ = ["dequantize_nvfp4", "quantize_nvfp4", "w4a16_linear", "w4a4_linear"]
