"""Triton paged GQA decode attention against attention/paged-decode."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "attention/paged-decode"
IMPL = "reference_engine.kernels.paged_decode:paged_decode"
# model-heads-b1-bf16 (real heads, 20 blocks of 16) passes too (about 10 s in the interpreter).
CPU_CASES = [
    "small-f32", "small-bf16", "one-token-seq-f32",
    "block-table-too-short", "seq-len-zero", "seq-lens-wrong-count", "block-id-negative", "cache-dtype-mismatch",
]
WRONG = ["paged_last_token_dropped", "paged_kv_heads_tiled"]
WRONG_CASES = ["small-f32"]

# Several splits, some entirely past a short sequence, and table entries past the used blocks that
# name a real (scratch) block: the output must match the torch op and hold no NaN.
SPLITS_SCRIPT = """
import torch
from reference_engine.kernels import paged_decode as kernel
from reference_engine.ops.attention import paged_decode as torch_op

g = torch.Generator().manual_seed(7)
B, NB, BS, MB, HQ, HKV, D = 3, 40, 4, 10, 4, 2, 16
original = kernel.plan
kernel.plan = lambda batch, kv_heads, capacity, sm: (16, 16, -(-capacity // 16))  # 16 tokens per split: 3 splits
query = torch.randn(B, HQ, D, generator=g)
k_cache, v_cache = torch.randn(NB, BS, HKV, D, generator=g), torch.randn(NB, BS, HKV, D, generator=g)
seq_lens = torch.tensor([1, 17, 40], dtype=torch.int32)
tables = torch.randperm(NB, generator=g)[: B * MB].reshape(B, MB).to(torch.int32)
tables[0, 1:] = NB - 1  # a scratch block id past the used ones: never read
expected = torch.empty(B, HQ, D)
torch_op(query, k_cache, v_cache, tables, seq_lens, expected, 0.25)
out = torch.full((B, HQ, D), float("nan"))
kernel.paged_decode(query, k_cache, v_cache, tables, seq_lens, out, 0.25)
assert torch.isfinite(out).all()
torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
kernel.plan = original
# The plan's knobs (tuning file: paged_min_tokens_per_split, paged_waves) at the bench's table of 1296 tokens, 2 KV heads
assert kernel.plan(1, 2, 1296, 132) == (16, 64, 21)  # defaults: 64 tokens per split at least, 2 waves
kernel.MIN_TOKENS_PER_SPLIT, kernel.WAVES = 16, 8
assert kernel.plan(1, 2, 1296, 132) == (16, 16, 81) and kernel.plan(32, 2, 1296, 132) == (16, 128, 11)
out = torch.full((B, HQ, D), float("nan"))
kernel.paged_decode(query, k_cache, v_cache, tables, seq_lens, out, 0.25)
torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
kernel.MIN_TOKENS_PER_SPLIT, kernel.WAVES = 64, 2
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, SPLITS_SCRIPT)


@pytest.fixture(scope="module")
def records(run):
    return {key.split("|", 1)[1]: value for key, value in run["records"].items()}


def test_contract_cpu_cases_pass_under_the_interpreter(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert [r["case"] for r in found] == WRONG_CASES
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r["message"]) for r in found]


def test_many_splits_and_scratch_table_entries_give_no_nan(run):
    assert_script_ok(run)


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "length"), [(1, 1024), (1, 30000), (32, 2048)])
def test_matches_the_torch_op_on_cuda(batch, length):
    from reference_engine.kernels.paged_decode import paged_decode
    from reference_engine.ops.static_attention import paged_decode as torch_op

    generator = torch.Generator(device="cuda").manual_seed(batch)
    block_size, max_blocks = 16, -(-length // 16) + 2
    num_blocks = batch * max_blocks
    query = torch.randn(batch, 16, 256, generator=generator, device="cuda").bfloat16()
    k_cache = torch.randn(num_blocks, block_size, 2, 256, generator=generator, device="cuda").bfloat16()
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, generator=generator, device="cuda").reshape(batch, max_blocks).to(torch.int32)
    seq_lens = torch.randint(1, length + 1, (batch,), generator=generator, device="cuda", dtype=torch.int32)
    expected = torch.empty_like(query)
    torch_op(query, k_cache, v_cache, tables, seq_lens, expected, 256**-0.5)
    out = torch.full_like(query, float("nan"))
    paged_decode(query, k_cache, v_cache, tables, seq_lens, out, 256**-0.5)
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert error < 5e-3, error
