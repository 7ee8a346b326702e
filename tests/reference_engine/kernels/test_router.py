"""Triton fused router (softmax + top-k + renormalise) against moe/router-topk."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import (
    assert_all_passed,
    assert_script_ok,
    contract_records,
    interpreter_run,
)

CONTRACT = "moe/router-topk"
IMPL = "reference_engine.kernels.router:router_topk"
# decode-t64-bf16 and prefill-1024-bf16 pass too but take minutes in the interpreter.
CPU_CASES = ["small-f32", "small-bf16", "top-one-f32", "all-experts-f32", "decode-t1-bf16", "top-k-larger-than-e", "top-k-zero", "top-k-disagrees-with-outputs", "logits-one-dim"]
WRONG = ["router_ties_to_higher_index", "router_not_renormalised"]
WRONG_CASES = ["small-f32"]


@pytest.fixture(scope="module")
def records():
    return contract_records(CONTRACT, {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG})


def test_contract_cpu_cases_pass_under_the_interpreter(records):
    assert_all_passed(records[IMPL], CPU_CASES)


@pytest.mark.parametrize("wrong", WRONG)
def test_contract_catches_known_wrong_kernel(records, wrong):
    found = records[f"wrong_kernels:{wrong}"]
    assert [r["case"] for r in found] == WRONG_CASES
    assert all(r["status"] == "INCORRECT_NUMERICAL" for r in found), [(r["case"], r["status"], r["message"]) for r in found]


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 32, 1024])
def test_matches_the_torch_op_on_cuda(tokens):
    from reference_engine.kernels.router import router_topk as triton_router
    from reference_engine.ops.moe import router_topk as torch_router

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    logits = (torch.randn(tokens, 256, generator=generator, device="cuda") * 2).to(torch.bfloat16)
    expected_weights = torch.empty(tokens, 8, device="cuda")
    expected_ids = torch.empty(tokens, 8, dtype=torch.int32, device="cuda")
    torch_router(logits, expected_weights, expected_ids, 8)
    weights = torch.full_like(expected_weights, float("nan"))
    ids = torch.full_like(expected_ids, -1)
    triton_router(logits, weights, ids, 8)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)


# The fused router of `moe_block_decode` (logits and top-k with the shared slot in one launch; the last
# program of a token draws the last ticket and runs the top-k) against F.linear + the torch op, float32 so
# that no rounding separates them: same ids, same weights, every slot written, tickets back at zero (a
# second call is complete and equal).
FUSED_SCRIPT = """
import torch
from reference_engine.kernels import launch, router
from reference_engine.ops import moe

g = torch.Generator().manual_seed(5)
for rows, tokens, experts, hidden, top_k in ((2, 1, 16, 64, 4), (2, 3, 20, 96, 6), (1, 3, 20, 96, 6), (8, 2, 20, 96, 6)):  # 21 rows: a partial row block at 2 and 8
    router.ROUTER_ROWS = rows
    x = torch.randn(tokens, hidden, generator=g)
    weight = torch.randn(experts + 1, hidden, generator=g) * 0.3
    want_w, want_i = torch.empty(tokens, top_k + 1), torch.empty(tokens, top_k + 1, dtype=torch.int32)
    moe.router_topk_with_shared(torch.nn.functional.linear(x, weight), want_w, want_i, top_k)
    results = []
    for _ in range(2):
        got_w, got_i = torch.full((tokens, top_k + 1), float("nan")), torch.full((tokens, top_k + 1), -7, dtype=torch.int32)
        router.router_gemv_topk_with_shared(x, weight, got_w, got_i, top_k)
        assert torch.equal(got_i, want_i), (got_i, want_i)
        torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
        results.append((got_w, got_i))
    assert int(launch._TICKETS[x.device].abs().sum()) == 0
print("ok")
"""


def test_fused_router_gemv_topk_matches_the_torch_ops_under_the_interpreter():
    assert_script_ok(interpreter_run({}, FUSED_SCRIPT))


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "warps"), [(2, 4), (1, 1), (4, 2), (8, 8)])
@pytest.mark.parametrize("tokens", [1, 4])
def test_fused_router_gemv_topk_matches_the_torch_ops_on_cuda(tokens, rows, warps, monkeypatch):
    from reference_engine.kernels import launch, router
    from reference_engine.kernels.router import router_gemv_topk_with_shared
    from reference_engine.ops.moe import router_topk_with_shared

    monkeypatch.setattr(router, "ROUTER_ROWS", rows)
    monkeypatch.setattr(router, "ROUTER_WARPS", warps)

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=generator, device="cuda")  # float32: no rounding between the two paths
    weight = torch.randn(257, 2048, generator=generator, device="cuda") * 2048**-0.5
    want_w, want_i = torch.empty(tokens, 9, device="cuda"), torch.empty(tokens, 9, dtype=torch.int32, device="cuda")
    router_topk_with_shared(torch.nn.functional.linear(x, weight), want_w, want_i, 8)
    for _ in range(2):  # the tickets are back at zero after each call
        got_w, got_i = torch.full_like(want_w, float("nan")), torch.full_like(want_i, -1)
        router_gemv_topk_with_shared(x, weight, got_w, got_i, 8)
        assert torch.equal(got_i, want_i)
        torch.testing.assert_close(got_w, want_w, rtol=1e-4, atol=1e-5)
    assert int(launch._TICKETS[x.device].abs().sum()) == 0


# The fused router's expert prefetch (`router_gemv_topk_with_shared(prefetch=experts)`): in record mode (the
# interpreter cannot run the PTX) the kernel stores the chunks it would prefetch. They must be exactly the selected
# experts' spans of the four stacked tensors, 16-byte aligned, at most one chunk long, covering each span once; the
# routing outputs must not change; and the checker must reject a table that misses a chunk or names another expert.
PREFETCH_SCRIPT = """
import torch
from reference_engine.kernels import router
from reference_engine.kernels.launch import cdiv
from reference_engine.ops.static_moe import StackedNvfp4Experts

def check(table, ids, spans, chunk):
    got = sorted((int(a), int(n)) for a, n in table.tolist() if n)
    want = []
    for base, per_expert in spans:
        for e in sorted(set(ids)):
            for offset in range(0, per_expert, chunk):
                want.append((base + e * per_expert + offset, min(chunk, per_expert - offset)))
    # a token repeats no expert, but two tokens may share one: the table lists it once per token
    want_per_token = sorted(w for w in want)
    return got, sorted(want_per_token)

g = torch.Generator().manual_seed(9)
E, H, I, top_k = 12, 64, 32, 4
experts = StackedNvfp4Experts(
    torch.randint(0, 255, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g), torch.randn(E, 2 * I, H // 16, generator=g).to(torch.float8_e4m3fn),
    torch.rand(E, 2, generator=g), torch.randint(0, 255, (E, H, I // 2), dtype=torch.uint8, generator=g),
    torch.randn(E, H, I // 16, generator=g).to(torch.float8_e4m3fn), torch.rand(E, generator=g))
spans = router.expert_prefetch_spans(experts)
assert spans is not None and [s[1] for s in spans] == [2 * I * H // 2, 2 * I * H // 16, H * I // 2, H * I // 16]
router.PREFETCH_CHUNK = 256  # several chunks per span at this size (the real 64 KB chunk is one or more per span too)
for tokens in (1, 3):
    x = torch.randn(tokens, H, generator=g)
    weight = torch.randn(E + 1, H, generator=g) * 0.3
    plain_w, plain_i = torch.empty(tokens, top_k + 1), torch.empty(tokens, top_k + 1, dtype=torch.int32)
    router.router_gemv_topk_with_shared(x, weight, plain_w, plain_i, top_k)
    rows = router.prefetch_rows(top_k, experts)
    table = torch.full((tokens * rows, 2), -1, dtype=torch.int64)
    got_w, got_i = torch.empty_like(plain_w), torch.empty_like(plain_i)
    router.router_gemv_topk_with_shared(x, weight, got_w, got_i, top_k, prefetch=experts, record=table)
    assert torch.equal(got_i, plain_i) and torch.equal(got_w, plain_w)
    assert bool((table[:, 1] >= 0).all()), "every row of the table written"
    for t in range(tokens):
        part = table[t * rows : (t + 1) * rows]
        chosen = got_i[t, :top_k].tolist()
        got, want = check(part, chosen, spans, router.PREFETCH_CHUNK)
        assert got == want, (t, got[:4], want[:4])
        assert all(a % 16 == 0 and 0 < n <= router.PREFETCH_CHUNK and n % 16 == 0 for a, n in got)
        # known-wrong tables are rejected by the same check: a dropped chunk, a neighbouring expert
        dropped = part.clone(); dropped[int(torch.nonzero(dropped[:, 1])[-1])] = 0
        assert check(dropped, chosen, spans, router.PREFETCH_CHUNK)[0] != want
        shifted = [(e + 1) % E for e in chosen]
        assert check(part, shifted, spans, router.PREFETCH_CHUNK)[1] != got
print("ok")
"""


def test_fused_router_records_exactly_the_selected_experts_chunks_under_the_interpreter():
    assert_script_ok(interpreter_run({}, PREFETCH_SCRIPT))


@pytest.mark.cuda
def test_fused_router_with_the_expert_prefetch_gives_the_same_routing_on_cuda():
    from reference_engine.kernels import router
    from reference_engine.ops.static_moe import StackedNvfp4Experts

    generator = torch.Generator(device="cuda").manual_seed(3)
    experts_count, hidden, inter = 256, 2048, 512

    def rand_bytes(*shape):
        return torch.randint(0, 255, shape, dtype=torch.uint8, device="cuda", generator=generator)

    experts = StackedNvfp4Experts(
        rand_bytes(experts_count, 2 * inter, hidden // 2), rand_bytes(experts_count, 2 * inter, hidden // 16).view(torch.float8_e4m3fn),
        torch.rand(experts_count, 2, device="cuda"), rand_bytes(experts_count, hidden, inter // 2),
        rand_bytes(experts_count, hidden, inter // 16).view(torch.float8_e4m3fn), torch.rand(experts_count, device="cuda"),
    )  # fmt: skip
    x = torch.randn(1, hidden, device="cuda", generator=generator).bfloat16()
    weight = (torch.randn(experts_count + 1, hidden, device="cuda", generator=generator) * hidden**-0.5).bfloat16()
    outputs = []
    for prefetch in (None, experts):
        got_w, got_i = torch.full((1, 9), float("nan"), device="cuda"), torch.full((1, 9), -1, dtype=torch.int32, device="cuda")
        router.router_gemv_topk_with_shared(x, weight, got_w, got_i, 8, prefetch=prefetch)
        outputs.append((got_w, got_i))
    torch.cuda.synchronize()
    assert torch.equal(outputs[0][1], outputs[1][1]) and torch.equal(outputs[0][0], outputs[1][0])
