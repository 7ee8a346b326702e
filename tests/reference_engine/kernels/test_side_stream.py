"""The GDN b/a projection on a side stream at small decode batches (`kernels/side_stream.py`).

CPU: which batches take the side stream, that there is none off CUDA, the tuning key, and a static decode of the tiny
model through a recording stand-in (every GDN layer of every decode step at a batch up to the limit asks for the two
branches, none above it; logits unchanged). CUDA (marked): graph decode with the side stream gives the logits of the
run without it, bit for bit.
"""

from __future__ import annotations

import json

import pytest
import torch
from static_decode import decode_logits

from reference_engine.kernels import side_stream, tuning
from reference_engine.model.gated_deltanet import GatedDeltaNet
from reference_engine.presets import build_preset


@pytest.fixture(scope="module")
def tiny_nvfp4():
    return build_preset("tiny", device=torch.device("cpu"), dtype=torch.float32, seed=3, quantize="nvfp4")


class _Recorder:
    """Stands in for `SideStream` on the CPU: runs both branches in order and records the row counts it was asked for."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def branches(self, main_work, side_work):
        main_result = main_work()
        side_result = side_work()
        self.rows.append(side_result[0].shape[0])
        return main_result, side_result


def test_the_side_stream_is_taken_up_to_its_batch(monkeypatch) -> None:
    monkeypatch.setattr(side_stream, "BA_MAX_BATCH", 2)
    side = _Recorder()
    assert side_stream.ba_on_side(side, 1) and side_stream.ba_on_side(side, 2)
    assert not side_stream.ba_on_side(side, 3) and not side_stream.ba_on_side(None, 1)
    monkeypatch.setattr(side_stream, "BA_MAX_BATCH", 0)
    assert not side_stream.ba_on_side(side, 1)


def test_there_is_no_side_stream_off_cuda(monkeypatch) -> None:
    monkeypatch.setattr(side_stream, "BA_MAX_BATCH", 4)
    assert side_stream.for_device("cpu") is None


def test_tuning_key_is_validated_and_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(side_stream, "BA_MAX_BATCH", 0)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "gdn_ba_side_max_batch": 1}))
    tuning.apply_tuning(path)
    assert side_stream.BA_MAX_BATCH == 1
    path.write_text(json.dumps({"device": "x", "gdn_ba_side_max_batch": -1}))
    with pytest.raises(ValueError, match="gdn_ba_side_max_batch"):
        tuning.apply_tuning(path)


@pytest.mark.parametrize("max_batch", [2, 1])
def test_static_decode_asks_for_branches_in_every_gdn_layer_up_to_the_batch(tiny_nvfp4, monkeypatch, max_batch) -> None:
    """Both prompts decode together, so every decode step runs at batch 2: all GDN layers of every step take the side
    stream with a limit of 2, none with a limit of 1. Logits are unchanged either way."""
    plain, _ = decode_logits(tiny_nvfp4, lambda decoder: None)
    monkeypatch.setattr(side_stream, "BA_MAX_BATCH", max_batch)
    recorder = _Recorder()
    sided, _ = decode_logits(tiny_nvfp4, lambda decoder: setattr(decoder, "side", recorder))
    assert len(plain) == len(sided)
    for a, b in zip(plain, sided, strict=True):
        assert torch.equal(a, b)
    gdn_layers = sum(isinstance(layer.mixer, GatedDeltaNet) for layer in tiny_nvfp4.layers)
    decode_steps = len(plain) - 1  # the first step is the prefill
    assert gdn_layers > 0 and decode_steps >= 3
    if max_batch >= 2:
        assert recorder.rows == [2] * (gdn_layers * decode_steps)
    else:
        assert recorder.rows == []


def test_a_layer_without_the_stacks_does_not_use_the_side_stream(tiny_nvfp4) -> None:
    """The branches need both stacked projections; a layer built without them projects one by one, side or not."""
    layer = next(layer.mixer for layer in tiny_nvfp4.layers if isinstance(layer.mixer, GatedDeltaNet))
    assert layer.in_proj_qkvz is not None and layer.in_proj_ba is not None
    x = torch.randn(1, layer.in_proj_qkv.in_features, generator=torch.Generator().manual_seed(2))
    recorder = _Recorder()
    both = layer._projections(x, None, recorder)
    assert recorder.rows == [1]
    unstacked = type(layer)(**{**vars(layer), "in_proj_qkvz": None, "in_proj_ba": None})
    alone = unstacked._projections(x, None, recorder)
    assert recorder.rows == [1]
    for a, b in zip(both, alone, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_decode_with_the_side_stream_gives_the_same_logits_on_cuda(monkeypatch) -> None:
    model = build_preset("tiny", device=torch.device("cuda"), dtype=torch.bfloat16, seed=3, quantize="nvfp4")

    def configure(decoder, max_batch: int) -> None:  # after the engine's op selection, which installs the card's tuning file
        monkeypatch.setattr(side_stream, "BA_MAX_BATCH", max_batch)
        decoder.side = side_stream.for_device("cuda")

    def run(max_batch: int):
        logits, engine = decode_logits(model, lambda decoder: configure(decoder, max_batch), device="cuda", mode="graphs")
        decoder = engine.runner.decoder
        assert (decoder.side is None) == (max_batch == 0)
        assert decoder.captured_buckets, "the decode steps ran as graphs"
        return logits

    plain, sided = run(0), run(2)
    assert len(plain) == len(sided)
    for a, b in zip(plain, sided, strict=True):
        assert torch.equal(a, b)
