"""What `LLM.generate` returns: one `RequestOutput` per prompt, in input order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None  # None while the request still runs
    # Per generated token: token id -> log-probability for the top `SamplingParams.logprobs` tokens plus the sampled one,
    # from the model's own distribution (before temperature, top-k, top-p and min_tokens masking).
    logprobs: tuple[dict[int, float], ...] | None = None
    stop_reason: int | None = None  # the token id that stopped it, when finish_reason is "stop"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: list[CompletionOutput] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)
