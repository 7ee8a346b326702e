"""Triton chunked Gated DeltaNet prefill against the torch op, the token-by-token recurrence and the contract.

One interpreter subprocess runs the contract's CPU cases and a script that compares the kernel with
(a) the torch chunked op and (b) `gdn_recurrent_decode` applied token by token (an independent
definition), on ragged batches with non-zero initial states and poisoned (NaN) outputs, and measures
two known-wrong variants of the kernel (its source with one deliberate mistake) on the same data.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from kernel_interpreter import assert_all_passed, interpreter_run

CONTRACT = "linear-attention/gdn-chunked-prefill"
IMPL = "reference_engine.kernels.gdn_chunked_prefill:gdn_chunked_prefill"
CPU_CASES = [
    "small-f32", "small-bf16", "all-length-one-bf16", "whole-chunks-f32", "real-heads-f32",  # real-heads-f32: Dk = Dv = 128, C = 64
    "hv-not-multiple-of-hk", "key-shape-mismatch", "qkv-dtype-mismatch", "g-not-float32", "state-not-float32",
    "state-wrong-shape", "cu-seqlens-wrong-end", "cu-seqlens-not-from-zero", "chunk-size-zero",
]
F32_BOUND = 1e-4  # rel_fro, float32 kernel vs float32 references (measured about 1e-7)
BF16_OUT_BOUND = 5e-3  # rel_fro, bf16 output vs the torch op's bf16 output (both round fp32 once)
WRONG_MIN_ERROR = 1e-2  # each known-wrong variant must be off by at least this (rel_fro) on the ragged case

# Each known-wrong variant: (text in the kernel source, its replacement). Both must stay in sync with the kernel.
WRONG_VARIANTS = {
    "no_decay_across_chunks": ("dtype=tl.float32) + tl.exp(c_last))", "dtype=tl.float32) + 1.0)"),  # S not decayed between chunks
    "beta_missing_in_state_keys": (  # W = T (k exp(c)) without beta
        "key_weights = k_scale_rows * beta * tl.exp(c)", "key_weights = k_scale_rows * tl.exp(c)"),
    "pool_has_initial_state_ignored": (  # a fresh sequence starts from its pool row instead of zeros
        "mask=lo_mask & has_state, other=0.0)", "mask=lo_mask, other=0.0)"),
    "blocked_inverse_series_short": (  # (I + N)^-1 without its N^3 term: tiny on random keys, large on repeated ones
        "return tl.dot(eye - n + n2 - n3, tb", "return tl.dot(eye - n + n2, tb"),
}

SCRIPT = r"""
import json
import wrong_source
import torch
from reference_engine.kernels import gdn_chunked_prefill as kernel_module
from reference_engine.ops.linear_attention import gdn_chunked_prefill as torch_op, gdn_recurrent_decode

WRONG_VARIANTS = __WRONG__

def wrong_module(name, old, new):
    return wrong_source.wrong_module(kernel_module, name, old, new)

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

def inputs(lengths, dtype, seed, hk=2, hv=4, dk=16, dv=16):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
    k = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
    v = torch.randn(tokens, hv, dv, generator=gen).to(dtype)
    g = -0.5 * torch.rand(tokens, hv, generator=gen) - 0.01  # log decay < 0, as from gdn-gates
    beta = 0.98 * torch.rand(tokens, hv, generator=gen) + 0.01
    state = torch.randn(len(lengths), hv, dk, dv, generator=gen)
    return q, k, v, g, beta, cu, state

def recurrent(q, k, v, g, beta, cu, state):
    # gdn_recurrent_decode one token at a time per sequence: the contract's definition, independent of chunks
    out = torch.empty(v.shape, dtype=torch.float32)
    final = state.clone()
    offsets = cu.tolist()
    for b in range(len(offsets) - 1):
        s = state[b : b + 1].clone()
        for t in range(offsets[b], offsets[b + 1]):
            o = torch.empty(1, v.shape[1], v.shape[2])
            nxt = torch.empty_like(s)
            gdn_recurrent_decode(q[t : t + 1].float(), k[t : t + 1].float(), v[t : t + 1].float(), g[t : t + 1], beta[t : t + 1], s, o, nxt)
            out[t], s = o[0], nxt
        final[b] = s[0]
    return out, final

def run(module, args, chunk, in_place=False):
    q, k, v, g, beta, cu, state = args
    out = torch.full(v.shape, float("nan"), dtype=v.dtype)
    if in_place:
        final = state.clone()
        module.gdn_chunked_prefill(q, k, v, g, beta, cu, final, out, final, chunk_size=chunk)
    else:
        final = torch.full_like(state, float("nan"))
        module.gdn_chunked_prefill(q, k, v, g, beta, cu, state, out, final, chunk_size=chunk)
    return out, final

def as_column_views(args):
    # q, k, v as the model passes them: column ranges of one wider [T, C] buffer (the conv output), row stride C
    q, k, v, *rest = args
    tokens = q.shape[0]
    wide = torch.full((tokens, q[0].numel() + k[0].numel() + v[0].numel() + 8), float("nan"), dtype=q.dtype)
    a, b = q[0].numel(), q[0].numel() + k[0].numel()
    wide[:, :a], wide[:, a:b], wide[:, b : b + v[0].numel()] = q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)
    views = wide[:, :a].view(q.shape), wide[:, a:b].view(k.shape), wide[:, b : b + v[0].numel()].view(v.shape)
    assert not any(view.is_contiguous() for view in views)
    return (*views, *rest)

def measure(name, lengths, dtype, chunk, seed, in_place=False, strided=False, **dims):
    args = inputs(lengths, dtype, seed, **dims)
    args = as_column_views(args) if strided else args
    q, k, v, g, beta, cu, state = args
    out, final = run(kernel_module, args, chunk, in_place)
    ref_out, ref_final = torch.empty_like(v), torch.empty_like(state)
    torch_op(q, k, v, g, beta, cu, state, ref_out, ref_final, chunk_size=chunk)
    rec_out, rec_final = recurrent(*args)
    return {
        "unwritten": int(out.isnan().sum() + final.isnan().sum()),
        "out_vs_torch": rel(out, ref_out), "state_vs_torch": rel(final, ref_final),
        "out_vs_recurrent": rel(out, rec_out), "state_vs_recurrent": rel(final, rec_final),
    }

RAGGED = [1, 5, 16, 17, 40]
result = {"cases": {}, "wrong": {}}
result["cases"]["ragged-f32-chunk16"] = measure("ragged", RAGGED, torch.float32, 16, 1)
result["cases"]["ragged-f32-chunk8"] = measure("ragged8", RAGGED, torch.float32, 8, 2)
result["cases"]["batch1-f32-chunk16"] = measure("b1", [40], torch.float32, 16, 3)
result["cases"]["batch3-empty-seq-in-place"] = measure("b3", [17, 0, 23], torch.float32, 16, 4, in_place=True)
result["cases"]["batch3-hv-eq-hk-dv64"] = measure("b3b", [33, 2, 16], torch.float32, 16, 5, hk=2, hv=2, dk=16, dv=64)  # 2 column blocks
result["cases"]["ragged-bf16-chunk16"] = measure("bf16", RAGGED, torch.bfloat16, 16, 6)
LONG = [70, 3, 130]  # chunks of 64: full ones span the blocked inverse's 4 diagonal blocks of 16
result["cases"]["long-f32-chunk64"] = measure("long", LONG, torch.float32, 64, 7)
for blocked in (True, False):  # the blocked inverse against row-by-row substitution, on the same data
    kernel_module.BLOCKED_INVERSE = blocked
    result["cases"][f"long-f32-chunk64-blocked-{blocked}"] = measure("long", LONG, torch.float32, 64, 8)
kernel_module.BLOCKED_INVERSE = True
kernel_module.SCAN_STAGES = 2  # launch 2 as a pipelined range loop: sequences with fewer chunks run masked steps
result["cases"]["ragged-f32-chunk16-stages2"] = measure("ragged", RAGGED, torch.float32, 16, 1)
result["cases"]["batch3-empty-seq-in-place-stages2"] = measure("b3", [17, 0, 23], torch.float32, 16, 4, in_place=True)
result["cases"]["batch3-empty-first-stages2"] = measure("b3e", [0, 17, 23], torch.float32, 16, 10)
result["cases"]["long-f32-chunk64-stages2"] = measure("long", LONG, torch.float32, 64, 7)
result["cases"]["ragged-f32-chunk16-strided-stages2"] = measure("ragged", RAGGED, torch.float32, 16, 11, strided=True)
kernel_module.SCAN_STAGES = 0
result["cases"]["ragged-f32-chunk16-strided"] = measure("ragged", RAGGED, torch.float32, 16, 11, strided=True)

# Worst case for the inverse: every key the same, beta near 1, almost no decay (A is nearly all ones below the
# diagonal; its powers grow binomially, the inverse stays bidiagonal).
def repeated_keys(lengths, seed):
    q, k, v, g, beta, cu, state = inputs(lengths, torch.float32, seed)
    return q, k[:1].expand_as(k).contiguous(), v, torch.full_like(g, -1e-4), torch.full_like(beta, 0.99), cu, state
args = repeated_keys([64, 100], 9)
out, final = run(kernel_module, args, 64)
ref_out, ref_final = torch.empty_like(args[2]), torch.empty_like(args[6])
torch_op(*args, ref_out, ref_final, chunk_size=64)
rec_out, rec_final = recurrent(*args)
result["cases"]["repeated-keys-f32-chunk64"] = {"unwritten": int(out.isnan().sum() + final.isnan().sum()), "out_vs_torch": rel(out, ref_out),
                                                 "state_vs_torch": rel(final, ref_final), "out_vs_recurrent": rel(out, rec_out), "state_vs_recurrent": rel(final, rec_final)}

# the model's prefill form: states as rows of a pool, read and written in place (state_slots, has_initial_state)
def pooled(module, lengths, slots, has, seed, stages):
    module.SCAN_STAGES = stages
    q, k, v, g, beta, cu, state = inputs(lengths, torch.float32, seed)
    pool = torch.full((5, *state.shape[1:]), float("nan"))
    pool[slots] = state  # every used row holds a state, also the fresh sequences' rows (which must not be read)
    given = torch.where(torch.tensor(has)[:, None, None, None], state, torch.zeros_like(state))
    ref_out, ref_final = torch.empty_like(v), torch.empty_like(state)
    torch_op(q, k, v, g, beta, cu, given, ref_out, ref_final, chunk_size=16)
    out = torch.full(v.shape, float("nan"))
    module.gdn_chunked_prefill(q, k, v, g, beta, cu, pool, out, pool, chunk_size=16, state_slots=torch.tensor(slots), has_initial_state=torch.tensor(has))
    module.SCAN_STAGES = 0
    untouched = [r for r in range(5) if r not in slots]
    return {"out_vs_torch": rel(out, ref_out), "state_vs_torch": rel(pool[slots], ref_final), "unwritten": int(out.isnan().sum()),
            "unused_rows_untouched": bool(pool[untouched].isnan().all())}
POOLED = ([17, 0, 23], [3, 1, 0], [True, False, False])
result["pool"] = {f"stages{stages}": pooled(kernel_module, *POOLED, 12, stages) for stages in (0, 2)}

for name, (old, new) in WRONG_VARIANTS.items():
    module = wrong_module(name, old, new)
    if name.startswith("pool_"):  # measured on the pooled case it would break
        errors = pooled(module, *POOLED, 12, 0)
        result["wrong"][name] = {"out_vs_torch_pooled": errors["out_vs_torch"], "state_vs_torch_pooled": errors["state_vs_torch"]}
        continue
    result["wrong"][name] = {}
    for label, make, chunk in (("ragged16", lambda: inputs(RAGGED, torch.float32, 1), 16), ("long64", lambda: inputs(LONG, torch.float32, 1), 64),
                               ("repeated64", lambda: repeated_keys([64, 100], 9), 64)):  # fmt: skip
        args = make()
        ref_out, ref_final = torch.empty_like(args[2]), torch.empty_like(args[6])
        torch_op(*args, ref_out, ref_final, chunk_size=chunk)
        out, final = run(module, args, chunk)
        result["wrong"][name] |= {f"out_vs_torch_{label}": rel(out, ref_out), f"state_vs_torch_{label}": rel(final, ref_final)}
print("RESULT" + json.dumps(result))
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    script = SCRIPT.replace("__WRONG__", repr(WRONG_VARIANTS))
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES}}, script)


@pytest.fixture(scope="module")
def measured(run):
    script = run["script"]
    assert script is not None and script["ok"], script
    marker = script["output"].rfind("RESULT")
    assert marker >= 0, script["output"]
    return json.loads(script["output"][marker + len("RESULT"):].splitlines()[0])


def test_contract_cpu_cases_pass_under_the_interpreter(run):
    records = {key.split("|", 1)[1]: value for key, value in run["records"].items()}
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("case", [
    "ragged-f32-chunk16", "ragged-f32-chunk8", "batch1-f32-chunk16", "batch3-empty-seq-in-place", "batch3-hv-eq-hk-dv64",
    "long-f32-chunk64", "long-f32-chunk64-blocked-True", "long-f32-chunk64-blocked-False", "repeated-keys-f32-chunk64",
    "ragged-f32-chunk16-stages2", "batch3-empty-seq-in-place-stages2", "batch3-empty-first-stages2", "long-f32-chunk64-stages2",
    "ragged-f32-chunk16-strided", "ragged-f32-chunk16-strided-stages2",  # q, k, v column views of one [T, C] buffer
])
def test_float32_matches_the_torch_op_and_the_recurrence(measured, case):
    errors = measured["cases"][case]
    assert errors["unwritten"] == 0, errors
    for name in ("out_vs_torch", "state_vs_torch", "out_vs_recurrent", "state_vs_recurrent"):
        assert errors[name] < F32_BOUND, (name, errors)


@pytest.mark.parametrize("stages", [0, 2])
def test_pooled_states_match_the_torch_op(measured, stages):
    errors = measured["pool"][f"stages{stages}"]
    assert errors["unwritten"] == 0 and errors["unused_rows_untouched"], errors
    assert errors["out_vs_torch"] < F32_BOUND and errors["state_vs_torch"] < F32_BOUND, errors


def test_bfloat16_output_matches_the_torch_op(measured):
    errors = measured["cases"]["ragged-bf16-chunk16"]
    assert errors["unwritten"] == 0, errors
    assert errors["out_vs_torch"] < BF16_OUT_BOUND, errors
    assert errors["state_vs_torch"] < F32_BOUND, errors  # the state stays float32 (inputs are exact bf16 values)
    assert errors["state_vs_recurrent"] < F32_BOUND, errors
    assert errors["out_vs_recurrent"] < BF16_OUT_BOUND, errors  # bf16 rounding of the output only (about 1.7e-3)


@pytest.mark.parametrize("wrong", sorted(WRONG_VARIANTS))
def test_the_comparison_rejects_a_known_wrong_kernel(measured, wrong):
    errors = measured["wrong"][wrong]
    assert max(errors.values()) > WRONG_MIN_ERROR, errors
    assert max(errors.values()) > 100 * F32_BOUND, errors


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lengths", [[1024], [1, 255, 256, 512]])
@pytest.mark.parametrize(("stages", "prepare_warps"), [(0, 0), (2, 0), (2, 4)])
def test_matches_the_torch_op_on_cuda_at_the_real_head_shape(lengths, dtype, stages, prepare_warps, monkeypatch):
    """bfloat16 inputs run one-pass tf32 dots (within the contract's bfloat16 bounds, and tighter than fla's run19
    figures); float32 inputs run tf32x3, about float32 accuracy. Launch 2 as a while loop and as a pipelined range loop."""
    from reference_engine.kernels import gdn_chunked_prefill as kernel_module
    from reference_engine.kernels.gdn_chunked_prefill import gdn_chunked_prefill
    from reference_engine.ops.linear_attention import gdn_chunked_prefill as torch_op

    monkeypatch.setattr(kernel_module, "SCAN_STAGES", stages)
    monkeypatch.setattr(kernel_module, "PREPARE_WARPS", prepare_warps)

    generator = torch.Generator(device="cuda").manual_seed(len(lengths))
    tokens, batch = sum(lengths), len(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda")

    q, k, v = randn(tokens, 16, 128).to(dtype), randn(tokens, 16, 128).to(dtype), randn(tokens, 32, 128).to(dtype)
    wide = torch.full((tokens, 8192 + 4096), float("nan"), dtype=dtype, device="cuda")  # the model's conv output holds q | k | v
    wide[:, :2048], wide[:, 2048:4096], wide[:, 4096:8192] = q.view(tokens, -1), k.view(tokens, -1), v.view(tokens, -1)
    q_view, k_view, v_view = wide[:, :2048].view(q.shape), wide[:, 2048:4096].view(k.shape), wide[:, 4096:8192].view(v.shape)
    g = -0.5 * torch.rand(tokens, 32, generator=generator, device="cuda") - 0.01
    beta = torch.rand(tokens, 32, generator=generator, device="cuda")
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    state = randn(batch, 32, 128, 128)
    expected_out, expected_state = torch.empty_like(v), torch.empty_like(state)
    torch_op(q, k, v, g, beta, cu, state, expected_out, expected_state)
    out = torch.full_like(v, float("nan"))
    final = torch.full_like(state, float("nan"))
    gdn_chunked_prefill(q, k, v, g, beta, cu, state, out, final)
    viewed_out, viewed_final = torch.full_like(v, float("nan")), torch.full_like(state, float("nan"))
    gdn_chunked_prefill(q_view, k_view, v_view, g, beta, cu, state, viewed_out, viewed_final)  # read in place, no copies
    torch.cuda.synchronize()
    assert not out.isnan().any() and not final.isnan().any()
    assert torch.equal(viewed_out, out) and torch.equal(viewed_final, final)
    pool = torch.full((batch + 2, *state.shape[1:]), float("nan"), device="cuda")  # states as pool rows, read and written in place
    slots = torch.arange(batch, device="cuda").flip(0) + 1
    pool[slots] = state
    pooled_out = torch.full_like(v, float("nan"))
    gdn_chunked_prefill(q_view, k_view, v_view, g, beta, cu, pool, pooled_out, pool, state_slots=slots, has_initial_state=torch.ones(batch, dtype=torch.bool, device="cuda"))
    assert torch.equal(pooled_out, out) and torch.equal(pool[slots], final) and pool[0].isnan().all() and pool[-1].isnan().all()

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    state_bound, out_bound = (1e-4, 1e-4) if dtype == torch.float32 else (3e-3, 5e-3)  # run19 tf32: 1.1e-3 and 2.5e-3
    assert rel(final, expected_state) < state_bound, rel(final, expected_state)
    assert rel(out.float(), expected_out.float()) < out_bound, rel(out.float(), expected_out.float())


@pytest.mark.parametrize(("lengths", "chunk"), [([5], 4), ([0, 7, 1, 8], 4), ([64, 65, 0, 3], 64), ([1, 1, 1], 1)])
def test_chunk_table_covers_every_token_once_in_order(lengths, chunk):
    """The host-built chunk table: per sequence its slots in order, each a chunk of at most `chunk` tokens that
    stays inside the sequence, together covering the sequence exactly; unused slots have length 0."""
    from reference_engine.kernels.gdn_chunked_prefill import _chunk_table_from_offsets

    offsets = [0, *itertools.accumulate(lengths)]
    start, length, first, count = (t.tolist() for t in _chunk_table_from_offsets(offsets, offsets[-1], chunk, torch.device("cpu")))
    assert len(start) == len(length) == offsets[-1] // chunk + len(lengths) and len(first) == len(count) == len(lengths)
    used = set()
    for b, (begin, end) in enumerate(itertools.pairwise(offsets)):
        slots = range(first[b], first[b] + count[b])
        assert count[b] == -(-(end - begin) // chunk)
        covered = [t for s in slots for t in range(start[s], start[s] + length[s])]
        assert covered == list(range(begin, end)) and all(1 <= length[s] <= chunk for s in slots)
        used.update(slots)
    assert all(length[s] == 0 for s in range(len(start)) if s not in used)
