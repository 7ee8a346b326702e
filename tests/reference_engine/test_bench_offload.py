"""Parking our weights on the host while the peer runs: every tensor moves, views stay views, values and function stay.

On the CPU the move is forced to make fresh host copies, which checks the bookkeeping (every storage copied once,
every tensor re-pointed, aliasing kept); the CUDA test checks the real round trip and the memory it frees.
"""

from __future__ import annotations

import pytest
import torch

from reference_engine.bench.offload import (
    move_weights,
    reachable_tensors,
    weights_parked_on_host,
)
from reference_engine.bench.peer import iter_hf_state
from reference_engine.presets import build_preset


def _tiny(device: str = "cpu", dtype: torch.dtype = torch.float32):
    return build_preset(
        "tiny", seed=3, dtype=dtype, quantize="nvfp4", device=torch.device(device)
    )


def _state(model, device=None) -> dict[str, torch.Tensor]:
    return {
        name: tensor.detach().cpu().clone()
        for name, tensor in iter_hf_state(model, torch.float32, device)
    }


def _aliased_pairs(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(part, stack) pairs that the model builds as views of one storage."""
    pairs = []
    for layer in model.layers:
        mixer = layer.mixer
        stacked = getattr(mixer, "in_proj_qkvz", None) or getattr(mixer, "qkv", None)
        part = getattr(mixer, "in_proj_qkv", None) or getattr(mixer, "q_proj", None)
        if stacked is not None and stacked.weight_packed is not None:
            pairs.append((part.weight_packed, stacked.weight_packed))
    return pairs


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _per_tensor_copy(model) -> None:
    """Known-wrong mover: copies each tensor on its own, so views of one storage become separate copies."""
    with torch.inference_mode():
        for tensor in reachable_tensors(model):
            tensor.set_(tensor.clone())


def test_reachable_tensors_cover_every_weight_the_model_counts() -> None:
    model = _tiny()
    tensors = reachable_tensors(model)
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
    }
    held = sum(storages.values())
    assert held >= model.nbytes() > 0
    assert (
        held <= 1.1 * model.nbytes()
    )  # the fused router's padded copy and the like, not a second copy of everything
    assert len(tensors) == len({id(t) for t in tensors})


def test_move_copies_every_storage_once_and_keeps_views_and_values() -> None:
    model = _tiny()
    before = _state(model)
    pairs = _aliased_pairs(model)
    assert pairs and all(_shares(a, b) for a, b in pairs)
    old = {id(t): t.untyped_storage().data_ptr() for t in reachable_tensors(model)}
    report = move_weights(model, "cpu")
    after_tensors = reachable_tensors(model)
    assert report.tensors == len(after_tensors) == len(old)
    assert report.storages == len(
        {t.untyped_storage().data_ptr() for t in after_tensors}
    )
    assert all(
        t.untyped_storage().data_ptr() != old[id(t)] for t in after_tensors
    )  # fresh copies everywhere
    assert all(
        _shares(a, b) for a, b in pairs
    )  # the stacked linears and their parts still share one copy
    after = _state(model)
    assert after.keys() == before.keys() and all(
        torch.equal(after[k], before[k]) for k in before
    )


def test_the_alias_check_catches_a_per_tensor_copy() -> None:
    model = _tiny()
    pairs = _aliased_pairs(model)
    _per_tensor_copy(model)
    assert not any(_shares(a, b) for a, b in pairs)


def test_a_host_model_is_not_moved() -> None:
    model = _tiny()
    old = [t.untyped_storage().data_ptr() for t in reachable_tensors(model)]
    with weights_parked_on_host(model) as report:
        assert report is None
    assert [t.untyped_storage().data_ptr() for t in reachable_tensors(model)] == old


@pytest.mark.cuda
def test_parking_on_the_host_frees_the_device_and_comes_back_unchanged() -> None:
    from reference_engine.bench.gate import run_gate
    from reference_engine.tokenizer import load_tokenizer

    model = _tiny("cuda", torch.bfloat16)
    before = _state(model)
    pairs = _aliased_pairs(model)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    with weights_parked_on_host(model) as report:
        assert report is not None and report.bytes >= model.nbytes()
        assert all(t.device.type == "cpu" for t in reachable_tensors(model))
        assert torch.cuda.memory_allocated() <= held - model.nbytes()
        parked = _state(
            model, torch.device("cuda")
        )  # the peer is built from the parked weights like this
    assert all(t.is_cuda for t in reachable_tensors(model))
    assert all(_shares(a, b) for a, b in pairs)
    assert all(torch.equal(parked[k], before[k]) for k in before)
    assert all(torch.equal(v, before[k]) for k, v in _state(model).items())
    result = run_gate(
        model, load_tokenizer("tiny"), "graphs", num_prompts=2, decode_steps=3
    )
    assert result.passed, result.message
