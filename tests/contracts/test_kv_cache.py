"""The kv-cache contracts pass on the engine's implementations and fail on known-wrong ones."""

from __future__ import annotations

import pytest
import torch

from reference_engine.cache.block_manager import BlockManager
from reference_engine.cache.kv_write import write_kv
from reference_engine.cache.slot_pool import StateSlotPool
from toolbox.harness.execution import execute
from toolbox.harness.loading import load_contract
from toolbox.harness.statuses import Status


def _cases(contract_id: str) -> list[str]:
    return [case.name for case in load_contract(contract_id).contract.cases]


def _errors(contract_id: str) -> list[str]:
    return [error.name for error in load_contract(contract_id).contract.errors]


# Known-wrong implementations ------------------------------------------------------------------
class FreesSharedBlocksEarly(BlockManager):
    """Ignores reference counts: the first free of a shared block returns it to the pool."""

    def free(self, seq_id):
        if seq_id not in self._tables:
            raise KeyError(seq_id)
        for block in self._tables.pop(seq_id):
            if self._refcounts[block] > 0:
                self._refcounts[block] = 0
                self._free.append(block)
        del self._num_tokens[seq_id]


class NeverFrees(BlockManager):
    def free(self, seq_id):
        if seq_id not in self._tables:
            raise KeyError(seq_id)
        del self._tables[seq_id], self._num_tokens[seq_id]


class NoCopyOnWrite(BlockManager):
    """Appends into a shared partial block in place."""

    def blocks_to_append(self, seq_id, num_new_tokens):
        table, used = self._lookup(seq_id)
        return -(-max(0, used + num_new_tokens - len(table) * self.block_size) // self.block_size)

    def append_slots(self, seq_id, num_new_tokens):
        table, used = self._lookup(seq_id)
        needed = self.blocks_to_append(seq_id, num_new_tokens)
        table.extend(self._take(needed, "append"))
        self._num_tokens[seq_id] = used + num_new_tokens
        return []


class ReusesLiveSlot(StateSlotPool):
    """Hands a freed-looking slot back without taking it off the free list."""

    def allocate(self, seq_id):
        if seq_id in self._owner:
            raise ValueError(seq_id)
        if not self._free:
            raise RuntimeError("full")
        slot = self._free[0]
        self._owner[seq_id] = slot
        return slot


class AlwaysSlotZero(StateSlotPool):
    """Keeps its counts right but hands every sequence slot 0."""

    def allocate(self, seq_id):
        super().allocate(seq_id)
        self._owner[seq_id] = 0
        return 0


class SilentDoubleFree(StateSlotPool):
    def free(self, seq_id):
        if seq_id in self._owner:
            super().free(seq_id)


def write_kv_swapped(key, value, k_cache, v_cache, slot_mapping):
    """Block and offset swapped: block = slot % block_size, offset = slot // block_size."""
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            k_cache[slot % block_size, slot // block_size] = key[token]
            v_cache[slot % block_size, slot // block_size] = value[token]


def write_kv_unchecked(key, value, k_cache, v_cache, slot_mapping):
    flat = slot_mapping.clamp(min=0)
    k_cache.view(-1, *k_cache.shape[2:])[flat] = key.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[flat] = value.to(v_cache.dtype)[:, :, : v_cache.shape[-1]]


# Tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", _cases("kv-cache/block-manager"))
def test_block_manager_passes(case):
    outcome = execute(load_contract("kv-cache/block-manager"), "case", case, BlockManager)
    assert outcome.status == Status.PASSED, outcome.message


@pytest.mark.parametrize("wrong", [FreesSharedBlocksEarly, NeverFrees, NoCopyOnWrite])
def test_block_manager_catches_wrong(wrong):
    outcome = execute(load_contract("kv-cache/block-manager"), "case", "small-blocks", wrong)
    assert outcome.status == Status.INCORRECT_NUMERICAL, outcome.message


@pytest.mark.parametrize("case", _cases("kv-cache/state-slots"))
def test_state_slots_pass(case):
    outcome = execute(load_contract("kv-cache/state-slots"), "case", case, StateSlotPool)
    assert outcome.status == Status.PASSED, outcome.message


@pytest.mark.parametrize("wrong", [ReusesLiveSlot, AlwaysSlotZero, SilentDoubleFree])
def test_state_slots_catch_wrong(wrong):
    outcome = execute(load_contract("kv-cache/state-slots"), "case", "small-pool", wrong)
    assert outcome.status != Status.PASSED, outcome.message


@pytest.mark.parametrize("case", _cases("kv-cache/kv-write"))
def test_kv_write_passes(case):
    outcome = execute(load_contract("kv-cache/kv-write"), "case", case, write_kv)
    assert outcome.status == Status.PASSED, outcome.message


@pytest.mark.parametrize("error", _errors("kv-cache/kv-write"))
def test_kv_write_error_cases(error):
    outcome = execute(load_contract("kv-cache/kv-write"), "error", error, write_kv)
    assert outcome.status == Status.PASSED, outcome.message


@pytest.mark.parametrize("case", _cases("kv-cache/kv-write"))
def test_kv_write_swapped_block_offset_fails(case):
    outcome = execute(load_contract("kv-cache/kv-write"), "case", case, write_kv_swapped)
    assert outcome.status != Status.PASSED
    if case == "full-size-heads":  # in range, so it must be caught by comparison, not by a crash
        assert outcome.status == Status.INCORRECT_NUMERICAL, outcome.message


def test_kv_write_unchecked_misses_errors():
    statuses = {execute(load_contract("kv-cache/kv-write"), "error", e, write_kv_unchecked).status for e in _errors("kv-cache/kv-write")}
    assert Status.MISSING_ERROR in statuses


def test_kv_write_padding_is_skipped():
    k_cache = torch.randn(4, 2, 1, 3)
    v_cache = torch.randn(4, 2, 1, 3)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key, value = torch.randn(3, 1, 3), torch.randn(3, 1, 3)
    write_kv(key, value, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(k_cache[2, 1], key[0]) and torch.equal(v_cache[0, 0], value[2])
    untouched = torch.ones(8, dtype=torch.bool)
    untouched[[5, 0]] = False
    assert torch.equal(k_cache.view(8, -1)[untouched], before_k.view(8, -1)[untouched])
    assert torch.equal(v_cache.view(8, -1)[untouched], before_v.view(8, -1)[untouched])
