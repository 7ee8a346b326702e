"""A float32-activation twin of a model that shares its quantised weights.

`float32_twin(model)` rebuilds the frozen model tree with every bfloat16/float16 tensor (embeddings,
norms, dense linears such as the router and a bf16 LM head) copied to float32, and every other tensor
(NVFP4 codes and scales, float32 gate parameters) shared, not copied. The twin computes the same
function as the model with float32 activations: the accuracy gate uses it as the reference a bf16
fast path and the bf16 plain path are both measured against. Costs the dense tensors twice in
float32 (about 4 GB at full size with a bf16 LM head); the NVFP4 weights are held once.
"""

from __future__ import annotations

import dataclasses

import torch

_HALF = (torch.bfloat16, torch.float16)


def _convert(value, memo: dict[int, object]):
    key = id(value)
    if key in memo:  # a tensor or object reached twice (views of a stack) is converted once
        return memo[key]
    if isinstance(value, torch.Tensor):
        result = value.float() if value.dtype in _HALF else value
    elif isinstance(value, tuple):
        result = tuple(_convert(item, memo) for item in value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: _convert(getattr(value, field.name), memo) for field in dataclasses.fields(value) if field.init}
        result = dataclasses.replace(value, **changes)
    else:
        result = value
    memo[key] = result
    return result


def float32_twin(model):
    """The model with float32 activations (see the module docstring); `model` itself is unchanged."""
    return _convert(model, {})
