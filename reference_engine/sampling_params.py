"""How to sample one request: a frozen dataclass checked at construction (clear ValueError, no silent clamping)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 -> greedy (argmax, ties to the lowest token id)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = -1  # tokens kept; -1 (or 0) disables the filter
    max_tokens: int = 16  # generated tokens at most
    min_tokens: int = 0  # end-of-sequence and stop tokens cannot be produced before this many
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] | None = None
    seed: int | None = None  # per-request seed: the same seed gives the same tokens
    logprobs: int | None = None  # return this many top log-probabilities per generated token (plus the sampled one)

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k not in (-1, 0)):
            raise ValueError(f"top_k must be a positive integer, or -1 to disable it, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.stop_token_ids is not None:
            ids = tuple(self.stop_token_ids)
            if not all(_is_int(i) and i >= 0 for i in ids):
                raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
            object.__setattr__(self, "stop_token_ids", ids)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**62):
            raise ValueError(f"seed must be an integer in [0, 2**62), got {self.seed!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs must be an integer >= 0 (how many top tokens), got {self.logprobs!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")  # noqa: TRY004 - one error type for bad params

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_or_disabled(self) -> int:
        """top_k as the sampling op reads it: 0 when disabled."""
        return 0 if self.top_k in (-1, 0) else self.top_k


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
