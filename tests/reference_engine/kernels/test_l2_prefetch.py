"""The decode path's L2 prefetch of the next layer's weights (`kernels/l2_prefetch.py`).

CPU: the span and chunk arithmetic (every 16-byte granule of every span covered once, chunks aligned and bounded;
two known-wrong chunkers caught), the spans of a tiny model's layer (every mixer and non-expert MoE tensor inside
them, the routed experts outside), the decoder's calls in a static-mode decode (layer order, both points, one join
per step, logits unchanged), the tuning key. CUDA (marked): graph decode with each prefetch point gives the logits
of the run without it, bit for bit.
"""

from __future__ import annotations

import json

import pytest
import torch
from static_decode import decode_logits

from reference_engine.kernels import l2_prefetch, tuning
from reference_engine.kernels.l2_prefetch import (
    ALIGN,
    chunk_spans,
    layer_spans,
    merge_spans,
)
from reference_engine.model.experts import RoutedExperts
from reference_engine.presets import build_preset


def _granules(spans) -> set[int]:
    """The 16-byte granules lying wholly inside the spans."""
    out = set()
    for start, size in spans:
        first = -(-start // ALIGN) * ALIGN
        out.update(range(first, (start + size) // ALIGN * ALIGN, ALIGN))
    return out


def _check_chunks(spans, chunks, chunk_bytes) -> None:
    """What the bulk prefetch needs and what the plan promises: aligned, bounded, disjoint, covering every granule."""
    seen: list[int] = []
    for address, size in chunks:
        assert address % ALIGN == 0 and size % ALIGN == 0, (address, size)
        assert 0 < size <= chunk_bytes, size
        seen.extend(range(address, address + size, ALIGN))
    assert len(seen) == len(set(seen)), "chunks overlap"
    assert set(seen) == _granules(spans), "chunks do not cover exactly the spans' granules"


SPANS = [(1000, 5000), (70_000, 16), (100_000, 200_000), (400_003, 29), (500_000, 0)]


def test_chunks_cover_every_granule_aligned_and_bounded() -> None:
    for chunk_bytes in (16, 4096, 1 << 16):
        _check_chunks(SPANS, chunk_spans(SPANS, chunk_bytes), chunk_bytes)
    assert chunk_spans([(0, 15)]) == [] and chunk_spans([(8, 16)]) == []  # no whole granule inside


def test_chunk_checker_catches_known_wrong_chunkers() -> None:
    def drops_tail(spans, chunk_bytes):  # forgets the last partial chunk of each span
        return [c for c in chunk_spans(spans, chunk_bytes) if c[1] == chunk_bytes]

    def unaligned(spans, chunk_bytes):  # starts at the span's first byte, not its first whole granule
        return [(start, min(chunk_bytes, size)) for start, size in spans if size]

    for wrong in (drops_tail, unaligned):
        with pytest.raises(AssertionError):
            _check_chunks(SPANS, wrong(SPANS, 4096), 4096)


def test_chunk_size_must_be_a_positive_multiple_of_16() -> None:
    for bad in (0, -16, 100):
        with pytest.raises(ValueError, match="multiple of 16"):
            chunk_spans(SPANS, bad)


def test_merge_spans_joins_overlapping_and_touching_views() -> None:
    assert merge_spans([(100, 50), (120, 100), (0, 10), (220, 5), (300, 0), (400, 10)]) == [(0, 10), (100, 125), (400, 10)]


@pytest.fixture(scope="module")
def tiny_nvfp4():
    return build_preset("tiny", device=torch.device("cpu"), dtype=torch.float32, seed=3, quantize="nvfp4")


def _inside(tensor: torch.Tensor, spans) -> bool:
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return any(s <= start and end <= s + n for s, n in spans)


def test_layer_spans_cover_the_layer_and_leave_out_the_routed_experts(tiny_nvfp4) -> None:
    for layer in tiny_nvfp4.layers:
        spans = layer_spans(layer)
        assert spans == merge_spans(spans)  # disjoint, ordered
        expected = [layer.input_layernorm, layer.post_attention_layernorm]
        expected += [v for v in vars(layer.mixer).values() if isinstance(v, torch.Tensor)]
        for linear in [v for v in vars(layer.mixer).values() if hasattr(v, "weight_packed")] + [layer.mlp.gate, layer.mlp.shared_down_proj]:
            expected += [t for t in (linear.weight, linear.weight_packed, linear.weight_scale) if t is not None]
        assert len(expected) > 8
        for tensor in expected:
            assert _inside(tensor, spans), tensor.shape
        experts = layer.mlp.experts
        assert isinstance(experts, RoutedExperts) and experts.stacked is not None
        for tensor in (t for t in vars(experts.stacked).values() if isinstance(t, torch.Tensor) and t.numel() > 64):
            start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
            assert all(s + n <= start or end <= s for s, n in spans), "routed experts are not prefetched"


def test_for_model_is_off_on_the_cpu_and_rejects_unknown_points(tiny_nvfp4) -> None:
    assert l2_prefetch.for_model(tiny_nvfp4, "moe") is None  # nothing to prefetch off CUDA
    assert l2_prefetch.for_model(tiny_nvfp4, "off") is None
    with pytest.raises(ValueError, match="l2_prefetch point"):
        l2_prefetch.for_model(tiny_nvfp4, "attention")


class _Recorder:
    """Stands in for `LayerPrefetch` in a CPU static decode: records what the model asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.joins = 0

    def at(self, layer_index: int, point: str) -> None:
        self.calls.append((layer_index, point))

    def join(self) -> None:
        self.joins += 1


def _decode(model, prefetch, device: str = "cpu", mode: str = "static") -> tuple[list[torch.Tensor], object]:
    """Greedy decode of two prompts with `prefetch` set on the runner's static decoder: each step's logits (CPU) and the
    engine. `prefetch` is an object or a callable of the model that makes one."""
    return decode_logits(model, lambda decoder: setattr(decoder, "prefetch", prefetch(model) if callable(prefetch) else prefetch), device, mode)


def test_static_decode_calls_each_layer_at_both_points_and_joins_once_per_step(tiny_nvfp4) -> None:
    plain, _ = _decode(tiny_nvfp4, None)
    recorder = _Recorder()
    with_prefetch, _ = _decode(tiny_nvfp4, recorder)
    assert len(plain) == len(with_prefetch)
    for a, b in zip(plain, with_prefetch, strict=True):
        assert torch.equal(a, b)
    layers = len(tiny_nvfp4.layers)
    per_step = [(index, point) for index in range(layers) for point in ("mixer", "moe")]
    steps = len(recorder.calls) // len(per_step)
    assert steps >= 3 and recorder.calls == per_step * steps  # decode steps only (the prefill batches carry no prefetch)
    assert recorder.joins == steps


def test_tuning_key_is_validated_and_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(l2_prefetch, "POINT", None)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "l2_prefetch": "moe"}))
    tuning.apply_tuning(path)
    assert l2_prefetch.POINT == "moe"
    path.write_text(json.dumps({"device": "x", "l2_prefetch": "off"}))
    tuning.apply_tuning(path)
    assert l2_prefetch.POINT is None
    path.write_text(json.dumps({"device": "x", "l2_prefetch": "always"}))
    with pytest.raises(ValueError, match="l2_prefetch"):
        tuning.apply_tuning(path)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("point", ["mixer", "moe"])
def test_graph_decode_with_prefetch_gives_the_same_logits_on_cuda(point) -> None:
    model = build_preset("tiny", device=torch.device("cuda"), dtype=torch.bfloat16, seed=3, quantize="nvfp4")

    def run(prefetch_point):
        logits, engine = _decode(model, lambda m: l2_prefetch.for_model(m, prefetch_point), device="cuda", mode="graphs")
        decoder = engine.runner.decoder
        assert (decoder.prefetch is None) == (prefetch_point == "off")
        if decoder.prefetch is not None:
            assert decoder.prefetch.nbytes > 0 and len(decoder.prefetch.tables) == len(model.layers)
        assert decoder.captured_buckets, "the decode steps ran as graphs"
        return logits

    plain, prefetched = run("off"), run(point)
    assert len(plain) == len(prefetched)
    for a, b in zip(plain, prefetched, strict=True):
        assert torch.equal(a, b)
