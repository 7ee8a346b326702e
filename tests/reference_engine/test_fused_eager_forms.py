"""The eager (prefill) path of a fused MoE block and of a Gated DeltaNet layer with stacked projections runs fewer,
larger GEMMs (router + shared gate logits in one, shared gate + up in one; in_proj_qkv + z and b + a in one each):
the same function as the composed path. Checked on the tiny NVFP4 preset against the composed path of the same
block (the fused form switched off on that block), and the padded-pitch router logits against F.linear."""

from __future__ import annotations

import torch

from reference_engine.ops.dense_linear import aligned_linear
from reference_engine.presets import build_preset


def _model():
    return build_preset("tiny", dtype=torch.float32, quantize="nvfp4", seed=3)


def _wrong_shared_gate_logits(x, weight):
    """Known wrong: the shared expert's gate logit taken from the last routed expert's row."""
    logits = torch.nn.functional.linear(x, weight)
    return torch.cat([logits[:, :-1], logits[:, -2:-1]], dim=1)


def _fused_and_composed(monkeypatch, logits_fn=None):
    from reference_engine.model import moe_block

    if logits_fn is not None:
        monkeypatch.setattr(moe_block, "aligned_linear", logits_fn)
    block = _model().layers[0].mlp
    assert block.shared_nvfp4 is not None and block.shared_gate_up is not None  # the fused form was built
    x = torch.randn(37, block.router_weight.shape[1], generator=torch.Generator().manual_seed(0))
    fused = block(x)
    object.__setattr__(block, "shared_nvfp4", None)  # this block only: the composed path
    return fused, block(x)


def test_fused_moe_block_eager_path_equals_the_composed_path(monkeypatch):
    fused, composed = _fused_and_composed(monkeypatch)
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, composed, rtol=1e-5, atol=1e-6)


def test_the_comparison_catches_a_wrong_shared_gate_logit(monkeypatch):
    fused, composed = _fused_and_composed(monkeypatch, _wrong_shared_gate_logits)
    assert float((fused - composed).norm() / composed.norm()) > 1e-3


def test_gdn_eager_projections_are_the_stacked_views():
    model = _model()
    mixer = next(layer.mixer for layer in model.layers if hasattr(layer.mixer, "in_proj_qkvz"))
    assert mixer.in_proj_qkvz is not None and mixer.in_proj_ba is not None
    x = torch.randn(9, mixer.in_proj_qkv.in_features, generator=torch.Generator().manual_seed(1))
    mixed, z, b, a = mixer._projections(x, None)
    for got, linear in ((mixed, mixer.in_proj_qkv), (z, mixer.in_proj_z), (b, mixer.in_proj_b), (a, mixer.in_proj_a)):
        torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-6)


def test_aligned_linear_runs_over_padding_rows_and_returns_the_first_n_columns():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 16, generator=g)
    storage = torch.randn(16, 16, generator=g)
    storage[11:] = float("nan")  # padding rows: their products land only in columns past N
    weight = storage[:11]
    got = aligned_linear(x, weight)
    assert got.shape == (5, 11) and torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight))
    # no padding in the storage (or N aligned): plain F.linear
    exact = torch.randn(11, 16, generator=g)
    assert torch.equal(aligned_linear(x, exact), torch.nn.functional.linear(x, exact))
    assert aligned_linear(x, storage[3:14]).shape == (5, 11)  # rows 3..13: the storage ends before a pitch of 16 rows


def test_fused_block_router_weight_is_padded_with_zero_rows():
    block = _model().layers[0].mlp
    rows, hidden = block.router_weight.shape
    padded = block.router_weight.as_strided((-(-rows // 8) * 8, hidden), (hidden, 1))
    assert torch.equal(padded[rows:], torch.zeros_like(padded[rows:]))
    assert torch.equal(padded[: rows - 1], block.gate.weight) and torch.equal(padded[rows - 1 : rows], block.shared_expert_gate.weight)
