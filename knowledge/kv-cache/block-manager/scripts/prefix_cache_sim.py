"""A prefix-caching block manager and its invariants, checked under random operations (CPU, seconds).

Integers only. Blocks have reference counts; full blocks are named by a chained hash
h_i = hash((h_{i-1}, tokens of block i)); a new sequence reuses the longest run of cached full
blocks of its prompt; blocks whose count drops to 0 stay cached (evictable, least recently freed
first) until a new allocation takes them. A simulated cache records which token each slot holds,
so a sequence reading another's token, a leak or a double free is caught. Two known-wrong
managers (no copy-on-write; evicting a block without dropping its hash) must fail.
Exits non-zero when the correct manager fails or a wrong one passes.
"""

from __future__ import annotations

import random
import sys
from collections import OrderedDict


class PrefixCachingBlockManager:
    def __init__(self, num_blocks: int, block_size: int, copy_on_write: bool = True, forget_hash_on_evict: bool = True):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.copy_on_write, self.forget_hash_on_evict = copy_on_write, forget_hash_on_evict
        self.refcount = [0] * num_blocks
        self.never_used = list(range(num_blocks))[::-1]  # stack of blocks without cached content
        self.evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0 but cached; oldest first
        self.hash_to_block: dict[int, int] = {}
        self.block_hash: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.never_used) + len(self.evictable)

    def _take(self) -> int:
        if self.never_used:
            block = self.never_used.pop()
        else:
            block, _ = self.evictable.popitem(last=False)  # evict the least recently freed
            old = self.block_hash.pop(block)
            if self.forget_hash_on_evict:
                del self.hash_to_block[old]
        self.refcount[block] = 1
        return block

    def _hashes(self, tokens: list[int]) -> list[int]:
        hashes, parent = [], None
        for start in range(0, len(tokens) - len(tokens) % self.block_size, self.block_size):
            parent = hash((parent, tuple(tokens[start : start + self.block_size])))
            hashes.append(parent)
        return hashes

    def _seal_full_blocks(self, seq: int) -> None:
        """Register every full block of the sequence in the hash table (first writer wins)."""
        for index, value in enumerate(self._hashes(self.tokens[seq])):
            block = self.tables[seq][index]
            if value not in self.hash_to_block and block not in self.block_hash:
                self.hash_to_block[value] = block
                self.block_hash[block] = value

    def allocate(self, seq: int, prompt: list[int]) -> int:
        """Returns the number of prompt tokens whose KV is already cached (multiple of block_size)."""
        hits = []
        for value in self._hashes(prompt[:-1]):  # keep at least one token to compute
            block = self.hash_to_block.get(value)
            if block is None:
                break
            hits.append(block)
        needed = -(-len(prompt) // self.block_size) - len(hits)
        revived = sum(1 for block in hits if self.refcount[block] == 0)
        if needed + revived > self.num_free_blocks:
            raise MemoryError(f"{needed} new blocks needed, {self.num_free_blocks - revived} free")
        for block in hits:
            if self.refcount[block] == 0:
                del self.evictable[block]
            self.refcount[block] += 1
        self.tables[seq] = hits + [self._take() for _ in range(needed)]
        self.tokens[seq] = list(prompt)
        return len(hits) * self.block_size

    def append(self, seq: int, new_tokens: list[int]) -> list[tuple[int, int]]:
        table, used, copies = self.tables[seq], len(self.tokens[seq]), []
        partial = used % self.block_size
        if self.copy_on_write and new_tokens and partial and self.refcount[table[-1]] > 1:
            source = table[-1]
            self.refcount[source] -= 1
            table[-1] = self._take()
            copies.append((source, table[-1]))
        while len(table) * self.block_size < used + len(new_tokens):
            table.append(self._take())
        self.tokens[seq].extend(new_tokens)
        self._seal_full_blocks(seq)
        return copies

    def fork(self, parent: int, child: int) -> None:
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        for block in self.tables[child]:
            self.refcount[block] += 1

    def free(self, seq: int) -> None:
        if seq not in self.tables:
            raise KeyError(f"sequence {seq} holds no blocks")
        for block in reversed(self.tables.pop(seq)):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                if block in self.block_hash:
                    self.evictable[block] = None
                else:
                    self.never_used.append(block)
        del self.tokens[seq]


def check(manager: PrefixCachingBlockManager, cache: dict[int, int]) -> None:
    holders = [0] * manager.num_blocks
    for table in manager.tables.values():
        for block in table:
            holders[block] += 1
    assert holders == manager.refcount, "a reference count differs from the number of tables holding the block"
    free = set(manager.never_used) | set(manager.evictable)
    assert not free & {b for t in manager.tables.values() for b in t}, "a held block is on a free list"
    assert len(free) + sum(1 for h in holders if h) == manager.num_blocks, "a block leaked"
    for value, block in manager.hash_to_block.items():
        assert manager.block_hash.get(block) == value, "the hash table names a block that holds other tokens"
    size = manager.block_size
    for seq, table in manager.tables.items():
        read = [cache.get(table[p // size] * size + p % size) for p in range(len(manager.tokens[seq]))]
        assert read == manager.tokens[seq], f"sequence {seq} reads tokens it did not write"


def drive(manager: PrefixCachingBlockManager, seed: int, steps: int = 3000) -> tuple[int, int]:
    rng, cache, next_seq, reused = random.Random(seed), {}, 0, 0
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(1, 40))] for _ in range(6)]  # shared prefixes
    size = manager.block_size
    for _ in range(steps):
        live, action = sorted(manager.tables), rng.random()
        if action < 0.3 or not live:
            prompt = rng.choice(prompts)[: rng.randrange(1, 40)] + [rng.randrange(50) for _ in range(rng.randrange(0, 5))]
            try:
                cached = manager.allocate(next_seq, prompt)
            except MemoryError:
                continue
            reused += cached
            table = manager.tables[next_seq]
            for p in range(cached, len(prompt)):  # write only what was not cached
                cache[table[p // size] * size + p % size] = prompt[p]
            manager._seal_full_blocks(next_seq)
            next_seq += 1
        elif action < 0.6:
            seq = rng.choice(live)
            new = [rng.randrange(50) for _ in range(rng.randrange(1, size + 2))]
            start = len(manager.tokens[seq])
            if -(-(start + len(new)) // size) - len(manager.tables[seq]) + 1 > manager.num_free_blocks:
                continue
            for source, destination in manager.append(seq, new):
                for offset in range(size):
                    if source * size + offset in cache:
                        cache[destination * size + offset] = cache[source * size + offset]
            table = manager.tables[seq]
            for p in range(start, start + len(new)):
                cache[table[p // size] * size + p % size] = new[p - start]
        elif action < 0.8:
            manager.fork(rng.choice(live), next_seq)
            next_seq += 1
        else:
            seq = rng.choice(live)
            manager.free(seq)
            try:
                manager.free(seq)
            except KeyError:
                pass
            else:
                raise AssertionError("a second free did not raise")
        check(manager, cache)
    for seq in sorted(manager.tables):
        manager.free(seq)
    assert manager.num_free_blocks == manager.num_blocks, "blocks leaked after freeing everything"
    return next_seq, reused


def main() -> int:
    sequences, reused = drive(PrefixCachingBlockManager(48, 4), seed=0)
    print(f"correct manager: {sequences} sequences, {reused} prompt tokens served from the prefix cache: ok")
    for name, wrong in (("no copy-on-write", {"copy_on_write": False}), ("hash kept after eviction", {"forget_hash_on_evict": False})):
        try:
            drive(PrefixCachingBlockManager(48, 4, **wrong), seed=0)
        except AssertionError as error:
            print(f"known-wrong manager ({name}) caught: {error}")
        else:
            print(f"FAIL: known-wrong manager ({name}) passed")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
