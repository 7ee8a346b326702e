"""The engine's logits equal transformers' Qwen3_5MoeForCausalLM (same tiny random weights, float32).

Metric: for every position, max|engine - hf| / max|hf| over the vocabulary; the worst position must
be below 1e-4. Scenarios: prefill, token-by-token decode through the paged cache, a batch of
unequal prompts, chunked prefill with states carried across chunks, and a mixed step. A model with
one wrong detail must fail the same metric (the check can fail).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hf_oracle import build_hf_model, hf_logits, max_rel_error_per_position

from reference_engine.contract_entries.simple_driver import SimpleDriver
from reference_engine.presets import TINY, build_preset, preset_state_dict

BOUND = 1e-4
SEED = 3


@pytest.fixture(scope="module")
def engine_model():
    return build_preset("tiny", seed=SEED)


@pytest.fixture(scope="module")
def hf_model():
    return build_hf_model(TINY.to_hf(), preset_state_dict("tiny", seed=SEED))


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY.vocab_size, (n,), generator=generator).tolist() for n in lengths]


def test_prefill_one_prompt(engine_model, hf_model):
    (prompt,) = _prompts([19], seed=1)
    logits = SimpleDriver(engine_model, 1, 32).step([0], [prompt])[0]
    error = max_rel_error_per_position(logits, hf_logits(hf_model, prompt))
    print(f"prefill max rel error {error:.2e}")
    assert error < BOUND


def test_decode_token_by_token(engine_model, hf_model):
    (prompt,) = _prompts([14], seed=2)
    driver = SimpleDriver(engine_model, 1, 32)
    rows = [driver.step([0], [prompt[:4]])[0]]
    for token in prompt[4:]:
        rows.append(driver.step([0], [[token]])[0])
    error = max_rel_error_per_position(torch.cat(rows), hf_logits(hf_model, prompt))
    print(f"decode max rel error {error:.2e}")
    assert error < BOUND


def test_batch_of_unequal_prompts_then_batched_decode(engine_model, hf_model):
    prompts = _prompts([3, 11, 7], seed=3)
    extra = _prompts([4, 4, 4], seed=4)
    driver = SimpleDriver(engine_model, 4, 32)
    seq_ids = [2, 0, 3]  # not in order, and sequence 1 unused
    outputs = driver.step(seq_ids, prompts)
    decoded = [[] for _ in prompts]
    for step in range(4):
        for i, row in enumerate(driver.step(seq_ids, [[extra[i][step]] for i in range(3)])):
            decoded[i].append(row)
    worst = 0.0
    for i, prompt in enumerate(prompts):
        full = prompt + extra[i]
        engine = torch.cat([outputs[i], *decoded[i]])
        worst = max(worst, max_rel_error_per_position(engine, hf_logits(hf_model, full)))
    print(f"batch max rel error {worst:.2e}")
    assert worst < BOUND


def test_chunked_prefill_carries_states(engine_model, hf_model):
    (prompt,) = _prompts([23], seed=5)
    driver = SimpleDriver(engine_model, 2, 32)
    chunks = [driver.step([1], [prompt[start : start + 5]])[0] for start in range(0, len(prompt), 5)]
    error = max_rel_error_per_position(torch.cat(chunks), hf_logits(hf_model, prompt))
    print(f"chunked prefill max rel error {error:.2e}")
    assert error < BOUND


def test_mixed_step_decode_with_prefill_chunk(engine_model, hf_model):
    first, second = _prompts([9, 12], seed=6)
    driver = SimpleDriver(engine_model, 2, 32)
    a0 = driver.step([0], [first[:8]])[0]
    # One step holding a decode token of sequence 0 and the first chunk of sequence 1 (not is_decode).
    a1, b0 = driver.step([0, 1], [[first[8]], second[:6]])
    b1 = driver.step([1], [second[6:]])[0]
    error = max(
        max_rel_error_per_position(torch.cat([a0, a1]), hf_logits(hf_model, first)),
        max_rel_error_per_position(torch.cat([b0, b1]), hf_logits(hf_model, second)),
    )
    print(f"mixed step max rel error {error:.2e}")
    assert error < BOUND


def test_last_token_logits_only(engine_model, hf_model):
    prompts = _prompts([5, 8], seed=7)
    outputs = SimpleDriver(engine_model, 2, 32).step([0, 1], prompts, all_logits=False)
    for prompt, logits in zip(prompts, outputs):
        assert logits.shape == (1, TINY.vocab_size) and logits.dtype == torch.float32
        assert max_rel_error_per_position(logits, hf_logits(hf_model, prompt)[-1:]) < BOUND


@pytest.mark.parametrize("defect", ["swapped_layers", "rope_theta", "top_k"])
def test_metric_catches_a_wrong_model(engine_model, hf_model, defect):
    if defect == "swapped_layers":
        layers = list(engine_model.layers)
        layers[0], layers[1] = layers[1], layers[0]
        wrong = dataclasses.replace(engine_model, layers=tuple(layers))
    elif defect == "rope_theta":
        layer = engine_model.layers[3]
        mixer = dataclasses.replace(layer.mixer, rope_theta=1e4)
        wrong = dataclasses.replace(engine_model, layers=(*engine_model.layers[:3], dataclasses.replace(layer, mixer=mixer)))
    else:
        layers = tuple(dataclasses.replace(layer, mlp=dataclasses.replace(layer.mlp, top_k=3)) for layer in engine_model.layers)
        wrong = dataclasses.replace(engine_model, layers=layers)
    (prompt,) = _prompts([12], seed=8)
    logits = SimpleDriver(wrong, 1, 32).step([0], [prompt])[0]
    assert max_rel_error_per_position(logits, hf_logits(hf_model, prompt)) > 100 * BOUND
