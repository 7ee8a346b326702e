"""The MoE block's input in the Gluon experts' column order, written by the norm before the block (no copy launch).

On the eager GPU prefill, when the experts' gate/up launch is the Gluon kernel (it reads its input with each
128-column step permuted, `moe_prefill_gluon.permute_steps`), the decoder layer asks the block for a buffer
(`SparseMoeBlock.steps_buffer`), the Triton fused-add RMSNorm fills it (`steps_out`), and the block hands it to the
experts (`x_steps`). Here, on the CPU: the wiring (a decoder layer of the tiny NVFP4 preset with the kernel choice
stubbed: the buffer the norm wrote reaches the experts with the block's input, and the layer's output does not
change), a wiring that drops the buffer is caught, nothing is asked for off the GPU, and `nvfp4_moe_prefill` refuses a
bad `x_steps`. The kernel side (the norm's permuted store; the Gluon launch reading `x_steps`) is tested in
`kernels/test_norms.py` and `kernels/test_moe_prefill_gluon.py`.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from reference_engine.model import decoder as decoder_module
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.moe_block import SparseMoeBlock
from reference_engine.ops import norms as torch_norms
from reference_engine.presets import build_preset


def _layer():
    model = build_preset("tiny", dtype=torch.float32, quantize="nvfp4", seed=5)
    layer = model.layers[0]
    assert layer.mlp.shared_nvfp4 is not None  # the fused block: the eager path that can take x_steps
    return dataclasses.replace(layer, mixer=lambda normed, batch, caches: normed * 1.5 - 0.25)  # a stand-in mixer


def _marked(out: torch.Tensor) -> torch.Tensor:
    """What the stub norm writes into steps_out: a recognisable function of out (the real order is tested on the kernel)."""
    return out.flip(-1) * 2.0


def _run(monkeypatch, wants_steps: bool, drop_in_block: bool = False):
    """The layer with the Triton norm choice stubbed; returns (output, residual, what the experts received)."""
    received = []
    norm_calls = []

    def fused_add(x, residual, weight, out, residual_out, eps=1e-6, steps_out=None):
        torch_norms.fused_add_rms_norm(x, residual, weight, out, residual_out, eps=eps)
        norm_calls.append(steps_out is not None)
        if steps_out is not None:
            steps_out.copy_(_marked(out))
        return out

    monkeypatch.setattr(decoder_module, "eager_backend", lambda name, tensor, backend=None: "triton")
    monkeypatch.setattr(decoder_module, "eager_op", lambda name, tensor, backend=None: fused_add if name == "fused_add_rms_norm" else torch_norms.rms_norm)
    monkeypatch.setattr(SparseMoeBlock, "steps_buffer", lambda self, x: torch.full_like(x, float("nan")) if wants_steps else None)
    real_call = RoutedExperts.__call__

    def recording(self, x, topk_weights, topk_ids, out, ops=None, shared=None, x_steps=None):
        received.append((x.clone(), None if x_steps is None else x_steps.clone()))
        return real_call(self, x, topk_weights, topk_ids, out, ops=ops, shared=shared, x_steps=x_steps)

    monkeypatch.setattr(RoutedExperts, "__call__", recording)
    if drop_in_block:  # known wrong: the block forgets to pass the buffer on
        real_fused = SparseMoeBlock._fused_eager
        monkeypatch.setattr(SparseMoeBlock, "_fused_eager", lambda self, x, x_steps=None: real_fused(self, x))
    layer = _layer()
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(11, layer.post_attention_layernorm.shape[0], generator=generator)
    residual = torch.randn(x.shape, generator=generator)
    out, new_residual = layer(x, residual, SimpleNamespace(), None)
    return out, new_residual, received, norm_calls


def _steps_reached_the_experts(received) -> bool:
    (x, x_steps), = received
    return x_steps is not None and torch.equal(x_steps, _marked(x))


def test_the_norm_writes_the_buffer_and_the_experts_receive_it(monkeypatch):
    out, residual, received, norm_calls = _run(monkeypatch, wants_steps=True)
    assert norm_calls == [False, True]  # the input norm did not get steps_out, the post-mixer norm did
    assert _steps_reached_the_experts(received)
    monkeypatch.undo()
    plain_out, plain_residual, plain_received, plain_calls = _run(monkeypatch, wants_steps=False)
    assert not any(plain_calls) and plain_received[0][1] is None
    assert torch.isfinite(out).all()
    assert torch.equal(out, plain_out) and torch.equal(residual, plain_residual)  # off the GPU x_steps changes nothing


def test_a_block_that_drops_the_buffer_is_caught(monkeypatch):
    _, _, received, _ = _run(monkeypatch, wants_steps=True, drop_in_block=True)
    assert not _steps_reached_the_experts(received)


def test_nothing_is_asked_for_off_the_gpu():
    layer = _layer()
    x = torch.randn(4, layer.post_attention_layernorm.shape[0])
    assert layer.mlp.steps_buffer(x) is None
    assert not layer.mlp.experts.prefill_takes_steps(x, layer.mlp.top_k)


def test_the_prefill_refuses_a_bad_x_steps():
    pytest.importorskip("triton")
    from reference_engine.kernels import nvfp4_gemm

    experts = _layer().mlp.experts.stacked
    tokens, hidden = 5, experts.gate_up_packed.shape[2] * 2
    x = torch.randn(tokens, hidden).bfloat16()
    weights, ids = torch.rand(tokens, 2), torch.randint(0, experts.gate_up_packed.shape[0], (tokens, 2), dtype=torch.int32)
    for bad in (torch.empty(tokens, hidden + 1).bfloat16(), torch.empty(tokens, hidden), torch.empty(hidden, tokens).bfloat16().t()):
        with pytest.raises(ValueError, match="x_steps"):
            nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, experts, torch.empty_like(x), x_steps=bad)
