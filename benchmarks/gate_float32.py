"""The accuracy gate in float32 at full size: fast path (CUDA graphs, Triton kernels) vs the plain eager path.

    PYTHONPATH=. python3 benchmarks/gate_float32.py [--torch]

Builds the full-size NVFP4 model, takes its float32 twin (same NVFP4 weights, float32 activations)
and runs `run_gate` on it, whose float32 bounds (KL mean 1e-8, max 1e-7, top-1 1.0) leave room for
summation order only: a kernel bug at the real shapes shows here even where bf16 rounding would hide it.
"""

from __future__ import annotations

import sys
import time

import torch

from reference_engine.bench.gate import run_gate
from reference_engine.model.cast import float32_twin
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

if __name__ == "__main__":
    use_triton = "--torch" not in sys.argv
    begin = time.perf_counter()
    model = float32_twin(build_preset("full", device="cuda", dtype=torch.bfloat16, seed=0, quantize="nvfp4"))
    result = run_gate(model, load_tokenizer("full"), "graphs", num_prompts=4, decode_steps=8, use_triton=use_triton)
    print(result.message)
    print(f"({time.perf_counter() - begin:.0f} s)")
    raise SystemExit(0 if result.passed else 1)
