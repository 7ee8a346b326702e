"""Pool of Gated DeltaNet state slots: one row of the recurrent/conv state tensors per running sequence.

Integers only: the runner owns the state tensors and performs the copies this pool asks for.
Unlike KV blocks, a state is rewritten at every step, so a forked sequence cannot share its
parent's slot: `fork` takes a fresh slot and returns the `(src_slot, dst_slot)` copy to perform.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from reference_engine.ops.registry import satisfies


class SlotAllocationError(RuntimeError):
    """Every state slot is in use."""


@satisfies("kv-cache/state-slots", 1)
class StateSlotPool:
    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._owner: dict[Hashable, int] = {}
        self._in_use = [False] * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def can_allocate(self, count: int = 1) -> bool:
        return count <= len(self._free)

    def has(self, seq_id: Hashable) -> bool:
        return seq_id in self._owner

    def slot(self, seq_id: Hashable) -> int:
        try:
            return self._owner[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r} (no state slot: never allocated or already freed)") from None

    def allocate(self, seq_id: Hashable) -> int:
        if seq_id in self._owner:
            raise ValueError(f"sequence {seq_id!r} already owns state slot {self._owner[seq_id]}")
        if not self._free:
            raise SlotAllocationError(f"all {self.num_slots} state slots are in use")
        slot = self._free.popleft()
        if self._in_use[slot]:
            raise RuntimeError(f"state slot {slot} is on the free list but in use (pool corrupted)")
        self._in_use[slot] = True
        self._owner[seq_id] = slot
        return slot

    def fork(self, parent_id: Hashable, child_id: Hashable) -> tuple[int, int]:
        """Give `child_id` its own slot holding a copy of the parent's state: returns (src_slot, dst_slot)."""
        source = self.slot(parent_id)
        return source, self.allocate(child_id)

    def free(self, seq_id: Hashable) -> None:
        if seq_id not in self._owner:
            raise KeyError(f"sequence {seq_id!r} owns no state slot (already freed or never allocated)")
        slot = self._owner.pop(seq_id)
        self._in_use[slot] = False
        self._free.append(slot)
