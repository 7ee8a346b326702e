"""Triton Gated DeltaNet decode step against linear-attention/gdn-recurrent-decode."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_all_passed, assert_script_ok, interpreter_run

CONTRACT = "linear-attention/gdn-recurrent-decode"
IMPL = "reference_engine.kernels.gdn_decode:gdn_recurrent_decode"
CPU_CASES = [
    "small-f32", "small-bf16", "equal-heads-f32",  # decode-t1-bf16 (real head shape) passes too: 20 s in the interpreter
    "hv-not-multiple-of-hk", "state-batch-mismatch", "state-not-float32", "value-batch-mismatch", "beta-wrong-shape",
]
WRONG = ["gdn_beta_ignored", "gdn_key_heads_tiled"]
WRONG_CASES = ["small-f32"]

IN_PLACE_SCRIPT = """
import torch
from reference_engine.kernels.gdn_decode import gdn_recurrent_decode
from reference_engine.ops.linear_attention import gdn_recurrent_decode as torch_op

g = torch.Generator().manual_seed(3)
B, Hk, Hv, Dk, Dv = 2, 2, 4, 16, 64
q, k = torch.randn(B, Hk, Dk, generator=g), torch.randn(B, Hk, Dk, generator=g)
v = torch.randn(B, Hv, Dv, generator=g)
gate, beta = -torch.rand(B, Hv, generator=g), torch.rand(B, Hv, generator=g)
state = torch.randn(B, Hv, Dk, Dv, generator=g)
expected_out, expected_state = torch.empty(B, Hv, Dv), torch.empty_like(state)
torch_op(q, k, v, gate, beta, state, expected_out, expected_state)
out = torch.full((B, Hv, Dv), float("nan"))
gdn_recurrent_decode(q, k, v, gate, beta, state, out, state)  # state_out is state
torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({CONTRACT: {IMPL: CPU_CASES} | {f"wrong_kernels:{name}": WRONG_CASES for name in WRONG}}, IN_PLACE_SCRIPT)


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


def test_state_updated_in_place_with_several_column_blocks(run):
    assert_script_ok(run)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 32])
def test_matches_the_torch_op_on_cuda(batch):
    from reference_engine.kernels.gdn_decode import gdn_recurrent_decode
    from reference_engine.ops.linear_attention import gdn_recurrent_decode as torch_op

    generator = torch.Generator(device="cuda").manual_seed(batch)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda")

    q, k, v = randn(batch, 16, 128).bfloat16(), randn(batch, 16, 128).bfloat16(), randn(batch, 32, 128).bfloat16()
    gate = -torch.rand(batch, 32, generator=generator, device="cuda")
    beta = torch.rand(batch, 32, generator=generator, device="cuda")
    state = randn(batch, 32, 128, 128)
    expected_out, expected_state = torch.empty_like(v), torch.empty_like(state)
    torch_op(q, k, v, gate, beta, state, expected_out, expected_state)
    out = torch.full_like(v, float("nan"))
    gdn_recurrent_decode(q, k, v, gate, beta, state, out, state)
    torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.float(), expected_out.float(), rtol=1e-2, atol=1e-2)
