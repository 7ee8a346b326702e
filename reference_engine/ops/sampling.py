"""Token sampling in plain torch: greedy, temperature, top-k, top-p, reproducible per-row seeds.

Semantics (contracts sampling/greedy and sampling/stochastic):
- temperature 0 -> argmax of the logits, ties to the lowest token id; top_k/top_p ignored.
- otherwise logits / temperature, then top-k (k <= 0 or k >= V: disabled), then top-p over the
  renormalised top-k distribution (p >= 1: disabled): the smallest prefix of tokens sorted by
  probability descending, ties lower id first, whose mass reaches top_p (at least one token).
- One uniform number per row comes from a counter-based hash of the row's seed (splitmix64 in
  int64 tensor arithmetic), so the same seed gives the same token on any batch composition and
  any device, with no generator state; the token is the inverse CDF of the filtered distribution.

Paths: the full vocabulary sorted (stable, descending); rows whose sampled rows all keep at most `TOP_K_SELECT_MAX`
tokens take one top-k selection over unique order keys instead (`_top_candidates`, same order as the sort); on CUDA
with `kernels.sampling_select.FUSED` that selection and the draw run in two Triton launches.
"""

from __future__ import annotations

import torch

from reference_engine.ops.registry import satisfies

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64 constants as signed int64
_MIX_1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX_2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right_logical(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniform_from_seeds(seeds: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in [0, 1 - 2^-24] per int64 seed (splitmix64; int64 products wrap)."""
    z = seeds.to(torch.int64) + _GOLDEN
    z = (z ^ _shift_right_logical(z, 30)) * _MIX_1
    z = (z ^ _shift_right_logical(z, 27)) * _MIX_2
    z = z ^ _shift_right_logical(z, 31)
    return _shift_right_logical(z, 40).to(torch.float64) * (2.0**-24)


TOP_K_SELECT_MAX = 1024  # rows filtered to at most this many tokens take `_top_candidates`, not a sort of the vocabulary


def _top_candidates(scaled: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` first tokens of each row of `scaled` [B, V] float32 in the order of a stable descending sort (value
    descending, ties lower id first), as (values [B, count], ids [B, count]), from one top-k selection over unique
    int64 keys: the float's bits mapped to an order-preserving integer in the high word (negative floats have their
    magnitude bits flipped; -0.0 is made +0.0 first, as the sort ties them), V - 1 - id in the low word."""
    vocab = scaled.shape[1]
    bits = (scaled + 0.0).view(torch.int32).to(torch.int64)  # sign-extended float32 bits
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # increasing with the float value
    ids = torch.arange(vocab, device=scaled.device, dtype=torch.int64)
    keys = ordered * (1 << 32) + (vocab - 1 - ids)[None, :]
    order = torch.topk(keys, count, dim=-1, largest=True, sorted=True).indices  # [B, count], distinct keys: no ties
    return scaled.gather(1, order), order


def _check(logits, temperature, top_k, top_p, seeds, out) -> None:
    def require(condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(message)

    require(logits.dim() == 2 and logits.shape[1] >= 1, f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    require(logits.is_floating_point(), f"logits must be floating, got {logits.dtype}")
    batch = logits.shape[0]
    for name, tensor, kinds in (
        ("temperature", temperature, (torch.float32, torch.float64)),
        ("top_k", top_k, (torch.int32, torch.int64)),
        ("top_p", top_p, (torch.float32, torch.float64)),
        ("seeds", seeds, (torch.int64,)),
        ("out", out, (torch.int64,)),
    ):
        require(tuple(tensor.shape) == (batch,), f"{name} must have shape ({batch},), got {tuple(tensor.shape)}")
        require(tensor.dtype in kinds, f"{name} must be {' or '.join(str(k) for k in kinds)}, got {tensor.dtype}")
        require(tensor.device == logits.device, f"{name} is on {tensor.device}, logits on {logits.device}")
    require(not bool((temperature < 0).any()) and not bool(torch.isnan(temperature).any()), "temperature must be >= 0 (0 means greedy)")
    require(bool(((top_p > 0) & (top_p <= 1)).all()), "top_p must lie in (0, 1] (1 disables it)")


@satisfies("sampling/greedy", major=1)
@satisfies("sampling/stochastic", major=1)
def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """out[b] = a token drawn from row b of logits [B, V] under its temperature/top_k/top_p, reproducible by seeds[b]."""
    _check(logits, temperature, top_k, top_p, seeds, out)
    vocab = logits.shape[1]
    all_greedy = bool((temperature == 0).all())
    filtered = bool((((top_k > 0) & (top_k < vocab)) | (top_p < 1)).any())
    return sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=all_greedy, filtered=filtered,
                                   candidates=top_k_bound(temperature.tolist(), top_k.tolist(), vocab))  # fmt: skip


def top_k_bound(temperatures: list[float], top_ks: list[int], vocab: int) -> int | None:
    """The largest top_k of the sampled rows (temperature > 0) when every one of them keeps 0 < top_k < vocab tokens,
    else None (some sampled row keeps the whole vocabulary, or no row samples)."""
    kept = [k for t, k in zip(temperatures, top_ks, strict=True) if t > 0]
    return max(kept) if kept and all(0 < k < vocab for k in kept) else None


def sample_tokens_unchecked(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor,
    *,
    all_greedy: bool,
    filtered: bool,
    candidates: int | None = None,
) -> torch.Tensor:
    """`sample_tokens` without its checks and host reads, for callers that know the rows' settings on the host (the
    engine's sampler): all_greedy, every temperature is 0; filtered, some row has 0 < top_k < V or top_p < 1;
    candidates (optional), every non-greedy row has 0 < top_k <= candidates. Queues device work only, so a decode step
    can be launched behind it before its tokens are read.

    With candidates at most `TOP_K_SELECT_MAX` (and below V), the rows' top-k come from one selection of that many
    tokens instead of a sort of the vocabulary (`_top_candidates`); the filtered distribution and its order are the
    same, so is the token (the softmax sums fewer terms, which may move a probability by a float32 rounding)."""
    vocab = logits.shape[1]
    logits32 = logits.float()
    if all_greedy:
        out.copy_(logits32.argmax(dim=-1))  # first maximum: ties go to the lowest id
        return out
    uniform = uniform_from_seeds(seeds)  # [B] float64
    select = filtered and candidates is not None and 0 < candidates <= min(TOP_K_SELECT_MAX, vocab - 1)
    if select and logits32.is_cuda:
        from reference_engine.kernels import sampling_select

        if sampling_select.FUSED and sampling_select.applies(logits32, candidates):  # two launches (the tuning file's `sampling_fused_select`)
            return sampling_select.select_and_draw(logits32.contiguous(), temperature, top_k, top_p, uniform, out, candidates)
    greedy = temperature == 0  # [B]
    greedy_tokens = logits32.argmax(dim=-1)  # first maximum: ties go to the lowest id
    safe_temperature = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits32 / safe_temperature[:, None]  # [B, V]
    k = top_k.long()
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    if not filtered:
        # no row filters: draw from the unsorted distribution (sorting the vocabulary is the slow part)
        cdf = torch.softmax(scaled, dim=-1).double().cumsum(dim=-1)  # [B, V]
        index = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).clamp(max=vocab - 1)
        out.copy_(torch.where(greedy, greedy_tokens, index.squeeze(1)))
        return out
    if select:
        sorted_logits, order = _top_candidates(scaled, candidates)  # [B, C]
        k = k.clamp(max=candidates)  # greedy rows may ask for more; their draw is not used
    else:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # ties: lower id first
    ranks = torch.arange(sorted_logits.shape[1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1).double()  # [B, V], sorted descending
    mass_before = probs.cumsum(dim=-1) - probs
    keep = (mass_before < top_p.double()[:, None]) | (top_p >= 1)[:, None]
    keep[:, 0] = True
    cdf = (probs * keep).cumsum(dim=-1)  # [B, V]
    target = uniform * cdf[:, -1]  # strictly below the total mass
    index = torch.searchsorted(cdf, target[:, None], right=True).clamp(max=cdf.shape[1] - 1)  # first index with cdf > target
    sampled = order.gather(1, index).squeeze(1)
    out.copy_(torch.where(greedy, greedy_tokens, sampled))
    return out
