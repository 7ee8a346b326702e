"""Executable half of the test contract attention/demo-copy."""

from __future__ import annotations

import math

import torch

from toolbox.expressions import evaluate  # noqa: F401 - the forbidden import is the point


def make_inputs(axes, params, dtype, device, generator):
    return {"x": torch.randn(axes["T"], axes["H"], generator=generator, device=device).to(dtype)}


def reference(x):
    return {"out": x.clone()}


def finite_output(inputs, outputs, params):
    assert all(math.isfinite(v) for v in outputs["out"].flatten().tolist())


def flatten_x(inputs, params):
    return {"x": inputs["x"].reshape(-1)}, params
