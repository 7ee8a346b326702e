"""Triton causal conv1d + SiLU (prefill) against the torch op, the contract's float64 reference and the contract.

One interpreter subprocess runs the contract's CPU cases (the kernel, and three known-wrong wrappers
from wrong_kernels.py that the contract must reject), then a script that compares the kernel with the
torch op `ops.linear_attention.causal_conv1d` and the contract's float64 reference on ragged batches
(sequences of length 0, 1, shorter than K-1, longer than a token block; several channel blocks;
non-zero initial states; outputs poisoned with NaN; final_state aliasing initial_state; strided x and
out), and two known-wrong variants of the kernel source on the same data.
"""

from __future__ import annotations

import json

import pytest
import torch
from kernel_interpreter import assert_all_passed, interpreter_run

CONTRACT = "linear-attention/causal-conv1d"
IMPL = "reference_engine.kernels.causal_conv1d:causal_conv1d"
CPU_CASES = [
    "small-f32", "small-bf16", "all-length-one-f32", "one-long-sequence-bf16", "kernel-three-f32", "real-width-bf16",
    "weight-channel-mismatch", "weight-dtype-mismatch", "state-width-mismatch", "state-batch-mismatch",
    "cu-seqlens-wrong-end", "cu-seqlens-decreasing", "cu-seqlens-int64",
]  # fmt: skip
WRONG = ["conv_taps_reversed", "conv_initial_state_ignored", "conv_final_state_from_outputs"]
WRONG_CASES = ["small-f32", "all-length-one-f32"]
F32_BOUND = 1e-6  # rel_fro, float32 kernel vs the torch op and vs float64 (measured about 2e-8)
BF16_OUT_BOUND = 5e-3  # rel_fro, bf16 output (both round the float32 result once; measured 0 against the torch op)
WRONG_MIN_ERROR = 1e-2  # each known-wrong source variant must be off by at least this (rel_fro of out)

# Known-wrong variants of the kernel source: (text in the kernel, its replacement). Both must stay in sync with the kernel.
WRONG_VARIANTS = {
    "boundary_token_in_previous_sequence": (  # the binary search puts a sequence's first token in the sequence before
        "below = tl.load(cu_ptr + mid) <= tokens", "below = tl.load(cu_ptr + mid) < tokens"),
    "silu_missing": ("y = tl.math.div_rn(acc, 1.0 + e)", "y = acc"),
    "pool_state_read_without_has": ("from_state = (rel < 0) & token_ok & token_has", "from_state = (rel < 0) & token_ok"),
    "inputs_only_branch_one_token_early": (  # a tile starting at position K-2 skips the initial state (reads the sequence before)
        "position, K - 1), axis=0) >= K - 1:", "position, K - 1), axis=0) >= K - 2:"),
}

SCRIPT = r"""
import itertools, json
import wrong_source
import torch
from contracts_ref import reference
from reference_engine.kernels import causal_conv1d as kernel_module
from reference_engine.ops.linear_attention import causal_conv1d as torch_op

WRONG_VARIANTS = __WRONG__

def wrong_module(name, old, new):
    return wrong_source.wrong_module(kernel_module, name, old, new)

def rel(a, b):
    den = b.double().norm().item()
    return ((a.double() - b.double()).norm() / den).item() if den > 0 else (a.double() - b.double()).norm().item()

def inputs(lengths, channels, kernel, dtype, seed, strided=False):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    x = torch.randn(tokens, channels + (12 if strided else 0), generator=gen).to(dtype)
    x = x[:, 5 : 5 + channels] if strided else x  # row stride C + 12, column offset 5
    weight = (0.6 * torch.randn(channels, kernel, generator=gen)).to(dtype)
    state = torch.randn(len(lengths), channels, kernel - 1, generator=gen).to(dtype)
    return x, weight, cu, state

def float64_reference(x, weight, cu, state):
    # The contract's reference per sequence; an empty sequence (which its unfold does not take) keeps its state.
    out, final = torch.empty(x.shape, dtype=torch.float64), state.clone()
    for b, (start, end) in enumerate(itertools.pairwise(cu.tolist())):
        if end > start:
            one = reference(x[start:end], weight, torch.tensor([0, end - start], dtype=torch.int32), state[b : b + 1])
            out[start:end], final[b] = one["out"], one["final_state"][0]
    return {"out": out, "final_state": final}

def run(module, args, in_place=False, strided=False):
    x, weight, cu, state = args
    out_full = torch.full((x.shape[0], x.shape[1] + (7 if strided else 0)), float("nan"), dtype=x.dtype)
    out = out_full[:, 3 : 3 + x.shape[1]] if strided else out_full
    if in_place:
        final = state.clone()
        module.causal_conv1d(x, weight, cu, final, out, final)
    else:
        final = torch.full_like(state, float("nan"))
        module.causal_conv1d(x, weight, cu, state, out, final)
    outside = int((~out_full.isnan()).sum() - (~out.isnan()).sum()) if strided else 0  # written outside `out`
    return out, final, outside

def measure(lengths, channels, kernel, dtype, seed, in_place=False, strided=False):
    args = inputs(lengths, channels, kernel, dtype, seed, strided)
    x, weight, cu, state = args
    out, final, outside = run(kernel_module, args, in_place, strided)
    ref_out, ref_final = torch.empty(x.shape, dtype=dtype), torch.empty_like(state)
    torch_op(x, weight, cu, state, ref_out, ref_final)
    exact = float64_reference(x, weight, cu, state)
    return {
        "unwritten": int(out.isnan().sum() + final.isnan().sum()), "outside": outside,
        "out_vs_torch": rel(out, ref_out), "out_vs_float64": rel(out, exact["out"]),
        "out_differs_from_torch": int((out != ref_out).sum()), "elements": out.numel(),
        "state_equal_torch": bool(torch.equal(final, ref_final)), "state_equal_float64_ref": bool(torch.equal(final, exact["final_state"])),
    }

RAGGED = [1, 2, 5, 40]  # 1 and 2 shorter than K-1 = 3; 40 spans two token blocks of 32
result = {"cases": {}, "wrong": {}}
result["cases"]["ragged-f32"] = measure(RAGGED, 200, 4, torch.float32, 1)  # 2 channel blocks, the second partial
result["cases"]["ragged-bf16"] = measure(RAGGED, 200, 4, torch.bfloat16, 2)
result["cases"]["empty-sequences-in-place-bf16"] = measure([0, 2, 0, 37, 1, 0], 72, 4, torch.bfloat16, 3, in_place=True)
result["cases"]["nine-sequences-f32"] = measure([3, 1, 0, 2, 33, 1, 1, 64, 5], 40, 4, torch.float32, 4)  # 4 search steps
result["cases"]["kernel-three-f32"] = measure([1, 6, 10], 24, 3, torch.float32, 5)
result["cases"]["kernel-two-bf16"] = measure([1, 4, 2], 24, 2, torch.bfloat16, 6)
result["cases"]["one-long-f32"] = measure([100], 136, 4, torch.float32, 7)
result["cases"]["strided-f32"] = measure([2, 30], 48, 4, torch.float32, 8, strided=True)
result["cases"]["no-tokens-in-place-bf16"] = measure([0, 0], 16, 4, torch.bfloat16, 9, in_place=True)
# token blocks of 32: the block at token 64 starts at position 2 (initial-state branch) or 3 (inputs-only branch) of a sequence
AT_POSITION_2, AT_POSITION_3 = RAGGED + [14, 40], RAGGED + [13, 40]
result["cases"]["block-at-position-2-f32"] = measure(AT_POSITION_2, 40, 4, torch.float32, 10)
result["cases"]["block-at-position-3-f32"] = measure(AT_POSITION_3, 40, 4, torch.float32, 11)

# the model's prefill form: states as rows of a pool (slots, has_initial_state), padding after valid_tokens
def pooled(lengths, slots, has, valid=None, seed=12, channels=40, module=kernel_module):
    x, weight, cu, state = inputs(lengths, channels, 4, torch.float32, seed)
    pool = torch.full((5, channels, 3), float("nan"))  # unused rows stay NaN; used rows hold states
    pool[slots] = state
    given = torch.where(torch.tensor(has)[:, None, None], state, torch.zeros_like(state))  # what the sequences start from
    real_cu = cu.clone()
    if valid is not None:  # one sequence whose rows from `valid` on are padding: the reference sees the valid prefix only
        real_cu = torch.tensor([0, valid], dtype=torch.int32)
    ref_out, ref_final = torch.empty(x.shape), torch.empty_like(state)
    torch_op(x[: real_cu[-1]], weight, real_cu, given, ref_out[: real_cu[-1]], ref_final)
    out = torch.full(x.shape, float("nan"))
    extra = {} if valid is None else {"valid_tokens": torch.tensor([valid])}
    module.causal_conv1d(x, weight, cu, pool, out, pool, state_slots=torch.tensor(slots), has_initial_state=torch.tensor(has), **extra)
    untouched = [r for r in range(5) if r not in slots]
    return {"out_vs_torch": rel(out[: real_cu[-1]], ref_out[: real_cu[-1]]), "state_vs_torch": rel(pool[slots], ref_final),
            "unused_rows_untouched": bool(pool[untouched].isnan().all()), "unwritten": int(out[: real_cu[-1]].isnan().sum())}
result["pool"] = {
    "two-sequences": pooled([2, 37], [3, 1], [True, False]),  # the second starts from zeros, not its row
    "short-first-fresh": pooled([1, 9], [0, 4], [False, True]),  # a sequence shorter than K-1: its final state mixes zeros in
    "valid-30-of-64": pooled([64], [2], [False], valid=30),
    "valid-2-of-32": pooled([32], [2], [True], valid=2),  # fewer valid inputs than K-1: the final state keeps state entries
}

args = inputs(AT_POSITION_2, 200, 4, torch.float32, 1)
ref_out, ref_final = torch.empty(args[0].shape), torch.empty_like(args[3])
torch_op(*args, ref_out, ref_final)
for name, (old, new) in WRONG_VARIANTS.items():
    if name.startswith("pool_"):  # a pooled-state variant: measured on the pooled case it would break
        errors = pooled([2, 37], [3, 1], [True, False], module=wrong_module(name, old, new))
        result["wrong"][name] = {"out_vs_torch": max(errors["out_vs_torch"], errors["state_vs_torch"])}
        continue
    out, final, _ = run(wrong_module(name, old, new), args)
    result["wrong"][name] = {"out_vs_torch": rel(out, ref_out), "state_equal_torch": bool(torch.equal(final, ref_final))}
print("RESULT" + json.dumps(result))
print("ok")
"""

CONTRACT_REFERENCE = "import importlib.util, sys\n" + (
    "spec = importlib.util.spec_from_file_location('contracts_ref', 'contracts/linear-attention/causal-conv1d.py')\n"
    "contracts_ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(contracts_ref); sys.modules['contracts_ref'] = contracts_ref\n"
)


@pytest.fixture(scope="module")
def run():
    script = CONTRACT_REFERENCE + SCRIPT.replace("__WRONG__", repr(WRONG_VARIANTS))
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, script)


@pytest.fixture(scope="module")
def measured(run):
    script = run["script"]
    assert script is not None and script["ok"], script
    marker = script["output"].rfind("RESULT")
    assert marker >= 0, script["output"]
    return json.loads(script["output"][marker + len("RESULT") :].splitlines()[0])


def _records(run):
    return {key.split("|", 1)[1]: value for key, value in run["records"].items()}


def test_contract_cpu_cases_pass_under_the_interpreter(run):
    assert_all_passed(_records(run)[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(run, wrong):
    found = _records(run)[f"wrong_kernels:{wrong}"]
    assert sorted(r["case"] for r in found) == sorted(WRONG_CASES)
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r.get("message")) for r in found]


@pytest.mark.parametrize("case", ["ragged-f32", "nine-sequences-f32", "kernel-three-f32", "one-long-f32", "strided-f32",
                                  "block-at-position-2-f32", "block-at-position-3-f32"])
def test_float32_matches_the_torch_op_and_float64(measured, case):
    errors = measured["cases"][case]
    assert errors["unwritten"] == 0 and errors["outside"] == 0, errors
    assert errors["out_vs_torch"] < F32_BOUND and errors["out_vs_float64"] < F32_BOUND, errors
    assert errors["state_equal_torch"] and errors["state_equal_float64_ref"], errors


@pytest.mark.parametrize("case", ["ragged-bf16", "empty-sequences-in-place-bf16", "kernel-two-bf16"])
def test_bfloat16_matches_the_torch_op(measured, case):
    errors = measured["cases"][case]
    assert errors["unwritten"] == 0, errors
    assert errors["out_vs_torch"] < BF16_OUT_BOUND and errors["out_vs_float64"] < BF16_OUT_BOUND, errors
    assert errors["out_differs_from_torch"] <= errors["elements"] // 1000, errors  # same float32 value rounded once: (nearly) all equal
    assert errors["state_equal_torch"] and errors["state_equal_float64_ref"], errors


def test_no_tokens_returns_the_initial_state(measured):
    errors = measured["cases"]["no-tokens-in-place-bf16"]
    assert errors["unwritten"] == 0 and errors["state_equal_torch"] and errors["state_equal_float64_ref"], errors


@pytest.mark.parametrize("case", ["two-sequences", "short-first-fresh", "valid-30-of-64", "valid-2-of-32"])
def test_pooled_states_and_padding_match_the_torch_op(measured, case):
    errors = measured["pool"][case]
    assert errors["unwritten"] == 0 and errors["unused_rows_untouched"], errors
    assert errors["out_vs_torch"] < F32_BOUND and errors["state_vs_torch"] < F32_BOUND, errors


@pytest.mark.parametrize("wrong", sorted(WRONG_VARIANTS))
def test_the_comparison_rejects_a_known_wrong_kernel_source(measured, wrong):
    errors = measured["wrong"][wrong]
    assert errors["out_vs_torch"] > WRONG_MIN_ERROR, errors
    assert errors["out_vs_torch"] > 1000 * F32_BOUND, errors


@pytest.mark.cuda
@pytest.mark.parametrize(("lengths", "in_place"), [([1024], False), ([1, 2, 255, 766], False), ([1, 2, 255, 766], True), ([3, 0, 1021], False)])
def test_matches_the_torch_op_on_cuda_at_the_real_shape(lengths, in_place):
    from reference_engine.kernels.causal_conv1d import causal_conv1d
    from reference_engine.ops.linear_attention import causal_conv1d as torch_op

    channels, kernel = 8192, 4
    generator = torch.Generator(device="cuda").manual_seed(len(lengths))
    tokens, batch = sum(lengths), len(lengths)
    x = torch.randn(tokens, channels, generator=generator, device="cuda").bfloat16()
    weight = (0.6 * torch.randn(channels, kernel, generator=generator, device="cuda")).bfloat16()
    state = torch.randn(batch, channels, kernel - 1, generator=generator, device="cuda").bfloat16()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    expected_out, expected_state = torch.empty_like(x), torch.empty_like(state)
    torch_op(x, weight, cu, state, expected_out, expected_state)
    out = torch.full_like(x, float("nan"))
    if in_place:
        final = state.clone()
        causal_conv1d(x, weight, cu, final, out, final)
    else:
        final = torch.full_like(state, float("nan"))
        causal_conv1d(x, weight, cu, state, out, final)
    torch.cuda.synchronize()
    assert not out.isnan().any() and not final.isnan().any()
    assert torch.equal(final, expected_state)
    error = ((out.double() - expected_out.double()).norm() / expected_out.double().norm()).item()
    assert error < BF16_OUT_BOUND, error
    assert (out != expected_out).sum().item() <= out.numel() // 1000  # SiLU's exp may differ by an ulp: rare bf16 flips only
