"""State slot pool: unit checks and a hypothesis state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference_engine.cache.slot_pool import SlotAllocationError, StateSlotPool


def test_allocate_free_fork_and_errors():
    pool = StateSlotPool(2)
    a = pool.allocate("a")
    source, destination = pool.fork("a", "b")
    assert source == a and destination != a and pool.slot("b") == destination
    with pytest.raises(SlotAllocationError):
        pool.allocate("c")
    with pytest.raises(ValueError, match="already owns"):
        pool.allocate("a")
    pool.free("a")
    with pytest.raises(KeyError, match="already freed"):
        pool.free("a")
    with pytest.raises(KeyError):
        pool.slot("a")
    pool.free("b")
    assert pool.num_free_slots == 2


class SlotPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = StateSlotPool(4)
        self.live: set[int] = set()
        self.next_seq = 0

    @rule()
    def arrive(self):
        if len(self.live) == 4:
            with pytest.raises(SlotAllocationError):
                self.pool.allocate(self.next_seq)
        else:
            self.pool.allocate(self.next_seq)
            self.live.add(self.next_seq)
        self.next_seq += 1

    @precondition(lambda self: self.live and len(self.live) < 4)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.live)))
        source, destination = self.pool.fork(parent, self.next_seq)
        assert source == self.pool.slot(parent) != destination
        self.live.add(self.next_seq)
        self.next_seq += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        seq = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.free(seq)
        self.live.discard(seq)
        with pytest.raises(KeyError):
            self.pool.free(seq)

    @invariant()
    def distinct_slots(self):
        slots = [self.pool.slot(seq) for seq in self.live]
        assert len(set(slots)) == len(slots) and all(0 <= s < 4 for s in slots)
        assert self.pool.num_free_slots == 4 - len(self.live)

    def teardown(self):
        for seq in list(self.live):
            self.pool.free(seq)
        assert self.pool.num_free_slots == 4


SlotPoolMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestSlotPoolMachine = SlotPoolMachine.TestCase
