"""The engine's entry for the model/logits contract: build the model from a config and a state dict, return prompt logits.

The prompts go through the real cache path: the first half of every prompt is prefilled in one
ragged batch, the rest is decoded one token per step for all sequences at once (paged decode, GDN
recurrent decode), so the gate covers both stages.
"""

from __future__ import annotations

import torch

from reference_engine.config import ModelConfig
from reference_engine.contract_entries.simple_driver import SimpleDriver
from reference_engine.model.build import build_model, params_from_state_dict
from reference_engine.ops.registry import satisfies


@satisfies("model/logits", major=1)
def prompt_logits(config: dict, state_dict: dict[str, torch.Tensor], prompts: list[list[int]]) -> list[torch.Tensor]:
    model_config = ModelConfig.from_hf(config)
    sample = state_dict["model.embed_tokens.weight"]
    model = build_model(model_config, params_from_state_dict(model_config, state_dict, sample.dtype, sample.device))
    driver = SimpleDriver(model, len(prompts), max(len(p) for p in prompts), block_size=4)
    split = [max(1, (len(p) + 1) // 2) for p in prompts]
    rows = [[logits] for logits in driver.step(list(range(len(prompts))), [p[:n] for p, n in zip(prompts, split)])]
    for position in range(max(len(p) for p in prompts)):
        active = [i for i, p in enumerate(prompts) if split[i] <= position < len(p)]
        if active:
            for i, logits in zip(active, driver.step(active, [[prompts[i][position]] for i in active])):
                rows[i].append(logits)
    return [torch.cat(parts) for parts in rows]
