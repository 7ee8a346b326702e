"""The runner turns a scheduler plan into ForwardBatch tensors, copies blocks on copy-on-write, and samples the right rows."""

from __future__ import annotations

import torch

from reference_engine.config import EngineConfig
from reference_engine.presets import build_preset
from reference_engine.runner import ModelRunner
from reference_engine.sampler import Sampler, SamplingRow
from reference_engine.scheduler import ScheduledChunk, SchedulerOutput


def _runner() -> ModelRunner:
    model = build_preset("tiny", seed=0)
    config = EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, max_num_batched_tokens=16)
    return ModelRunner(model, config, num_blocks=20)


def _chunk(request_id, token_ids, start, table, slot, samples):
    slots = tuple(table[p // 4] * 4 + p % 4 for p in range(start, start + len(token_ids)))
    return ScheduledChunk(request_id, tuple(token_ids), start, tuple(table), slots, slot, samples)


def test_prepare_builds_the_batch():
    runner = _runner()
    plan = SchedulerOutput((
        _chunk("decode", [9], 6, [3, 7], 2, True),
        _chunk("first-chunk", [5, 6, 7, 8, 9], 0, [1, 4], 0, False),
        _chunk("last-chunk", [11, 12], 4, [0, 5], 1, True),
    ))
    batch = runner.prepare(plan)
    batch.validate()
    assert batch.input_ids.tolist() == [9, 5, 6, 7, 8, 9, 11, 12]
    assert batch.positions.tolist() == [6, 0, 1, 2, 3, 4, 4, 5]
    assert batch.cu_seqlens_q.tolist() == [0, 1, 6, 8]
    assert batch.seq_lens.tolist() == [7, 5, 6]
    assert batch.slot_mapping.tolist() == [7 * 4 + 2, 4, 5, 6, 7, 16, 20, 21]
    assert batch.block_tables.tolist() == [[3, 7], [1, 4], [0, 5]]
    assert batch.state_slots.tolist() == [2, 0, 1]
    assert batch.has_initial_state.tolist() == [True, False, True]
    assert batch.logits_indices.tolist() == [0, 7]  # only the rows that sample
    assert not batch.is_decode
    smaller = runner.prepare(SchedulerOutput((_chunk("decode", [4], 7, [3, 7], 2, True),)))
    assert smaller.input_ids.tolist() == [4] and smaller.is_decode and smaller.block_tables.tolist() == [[3, 7]]


def test_copy_blocks_copies_every_attention_layer():
    runner = _runner()
    caches = runner.caches
    generator = torch.Generator().manual_seed(0)
    for layer in caches.k_cache:
        caches.k_cache[layer].copy_(torch.randn(caches.k_cache[layer].shape, generator=generator))
        caches.v_cache[layer].copy_(torch.randn(caches.v_cache[layer].shape, generator=generator))
    before = {layer: (caches.k_cache[layer].clone(), caches.v_cache[layer].clone()) for layer in caches.k_cache}
    runner.copy_blocks(((2, 9), (4, 11)))
    for layer, (k_before, v_before) in before.items():
        assert torch.equal(caches.k_cache[layer][9], k_before[2]) and torch.equal(caches.v_cache[layer][11], v_before[4])
        untouched = [b for b in range(20) if b not in (9, 11)]
        assert torch.equal(caches.k_cache[layer][untouched], k_before[untouched])


def test_sampler_masks_banned_tokens_and_returns_logprobs():
    sampler = Sampler("cpu", max_num_seqs=3)
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(dim=-1).tolist()
    rows = [
        SamplingRow(0.0, 0, 1.0, seed=1),
        SamplingRow(0.0, 0, 1.0, seed=2, banned_token_ids=(best[1],), num_logprobs=2),
        SamplingRow(0.0, 0, 1.0, seed=3, num_logprobs=0),
    ]
    tokens, logprobs = sampler(logits, rows)
    assert tokens[0] == best[0] and tokens[2] == best[2]
    assert tokens[1] != best[1]  # masked, so the runner-up wins
    assert tokens[1] == logits[1].topk(2).indices[1].item()
    assert logprobs[0] is None
    assert set(logprobs[1]) == {best[1], tokens[1]}  # top-2 of the unmasked distribution, which holds the sampled token
    assert set(logprobs[2]) == {tokens[2]}
    expected = torch.log_softmax(logits[2], dim=-1)[tokens[2]].item()
    assert abs(logprobs[2][tokens[2]] - expected) < 1e-6


def test_use_triton_false_keeps_the_eager_forward_on_torch_ops(monkeypatch):
    """The accuracy gate's plain path (`use_triton=False`): every eager op of the forward, prefill included, is the
    torch op, even where a Triton choice was forced around it; the default runner leaves the choice alone."""
    from reference_engine.model import eager_ops

    seen = []
    for use_triton in (False, True):
        runner = ModelRunner(build_preset("tiny", seed=0), EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, max_num_batched_tokens=16),
                             num_blocks=20, decode_mode="eager", use_triton=use_triton)  # fmt: skip
        probe = torch.zeros(1)

        def recording(model, batch, caches, probe=probe):  # what the forward's ops would pick; random logits (no kernel runs)
            seen.append((eager_ops.triton_allowed(probe), eager_ops.eager_backend("rms_norm", probe)))
            return torch.randn(1, model.config.vocab_size)

        monkeypatch.setattr(type(runner.model), "forward", recording)
        plan = SchedulerOutput((_chunk("prefill", [5, 6, 7], 0, [1], 0, True),))
        with eager_ops.forced_backend("triton"):
            runner.execute(plan, [SamplingRow(0.0, 0, 1.0, seed=1)])
    assert seen == [(False, "torch"), (True, "triton")]
