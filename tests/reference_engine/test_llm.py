"""End to end on the tiny preset: greedy equals transformers, batching changes nothing, seeds reproduce, pools drain."""

from __future__ import annotations

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.presets import preset_config, preset_state_dict

PROMPTS = [
    "The capital of France is",
    "Hello",
    "Once upon a time there was a small model that wanted to answer every question",
]
NUM_TOKENS = 5
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="tiny", max_num_seqs=4, max_num_batched_tokens=7, max_model_len=128, seed=0)


@pytest.fixture(scope="module")
def batched(llm):
    """The prompts generated together: unequal lengths, 7-token steps, so prefills are chunked and mixed with decodes."""
    return llm.generate(PROMPTS, GREEDY, use_tqdm=False)


def hf_greedy_agrees(prompt_ids: tuple[int, ...], generated: tuple[int, ...]) -> list[int]:
    """Teacher-forced transformers pass over prompt + generated: its argmax at each step must be the next generated token.

    Equal to running transformers' greedy generation (each generated token is its argmax given the same prefix),
    in one forward pass per prompt. Returns transformers' greedy choices.
    """
    from hf_oracle import hf_logits

    model = _hf_model()
    logits = hf_logits(model, list(prompt_ids) + list(generated[:-1]))  # [P + N - 1, V]
    return logits[len(prompt_ids) - 1 :].argmax(dim=-1).tolist()


_HF: list = []


def _hf_model():
    from hf_oracle import build_hf_model

    if not _HF:
        _HF.append(build_hf_model(preset_config("tiny").to_hf(), preset_state_dict("tiny", seed=0), torch.float32))
    return _HF[0]


def _tokens(outputs) -> list[tuple[int, ...]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_batched_chunked_greedy_equals_transformers(llm, batched):
    assert [o.prompt for o in batched] == PROMPTS  # input order
    assert all(o.outputs[0].finish_reason == "length" and len(o.outputs[0].token_ids) == NUM_TOKENS for o in batched)
    for output in batched:
        assert list(output.outputs[0].token_ids) == hf_greedy_agrees(output.prompt_token_ids, output.outputs[0].token_ids)
    assert len(set(_tokens(batched))) > 1  # the prompts matter
    _assert_pools_full(llm)


def test_batched_equals_each_prompt_alone(llm, batched):
    alone = [llm.generate(prompt, GREEDY, use_tqdm=False)[0] for prompt in PROMPTS]
    assert _tokens(batched) == _tokens(alone)


def test_greedy_is_deterministic_across_engines(batched):
    """A second engine with other block size, budget and batch limit gives the same tokens and text."""
    other = LLM(model="tiny", max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128, block_size=4, seed=0)
    second = other.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert _tokens(batched) == _tokens(second)
    assert [o.outputs[0].text for o in batched] == [o.outputs[0].text for o in second]


def test_seeded_sampling_reproduces_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=5, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], seeded, use_tqdm=False)
    mixed = llm.generate(PROMPTS, [seeded, GREEDY, seeded], use_tqdm=False)
    assert _tokens(alone)[0] == _tokens(mixed)[0]
    assert _tokens(mixed)[0] != _tokens(mixed)[1]
    other_seeds = [SamplingParams(temperature=1.0, max_tokens=5, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    assert len(set(_tokens(llm.generate([PROMPTS[0]] * 3, other_seeds, use_tqdm=False)))) > 1


def test_unseeded_sampling_follows_the_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    engines = [LLM(model="tiny", max_model_len=64, seed=0) for _ in range(2)]
    first, second = (engine.generate(PROMPTS[:2], params, use_tqdm=False) for engine in engines)
    assert _tokens(first) == _tokens(second)  # the engine seed decides unseeded requests' seeds
    assert _tokens(engines[0].generate(PROMPTS[:2], params, use_tqdm=False)) != _tokens(first)  # fresh draws


def test_stop_token_max_tokens_and_min_tokens(llm, batched):
    greedy = _tokens(batched)[0]
    stop_at = greedy[2]
    if stop_at in greedy[:2]:
        pytest.skip("the greedy continuation repeats its third token early")
    stopped = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=NUM_TOKENS, stop_token_ids=[stop_at]), use_tqdm=False)[0]
    assert stopped.outputs[0].token_ids == greedy[:3] and stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].stop_reason == stop_at
    first = greedy[0]
    delayed = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3, min_tokens=2, stop_token_ids=[first]), use_tqdm=False)[0]
    assert delayed.outputs[0].token_ids[0] != first  # masked until min_tokens tokens exist
    assert len(delayed.outputs[0].token_ids) >= 2


def test_eos_stops_unless_ignored(llm, batched):
    """Treat the second greedy token as end-of-sequence: generation stops there, unless ignore_eos."""
    greedy = _tokens(batched)[1]
    if greedy[1] == greedy[0]:
        pytest.skip("the greedy continuation repeats its first token")
    saved = llm.engine.eos_token_ids
    llm.engine.eos_token_ids = (greedy[1],)
    try:
        stopped, ignored = llm.generate([PROMPTS[1]] * 2, [SamplingParams(temperature=0, max_tokens=4), GREEDY], use_tqdm=False)
    finally:
        llm.engine.eos_token_ids = saved
    assert stopped.outputs[0].token_ids == greedy[:2] and stopped.outputs[0].finish_reason == "stop"
    assert ignored.outputs[0].token_ids == greedy and ignored.outputs[0].finish_reason == "length"


def test_logprobs_hold_top_k_and_the_sampled_token(llm):
    output = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=3, logprobs=3, ignore_eos=True), use_tqdm=False)[0]
    completion = output.outputs[0]
    assert len(completion.logprobs) == 3
    for token, entry in zip(completion.token_ids, completion.logprobs):
        assert token in entry and 3 <= len(entry) <= 4
        assert all(value <= 0 for value in entry.values())
        assert entry[token] == max(entry.values())  # greedy picks the most likely token
        assert 0.0 < sum(torch.tensor(list(entry.values())).exp().tolist()) <= 1.0 + 1e-5
    assert llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].outputs[0].logprobs is None


def test_abort_returns_every_block_and_slot(llm):
    engine = llm.engine
    ids = [engine.add_request(prompt=p, params=SamplingParams(temperature=0, max_tokens=20)) for p in PROMPTS]
    for _ in range(2):
        engine.step()
    assert engine.scheduler.block_manager.num_free_blocks < engine.scheduler.block_manager.num_blocks
    results = [engine.abort(request_id) for request_id in ids]
    assert all(result.outputs[0].finish_reason == "abort" for result in results)
    assert not engine.has_unfinished()
    _assert_pools_full(llm)


def test_request_that_can_never_fit_raises(llm):
    with pytest.raises(ValueError, match="can never fit.*max_model_len=128"):
        llm.generate(prompt_token_ids=[5] * 120, sampling_params=SamplingParams(max_tokens=16), use_tqdm=False)
    with pytest.raises(ValueError, match="can never fit.*KV blocks"):
        LLM(model="tiny", max_model_len=256, num_blocks=2, block_size=16).generate(
            prompt_token_ids=[5] * 40, sampling_params=SamplingParams(max_tokens=1), use_tqdm=False
        )
    with pytest.raises(ValueError, match="token ids must lie in"):
        llm.generate(prompt_token_ids=[512], use_tqdm=False)
    _assert_pools_full(llm)
    assert not llm.engine.has_unfinished()


def test_bad_arguments_raise_clearly():
    with pytest.raises(ValueError, match="neither a preset"):
        LLM(model="no-such-model-dir")
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-3)
    for bad in ({"max_tokens": True}, {"max_tokens": 0}, {"logprobs": -1}, {"seed": -1}, {"stop_token_ids": [1, -2]},
                {"temperature": float("nan")}, {"ignore_eos": "yes"}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(top_k=-1).top_k_or_disabled == 0 and SamplingParams(top_k=5).top_k_or_disabled == 5
    with pytest.raises(ValueError, match="prompts or prompt_token_ids, not both"):
        LLM.__new__(LLM)._requests(["a"], None, [1])


def test_stream_pieces_add_up_to_generate(llm, batched):
    pieces = list(llm.stream(PROMPTS[2], GREEDY))
    assert len(pieces) >= 2
    assert "".join(pieces) == batched[2].outputs[0].text
    _assert_pools_full(llm)


def _assert_pools_full(llm):
    scheduler = llm.engine.scheduler
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    assert scheduler.slot_pool.num_free_slots == scheduler.slot_pool.num_slots
