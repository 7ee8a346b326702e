"""A continuous-batching scheduler in ~60 lines, a step trace, and the invariants it must keep.

Policy (../SKILL.md section 2): each step spends at most `budget` tokens; one token for every
decoding sequence first, then prompt chunks of sequences still prefilling (oldest first), then
new requests (FCFS) while their worst case (prompt + max_tokens) fits in the KV blocks left
unreserved and a state slot is free. A request that can never fit is refused at submission.

Run: python schedule_trace.py            (prints a trace, checks invariants on random traffic)
If the repository's reference engine is importable, the same traffic also goes through
`reference_engine.scheduler.Scheduler` and every step's plan must be identical.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass
class Request:
    rid: str
    prompt_len: int
    max_tokens: int
    computed: int = 0  # tokens whose KV / GDN state is in the caches
    generated: int = 0

    @property
    def known(self) -> int:  # prompt + generated tokens
        return self.prompt_len + self.generated


@dataclass
class ToyScheduler:
    budget: int
    max_seqs: int
    num_blocks: int
    block_size: int
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    reserved: dict = field(default_factory=dict)
    wrong: str | None = None  # "prefill-first": a known-wrong policy the checks must catch

    def add(self, req: Request) -> None:
        if blocks_for(req.prompt_len + req.max_tokens, self.block_size) > self.num_blocks:
            raise ValueError(f"{req.rid} can never fit")
        self.waiting.append(req)

    def schedule(self) -> list[tuple[str, int, int, bool]]:
        """Returns (request id, start, count, samples) per scheduled chunk, in plan order."""
        left, plan = self.budget, []
        decoding = [r for r in self.running if r.computed >= r.prompt_len]
        prefilling = [r for r in self.running if r.computed < r.prompt_len]
        order = prefilling + decoding if self.wrong == "prefill-first" else decoding + prefilling
        for req in order:
            if left == 0:
                break
            count = min(req.known - req.computed, left)
            plan.append((req, count))
            left -= count
        while left > 0 and self.waiting and self._fits(self.waiting[0]):
            req = self.waiting.pop(0)
            self.running.append(req)
            self.reserved[req.rid] = blocks_for(req.prompt_len + req.max_tokens, self.block_size)
            count = min(req.known - req.computed, left)
            plan.append((req, count))
            left -= count
        return [(r.rid, r.computed, n, r.computed + n == r.known) for r, n in plan]

    def _fits(self, req: Request) -> bool:
        need = blocks_for(req.prompt_len + req.max_tokens, self.block_size)
        return len(self.running) < self.max_seqs and sum(self.reserved.values()) + need <= self.num_blocks

    def commit(self, plan) -> list[str]:
        """Advance the chunks; sampled rows get a token; returns the ids that finished."""
        by_id = {r.rid: r for r in self.running}
        finished = []
        for rid, start, count, samples in plan:
            req = by_id[rid]
            req.computed = start + count
            if samples:
                req.generated += 1
                if req.generated >= req.max_tokens:
                    finished.append(rid)
                    self.running.remove(req)
                    del self.reserved[rid]
        return finished


def check_plan(sched: ToyScheduler, plan) -> None:
    assert sum(count for _, _, count, _ in plan) <= sched.budget, "token budget exceeded"
    assert len(plan) <= sched.max_seqs, "more sequences than max_seqs"
    seen_prefill = False
    for rid, start, count, _ in plan:
        req = next(r for r in sched.running if r.rid == rid)
        is_decode = start >= req.prompt_len and count == 1
        assert not (is_decode and seen_prefill), "a decode was placed after a prefill chunk (decode-first broken)"
        seen_prefill |= not is_decode
        assert count >= 1 and start + count <= req.known, "a chunk runs past the tokens the sequence knows"
    assert sum(sched.reserved.values()) <= sched.num_blocks, "reservations exceed the pool"


def random_traffic(seed: int, steps: int = 300):
    rng = random.Random(seed)
    arrivals = {}
    for i in range(40):
        step = rng.randrange(steps // 2)
        arrivals.setdefault(step, []).append(Request(f"r{i}", rng.randint(1, 40), rng.randint(1, 12)))
    return arrivals


def run_toy(seed: int, budget=16, max_seqs=4, num_blocks=24, block_size=4, verbose=False, wrong=None):
    sched = ToyScheduler(budget, max_seqs, num_blocks, block_size, wrong=wrong)
    arrivals, plans = random_traffic(seed), []
    for step in range(400):
        for req in arrivals.get(step, []):
            sched.add(req)
        plan = sched.schedule()
        if plan:
            check_plan(sched, plan)
        plans.append(plan)
        done = sched.commit(plan)
        if verbose and plan and step < 12:
            print(f"step {step:3d}: " + ", ".join(f"{rid}[{s}:{s + n}]{'*' if smp else ''}" for rid, s, n, smp in plan)
                  + (f"   finished {done}" if done else ""))
        if not sched.waiting and not sched.running and step > max(arrivals):
            break
    assert not sched.waiting and not sched.running, "requests left behind (starvation or leak)"
    return plans


def run_reference(seed: int, budget=16, max_seqs=4, num_blocks=24, block_size=4):
    from reference_engine.sampling_params import SamplingParams
    from reference_engine.scheduler import Scheduler
    from reference_engine.sequence import Sequence

    sched = Scheduler(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=10_000,
                      num_blocks=num_blocks, block_size=block_size)
    arrivals, plans = random_traffic(seed), []
    for step in range(400):
        for req in arrivals.get(step, []):
            sched.add(Sequence(req.rid, tuple(range(1, req.prompt_len + 1)), SamplingParams(max_tokens=req.max_tokens), seed=0))
        out = sched.schedule()
        sched.commit(out)
        plan = []
        for chunk in out.chunks:
            plan.append((chunk.request_id, chunk.start, len(chunk.token_ids), chunk.samples))
            if chunk.samples:
                seq = sched.get(chunk.request_id)
                seq.output_token_ids.append(5)
                if seq.stop_reason_after(5, ()) is not None:
                    sched.finish(seq, "length")
        plans.append(plan)
        if not sched.has_unfinished() and step > max(arrivals):
            break
    return plans


if __name__ == "__main__":
    print("trace (rid[start:end], * = row is sampled):")
    run_toy(0, verbose=True)
    for seed in range(20):
        run_toy(seed)
    print("invariants hold on 20 random traffic patterns (budget, decode-first, reservations, no starvation)")
    caught = 0
    for seed in range(20):
        try:
            run_toy(seed, wrong="prefill-first")
        except AssertionError:
            caught += 1
    assert caught > 0, "the decode-first check never fires on a prefill-first scheduler"
    print(f"known-wrong prefill-first scheduler caught on {caught}/20 patterns")
    try:
        import reference_engine  # noqa: F401
    except ImportError:
        print("reference_engine not importable: comparison skipped")
    else:
        for seed in range(20):
            toy, ref = run_toy(seed), run_reference(seed)
            assert toy == ref, f"seed {seed}: plans differ at step {next(i for i, (a, b) in enumerate(zip(toy, ref)) if a != b)}"
        print("reference_engine.scheduler.Scheduler produces identical plans on the same 20 patterns")
