"""Sampler graphs: which calls record and replay a graph (the key), and on CUDA that replays draw what the op draws
eagerly, call after call, with the logits buffer refilled and the rows' settings changed; a graph that reads stale
settings is caught."""

from __future__ import annotations

import pytest
import torch

from reference_engine import sampler as sampler_module
from reference_engine.sampler import SELECT_SIZES, Sampler, SamplingRow

VOCAB = 5000


def _keyed(device: str = "cpu") -> Sampler:
    sampler = Sampler(device, 8, graphs=True)
    sampler.use_graphs = True  # on the CPU too: graph_key only computes the key
    return sampler


def test_graph_key_picks_the_path_and_refuses_what_a_graph_cannot_take():
    sampler = _keyed()
    logits = torch.randn(3, VOCAB)
    greedy = SamplingRow(0.0, 0, 1.0, 1)

    def path(*rows):
        key = sampler.graph_key(logits[: len(rows)], list(rows))
        return None if key is None else key[3]

    assert path(greedy) is None  # greedy rows only: no sampling
    assert path(SamplingRow(0.7, 20, 0.8, 1), greedy) == ("select", 32)
    assert path(SamplingRow(0.7, 20, 0.8, 1), SamplingRow(1.0, 100, 1.0, 2)) == ("select", 128)
    assert path(SamplingRow(0.7, 700, 1.0, 1)) == ("select", SELECT_SIZES[-1])
    assert path(SamplingRow(0.7, 20, 0.8, 1), SamplingRow(1.0, 0, 0.9, 2)) == ("sort",)  # a sampled row without top-k
    assert path(SamplingRow(0.7, 2000, 1.0, 1)) == ("sort",)  # more candidates than a selection takes
    assert path(SamplingRow(0.7, 0, 1.0, 1)) == ("plain",)
    assert path(SamplingRow(0.7, 20, 0.8, 1, banned_token_ids=(3,))) is None  # bans: eager
    assert sampler.graph_key(torch.randn(8, sampler_module.GRAPH_MAX_ELEMENTS // 8 + 1), [SamplingRow(0.7, 20, 0.8, 1)] * 8) is None
    assert sampler.graph_key(logits.double(), [SamplingRow(0.7, 20, 0.8, 1)] * 3) is None
    assert Sampler("cpu", 8, graphs=True).graph_key(logits, [SamplingRow(0.7, 20, 0.8, 1)] * 3) is None  # CPU: never


def test_graph_key_stops_adding_keys_past_the_cap(monkeypatch):
    sampler = _keyed()
    monkeypatch.setattr(sampler_module, "MAX_GRAPHS", 2)
    logits = torch.randn(3, VOCAB)
    rows = [SamplingRow(0.7, 20, 0.8, 1)]
    first, second = sampler.graph_key(logits[:1], rows), sampler.graph_key(logits[:2], rows * 2)
    sampler.graphs.update({first: object(), second: object()})
    assert sampler.graph_key(logits[:1], rows) == first  # recorded keys still replay
    assert sampler.graph_key(logits[:3], rows * 3) is None


def _rows(step: int, count: int) -> list[SamplingRow]:
    settings = [(0.7, 20, 0.8), (1.0, 50, 1.0), (0.0, 0, 1.0), (1.3, 5, 0.5), (0.9, 100, 0.95)]
    return [SamplingRow(*settings[(step + i) % len(settings)], seed=1000 * i + step) for i in range(count)]


def _compare(graphed: Sampler, eager: Sampler, steps: int = 30) -> tuple[int, int]:
    """(steps whose tokens agree, steps) with the static logits buffer refilled every step."""
    buffer = torch.empty(8, VOCAB, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    agree = 0
    for step in range(steps):
        count = 1 + step % 4
        buffer.copy_((torch.randn(8, VOCAB, device="cuda", generator=generator) * 3).to(torch.bfloat16).float())
        rows = _rows(step, count)
        got = graphed.launch(buffer[:count], rows, static=True).clone()
        expected = eager.launch(buffer[:count], rows).clone()
        agree += bool(torch.equal(got, expected))
    return agree, steps


@pytest.mark.cuda
def test_replays_draw_what_the_eager_op_draws():
    graphed = Sampler("cuda", 8, graphs=True)
    agree, steps = _compare(graphed, Sampler("cuda", 8))
    assert agree == steps
    assert 1 <= len(graphed.graphs) <= 8 and graphed.replays >= 10


@pytest.mark.cuda
def test_a_graph_reading_stale_settings_is_caught():
    graphed = Sampler("cuda", 8, graphs=True)
    original = Sampler._graph_launch

    def stale(self, logits, rows, key):  # after the first recording, settings go to buffers no graph reads
        result = original(self, logits, rows, key)
        if self.graphs and not getattr(self, "moved", False):
            self._ints, self._floats, self.moved = self._ints.clone(), self._floats.clone(), True
        return result

    graphed._graph_launch = stale.__get__(graphed)
    agree, steps = _compare(graphed, Sampler("cuda", 8))
    assert agree < steps
