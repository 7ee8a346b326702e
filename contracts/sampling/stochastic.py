"""Executable half of sampling/stochastic: exact filtered distributions in float64 and the statistical driver `run`.

Row kinds cycle with the row index: 0 greedy; 1 low temperature only; 2 top-k only (a tie at the
k boundary); 3 top-p only; 4 top-k then top-p (a tie at the k boundary); 5 top_k >= V (disabled)
and high temperature; 6 tiny top-p (a degenerate one-token set).
"""

from __future__ import annotations

import math

import numpy as np
import torch

MARGIN = 1e-4  # top_p is kept this far from every cumulative mass (inside the step of a heavy token)
FAILURE_PROBABILITY = 1e-6


def _order(values: np.ndarray) -> np.ndarray:
    """Token ids by value descending, ties by lower id first."""
    return np.lexsort((np.arange(values.shape[0]), -values))


def _top_k_masses(row: np.ndarray, temperature: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids kept by top-k in order, their renormalised probabilities) in float64."""
    scaled = row / temperature
    order = _order(scaled)
    if 0 < top_k < row.shape[0]:
        order = order[:top_k]
    kept = scaled[order]
    weights = np.exp(kept - kept.max())
    return order, weights / weights.sum()


def filtered_distribution(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The exact distribution one row must be drawn from, float64 [V]."""
    probabilities = np.zeros(row.shape[0], dtype=np.float64)
    if temperature == 0:
        probabilities[int(np.flatnonzero(row == row.max())[0])] = 1.0
        return probabilities
    order, masses = _top_k_masses(row, temperature, top_k)
    if top_p < 1:
        # masses are sorted descending already (ties keep the lower id first): smallest prefix reaching top_p
        before = np.concatenate([[0.0], np.cumsum(masses)[:-1]])
        count = max(1, int((before < top_p).sum()))
        order, masses = order[:count], masses[:count]
    probabilities[order] = masses / masses.sum()
    return probabilities


def _safe_top_p(row: np.ndarray, temperature: float, top_k: int, generator: torch.Generator, kind: int) -> float:
    """A top_p inside the step of one of the first (heavy) tokens, at least MARGIN from every cumulative mass.

    For rows with both filters (kind 4) the step is also chosen so that top-p applied BEFORE top-k
    (on the unrenormalised distribution) would keep more tokens: the order of the filters shows.
    """
    _, masses = _top_k_masses(row, temperature, top_k)
    cumulative = np.concatenate([[0.0], np.cumsum(masses)])
    low = cumulative[:-1].copy()  # lower end of each token's step
    if kind == 4:
        _, full = _top_k_masses(row, temperature, 0)
        low = np.maximum(low, np.cumsum(full)[: len(masses)])  # above the full-distribution mass of the same prefix
    candidates = [j for j in range(min(len(masses), 8)) if cumulative[j + 1] - low[j] >= 10 * MARGIN]
    if kind == 4:
        candidates = [j for j in candidates if j + 1 < len(masses)]
    if kind == 6 or not candidates:
        candidates = [0]
    for _ in range(50):
        j = candidates[int(torch.randint(0, len(candidates), (1,), generator=generator))]
        fraction = 0.25 + 0.5 * float(torch.rand(1, generator=generator, dtype=torch.float64))
        value = float(np.float32(low[j] + fraction * (cumulative[j + 1] - low[j])))
        if np.abs(cumulative[1:] - value).min() >= MARGIN and 0 < value < 1:
            return value
    raise AssertionError("could not place top_p away from the cumulative masses; pick another seed")


def make_inputs(axes, params, dtype, device, generator):
    rows, vocab = axes["B"], axes["V"]
    logits = torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * 1.5
    head = min(8, max(1, vocab // 2))
    for row in range(rows):  # a few favoured tokens, so top-p sets stay small at any vocabulary size
        favoured = torch.randperm(vocab, generator=generator)[:head]
        logits[row, favoured] += math.log(vocab) + torch.randn(head, generator=generator, dtype=torch.float64)
    logits = logits.to(dtype).double()
    uniform = lambda low, high: float(low + (high - low) * torch.rand(1, generator=generator, dtype=torch.float64))  # noqa: E731
    temperature, top_k, top_p = [], [], []
    for row in range(rows):
        kind = row % 7
        t, k, p = uniform(0.6, 1.4), int(torch.randint(-3, 1, (1,), generator=generator)), 1.0
        if kind == 0:
            t, k, p = 0.0, int(torch.randint(1, vocab, (1,), generator=generator)), uniform(0.1, 0.9)
        elif kind == 1:
            t = uniform(0.35, 0.6)
        elif kind in (2, 4):
            k = int(torch.randint(2, max(3, min(vocab - 1, 9 if kind == 2 else 11)), (1,), generator=generator))
            order = _order(logits[row].numpy())
            logits[row, int(order[k])] = logits[row, int(order[k - 1])]  # a tie across the top-k boundary
            p = 0.5 if kind == 4 else 1.0  # placed by _safe_top_p
        elif kind == 3:
            p = 0.5  # placed by _safe_top_p
        elif kind == 5:
            t, k = uniform(2.0, 3.0), vocab + int(torch.randint(0, 3, (1,), generator=generator))
        else:
            t, p = uniform(0.5, 0.8), 0.02
        if kind != 0 and p < 1:
            p = _safe_top_p(logits[row].numpy(), float(np.float32(t)), k, generator, kind)
        temperature.append(t)
        top_k.append(k)
        top_p.append(p)
    batch = {
        "logits": logits.to(dtype),
        "temperature": torch.tensor(temperature, dtype=torch.float32),
        "top_k": torch.tensor(top_k, dtype=torch.int32),
        "top_p": torch.tensor(top_p, dtype=torch.float32),
        "seeds": torch.randint(0, 2**62, (rows,), generator=generator, dtype=torch.int64),
    }
    return {name: tensor.to(device) for name, tensor in batch.items()}


def reference(logits, temperature, top_k, top_p, seeds):
    """The exact filtered distribution of every row, float64 [B, V] (a sample cannot be compared exactly)."""
    values = logits.double().cpu().numpy()
    rows = [
        filtered_distribution(values[row], float(temperature[row]), int(top_k[row]), float(top_p[row]))
        for row in range(values.shape[0])
    ]
    return {"probabilities": torch.from_numpy(np.stack(rows))}


def _call(impl, batch, fill):
    out = torch.full((batch["logits"].shape[0],), fill, dtype=torch.int64, device=batch["logits"].device)
    impl(**batch, out=out)
    return out.cpu()


def run(impl, axes, params, dtype, device, generator):
    inputs = make_inputs(axes, params, dtype, device, generator)
    rows, vocab, draws = axes["B"], axes["V"], axes["N"]
    exact = reference(**inputs)["probabilities"]  # [B, V]
    batch = {name: tensor.repeat_interleave(draws, dim=0) for name, tensor in inputs.items() if name != "seeds"}
    base = int(torch.randint(0, 2**40, (1,), generator=generator))
    batch["seeds"] = (base + 7919 * torch.arange(rows * draws, dtype=torch.int64)).to(device)  # distinct seeds
    tokens = _call(impl, batch, -1)
    if bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise AssertionError(f"token ids outside [0, {vocab}) (unwritten or invalid): {tokens[(tokens < 0) | (tokens >= vocab)][:5].tolist()}")
    per_row = tokens.view(rows, draws)
    worst, checked = 0.0, 0
    for row in range(rows):
        allowed = exact[row] > 0
        drawn = per_row[row]
        outside = drawn[~allowed[drawn]]
        if outside.numel():
            raise AssertionError(
                f"row {row} (temperature {float(inputs['temperature'][row]):.3g}, top_k {int(inputs['top_k'][row])}, "
                f"top_p {float(inputs['top_p'][row]):.4g}) drew tokens outside the allowed set: {outside[:5].tolist()}"
            )
        size = int(allowed.sum())
        bound = 0.5 * math.sqrt(size / draws) + math.sqrt(math.log(2 * rows / FAILURE_PROBABILITY) / (2 * draws))
        if bound >= 0.5:
            continue
        empirical = torch.bincount(drawn, minlength=vocab).double() / draws
        distance = 0.5 * float((empirical - exact[row]).abs().sum())
        checked += 1
        worst = max(worst, distance)
        if distance > bound:
            raise AssertionError(f"row {row}: total variation distance {distance:.4f} from the exact distribution exceeds {bound:.4f} ({draws} draws, {size} allowed tokens)")
    again = _call(impl, batch, 2**40)
    if not torch.equal(again, tokens):
        raise AssertionError(f"not reproducible: a second call with the same seeds changed {int((again != tokens).sum())} of {tokens.numel()} tokens")
    permutation = torch.randperm(rows * draws, generator=generator)
    shuffled = {name: tensor[permutation.to(tensor.device)] for name, tensor in batch.items()}
    moved = _call(impl, shuffled, -1)
    if not torch.equal(moved, tokens[permutation]):
        raise AssertionError(f"a row's token depends on its place in the batch: {int((moved != tokens[permutation]).sum())} tokens changed when rows were permuted")
    return {"max_abs_error": worst, "message": f"{rows} rows x {draws} draws; worst total variation {worst:.4f} over {checked} rows checked"}


def _with_out(inputs):
    """Error cases call the implementation directly; a custom contract's harness allocates no outputs, so add `out`."""
    inputs["out"] = torch.full((inputs["logits"].shape[0],), -1, dtype=torch.int64, device=inputs["logits"].device)
    return inputs


def top_p_zero(inputs, params):
    inputs["top_p"] = inputs["top_p"].clone()
    inputs["top_p"][1] = 0.0
    _with_out(inputs)
    return inputs, params


def top_p_above_one(inputs, params):
    inputs["top_p"] = inputs["top_p"].clone()
    inputs["top_p"][3] = 1.5
    _with_out(inputs)
    return inputs, params


def temperature_negative(inputs, params):
    inputs["temperature"] = inputs["temperature"].clone()
    inputs["temperature"][2] = -0.5
    _with_out(inputs)
    return inputs, params


def seeds_int32(inputs, params):
    inputs["seeds"] = (inputs["seeds"] % 1000).to(torch.int32)
    _with_out(inputs)
    return inputs, params


def top_k_short(inputs, params):
    inputs["top_k"] = inputs["top_k"][:-1].clone()
    _with_out(inputs)
    return inputs, params
