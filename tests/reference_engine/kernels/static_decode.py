"""Greedy decode of two tiny prompts through the engine with the runner's static decoder adjusted first (test helper)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.tokenizer import load_tokenizer


def decode_logits(model, configure: Callable[[object], None], device: str = "cpu", mode: str = "static") -> tuple[list[torch.Tensor], object]:
    """Each engine step's logits (on the CPU) and the engine. `configure(decoder)` runs on the runner's `StaticDecoder`
    before the first step, so before any graph is captured."""
    dtype = "float32" if model.dtype == torch.float32 else "bfloat16"
    config = EngineConfig(device=device, dtype=dtype, max_num_seqs=2, max_model_len=48, num_blocks=16)
    engine = LLMEngine(model, load_tokenizer("tiny"), config, decode_mode=mode)
    configure(engine.runner.decoder)
    generator = torch.Generator().manual_seed(5)
    for index in range(2):
        prompt = torch.randint(1, model.config.vocab_size, (7 + 3 * index,), generator=generator).tolist()
        engine.add_request(str(index), prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    logits = []
    while engine.has_unfinished():
        engine.step()
        logits.append(engine.runner.last_logits.detach().float().cpu().clone())
    return logits, engine
