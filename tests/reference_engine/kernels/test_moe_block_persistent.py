"""The batch-1 MoE block in one persistent launch (`kernels/moe_block_persistent.py`).

Interpreter (one subprocess; the phases run as three launches there): for float32 and bfloat16 x, every weight-read
form (bytes, int32 words, packed float16 pairs) and three tile plans, at 4 and at 3 programs (rounds that do not divide
the items): the output bit-equal to the three-launch path (`moe_decode.moe_block_decode` with the same tiles), within
the float64 block reference's bound, and the routing rows equal to the fused router's. Known-wrong launches the
comparison must reject: phases out of order (the activation or the logits read before they are written: both start as
NaN under the interpreter) and a grid one program short of the one the kernel deals items over. The op wired into a
tiny model's MoE block through `moe_decode.PERSISTENT` (one token only) against the block's eager path.
In process: the tuning key, and the residency arithmetic. On CUDA (real shape): one launch with barriers against the
phased launches and the three-launch path, repeatedly and inside a CUDA graph, counters back at zero afterwards.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = r"""
import torch

from reference_engine.kernels import moe_block_persistent as mbp, moe_decode, router
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(17)
E, H, I, K = 6, 64, 32, 2

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
router_weight = torch.randn(E + 1, H, generator=g) * 0.15
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)

def deq64(packed, scale, scale_2):
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    return LUT[codes] * scale.double().repeat_interleave(16, dim=-1) * torch.as_tensor(scale_2).double()

def swiglu64(x, gate_up, down):
    h = x @ gate_up.t()
    return (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ down.t()

def block_reference(x, rw):
    # float64: logits in x's dtype, softmax over the E routed columns, top-K renormalised, plus sigmoid(logit E) * shared
    logits = (x.double() @ rw.double().t()).to(x.dtype).double()
    top = torch.softmax(logits[:, :E], dim=-1).topk(K, dim=-1)
    weights = top.values / top.values.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for j in range(K):
        e = int(top.indices[0, j])
        gate_up = torch.cat([deq64(experts.gate_up_packed[e, :I], experts.gate_up_scale[e, :I], experts.gate_up_scale_2[e, 0]),
                             deq64(experts.gate_up_packed[e, I:], experts.gate_up_scale[e, I:], experts.gate_up_scale_2[e, 1])])
        down = deq64(experts.down_packed[e], experts.down_scale[e], experts.down_scale_2[e])
        out += float(weights[0, j]) * swiglu64(x.double(), gate_up, down)
    shared_gate_up = torch.cat([deq64(shared.gate_up_packed[:I], shared.gate_up_scale[:I], shared.gate_up_scale_2[0]),
                                deq64(shared.gate_up_packed[I:], shared.gate_up_scale[I:], shared.gate_up_scale_2[1])])
    shared_down = deq64(shared.down_packed, shared.down_scale, shared.down_scale_2)
    return out + torch.sigmoid(logits[:, E:]) * swiglu64(x.double(), shared_gate_up, shared_down)

def rel(out, expected):
    return float((out.double() - expected.double()).norm() / expected.double().norm())

BOUND = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
PLANS = (mbp.PersistentPlan(router_rows=2, gate_up_block_n=8, gate_up_block_k=16, down_block_h=8, down_block_i=8, loop=3),
         mbp.PersistentPlan(router_rows=4, gate_up_block_n=16, gate_up_block_k=32, down_block_h=16, down_block_i=16, loop=1),
         mbp.PersistentPlan(router_rows=1, gate_up_block_n=4, gate_up_block_k=8, down_block_h=4, down_block_i=8, loop=0))
for programs in (4, 3):
    mbp._SM_COUNT_CPU = programs
    for dtype in (torch.float32, torch.bfloat16):
        for words in (0, 1, 2):
            for plan in PLANS:
                if programs == 3 and plan is not PLANS[0]:
                    continue
                p = mbp.PersistentPlan(**{**vars(plan), "words": words})
                x = torch.randn(1, H, generator=g).to(dtype)
                rw = router_weight.to(dtype)
                # the three-launch path with the same tiles and router rows: the same device functions, the same sums
                moe_decode.BATCH_ONE = (p.loop, p.gate_up_block_n, p.gate_up_block_k, p.down_block_h, p.down_block_i, p.words)
                router.ROUTER_ROWS = p.router_rows
                three = torch.full((1, H), float("nan"), dtype=dtype)
                moe_decode.moe_block_decode(x, rw, experts, shared, K, three)
                want_w, want_i = torch.full((1, K + 1), float("nan")), torch.full((1, K + 1), -1, dtype=torch.int32)
                router.router_gemv_topk_with_shared(x, rw, want_w, want_i, K)
                out = torch.full((1, H), float("nan"), dtype=dtype)
                got_w, got_i = torch.full((1, K + 1), float("nan")), torch.full((1, K + 1), -1, dtype=torch.int32)
                mbp.moe_block_persistent(x, rw, experts, shared, K, out, plan=p, routing=(got_w, got_i))
                assert torch.isfinite(out).all(), (programs, dtype, words, plan)
                assert torch.equal(out, three), (programs, dtype, words, plan, rel(out, three))
                assert torch.equal(got_i, want_i) and torch.equal(got_w, want_w), (got_i, want_i, got_w, want_w)
                error = rel(out, block_reference(x, rw))
                assert error < BOUND[dtype], (programs, dtype, words, plan, error)
                print(f"programs={programs} {dtype} words={words} rows/tiles={p.router_rows}/{p.gate_up_block_n}/{p.down_block_h} loop={p.loop}: "
                      f"bit-equal to three launches, {error:.2e} vs float64")
moe_decode.BATCH_ONE, router.ROUTER_ROWS = None, 2

# Known-wrong launches: each must give an output the comparison rejects.
mbp._SM_COUNT_CPU = 4
x = torch.randn(1, H, generator=g)
expected = block_reference(x, router_weight)

def launched(order, short=False):
    out = torch.full((1, H), float("nan"))
    block = mbp.prepare(x, router_weight, experts, shared, K, out, plan=PLANS[0])
    for phase in order:
        block.run_phase(phase, programs=block.programs - 1 if short else None)
    block.finish()
    return out

good = launched((1, 2, 3))
assert torch.isfinite(good).all() and rel(good, expected) < BOUND[torch.float32]
for name, order, short in (("down before gate/up", (1, 3, 2), False), ("routing before the logits", (2, 1, 3), False),
                           ("grid one program short", (1, 2, 3), True)):
    out = launched(order, short)
    caught = not torch.isfinite(out).all() or rel(out, expected) > 100 * BOUND[torch.float32]
    print(f"wrong {name}: finite={bool(torch.isfinite(out).all())} caught={caught}")
    assert caught, name

# Wired into the model: one token through `moe_decode.PERSISTENT`, three tokens keep the three launches.
from dataclasses import replace

from reference_engine.ops.backend import torch_ops
from reference_engine.presets import build_preset

calls = []
real = mbp.moe_block_persistent
mbp.moe_block_persistent = lambda *args, **kwargs: (calls.append(args[0].shape[0]), real(*args, **kwargs))[1]
moe_decode.PERSISTENT = True
model = build_preset("tiny", quantize="nvfp4", seed=5)
block = model.layers[1].mlp
ops = replace(torch_ops(), moe_block_decode=moe_decode.moe_block_decode)
for T in (1, 3):
    xt = torch.randn(T, model.config.hidden_size, generator=g)
    error = rel(block(xt, ops=ops), block(xt))
    print(f"tiny block T={T} persistent on, vs eager: {error:.2e}")
    assert error < 1e-5, (T, error)
assert calls == [1], calls
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=600)


def test_persistent_block_equals_the_three_launches_and_rejects_wrong_launches_under_the_interpreter(run):
    assert_script_ok(run)


def test_tuning_key_switches_the_block_and_sets_its_plan(tmp_path, monkeypatch):
    from reference_engine.kernels import moe_block_persistent, moe_decode, tuning

    monkeypatch.setattr(moe_decode, "PERSISTENT", False)
    monkeypatch.setattr(moe_block_persistent, "PLAN", moe_block_persistent.PersistentPlan())
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"device": "card", "moe_block_persistent": {"on": 1, "programs_per_sm": 2, "gate_up_block_n": 32, "loop": 1}}))
    tuning.apply_tuning(path)
    assert moe_decode.PERSISTENT is True
    assert moe_block_persistent.PLAN == moe_block_persistent.PersistentPlan(programs_per_sm=2, gate_up_block_n=32, loop=1)
    path.write_text(json.dumps({"device": "card", "moe_block_persistent": {"on": 1, "gate_up_block_n": 3}}))
    with pytest.raises(ValueError, match="gate_up_block_n"):
        tuning.apply_tuning(path)


def test_residency_counts_the_tightest_resource():
    from reference_engine.kernels.moe_block_persistent import programs_that_fit

    h200 = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472, max_threads_per_multi_processor=2048)
    assert programs_that_fit(72, 10240, 4, h200) == 7  # registers: 72 x 128 threads = 9,216 of 65,536
    assert programs_that_fit(255, 0, 8, h200) == 1  # 255 registers round up to 256 per thread: one 8-warp program
    assert programs_that_fit(32, 120 * 1024, 4, h200) == 1  # shared memory
    assert programs_that_fit(16, 0, 4, h200) == 16  # threads: 2,048 / 128
    assert programs_that_fit(16, 0, 1, h200) == 32  # the block limit


@pytest.mark.cuda
@pytest.mark.parametrize(("programs_per_sm", "cooperative"), [(1, True), (2, True), (1, False)])
def test_one_launch_with_barriers_equals_the_phases_and_three_launches_on_cuda(programs_per_sm, cooperative, monkeypatch):
    from reference_engine.kernels import moe_block_persistent as mbp
    from reference_engine.kernels import moe_decode, router, tuning
    from reference_engine.ops.static_moe import SharedNvfp4Expert
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    tuning.apply_for_cuda()
    monkeypatch.setattr(mbp, "COOPERATIVE", cooperative)
    torch.manual_seed(programs_per_sm)
    E, H, I, K = 256, 2048, 512, 8

    def q(rows, cols):
        return quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)

    experts = moe_decode.stack_nvfp4_experts([q(I, H) for _ in range(E)], [q(I, H) for _ in range(E)], [q(H, I) for _ in range(E)])
    shared = SharedNvfp4Expert.concatenate(q(I, H), q(I, H), q(H, I))
    weight = (torch.randn(E + 1, H, device="cuda") * H**-0.5).bfloat16()
    plan = mbp.PersistentPlan(programs_per_sm=programs_per_sm)
    # the three-launch path with the same tiles, router rows and warps (the same sums in the same order), not sent here
    monkeypatch.setattr(moe_decode, "PERSISTENT", False)
    monkeypatch.setattr(router, "ROUTER_ROWS", plan.router_rows)
    monkeypatch.setattr(router, "ROUTER_WARPS", plan.num_warps)
    monkeypatch.setattr(moe_decode, "BATCH_ONE", (plan.loop, plan.gate_up_block_n, plan.gate_up_block_k, plan.down_block_h, plan.down_block_i, plan.words))
    xs = [torch.randn(1, H, device="cuda").bfloat16() for _ in range(4)]
    for x in xs:
        three = torch.full((1, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        moe_decode.moe_block_decode(x, weight, experts, shared, K, three)
        monkeypatch.setattr(mbp, "PHASED", True)
        phased = torch.full_like(three, float("nan"))
        mbp.moe_block_persistent(x, weight, experts, shared, K, phased, plan=plan)
        monkeypatch.setattr(mbp, "PHASED", False)
        for _ in range(5):  # the barriers, again and again: the same bits every time
            one = torch.full_like(three, float("nan"))
            mbp.moe_block_persistent(x, weight, experts, shared, K, one, plan=plan)
            assert torch.equal(one, phased) and torch.equal(one, three)
    assert int(mbp.sync_counters(xs[0].device).abs().sum()) == 0
    outs = [torch.full((1, H), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in xs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):  # ten blocks in a row, as the decode graph runs them layer after layer
            for x, out in zip(xs, outs):
                mbp.moe_block_persistent(x, weight, experts, shared, K, out, plan=plan)
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for x, out in zip(xs, outs):
        want = torch.empty_like(out)
        moe_decode.moe_block_decode(x, weight, experts, shared, K, want)
        assert torch.equal(out, want)
    assert int(mbp.sync_counters(xs[0].device).abs().sum()) == 0
