"""Padded prefill (`prefill_graphs.py`): a fresh prompt padded to its bucket must leave exactly what the plain
prefill leaves: the same last-row logits, the same Gated DeltaNet conv and recurrent states, the same K/V in
the prompt's cache slots, and then the same greedy tokens.

On the CPU the padded forward runs eagerly ("static" mode, float32 torch ops); the CUDA test replays the
captured graphs against the eager Triton prefill. A batch whose padding is not masked (no `valid_tokens`)
is a known-wrong variant: its states must differ.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference_engine import prefill_graphs
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.presets import build_preset
from reference_engine.sampling_params import SamplingParams
from reference_engine.tokenizer import load_tokenizer

BUCKET = 32


def _engine(model, padded: bool, device: str = "cpu") -> LLMEngine:
    config = EngineConfig(device=device, dtype=str(model.dtype).removeprefix("torch."), max_num_seqs=2, max_model_len=160, num_blocks=24,
                          max_num_batched_tokens=128)  # fmt: skip
    if device == "cpu":
        return LLMEngine(model, load_tokenizer("tiny"), config, decode_mode="static" if padded else "eager", prefill_graphs=padded)
    return LLMEngine(model, load_tokenizer("tiny"), config, decode_mode="graphs", prefill_graphs=padded)


def _prompt(length: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prefill_and_states(engine: LLMEngine, prompt: list[int], steps: int = 3):
    engine.add_request(request_id="r", prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    engine.step()  # the prefill
    runner = engine.runner
    logits = runner.last_logits[-1].double().cpu()
    scheduler = engine.scheduler
    slot, blocks = scheduler.slot_pool.slot("r"), list(scheduler.block_manager.block_table("r"))
    caches = runner.caches
    conv = {layer: state[slot].double().cpu().clone() for layer, state in caches.conv_state.items()}
    recurrent = {layer: state[slot].double().cpu().clone() for layer, state in caches.recurrent_state.items()}
    kv = {}
    for layer in caches.k_cache:
        keys = caches.k_cache[layer][blocks].flatten(0, 1)[: len(prompt)]
        values = caches.v_cache[layer][blocks].flatten(0, 1)[: len(prompt)]
        kv[layer] = (keys.double().cpu().clone(), values.double().cpu().clone())
    tokens = []
    while engine.has_unfinished():
        for output in engine.step():
            tokens = list(output.outputs[0].token_ids)
    return logits, conv, recurrent, kv, tokens


def _max_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for key, value in a.items():
        left, right = (value, b[key]) if not isinstance(value, tuple) else (torch.cat(value), torch.cat(b[key]))
        worst = max(worst, float((left - right).abs().max()))
    return worst


@pytest.fixture(scope="module")
def model():
    return build_preset("tiny", seed=3)


@pytest.mark.parametrize("length", [1, 3, 20, 32, 45])
def test_padded_prefill_matches_the_plain_prefill(model, length, monkeypatch) -> None:
    monkeypatch.setattr(prefill_graphs, "BUCKET_TOKENS", BUCKET)
    prompt = _prompt(length, length, model.config.vocab_size)
    plain = _prefill_and_states(_engine(model, padded=False), prompt)
    padded_engine = _engine(model, padded=True)
    padded_engine.runner.prefill_graphs.bucket_tokens = BUCKET
    padded = _prefill_and_states(padded_engine, prompt)
    assert float((plain[0] - padded[0]).abs().max()) < 1e-4
    assert _max_difference(plain[1], padded[1]) < 1e-5  # conv states: the last K-1 prompt inputs
    assert _max_difference(plain[2], padded[2]) < 1e-4  # recurrent states
    assert _max_difference(plain[3], padded[3]) < 1e-5  # K/V of the prompt's positions
    assert plain[4] == padded[4] and len(plain[4]) == 3


def test_unmasked_padding_is_caught(model, monkeypatch) -> None:
    """Known-wrong: padding rows treated as prompt tokens (no valid_tokens) change the GDN states."""
    original = prefill_graphs.PrefillGraphs.batch

    def unmasked(self, bucket):
        return dataclasses.replace(original(self, bucket), valid_tokens=None)

    monkeypatch.setattr(prefill_graphs.PrefillGraphs, "batch", unmasked)
    prompt = _prompt(20, 7, model.config.vocab_size)
    plain = _prefill_and_states(_engine(model, padded=False), prompt)
    engine = _engine(model, padded=True)
    engine.runner.prefill_graphs.bucket_tokens = BUCKET
    padded = _prefill_and_states(engine, prompt)
    assert _max_difference(plain[1], padded[1]) > 1e-3 and _max_difference(plain[2], padded[2]) > 1e-3
    assert float((plain[0] - padded[0]).abs().max()) < 1e-4  # the prompt's own logits cannot see the padding


def test_which_plans_take_the_padded_path(model) -> None:
    engine = _engine(model, padded=True)
    graphs = engine.runner.prefill_graphs
    assert graphs.max_tokens == 128 and prefill_graphs.prefill_bucket(129, 128) == 256 and prefill_graphs.prefill_bucket(128, 128) == 128
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.add_request(prompt_token_ids=_prompt(10, 1, model.config.vocab_size), params=params)
    engine.add_request(prompt_token_ids=_prompt(12, 2, model.config.vocab_size), params=params)
    plan = engine.scheduler.schedule()
    assert len(plan.chunks) == 2 and not graphs.accepts(plan)  # two prompts in one step: eager
    one = dataclasses.replace(plan, chunks=plan.chunks[:1])
    assert graphs.accepts(one)
    assert not graphs.accepts(dataclasses.replace(one, block_copies=((0, 1),)))
    later = dataclasses.replace(one, chunks=(dataclasses.replace(one.chunks[0], start=4),))
    assert not graphs.accepts(later)  # a cached prefix: eager
    with pytest.raises(ValueError, match="at least one token"):
        prefill_graphs.prefill_bucket(0)


def test_prefill_graphs_need_a_static_decoder(model) -> None:
    config = EngineConfig(max_num_seqs=1, max_model_len=64, num_blocks=8)
    with pytest.raises(ValueError, match="prefill_graphs needs decode_mode"):
        LLMEngine(model, load_tokenizer("tiny"), config, decode_mode="eager", prefill_graphs=True)


@pytest.mark.cuda
@pytest.mark.parametrize("length", [7, 64, 100])
def test_graph_prefill_matches_the_eager_prefill_on_cuda(length) -> None:
    cuda_model = build_preset("tiny", device="cuda", dtype=torch.bfloat16, seed=3, quantize="nvfp4")
    prompt = _prompt(length, length, cuda_model.config.vocab_size)
    results = []
    for padded in (False, True):
        engine = _engine(cuda_model, padded=padded, device="cuda")
        if padded:
            engine.runner.prefill_graphs.bucket_tokens = BUCKET
            _prefill_and_states(engine, _prompt(length, 99, cuda_model.config.vocab_size))  # first use: eager run, then capture
            assert engine.runner.prefill_graphs.captured_buckets, engine.runner.prefill_graphs.capture_error
        results.append(_prefill_and_states(engine, prompt))  # padded: a replay
    eager, graph = results
    scale = float(eager[0].abs().max())
    assert float((eager[0] - graph[0]).abs().max()) < 0.05 * scale
    assert _max_difference(eager[2], graph[2]) < 0.05 * max(float(t.abs().max()) for t in eager[2].values())
    assert eager[4][:1] == graph[4][:1]


def test_a_repeated_forward_reads_no_metadata_from_the_device(model) -> None:
    """A graph capture may not read device tensors to the host: the capture repeats the warm-up forward in one
    `one_forward` scope, so every host read of batch metadata must hit the values the warm-up read (a fresh
    view per call would miss and sync mid-capture)."""
    from reference_engine.ops import host_values

    engine = _engine(model, padded=True)
    graphs = engine.runner.prefill_graphs
    graphs.bucket_tokens = BUCKET
    engine.add_request(prompt_token_ids=_prompt(20, 5, model.config.vocab_size), params=SamplingParams(temperature=0, max_tokens=1))
    bucket = graphs.fill(engine.scheduler.schedule())
    with torch.inference_mode(), host_values.one_forward():
        graphs._forward(bucket)
        read = dict(host_values._SCOPE.get())
        graphs._forward(bucket)
        assert read and host_values._SCOPE.get().keys() == read.keys()
