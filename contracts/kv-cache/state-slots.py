"""Executable half of kv-cache/state-slots: drives a state-slot pool through random operations.

Imports only the standard library and torch. Each live sequence's slot holds a simulated state
value; forks copy it through the (src, dst) instruction the pool returns. At every step each
live sequence must own a distinct in-range slot and read back its own state.
"""

from __future__ import annotations

import torch

REQUIRED_METHODS = ("allocate", "free", "fork", "slot")


def _free_count(pool) -> int:
    value = pool.num_free_slots
    return int(value() if callable(value) else value)


def run(impl, axes, params, dtype, device, generator) -> dict:
    num_slots, num_operations = axes["num_slots"], axes["num_operations"]
    pool = impl(num_slots)
    missing = [name for name in REQUIRED_METHODS + ("num_free_slots",) if not hasattr(pool, name)]
    assert not missing, f"the slot pool lacks {missing}"
    states: dict[int, int] = {}  # simulated state tensor: slot -> value
    expected: dict[int, int] = {}  # live sequence -> the value its state must hold
    next_seq, next_value = 0, 1000

    def draw(high: int) -> int:
        return int(torch.randint(0, high, (1,), generator=generator, device=generator.device))

    for step in range(num_operations):
        live = sorted(expected)
        choice = draw(10)
        if choice < 4 or not live:
            if len(live) == num_slots:
                try:
                    pool.allocate(next_seq)
                except (ValueError, RuntimeError, MemoryError):
                    continue
                raise AssertionError(f"step {step}: allocate succeeded with all {num_slots} slots in use")
            slot = int(pool.allocate(next_seq))
            assert 0 <= slot < num_slots, f"step {step}: slot {slot} is outside [0, {num_slots})"
            states[slot], expected[next_seq] = next_value, next_value
            next_seq, next_value = next_seq + 1, next_value + 1
        elif choice < 6:  # the sequence's state advances by one step
            seq = live[draw(len(live))]
            states[int(pool.slot(seq))], expected[seq] = next_value, next_value
            next_value += 1
        elif choice < 8 and len(live) < num_slots:
            parent = live[draw(len(live))]
            source, destination = (int(v) for v in pool.fork(parent, next_seq))
            assert source == int(pool.slot(parent)), f"step {step}: fork copies from {source}, the parent owns {pool.slot(parent)}"
            assert destination == int(pool.slot(next_seq)) and destination != source, f"step {step}: fork copies into a wrong slot"
            states[destination] = states[source]
            expected[next_seq] = expected[parent]
            next_seq += 1
        else:
            seq = live[draw(len(live))]
            pool.free(seq)
            del expected[seq]
            try:
                pool.free(seq)
            except (KeyError, ValueError, RuntimeError):
                pass
            else:
                raise AssertionError(f"step {step}: a second free({seq}) did not raise")
        owned = {seq: int(pool.slot(seq)) for seq in expected}
        assert len(set(owned.values())) == len(owned), f"step {step}: two live sequences share a slot: {owned}"
        for seq, slot in owned.items():
            assert 0 <= slot < num_slots, f"step {step}: slot {slot} is outside [0, {num_slots})"
            assert states.get(slot) == expected[seq], f"step {step}: sequence {seq} reads a state another sequence wrote"
        assert _free_count(pool) == num_slots - len(expected), f"step {step}: {_free_count(pool)} free slots, expected {num_slots - len(expected)}"
    for seq in sorted(expected):
        pool.free(seq)
    assert _free_count(pool) == num_slots, f"after freeing everything {_free_count(pool)} of {num_slots} slots are free"
    return {"message": f"{num_operations} operations over {next_seq} sequences"}
