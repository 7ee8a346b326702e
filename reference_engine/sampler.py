"""Per-row sampling settings as device tensors, the sampling op, and log-probabilities when asked.

Each sampled row carries its request's settings. The seed of a row is the request's seed plus the
number of tokens it has generated so far, so a seeded request draws the same tokens whatever else
shares its batch. Rows below `min_tokens` get their stop tokens masked to -inf first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.ops.sampling import sample_tokens_unchecked, top_k_bound


@dataclass(frozen=True)
class SamplingRow:
    temperature: float  # 0: greedy
    top_k: int  # 0: disabled
    top_p: float
    seed: int  # request seed + step
    banned_token_ids: tuple[int, ...] = ()  # stop tokens not allowed yet (min_tokens)
    num_logprobs: int | None = None


class Sampler:
    def __init__(self, device: torch.device | str, max_num_seqs: int) -> None:
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs
        self._out = torch.empty(max_num_seqs, dtype=torch.int64, device=self.device)  # [S]

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[list[int], list[dict[int, float] | None]]:
        """logits [S, V] float32, one row per entry of `rows`; returns the token ids and per-row logprobs (or None)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [{len(rows)}, vocab], got {list(logits.shape)}")
        if not rows:
            return [], []
        tokens = self.launch(logits, rows).tolist()
        return tokens, self._logprobs(logits.float(), rows, tokens)

    def launch(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Queue the sampling of `rows` without a host read: [S] int64 tokens on the device, a view of a buffer the next
        call overwrites. The rows' settings decide the path on the host (SamplingParams has checked them)."""
        num_rows = len(rows)
        if logits.dim() != 2 or logits.shape[0] != num_rows or num_rows == 0:
            raise ValueError(f"logits must be [{num_rows}, vocab] with at least one row, got {list(logits.shape)}")
        if num_rows > self.max_num_seqs:
            raise ValueError(f"{num_rows} rows to sample, the sampler was sized for {self.max_num_seqs}")
        logits = logits.float()
        vocab = logits.shape[1]
        banned = [(i, t) for i, row in enumerate(rows) for t in row.banned_token_ids if t < logits.shape[1]]
        if banned:
            logits = logits.clone()
            index = torch.tensor(banned, dtype=torch.int64, device=logits.device)  # [N, 2]
            logits[index[:, 0], index[:, 1]] = float("-inf")
        temperature = torch.tensor([row.temperature for row in rows], dtype=torch.float32)  # [S], on the host first:
        top_k = torch.tensor([row.top_k for row in rows], dtype=torch.int32)  # the path is decided from these
        top_p = torch.tensor([row.top_p for row in rows], dtype=torch.float32)  # exactly as sample_tokens decides it
        seeds = torch.tensor([row.seed for row in rows], dtype=torch.int64)  # on the device, with no device read
        all_greedy = bool((temperature == 0).all())
        filtered = bool((((top_k > 0) & (top_k < vocab)) | (top_p < 1)).any())
        candidates = top_k_bound([row.temperature for row in rows], [row.top_k for row in rows], vocab)
        out = self._out[:num_rows]
        if self.device.type == "cuda":  # a copy from pageable memory would wait for the stream (torch syncs it); pinned
            # blocks from torch's caching host allocator are not reused before their copy has run
            temperature, top_k, top_p, seeds = (t.pin_memory().to(self.device, non_blocking=True) for t in (temperature, top_k, top_p, seeds))
        return sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=all_greedy, filtered=filtered,
                                       candidates=candidates)

    @staticmethod
    def _logprobs(logits: torch.Tensor, rows: list[SamplingRow], tokens: list[int]) -> list[dict[int, float] | None]:
        wanted = [i for i, row in enumerate(rows) if row.num_logprobs is not None]
        result: list[dict[int, float] | None] = [None] * len(rows)
        if not wanted:
            return result
        log_probs = torch.log_softmax(logits[wanted], dim=-1)  # [W, V] of the model's own distribution
        largest = max(rows[i].num_logprobs for i in wanted)
        values, ids = log_probs.topk(min(largest, log_probs.shape[1]), dim=-1) if largest else (None, None)
        for position, row_index in enumerate(wanted):
            count = rows[row_index].num_logprobs
            entry: dict[int, float] = {}
            if count:
                entry = dict(zip(ids[position, :count].tolist(), values[position, :count].tolist()))
            token = tokens[row_index]
            entry[token] = float(log_probs[position, token])
            result[row_index] = entry
        return result
