"""Point the runner's op selection at chosen Triton kernels (a helper for the interpreter scripts of the model tests)."""

from __future__ import annotations

from dataclasses import replace


def use_kernels(kernels: dict) -> None:
    """From now on `runner.select_ops` returns its usual ops with `kernels` (op name -> function) put in, marked Triton."""
    from reference_engine import runner

    original = runner.select_ops

    def with_kernels(device, use_triton=True):
        ops = original(device, use_triton=use_triton)
        return replace(ops, **kernels, backends=ops.backends | {name: "triton" for name in kernels})

    runner.select_ops = with_kernels
