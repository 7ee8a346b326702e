"""model/logits: the engine passes; a constant-logits model, a model with swapped layers, and wrong shapes fail."""

from __future__ import annotations

import contract_driver as driver
import pytest
import torch

from reference_engine.contract_entries.model import prompt_logits

CONTRACT = driver.load("model/logits")


def _swap_first_layers(config, state_dict, prompts):
    swapped = {}
    for name, tensor in state_dict.items():
        name = name.replace("layers.0.", "layers.X.").replace("layers.1.", "layers.0.").replace("layers.X.", "layers.1.")
        swapped[name] = tensor
    return prompt_logits(config, swapped, prompts)


def _constant(config, state_dict, prompts):  # while True: yield "a"
    return [torch.zeros(len(p), config["vocab_size"]).index_fill_(1, torch.tensor([1]), 5.0) for p in prompts]


def _missing_last_position(config, state_dict, prompts):
    return [logits[:-1] for logits in prompt_logits(config, state_dict, prompts)]


def _float32_reference(config, state_dict, prompts):  # the float64 reference rounded to float32 passes the float32 bounds
    return [logits.float() for logits in CONTRACT.module.reference(config, state_dict, prompts)]


@pytest.mark.parametrize("case", [c.name for c in CONTRACT.cpu_cases()])
def test_engine_passes(case):
    outcome = driver.run_case(CONTRACT, prompt_logits, CONTRACT.case(case))
    print(case, outcome.message)
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("impl", [_swap_first_layers, _constant, _missing_last_position])
@pytest.mark.parametrize("case", ["four-layers-f32", "four-layers-bf16"])
def test_known_wrong_models_fail(impl, case):
    outcome = driver.run_case(CONTRACT, impl, CONTRACT.case(case))
    assert outcome.status == "INCORRECT_NUMERICAL", (outcome.status, outcome.message)


def test_rounded_reference_passes():
    assert driver.run_case(CONTRACT, _float32_reference, CONTRACT.case("four-layers-f32")).status == "PASSED"
