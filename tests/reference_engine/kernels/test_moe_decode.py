"""Triton fused routed experts: moe/routed-experts (dense weights) and the NVFP4 variant vs the torch op."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "moe/routed-experts"
IMPL = "reference_engine.kernels.moe_decode:routed_experts"
# real-expert-shape-bf16 (H 2048, I 512) takes over a minute in the interpreter: left to CUDA.
CPU_CASES = ["small-f32", "small-bf16", "every-expert-busy-f32", "one-token-bf16", "ids-out-of-range", "ids-int64", "weights-ids-mismatch", "gate-up-down-mismatch", "weight-dtype-mismatch"]
WRONG = ["moe_gate_up_swapped", "moe_last_slot_skipped"]
WRONG_CASES = ["small-f32"]

# The NVFP4 variant against the torch op on the dequantised weights (float32: exact to rounding;
# bfloat16: within the contract's bf16 bound), and a wrong variant (gate/up tensor scales swapped).
NVFP4_SCRIPT = """
import torch
from reference_engine.kernels.moe_decode import nvfp4_routed_experts, stack_nvfp4_experts
from reference_engine.ops.moe import routed_experts
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

g = torch.Generator().manual_seed(5)
E, H, I, T, K = 5, 64, 32, 3, 2
def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)
gate = [q(I, H, 0.1) for _ in range(E)]
up = [q(I, H, 0.3) for _ in range(E)]
down = [q(H, I, 0.2) for _ in range(E)]
experts = stack_nvfp4_experts(gate, up, down)
deq = lambda t: dequantize_nvfp4(*t, dtype=torch.float32)
gate_up = torch.stack([torch.cat([deq(a), deq(b)]) for a, b in zip(gate, up)])
down_dense = torch.stack([deq(d) for d in down])
ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K].to(torch.int32)
weights = torch.softmax(torch.randn(T, K, generator=g), dim=1)
x = torch.randn(T, H, generator=g)

def error(out, expected):
    return float((out.double() - expected.double()).norm() / expected.double().norm())

for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 6e-3)):
    expected = torch.empty(T, H, dtype=torch.float32)
    routed_experts(x.to(dtype).float(), weights, ids, gate_up, down_dense, expected)
    out = torch.full((T, H), float("nan"), dtype=dtype)
    nvfp4_routed_experts(x.to(dtype), weights, ids, experts, out)
    e = error(out, expected)
    print(f"{dtype} error {e:.2e}")
    assert e < bound, (dtype, e)

swapped = experts.__class__(**{**experts.__dict__, "gate_up_scale_2": experts.gate_up_scale_2.flip(1).contiguous()})
out = torch.full((T, H), float("nan"))
nvfp4_routed_experts(x, weights, ids, swapped, out)
expected = torch.empty(T, H)
routed_experts(x, weights, ids, gate_up, down_dense, expected)
assert error(out, expected) > 1e-2, "gate/up tensor scales swapped not caught"
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, NVFP4_SCRIPT)


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


def test_nvfp4_variant_matches_the_torch_op_on_dequantised_weights(run):
    assert_script_ok(run)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_nvfp4_matches_the_torch_op_on_cuda_at_the_real_shape(tokens):
    from reference_engine.kernels.moe_decode import nvfp4_routed_experts
    from reference_engine.ops.static_moe import StackedNvfp4Experts
    from reference_engine.ops.static_moe import (
        nvfp4_routed_experts as torch_nvfp4_routed_experts,
    )

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    experts_count, hidden, inter, top_k = 256, 2048, 512, 8

    def codes(*shape):
        return torch.randint(0, 256, shape, generator=generator, device="cuda", dtype=torch.int32).to(torch.uint8)

    def scales(*shape):
        return torch.randint(0x28, 0x48, shape, generator=generator, device="cuda", dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)

    experts = StackedNvfp4Experts(
        codes(experts_count, 2 * inter, hidden // 2), scales(experts_count, 2 * inter, hidden // 16),
        torch.rand(experts_count, 2, generator=generator, device="cuda") * 1e-2 + 1e-3,
        codes(experts_count, hidden, inter // 2), scales(experts_count, hidden, inter // 16),
        torch.rand(experts_count, generator=generator, device="cuda") * 1e-2 + 1e-3,
    )
    ids = torch.rand(tokens, experts_count, generator=generator, device="cuda").argsort(dim=1)[:, :top_k].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator, device="cuda"), dim=1)
    x = torch.randn(tokens, hidden, generator=generator, device="cuda").to(torch.bfloat16)
    expected = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    torch_nvfp4_routed_experts(x, weights, ids, experts, expected)
    out = torch.full_like(expected, float("nan"))
    nvfp4_routed_experts(x, weights, ids, experts, out)
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert error < 1e-2, error


@pytest.mark.cuda
def test_dense_contract_cases_pass_on_cuda():
    pytest.importorskip("pydantic")  # the toolbox harness needs it; the GPU image may not have it
    import subprocess
    import sys

    from kernel_interpreter import REPO

    result = subprocess.run(
        [sys.executable, "-m", "toolbox.cli", "test", CONTRACT, "--impl", IMPL, "--device", "cuda", "--cases", "decode-t1-bf16", "--cases", "decode-t64-bf16", "--cases", "decode-t16-f32"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:]
