"""Executable half of kv-cache/block-manager: drives a block manager through random operations.

Imports only the standard library and torch. The check keeps its own plain model of which
logical blocks each sequence holds, and a simulated cache of token values: every token a
sequence appends is written through the implementation's slot mapping (after the copies it asks
for), and every live sequence must read back exactly its own tokens at every step. Sharing must
match the model exactly (two sequences hold one physical block iff the model says they share it).
"""

from __future__ import annotations

import torch

ALLOCATION_ERRORS = (ValueError, RuntimeError, MemoryError)
REQUIRED_METHODS = ("can_allocate", "allocate", "append_slots", "fork", "free", "block_table", "slot_mapping")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _free_count(manager) -> int:
    value = manager.num_free_blocks
    return int(value() if callable(value) else value)


class _Model:
    """Logical blocks with reference counts: the plain reference the implementation is compared with."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs: dict[int, int] = {}  # logical block -> number of sequences holding it
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # the token values each sequence wrote, in order
        self._next = 0

    def free_blocks(self) -> int:
        return self.num_blocks - len(self.refs)

    def _new(self) -> int:
        self._next += 1
        self.refs[self._next] = 1
        return self._next

    def append_cost(self, seq: int, count: int) -> int:
        table, used = self.tables[seq], len(self.tokens[seq])
        cost = _ceil(max(0, used + count - len(table) * self.block_size), self.block_size)
        if count and used % self.block_size and self.refs[table[-1]] > 1:
            cost += 1
        return cost

    def allocate(self, seq: int, values: list[int]) -> None:
        self.tables[seq] = [self._new() for _ in range(_ceil(len(values), self.block_size))]
        self.tokens[seq] = list(values)

    def append(self, seq: int, values: list[int]) -> bool:
        """Returns whether a copy-on-write must happen."""
        table, used = self.tables[seq], len(self.tokens[seq])
        copied = False
        if values and used % self.block_size and self.refs[table[-1]] > 1:
            self.refs[table[-1]] -= 1
            table[-1] = self._new()
            copied = True
        while len(table) * self.block_size < used + len(values):
            table.append(self._new())
        self.tokens[seq].extend(values)
        return copied

    def fork(self, parent: int, child: int) -> None:
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        for block in self.tables[child]:
            self.refs[block] += 1

    def free(self, seq: int) -> None:
        for block in self.tables.pop(seq):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                del self.refs[block]
        del self.tokens[seq]


def _check_state(manager, model: _Model, cache: dict[int, int], step: str) -> None:
    where = f"after {step}"
    assert _free_count(manager) == model.free_blocks(), (
        f"{where}: num_free_blocks is {_free_count(manager)}, expected {model.free_blocks()} (a leak or an early free)"
    )
    physical_of: dict[int, int] = {}
    logical_of: dict[int, int] = {}
    for seq, logical_table in model.tables.items():
        table = [int(b) for b in manager.block_table(seq)]
        assert len(table) == len(logical_table), f"{where}: sequence {seq} holds {len(table)} blocks, expected {len(logical_table)}"
        for physical, logical in zip(table, logical_table):
            assert 0 <= physical < model.num_blocks, f"{where}: block id {physical} is outside [0, {model.num_blocks})"
            if physical_of.setdefault(logical, physical) != physical or logical_of.setdefault(physical, logical) != logical:
                raise AssertionError(f"{where}: block {physical} is shared by sequences that must not share it, or a shared block was split")
        used = len(model.tokens[seq])
        slots = [int(s) for s in manager.slot_mapping(seq, 0, used)]
        expected = [table[p // model.block_size] * model.block_size + p % model.block_size for p in range(used)]
        assert slots == expected, f"{where}: slot_mapping of sequence {seq} disagrees with its block table"
        read = [cache.get(slot) for slot in slots]
        assert read == model.tokens[seq], f"{where}: sequence {seq} reads back tokens another sequence overwrote"


def run(impl, axes, params, dtype, device, generator) -> dict:
    num_blocks, block_size, num_operations = axes["num_blocks"], axes["block_size"], axes["num_operations"]
    max_tokens = params.get("max_new_tokens", 3 * block_size)
    manager = impl(num_blocks, block_size)
    missing = [name for name in REQUIRED_METHODS + ("num_free_blocks",) if not hasattr(manager, name)]
    assert not missing, f"the block manager lacks {missing}"
    model = _Model(num_blocks, block_size)
    cache: dict[int, int] = {}  # physical slot -> token value (the simulated KV cache)
    next_seq, counter = 0, [0]

    def draw(high: int) -> int:
        return int(torch.randint(0, high, (1,), generator=generator, device=generator.device))

    def values(count: int) -> list[int]:
        counter[0] += count
        return list(range(counter[0] - count, counter[0]))  # unique per token, so an overwrite is visible

    def write(seq: int, start: int, new: list[int]) -> None:
        for slot, value in zip(manager.slot_mapping(seq, start, start + len(new)), new):
            cache[int(slot)] = value

    copies_seen = 0
    for step in range(num_operations):
        live = sorted(model.tables)
        choice = draw(10)
        if choice < 3 or not live:  # a new sequence
            count = 1 + draw(max_tokens)
            fits = _ceil(count, block_size) <= model.free_blocks()
            assert bool(manager.can_allocate(count)) == fits, f"step {step}: can_allocate({count}) should be {fits}"
            if not fits:
                try:
                    manager.allocate(next_seq, count)
                except ALLOCATION_ERRORS:
                    pass
                else:
                    raise AssertionError(f"step {step}: allocate({count}) succeeded without enough free blocks")
                assert _free_count(manager) == model.free_blocks(), f"step {step}: a failed allocate changed the pool"
                continue
            new = values(count)
            manager.allocate(next_seq, count)
            model.allocate(next_seq, new)
            write(next_seq, 0, new)
            label, next_seq = f"allocate({next_seq}, {count})", next_seq + 1
        elif choice < 6:  # a sequence grows
            seq = live[draw(len(live))]
            count = 1 + draw(block_size + 2) if draw(2) else 1
            if model.append_cost(seq, count) > model.free_blocks():
                continue
            start = len(model.tokens[seq])
            must_copy = model.append(seq, values(count))
            copies = [(int(a), int(b)) for a, b in (manager.append_slots(seq, count) or [])]
            assert len(copies) == int(must_copy), f"step {step}: append_slots returned copies {copies}, expected {int(must_copy)}"
            for source, destination in copies:
                assert source != destination, f"step {step}: copy-on-write into the same block {source}"
                for offset in range(block_size):
                    if source * block_size + offset in cache:
                        cache[destination * block_size + offset] = cache[source * block_size + offset]
                copies_seen += 1
            write(seq, start, model.tokens[seq][start:])
            label = f"append_slots({seq}, {count})"
        elif choice < 8:  # fork
            parent = live[draw(len(live))]
            manager.fork(parent, next_seq)
            model.fork(parent, next_seq)
            label, next_seq = f"fork({parent}, {next_seq})", next_seq + 1
        else:  # finish or abort
            seq = live[draw(len(live))]
            manager.free(seq)
            model.free(seq)
            label = f"free({seq})"
            try:
                manager.free(seq)
            except (KeyError, ValueError, RuntimeError):
                pass
            else:
                raise AssertionError(f"step {step}: a second free({seq}) did not raise")
        _check_state(manager, model, cache, f"step {step}: {label}")
    for seq in sorted(model.tables):
        manager.free(seq)
        model.free(seq)
    assert _free_count(manager) == num_blocks, f"after freeing every sequence {_free_count(manager)} of {num_blocks} blocks are free"
    return {"message": f"{num_operations} operations, {next_seq} sequences, {copies_seen} copy-on-write copies"}
