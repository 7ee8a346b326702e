"""Scheduler: budgets, decode-first order, chunked prefill, admission by worst case, aborts, and no leaks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.sampling_params import SamplingParams
from reference_engine.scheduler import Scheduler
from reference_engine.sequence import Sequence, SequenceStatus


def _seq(request_id: str, prompt_length: int, max_tokens: int = 4) -> Sequence:
    return Sequence(request_id, tuple(range(3, 3 + prompt_length)), SamplingParams(max_tokens=max_tokens), seed=0)


def _step(scheduler: Scheduler, next_token: int = 7) -> list:
    output = scheduler.schedule()
    scheduler.commit(output)
    for chunk in output.chunks:
        if chunk.samples:
            seq = scheduler.get(chunk.request_id)
            seq.output_token_ids.append(next_token)
            reason = seq.stop_reason_after(next_token, eos_token_ids=())
            if reason:
                scheduler.finish(seq, reason)
    return list(output.chunks)


def test_chunked_prefill_then_decode_first():
    scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, num_blocks=32, block_size=4)
    scheduler.add(_seq("long", 13))
    first = _step(scheduler)
    assert [(c.request_id, c.start, len(c.token_ids), c.samples) for c in first] == [("long", 0, 8, False)]
    assert first[0].slot_mapping == tuple(scheduler.block_manager.slot_mapping("long", 0, 8))
    scheduler.add(_seq("short", 3))
    second = _step(scheduler)  # the rest of "long" (5 tokens), then 3 of "short"
    assert [(c.request_id, c.start, len(c.token_ids), c.samples) for c in second] == [("long", 8, 5, True), ("short", 0, 3, True)]
    assert second[0].has_initial_state and not second[1].has_initial_state
    third = scheduler.schedule()
    assert [(c.request_id, len(c.token_ids)) for c in third.chunks] == [("long", 1), ("short", 1)] and third.is_decode
    assert third.chunks[0].token_ids == (7,)


def test_decodes_come_before_new_prefills_and_budget_holds():
    scheduler = Scheduler(max_num_seqs=8, max_num_batched_tokens=6, max_model_len=64, num_blocks=64, block_size=4)
    for i in range(3):
        scheduler.add(_seq(f"r{i}", 2, max_tokens=6))
    _step(scheduler)  # r0, r1, r2 prefill (6 tokens)
    scheduler.add(_seq("late", 10))
    chunks = _step(scheduler)
    assert [c.request_id for c in chunks] == ["r0", "r1", "r2", "late"]
    assert [len(c.token_ids) for c in chunks] == [1, 1, 1, 3]


def test_waits_for_worst_case_blocks_and_max_num_seqs():
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, num_blocks=4, block_size=4)
    scheduler.add(_seq("a", 4, max_tokens=4))  # 2 blocks worst case
    scheduler.add(_seq("b", 4, max_tokens=4))  # 2 blocks
    scheduler.add(_seq("c", 1, max_tokens=1))  # must wait: max_num_seqs and blocks
    chunks = _step(scheduler)
    assert [c.request_id for c in chunks] == ["a", "b"] and [s.request_id for s in scheduler.waiting] == ["c"]
    while scheduler.get("a") is not None:
        assert "c" not in [c.request_id for c in _step(scheduler)]
    assert "c" in [c.request_id for c in scheduler.schedule().chunks]  # admitted once "a" returned its blocks


def test_never_fits_raises_clear_errors():
    scheduler = Scheduler(max_num_seqs=2, max_num_batched_tokens=8, max_model_len=32, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="exceeds max_model_len=32"):
        scheduler.add(_seq("too-long", 30, max_tokens=8))
    with pytest.raises(ValueError, match="need 5 KV blocks, the cache has 4"):
        scheduler.add(_seq("too-big", 12, max_tokens=8))
    with pytest.raises(ValueError, match="prompt is empty"):
        scheduler.add(_seq("empty", 0))
    scheduler.add(_seq("ok", 4))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add(_seq("ok", 4))


def test_abort_returns_blocks_and_slots():
    scheduler = Scheduler(max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64, num_blocks=16, block_size=4)
    for i in range(3):
        scheduler.add(_seq(f"r{i}", 7, max_tokens=8))
    _step(scheduler)
    assert scheduler.block_manager.num_free_blocks < 16
    for i in range(3):
        seq = scheduler.abort(f"r{i}")
        assert seq.finish_reason == "abort" and seq.status is SequenceStatus.FINISHED
    assert scheduler.block_manager.num_free_blocks == 16 and scheduler.slot_pool.num_free_slots == 3
    assert not scheduler.has_unfinished()
    scheduler.add(_seq("queued", 3))
    assert scheduler.abort("queued").finish_reason == "abort" and not scheduler.waiting  # a waiting request holds nothing
    assert scheduler.schedule().chunks == ()
    with pytest.raises(KeyError):
        scheduler.abort("r0")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    max_num_seqs=st.integers(1, 5),
    budget=st.integers(1, 12),
    block_size=st.integers(1, 5),
    num_blocks=st.integers(6, 30),
)
def test_random_traffic_never_leaks(seed, max_num_seqs, budget, block_size, num_blocks):
    rng = random.Random(seed)
    max_model_len = 24
    scheduler = Scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                          num_blocks=num_blocks, block_size=block_size)
    submitted, finished = 0, set()
    for step in range(200):
        if submitted < 12 and rng.random() < 0.4:
            seq = _seq(f"q{submitted}", rng.randint(1, 12), max_tokens=rng.randint(1, 8))
            if -(-seq.max_total_tokens // block_size) > num_blocks or seq.max_total_tokens > max_model_len:
                with pytest.raises(ValueError):
                    scheduler.add(seq)
                finished.add(seq.request_id)
            else:
                scheduler.add(seq)
            submitted += 1
        if scheduler.running and rng.random() < 0.05:
            scheduler.abort(rng.choice(scheduler.running).request_id)
        output = scheduler.schedule()
        assert output.num_tokens <= budget and len(scheduler.running) <= max_num_seqs
        tables = [c.block_table for c in output.chunks]
        used = [b for table in tables for b in table]
        assert len(used) == len(set(used)), "two running sequences share a block"
        slots = [c.state_slot for c in output.chunks]
        assert len(slots) == len(set(slots))
        if scheduler.running:
            assert output.chunks, "running sequences but nothing scheduled (a stall)"
        _step_from(scheduler, output, rng)
        if submitted == 12 and not scheduler.has_unfinished():
            break
    assert not scheduler.has_unfinished(), "requests left after 200 steps (starvation or deadlock)"
    assert scheduler.block_manager.num_free_blocks == num_blocks
    assert scheduler.slot_pool.num_free_slots == max_num_seqs


def _step_from(scheduler, output, rng):
    scheduler.commit(output)
    for chunk in output.chunks:
        seq = scheduler.get(chunk.request_id)
        if chunk.samples and seq is not None:
            token = rng.randint(0, 9)
            seq.output_token_ids.append(token)
            reason = seq.stop_reason_after(token, eos_token_ids=(0,))
            if reason:
                scheduler.finish(seq, reason)
