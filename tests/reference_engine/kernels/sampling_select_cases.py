"""Tie-heavy sampling cases for `test_sampling_select.py`: the fused selection sampler against the torch selection path
(importable by the interpreter subprocess, which has this folder on its path)."""

import torch

from reference_engine.kernels import sampling_select
from reference_engine.ops import sampling


def case(vocab, rows, seed, device):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 2).to(torch.bfloat16).float()
    logits[:, :40] = logits[:, :40].round()  # whole numbers near the top: ties
    logits[0, 5:9] = torch.tensor([8.0, -0.0, 8.0, 0.0])
    logits[1, 100:120] = float("-inf")
    logits[1, 120:126] = 9.0  # six tied best tokens, top_k 4 cuts inside them
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.1
    temperature[2] = 0.0
    top_k = torch.randint(1, 30, (rows,), generator=g, dtype=torch.int32)
    top_k[1] = 4
    top_p = torch.where(torch.rand(rows, generator=g) < 0.5, torch.rand(rows, generator=g) * 0.9 + 0.05, torch.ones(rows))
    return [t.to(device) for t in (logits, temperature, top_k, top_p)]

def draws(device, vocab, rows, chunk, rounds, flip=False):
    equal = total = 0
    for seed in range(rounds):
        logits, temperature, top_k, top_p = case(vocab, rows, seed, device)
        bound = sampling.top_k_bound(temperature.tolist(), top_k.tolist(), vocab)
        seeds = torch.arange(rows, device=device) * 1000 + seed
        expected = torch.full((rows,), -1, dtype=torch.int64, device=device)
        sampling.sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, expected, all_greedy=False, filtered=True, candidates=bound)
        got = torch.full((rows,), -1, dtype=torch.int64, device=device)
        source = logits.flip(1).contiguous() if flip else logits
        sampling_select.select_and_draw(source, temperature, top_k, top_p, sampling.uniform_from_seeds(seeds), got, bound, chunk=chunk)
        if flip:
            got = vocab - 1 - got
        equal += int((got == expected).sum())
        total += rows
    return equal, total
