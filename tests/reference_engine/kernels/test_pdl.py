"""Programmatic dependent launch for the decode kernels (`kernels/pdl.py`, tuning key `pdl`).

PDL only changes when the next kernel is dispatched: every PDL-aware kernel waits for the previous one before it reads
or writes anything, so the outputs must be the same bits with it on. On the CPU: the launch arguments (none under the
interpreter, which has no grid dependency control; the `PDL` constexpr and Triton's `launch_pdl` option otherwise), a
bad mode refused, the tuning key, and every batch-1 graph kernel's launch site passing them. The PTX of each such kernel
holds the wait and the release (`benchmarks/kernels/compile_sm90.py`, configurations named `pdl=`). On CUDA: the tiny
model's graph decode with the Triton kernels gives the same logits bits with PDL 0, 1 and 2, and so do the real-shape
MoE block and GDN step.
"""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from reference_engine.kernels import pdl

# (module, kernel) of every kernel the batch-1 decode graph launches through Triton: each must take `PDL`, start with
# `pdl_wait(PDL)` and be launched with `**pdl.launch_args()`.
GRAPH_KERNELS = (
    ("norms", "_rms_norm_kernel"), ("nvfp4_half_dot", "_w4a16_gemv_half_kernel"), ("dense_gemv", "_dense_gemv_kernel"),
    ("gdn_decode_step", "_recurrent_norm_kernel"), ("gdn_decode_step", "_conv_update_kernel"), ("attention_prep", "_attention_prep_kernel"),
    ("paged_decode", "_paged_split_kernel"), ("paged_decode", "_combine_kernel"), ("router", "_router_gemv_topk_kernel"),
    ("router", "_router_topk_kernel"), ("moe_decode", "_gate_up_kernel"), ("moe_decode", "_down_kernel"),
)  # fmt: skip
LAUNCH_MODULES = {"nvfp4_half_dot": "nvfp4_gemv"}  # the half GEMV is launched from nvfp4_gemv


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_no_launch_arguments_under_the_interpreter(mode, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(pdl, "MODE", mode)
    assert pdl.launch_args() == {}


def test_launch_arguments_on_a_gpu_build(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(pdl, "MODE", 0)
    assert pdl.launch_args() == {}
    for mode in (1, 2):
        monkeypatch.setattr(pdl, "MODE", mode)
        assert pdl.launch_args() == {"PDL": mode, "launch_pdl": True}
    monkeypatch.setattr(pdl, "MODE", 3)
    with pytest.raises(ValueError, match="pdl.MODE must be 0, 1 or 2"):
        pdl.launch_args()


def test_tuning_key_sets_the_mode(tmp_path, monkeypatch):
    from reference_engine.kernels import tuning

    monkeypatch.setattr(pdl, "MODE", 0)
    path = tmp_path / "card.json"
    path.write_text('{"device": "test card"}')
    tuning.write_setting(path, "pdl", 2)
    tuning.apply_tuning(path)
    assert pdl.MODE == 2
    with pytest.raises(ValueError):
        tuning.write_setting(path, "pdl", 3)


@pytest.mark.parametrize(("module_name", "kernel_name"), GRAPH_KERNELS)
def test_every_graph_kernel_waits_first_and_is_launched_with_the_arguments(module_name, kernel_name):
    """The kernel takes PDL and its first statement (after the docstring) is the wait; its launch passes launch_args()."""
    import importlib

    module = importlib.import_module(f"reference_engine.kernels.{module_name}")
    kernel = getattr(module, kernel_name)
    assert "PDL" in [param.name for param in kernel.params], kernel_name
    body = ast.parse(inspect.getsource(kernel.fn).lstrip()).body[0].body
    body = body[1:] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body
    first = ast.unparse(body[0])
    assert first == "pdl.pdl_wait(PDL)", (kernel_name, first)
    launcher = importlib.import_module(f"reference_engine.kernels.{LAUNCH_MODULES.get(module_name, module_name)}")
    tree = ast.parse(inspect.getsource(launcher))
    launches = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and ast.unparse(node.func.value) == kernel_name]  # fmt: skip
    assert launches, f"no launch of {kernel_name} found"
    for call in launches:
        assert any(keyword.arg is None and ast.unparse(keyword.value) == "pdl.launch_args()" for keyword in call.keywords), (kernel_name, ast.unparse(call)[:200])


@pytest.mark.cuda
def test_graph_decode_logits_are_the_same_bits_with_pdl_on_cuda(monkeypatch) -> None:
    from test_cuda_graphs import _decode_logits, _prompts

    from reference_engine.presets import build_preset

    model = build_preset("tiny", device="cuda", dtype=torch.bfloat16, quantize="nvfp4", seed=3)
    prompts = _prompts(3, model.config.vocab_size, seed=11)
    results = {}
    for mode in (0, 1, 2):
        monkeypatch.setattr(pdl, "MODE", mode)
        _, logits, engine = _decode_logits(model, "graphs", prompts, steps=4, device="cuda", use_triton=True)
        assert engine.runner.decoder.captured_buckets, "no graph was captured"
        results[mode] = logits
    for mode in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(results[0], results[mode])), mode


@pytest.mark.cuda
@pytest.mark.parametrize("mode", [1, 2])
def test_the_real_moe_block_and_gdn_step_are_the_same_bits_with_pdl_on_cuda(mode, monkeypatch) -> None:
    """The committed settings of the card, one token: the MoE block (router, gate/up, down) and the GDN step, PDL off and
    on, the same bits (outputs and states)."""
    import sys

    from kernel_interpreter import REPO
    from real_moe_layer import EXPERTS, HIDDEN, TOP_K, real_decode_inputs

    from reference_engine.kernels import moe_decode, tuning

    tuning.apply_for_cuda()
    experts, shared, x, _, _ = real_decode_inputs(1)
    generator = torch.Generator(device="cuda").manual_seed(5)
    router_weight = (torch.randn(EXPERTS + 1, HIDDEN, generator=generator, device="cuda") * HIDDEN**-0.5).bfloat16()
    sys.path.insert(0, str(REPO / "benchmarks" / "kernels"))
    from time_decode_pieces import gdn_step_setup

    results = {}
    for setting in (0, mode):
        monkeypatch.setattr(pdl, "MODE", setting)
        out = torch.full_like(x, float("nan"))
        moe_decode.moe_block_decode(x, router_weight, experts, shared, TOP_K, out)
        call, pools, step_out, _ = gdn_step_setup(1)
        call(0)
        torch.cuda.synchronize()
        results[setting] = (out, step_out, pools[0][0], pools[0][1])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[mode]))
