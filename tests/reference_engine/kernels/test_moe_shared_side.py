"""The MoE block's shared expert on the side stream (`moe_decode._launch_shared_only` + `_launch(..., shared_in=)`).

Interpreter (one subprocess; a stand-in side stream runs the forked work at once and records fork, join and the down
launches): for float32 and bfloat16 x, every weight-read form, at 1 and 2 tokens, `moe_block_decode` with the side
stream gives the bits of the fused shared slot. The order is fork, the shared down, join, then the routed down. Known-wrong
forms the comparison must reject: the routed launches reading the routing rows as if they held no shared entry (at 2 tokens
the second token's experts shift), and the shared sums of the two tokens swapped. The op wired into a tiny model's MoE
block with the side argument, against the block's eager path. In process: the batch limit, the tuning key, and no side
stream when the block runs grouped by expert.
"""

from __future__ import annotations

import json

import pytest
from kernel_interpreter import assert_script_ok, interpreter_run

from reference_engine.kernels import side_stream, tuning

SCRIPT = r"""
import torch

from reference_engine.kernels import moe_decode, side_stream
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(23)
E, H, I, K = 6, 64, 32, 2

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
router_weight = torch.randn(E + 1, H, generator=g) * 0.15
events = []

class Side:  # the CPU stand-in for side_stream.SideStream: the forked work runs at once
    def fork(self, work):
        events.append("fork")
        return work()
    def join(self):
        events.append("join")

class Recorded:  # a kernel whose launches are recorded (and optionally rewritten)
    def __init__(self, kernel, name, drop=()):
        self.kernel, self.name, self.drop = kernel, name, drop
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            events.append(self.name)
            return self.kernel[grid](*args, **{k: v for k, v in kwargs.items() if k not in self.drop})
        return launch

real_gate_up, real_down = moe_decode._gate_up_kernel, moe_decode._down_kernel
moe_decode._down_kernel = Recorded(real_down, "down")
side_stream.MOE_SHARED_MAX_BATCH = 2
moe_decode.DOWN_SPLIT = 1
for words in (0, 1, 2):
    moe_decode.BATCH_ONE = (3, 8, 16, 8, 8, words)
    moe_decode.LOOP, moe_decode.GATE_UP_BLOCK_N, moe_decode.GATE_UP_BLOCK_K, moe_decode.DOWN_BLOCK_H, moe_decode.DOWN_BLOCK_I = 1, 16, 32, 16, 16
    moe_decode.WORDS = words
    for dtype in (torch.float32, torch.bfloat16):
        for T in (1, 2):
            x = torch.randn(T, H, generator=g).to(dtype)
            rw = router_weight.to(dtype)
            fused = torch.full((T, H), float("nan"), dtype=dtype)
            moe_decode.moe_block_decode(x, rw, experts, shared, K, fused)
            events.clear()
            out = torch.full((T, H), float("nan"), dtype=dtype)
            moe_decode.moe_block_decode(x, rw, experts, shared, K, out, side=Side())
            assert events == ["fork", "down", "join", "down"], events
            assert torch.isfinite(out).all() and torch.equal(out, fused), (words, dtype, T, (out.double() - fused.double()).abs().max())
            print(f"words={words} {dtype} T={T}: bit-equal to the fused shared slot")
            events.clear()
            moe_decode.moe_block_decode(x, rw, experts, shared, K, out, side=None)
            assert events == ["down"], events

# Known-wrong forms at 2 tokens, float32: each must change the output.
moe_decode.WORDS = 0
x = torch.randn(2, H, generator=g)
fused = torch.full((2, H), float("nan"))
moe_decode.moe_block_decode(x, router_weight, experts, shared, K, fused)

def wrong_stride():
    moe_decode._gate_up_kernel = Recorded(real_gate_up, "gate_up", drop=("ROUTE_SLOTS",))
    moe_decode._down_kernel = Recorded(real_down, "down", drop=("ROUTE_SLOTS",))
    try:
        out = torch.full((2, H), float("nan"))
        moe_decode.moe_block_decode(x, router_weight, experts, shared, K, out, side=Side())
    finally:
        moe_decode._gate_up_kernel, moe_decode._down_kernel = real_gate_up, Recorded(real_down, "down")
    return out

def swapped_shared_sums():
    real = moe_decode._launch_shared_only
    moe_decode._launch_shared_only = lambda *args: real(*args).flip(0).contiguous()
    try:
        out = torch.full((2, H), float("nan"))
        moe_decode.moe_block_decode(x, router_weight, experts, shared, K, out, side=Side())
    finally:
        moe_decode._launch_shared_only = real
    return out

for name, form in (("routing rows read without the shared entry", wrong_stride), ("shared sums swapped", swapped_shared_sums)):
    out = form()
    caught = not torch.equal(out, fused)
    print(f"wrong {name}: caught={caught}")
    assert caught, name

# Wired into the model: the block passes its side argument to the op.
from dataclasses import replace

from reference_engine.ops.backend import torch_ops
from reference_engine.presets import build_preset

model = build_preset("tiny", quantize="nvfp4", seed=5)
block = model.layers[1].mlp
ops = replace(torch_ops(), moe_block_decode=moe_decode.moe_block_decode)
for T in (1, 2, 3):
    xt = torch.randn(T, model.config.hidden_size, generator=g)
    events.clear()
    got = block(xt, ops=ops, side=Side())
    error = float((got - block(xt)).norm() / block(xt).norm())
    print(f"tiny block T={T} with the side stream, vs eager: {error:.2e}, events {events}")
    assert error < 1e-5, (T, error)
    assert ("fork" in events) == (T <= 2), (T, events)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT, timeout=600)


def test_the_shared_expert_on_the_side_stream_gives_the_fused_bits_under_the_interpreter(run):
    assert_script_ok(run)


def test_the_batch_limit_and_the_tuning_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(side_stream, "MOE_SHARED_MAX_BATCH", 0)
    side = object()
    assert not side_stream.shared_on_side(side, 1)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "moe_shared_side_max_batch": 4}))
    tuning.apply_tuning(path)
    assert side_stream.MOE_SHARED_MAX_BATCH == 4
    assert side_stream.shared_on_side(side, 4) and not side_stream.shared_on_side(side, 5) and not side_stream.shared_on_side(None, 1)
    assert side_stream.for_device("cpu") is None


def test_no_side_stream_where_the_block_runs_grouped_by_expert(monkeypatch) -> None:
    from reference_engine.kernels import (
        moe_decode,
        moe_grouped_decode,
        moe_grouped_half,
    )

    monkeypatch.setattr(moe_grouped_half, "runs", lambda tokens, dtype: tokens >= 16)
    monkeypatch.setattr(moe_grouped_decode, "MIN_TOKENS", 64)
    monkeypatch.setattr(moe_decode, "PERSISTENT", True)
    assert not moe_decode._per_pair(1, None)  # persistent at one token
    assert moe_decode._per_pair(8, None)
    assert not moe_decode._per_pair(16, None)
    monkeypatch.setattr(moe_grouped_half, "runs", lambda tokens, dtype: False)
    assert not moe_decode._per_pair(64, None)
