"""Block manager: unit checks and a hypothesis state machine (arrivals, appends, forks, finishes, aborts)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference_engine.cache.block_manager import BlockAllocationError, BlockManager


def test_allocate_append_boundary_and_slots():
    manager = BlockManager(num_blocks=6, block_size=4)
    table = manager.allocate("a", 5)
    assert len(table) == 2 and manager.num_free_blocks == 4
    assert manager.slot_mapping("a", 3, 5) == [table[0] * 4 + 3, table[1] * 4 + 0]
    assert manager.append_slots("a", 3) == []  # fills the second block, no new block
    assert manager.num_free_blocks == 4
    manager.append_slots("a", 1)  # crosses the boundary
    assert manager.num_free_blocks == 3 and len(manager.block_table("a")) == 3
    manager.free("a")
    assert manager.num_free_blocks == 6


def test_fork_shares_then_copy_on_write():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("parent", 6)  # one full block, one half-full block
    manager.fork("parent", "child")
    full, partial = manager.block_table("parent")
    assert manager.refcount(full) == 2 and manager.refcount(partial) == 2
    assert manager.num_free_blocks == 6
    copies = manager.append_slots("child", 1)
    assert len(copies) == 1 and copies[0][0] == partial
    assert manager.block_table("child")[0] == full and manager.block_table("child")[1] == copies[0][1]
    assert manager.refcount(partial) == 1 and manager.append_slots("parent", 1) == []  # parent now owns it alone
    manager.free("parent")
    assert manager.refcount(full) == 1 and manager.num_free_blocks == 6
    manager.free("child")
    assert manager.num_free_blocks == 8


def test_errors():
    manager = BlockManager(num_blocks=2, block_size=4)
    assert not manager.can_allocate(9) and manager.can_allocate(8)
    with pytest.raises(BlockAllocationError):
        manager.allocate("a", 9)
    assert manager.num_free_blocks == 2
    manager.allocate("a", 8)
    with pytest.raises(BlockAllocationError):
        manager.append_slots("a", 1)
    with pytest.raises(ValueError, match="already holds"):
        manager.allocate("a", 1)
    with pytest.raises(KeyError, match="unknown sequence"):
        manager.append_slots("b", 1)
    with pytest.raises(ValueError, match="outside"):
        manager.slot_mapping("a", 0, 9)
    manager.free("a")
    with pytest.raises(KeyError, match="already freed"):
        manager.free("a")
    with pytest.raises(ValueError):
        BlockManager(0, 4)


class BlockManagerMachine(RuleBasedStateMachine):
    """Every sequence writes unique token values through its slot mapping; each must read back its own."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = BlockManager(num_blocks=12, block_size=3)
        self.tokens: dict[int, list[int]] = {}
        self.cache: dict[int, int] = {}
        self.next_seq = 0
        self.next_value = 0

    def _values(self, count: int) -> list[int]:
        self.next_value += count
        return list(range(self.next_value - count, self.next_value))

    def _write(self, seq: int, start: int, values: list[int]) -> None:
        for slot, value in zip(self.manager.slot_mapping(seq, start, start + len(values)), values):
            self.cache[slot] = value

    @rule(count=st.integers(1, 10))
    def arrive(self, count):
        if not self.manager.can_allocate(count):
            with pytest.raises(BlockAllocationError):
                self.manager.allocate(self.next_seq, count)
            return
        self.manager.allocate(self.next_seq, count)
        self.tokens[self.next_seq] = self._values(count)
        self._write(self.next_seq, 0, self.tokens[self.next_seq])
        self.next_seq += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), count=st.integers(1, 5))
    def grow(self, data, count):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        if not self.manager.can_append(seq, count):
            return
        start = len(self.tokens[seq])
        for source, destination in self.manager.append_slots(seq, count):
            for offset in range(self.manager.block_size):
                if source * 3 + offset in self.cache:
                    self.cache[destination * 3 + offset] = self.cache[source * 3 + offset]
        new = self._values(count)
        self.tokens[seq].extend(new)
        self._write(seq, start, new)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        self.manager.fork(parent, self.next_seq)
        self.tokens[self.next_seq] = list(self.tokens[parent])
        self.next_seq += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def finish_or_abort(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.manager.free(seq)
        del self.tokens[seq]
        with pytest.raises(KeyError):
            self.manager.free(seq)

    @invariant()
    def reads_back_and_counts(self):
        holders: dict[int, int] = {}
        for seq, tokens in self.tokens.items():
            table = self.manager.block_table(seq)
            assert len(table) == -(-len(tokens) // 3)
            for block in table:
                holders[block] = holders.get(block, 0) + 1
            assert [self.cache.get(s) for s in self.manager.slot_mapping(seq, 0, len(tokens))] == tokens
        for block in range(12):
            assert self.manager.refcount(block) == holders.get(block, 0)
        assert self.manager.num_free_blocks == 12 - len(holders)

    def teardown(self):
        for seq in list(self.tokens):
            self.manager.free(seq)
        assert self.manager.num_free_blocks == 12


BlockManagerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase
