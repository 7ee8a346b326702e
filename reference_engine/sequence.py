"""One request's integer state as it moves through the scheduler: tokens, progress, and how it ended."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from reference_engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """Mutable on purpose (it advances each step); only the scheduler and engine change it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    seed: int  # the request's seed, or one drawn from the engine's generator
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V and GDN state are already in the caches
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """Worst-case tokens this request can ever hold: its prompt plus every token it may generate."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        prompt_length = len(self.prompt_token_ids)
        return [self.prompt_token_ids[i] if i < prompt_length else self.output_token_ids[i - prompt_length] for i in range(start, end)]

    def stop_reason_after(self, token_id: int, eos_token_ids: tuple[int, ...]) -> str | None:
        """Why generation ends after `token_id` was appended: "stop", "length", or None to continue."""
        generated = len(self.output_token_ids)
        if generated >= self.params.min_tokens:
            if token_id in (self.params.stop_token_ids or ()):
                self.stop_reason = token_id
                return "stop"
            if not self.params.ignore_eos and token_id in eos_token_ids:
                self.stop_reason = token_id
                return "stop"
        if generated >= self.params.max_tokens:
            return "length"
        return None
