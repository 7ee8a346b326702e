"""The top-k selection path of `ops.sampling` (rows filtered to few tokens skip the sort of the vocabulary) draws the
same tokens as the sort path, on logits full of exact ties (bfloat16-rounded, as a bfloat16 LM head gives them), with
banned (-inf) tokens, -0.0 beside +0.0, greedy rows and top-p. Known-wrong orders of the candidates are caught."""

from __future__ import annotations

import pytest
import torch

from reference_engine.ops import sampling
from reference_engine.sampler import Sampler, SamplingRow

VOCAB = 3000
RIGHT = sampling._top_candidates


def _logits(rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, VOCAB, generator=generator) * 2).to(torch.bfloat16).float()  # many exact ties
    logits[:, :40] = logits[:, :40].round()  # more ties near the top: whole numbers
    logits[0, 5:9] = torch.tensor([8.0, -0.0, 8.0, 0.0])  # ties at the very top, and the two zeros
    logits[1, 100:120] = float("-inf")  # a min_tokens ban
    logits[1, 120:126] = 9.0  # six tied best tokens: top_k 4 cuts inside them
    return logits


def _settings(rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed + 1)
    temperature = torch.rand(rows, generator=generator) * 1.5 + 0.1
    temperature[2] = 0.0  # a greedy row among sampled ones
    top_k = torch.randint(1, 60, (rows,), generator=generator, dtype=torch.int32)
    top_k[1] = 4
    top_p = torch.where(torch.rand(rows, generator=generator) < 0.5, torch.rand(rows, generator=generator) * 0.9 + 0.05, torch.ones(rows))
    return temperature, top_k, top_p


def _draw(logits, temperature, top_k, top_p, seeds, candidates) -> torch.Tensor:
    out = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=logits.device)
    return sampling.sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=False, filtered=True,
                                            candidates=candidates).clone()  # fmt: skip


def _agreement(seeds_per_row: int = 40, device: str = "cpu") -> tuple[int, int]:
    """(draws equal between the two paths, draws made) over several logit sets and seeds."""
    equal = total = 0
    for seed in range(4):
        temperature, top_k, top_p = _settings(16, seed)
        bound = sampling.top_k_bound(temperature.tolist(), top_k.tolist(), VOCAB)
        assert bound is not None and bound == int(top_k[temperature > 0].max())
        logits, temperature, top_k, top_p = (t.to(device) for t in (_logits(16, seed), temperature, top_k, top_p))
        for draw in range(seeds_per_row):
            seeds = torch.arange(16, dtype=torch.int64, device=device) * 1000 + draw
            by_sort = _draw(logits, temperature, top_k, top_p, seeds, None)
            by_selection = _draw(logits, temperature, top_k, top_p, seeds, bound)
            equal += int((by_sort == by_selection).sum())
            total += 16
    return equal, total


def test_selection_draws_the_tokens_the_sort_draws():
    equal, total = _agreement()
    assert equal == total == 4 * 40 * 16


@pytest.mark.cuda
def test_selection_draws_the_tokens_the_sort_draws_on_cuda():
    equal, total = _agreement(device="cuda")
    assert equal == total == 4 * 40 * 16


def _order_matches_the_sort(top_candidates) -> bool:
    logits = _logits(6, 9)
    values, ids = top_candidates(logits, VOCAB - 1)  # down to the zeros, mid-row
    expected_values, expected_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return torch.equal(ids, expected_ids[:, : VOCAB - 1]) and torch.equal(values, expected_values[:, : VOCAB - 1])


def test_top_candidates_order_is_the_stable_descending_sort():
    assert _order_matches_the_sort(sampling._top_candidates)
    _, ids = sampling._top_candidates(_logits(6, 9), 8)
    assert ids[0, :2].tolist() == [5, 7] and ids[1, :4].tolist() == [120, 121, 122, 123]


def _ties_high(scaled: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ties to the higher id."""
    values, ids = RIGHT(scaled.flip(1), count)
    return values, scaled.shape[1] - 1 - ids


def _ties_shuffled(scaled: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ties in any order (what a selection on the raw values may give)."""
    noise = torch.rand(scaled.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e-9
    order = torch.argsort(scaled.double() + noise, dim=-1, descending=True)[:, :count]
    return scaled.gather(1, order), order


def _zeros_apart(scaled: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-0.0 ranked below +0.0 (the keys without the -0.0 fix)."""
    bits = scaled.view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = ordered * (1 << 32) + (scaled.shape[1] - 1 - torch.arange(scaled.shape[1]))[None, :]
    order = torch.topk(keys, count, dim=-1).indices
    return scaled.gather(1, order), order


@pytest.mark.parametrize("wrong", [_ties_high, _ties_shuffled, _zeros_apart])
def test_known_wrong_candidate_orders_are_caught(monkeypatch, wrong):
    assert not _order_matches_the_sort(wrong)
    if wrong is not _zeros_apart:  # the two zeros lie far below any top-k: the order test alone shows it
        monkeypatch.setattr(sampling, "_top_candidates", wrong)
        equal, total = _agreement(seeds_per_row=10)
        assert equal < total


def test_engine_sampler_passes_the_bound_only_when_every_sampled_row_has_a_top_k(monkeypatch):
    seen = []
    original = sampling.sample_tokens_unchecked

    def recording(*args, **kwargs):
        seen.append(kwargs.get("candidates"))
        return original(*args, **kwargs)

    monkeypatch.setattr("reference_engine.sampler.sample_tokens_unchecked", recording)
    sampler = Sampler("cpu", 4)
    logits = _logits(3, 1)
    rows = [SamplingRow(0.7, 20, 0.8, 1), SamplingRow(0.0, 0, 1.0, 2), SamplingRow(1.0, 50, 1.0, 3)]
    sampler.launch(logits, rows)
    sampler.launch(logits, [*rows[:2], SamplingRow(1.0, 0, 0.9, 3)])  # a sampled row without top-k
    sampler.launch(logits[:1], [SamplingRow(0.0, 5, 1.0, 4)])  # greedy only
    assert seen == [50, None, None]
