"""Implementations of the fixture contracts (tests/toolbox/fixtures/contracts/demo): one correct per contract,
and known-wrong ones, each of which the harness must give one exact status."""

from __future__ import annotations

import os
import time

import torch


def _check(x, y, ids):
    if x.shape != y.shape or x.shape != ids.shape:
        raise ValueError(f"x, y and ids must have one shape; got {tuple(x.shape)}, {tuple(y.shape)}, {tuple(ids.shape)}")


# ---- demo/axpby -------------------------------------------------------------------------------
def axpby(x, y, ids, out, ids_out, alpha, beta):
    _check(x, y, ids)
    out.copy_(alpha * x.float() + beta * y.float())
    ids_out.copy_(ids * 3 + 1)


def axpby_tiled_missing_last(x, y, ids, out, ids_out, alpha, beta, block=16):
    """Forgets the last tile of `out`."""
    n = x.shape[0]
    for start in range(0, n - block, block):
        out[start : start + block] = alpha * x[start : start + block].float() + beta * y[start : start + block].float()
    ids_out.copy_(ids * 3 + 1)


def axpby_skips_one_id(x, y, ids, out, ids_out, alpha, beta):
    """Never writes ids_out[5] (invisible to a single poison value that happens to match)."""
    out.copy_(alpha * x.float() + beta * y.float())
    ids_out[:5] = ids[:5] * 3 + 1
    ids_out[6:] = ids[6:] * 3 + 1


def axpby_wrong_id(x, y, ids, out, ids_out, alpha, beta):
    axpby(x, y, ids, out, ids_out, alpha, beta)
    ids_out[3] += 1


def axpby_resizes_out(x, y, ids, out, ids_out, alpha, beta):
    out.resize_(x.shape[0] // 2)
    out.copy_(alpha * x[: x.shape[0] // 2].float())
    ids_out.copy_(ids * 3 + 1)


def axpby_float64_out(x, y, ids, out, ids_out, alpha, beta):
    out.data = alpha * x.double() + beta * y.double()
    ids_out.copy_(ids * 3 + 1)


def axpby_returns_instead(x, y, ids, out, ids_out, alpha, beta):
    """Computes the result but returns it instead of writing the destinations."""
    return alpha * x + beta * y, ids * 3 + 1


def axpby_raises(x, y, ids, out, ids_out, alpha, beta):
    raise RuntimeError("kernel launch failed: too many resources requested")


def axpby_hangs(x, y, ids, out, ids_out, alpha, beta):
    time.sleep(600)


def axpby_exits(x, y, ids, out, ids_out, alpha, beta):
    os._exit(3)


def axpby_segfaults(x, y, ids, out, ids_out, alpha, beta):
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def axpby_nan(x, y, ids, out, ids_out, alpha, beta):
    axpby(x, y, ids, out, ids_out, alpha, beta)
    out[7] = float("nan")


def axpby_noisy(x, y, ids, out, ids_out, alpha, beta):
    """1% relative noise (deterministic per input): passes float32 bounds nowhere, bf16 bound 5e-3 neither."""
    exact = alpha * x.float() + beta * y.float()
    generator = torch.Generator(device=x.device).manual_seed(1234)
    noise = torch.randn(exact.shape, generator=generator, device=x.device)
    out.copy_(exact * (1 + 0.01 * noise))
    ids_out.copy_(ids * 3 + 1)


def axpby_mutates_x(x, y, ids, out, ids_out, alpha, beta):
    axpby(x, y, ids, out, ids_out, alpha, beta)
    x.mul_(2)


def axpby_no_check(x, y, ids, out, ids_out, alpha, beta):
    """Correct on valid inputs but does not validate: the error case must catch it."""
    n = min(x.shape[0], y.shape[0])
    out[:n] = alpha * x[:n].float() + beta * y[:n].float()
    ids_out.copy_(ids * 3 + 1)


def axpby_wrong_exception(x, y, ids, out, ids_out, alpha, beta):
    if x.shape != y.shape:
        raise KeyError("shapes")
    axpby(x, y, ids, out, ids_out, alpha, beta)


# ---- demo/softmax-inplace ---------------------------------------------------------------------
def softmax_inplace(x, temperature):
    x.copy_(torch.softmax(x / temperature[:, None], dim=-1))


def softmax_inplace_scaled(x, temperature):
    """Within the loose max_abs bound, but rows sum to 1.05: the invariant must catch it."""
    x.copy_(torch.softmax(x / temperature[:, None], dim=-1) * 1.05)


def softmax_inplace_reshapes(x, temperature):
    result = torch.softmax(x / temperature[:, None], dim=-1)
    x.resize_(result.numel())
    x.copy_(result.reshape(-1))


def softmax_not_in_place(x, temperature):
    """Computes the right values into a new tensor; x is left as it was."""
    return torch.softmax(x / temperature[:, None], dim=-1)


def softmax_mutates_temperature(x, temperature):
    temperature.fill_(1.0)
    x.copy_(torch.softmax(x, dim=-1))


# ---- demo/sort-custom -------------------------------------------------------------------------
def sort_values(x):
    return torch.sort(x).values


def sort_descending(x):
    return torch.sort(x, descending=True).values


def sort_raises(x):
    raise TypeError("sort() got an unexpected keyword")


# ---- demo/buggy -------------------------------------------------------------------------------
def double(x, out):
    out.copy_(x * 2)
