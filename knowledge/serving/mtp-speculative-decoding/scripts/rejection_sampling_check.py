"""Speculative sampling keeps the target distribution: an exact check, a Monte Carlo template, known-wrong rules.

A toy "target" p(. | prefix) and "draft" q(. | prefix) over a 4-token vocabulary are fixed
functions of the prefix. One speculative step drafts k tokens from q, then for i = 1..k accepts
x_i with probability min(1, p(x_i) / q(x_i)); at the first rejection it emits a token from
norm(max(0, p - q)) and stops; if all k are accepted it emits a bonus token from p
(Leviathan et al. 2211.17192, Chen et al. 2302.01318).

1. Exact: enumerating every branch, the distribution of the first k + 1 generated tokens equals
   p(y1 | s) p(y2 | s, y1) ... to float64 rounding, for k = 1..3; known-wrong rules (resample from p
   instead of the residual, residual max(0, q - p), accept only the target's argmax, bonus token
   drawn from the draft) are off by far more. (Skipping the bonus token wastes a token but does
   not bias the distribution.)
2. Greedy target (p one-hot at its argmax): the emitted tokens are the greedy continuation with
   probability 1.
3. Monte Carlo: `speculative_step` (uniform random numbers, as a kernel would use them) over
   40,000 seeded runs; total-variation distance to the exact joint under a bound derived as in
   the sampler skill.
Run: python rejection_sampling_check.py   (a few seconds on a CPU)
"""

from __future__ import annotations

import functools
import math
import random

import numpy as np

VOCAB = 4


@functools.cache
def _dist(prefix: tuple[int, ...], salt: int, sharpness: float) -> np.ndarray:
    rng = np.random.default_rng(abs(hash((prefix, salt))) % 2**32)
    logits = rng.normal(size=VOCAB) * sharpness
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def target(prefix):  # p(. | prefix)
    return _dist(prefix, 1, 1.5)


@functools.cache
def draft(prefix):  # q(. | prefix): a different, imperfect model
    return _dist(prefix, 2, 1.0) * 0.5 + target(prefix) * 0.5


@functools.cache
def greedy_target(prefix):
    one_hot = np.zeros(VOCAB)
    one_hot[int(np.argmax(target(prefix)))] = 1.0
    return one_hot


def residual(p, q, wrong=None):
    if wrong == "resample-from-p":
        return p
    r = np.maximum(0.0, q - p) if wrong == "residual-q-minus-p" else np.maximum(0.0, p - q)
    return r / r.sum() if r.sum() > 0 else p


def step_outcomes(prefix, k, p_fn, wrong=None):
    """Every (emitted tokens, probability) of one speculative step with k drafts, exactly."""
    out = []

    def walk(ctx, emitted, prob, i):
        p, q = p_fn(ctx), draft(ctx)
        if i == k:  # all drafts accepted: bonus token from the target
            bonus = q if wrong == "bonus-from-draft" else p
            for y in range(VOCAB):
                if bonus[y] > 0:
                    out.append((emitted + (y,), prob * bonus[y]))
            return
        for x in range(VOCAB):
            if q[x] == 0:
                continue
            accept = (1.0 if x == int(np.argmax(p)) else 0.0) if wrong == "accept-argmax-only" else min(1.0, p[x] / q[x])
            if accept > 0:
                walk(ctx + (x,), emitted + (x,), prob * q[x] * accept, i + 1)
            if accept < 1:
                r = residual(p, q, wrong)
                for y in range(VOCAB):
                    if r[y] > 0:
                        out.append((emitted + (y,), prob * q[x] * (1 - accept) * r[y]))

    walk(prefix, (), 1.0, 0)
    return out


def first_tokens(prefix, k, n, p_fn, wrong=None):
    """Exact distribution of the first n generated tokens (steps repeat until n exist), shape [VOCAB] * n."""
    dist = np.zeros((VOCAB,) * n)

    def run(ctx, generated, prob):
        for emitted, q in step_outcomes(ctx, k, p_fn, wrong):
            tokens = generated + emitted
            if len(tokens) >= n:
                dist[tokens[:n]] += prob * q
            elif tokens:
                run(ctx + emitted, tokens, prob * q)

    run(prefix, (), 1.0)
    return dist


def exact_joint(prefix, n, p_fn):
    """p(y1 | s) p(y2 | s, y1) ... p(yn | ...), shape [VOCAB] * n."""
    if n == 0:
        return np.array(1.0)
    p = p_fn(prefix)
    return np.stack([p[a] * exact_joint(prefix + (a,), n - 1, p_fn) for a in range(VOCAB)])


def speculative_step(prefix, k, rng: random.Random):
    """A reference implementation with uniform random numbers; returns the emitted tokens."""
    def draw(probs):
        return min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), VOCAB - 1)  # inverse CDF

    ctx, drafts = prefix, []
    for _ in range(k):
        x = draw(draft(ctx))
        drafts.append(x)
        ctx = ctx + (x,)
    ctx, emitted = prefix, []
    for x in drafts:
        p, q = target(ctx), draft(ctx)
        if rng.random() * q[x] <= p[x]:  # u < p/q without dividing; accepts surely when p >= q
            emitted.append(x)
            ctx = ctx + (x,)
        else:
            emitted.append(draw(residual(p, q)))
            return emitted
    emitted.append(draw(target(ctx)))
    return emitted


def main() -> None:
    prefix = (3, 1)
    for k in (1, 2, 3):
        n = k + 1  # long enough to see the bonus token of a fully accepted step
        err = np.abs(first_tokens(prefix, k, n, target) - exact_joint(prefix, n, target)).max()
        assert err < 1e-12, f"k={k}: speculative sampling changed the distribution by {err}"
        print(f"k={k}: exact joint of the first {n} tokens equals the target's (max error {err:.1e})")
        for wrong in ("resample-from-p", "residual-q-minus-p", "accept-argmax-only", "bonus-from-draft"):
            err_wrong = np.abs(first_tokens(prefix, k, n, target, wrong) - exact_joint(prefix, n, target)).max()
            assert err_wrong > 1e-3, f"the check does not see the known-wrong rule {wrong}"
            print(f"    known-wrong {wrong:<20} off by {err_wrong:.3f}")
    greedy = first_tokens(prefix, 3, 4, greedy_target)
    assert abs(greedy.max() - 1.0) < 1e-12 and greedy.argmax() == exact_joint(prefix, 4, greedy_target).argmax()
    print("greedy target: the emitted tokens are the greedy continuation with probability 1")
    rng, counts, runs, k = random.Random(0), np.zeros((VOCAB, VOCAB)), 40_000, 2
    for _ in range(runs):
        tokens = speculative_step(prefix, k, rng)
        if len(tokens) < 2:
            tokens = tokens + speculative_step(prefix + tuple(tokens), k, rng)
        counts[tokens[0], tokens[1]] += 1
    expected = exact_joint(prefix, 2, target)
    tv = 0.5 * np.abs(counts / runs - expected).sum()
    support = int((expected > 0).sum())
    bound = 0.5 * math.sqrt((support - 1) / runs) + math.sqrt(math.log(1 / 1e-6) / (2 * runs))
    assert tv <= bound, f"Monte Carlo TV {tv:.4f} above {bound:.4f}"
    print(f"Monte Carlo ({runs} runs, k={k}): TV {tv:.4f} <= bound {bound:.4f}")


if __name__ == "__main__":
    main()
