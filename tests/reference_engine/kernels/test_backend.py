"""ops/backend.py: torch ops by default, Triton kernels on CUDA, same signatures."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
from kernel_interpreter import REPO

from reference_engine.ops import backend


def test_cpu_gets_the_torch_ops():
    ops = backend.select_ops("cpu")
    assert set(ops.backends.values()) == {"torch"}
    assert ops.rms_norm.__module__ == "reference_engine.ops.norms"
    # the decode-step fallbacks must be the capturable (static-shape) variants
    assert ops.gdn_recurrent_decode.__module__ == "reference_engine.ops.linear_attention"
    assert ops.paged_decode.__module__ == "reference_engine.ops.static_attention"
    assert backend.select_ops("cuda", use_triton=False) == ops  # use_triton=False: the torch ops on any device


def test_every_kernel_module_imports_and_has_the_torch_signature():
    kernels = backend.triton_kernels()
    assert set(kernels) == set(backend.TRITON_KERNELS), sorted(set(backend.TRITON_KERNELS) - set(kernels))
    torch_ops = backend.torch_ops()
    for name, kernel in kernels.items():
        expected = list(inspect.signature(getattr(torch_ops, name)).parameters)
        parameters = inspect.signature(kernel).parameters
        assert list(parameters)[: len(expected)] == expected, name  # the torch op's signature first, in order
        extras = list(parameters.values())[len(expected) :]  # then only optional kernel-only arguments (fused_add_rms_norm: steps_out)
        assert all(parameter.default is not inspect.Parameter.empty for parameter in extras), (name, extras)


def test_kernels_are_registered_for_cuda_under_the_triton_backend():
    from reference_engine.ops.registry import registered

    backend.triton_kernels()
    entries = [entry for entries in registered().values() for entry in entries if entry.target.startswith("reference_engine.kernels.")]
    assert {entry.backend for entry in entries} == {"triton"}
    assert all(entry.devices == ("cuda",) for entry in entries)
    assert {entry.contract_id for entry in entries} >= {
        "quantization/w4a16-linear", "moe/routed-experts", "moe/router-topk", "linear-attention/gdn-recurrent-decode",
        "attention/paged-decode", "norms-and-activations/rmsnorm", "norms-and-activations/fused-add-rmsnorm", "norms-and-activations/gated-rmsnorm",
    }


def test_a_kernel_refuses_cpu_tensors_without_the_interpreter():
    from reference_engine.kernels.norms import rms_norm

    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="CUDA"):
        rms_norm(x, torch.zeros(8), torch.empty_like(x))


def test_benchmark_script_prints_its_usage_without_arguments():
    result = subprocess.run([sys.executable, "benchmarks/kernels/bench_decode_kernels.py"], check=False, cwd=REPO, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "bench_decode_kernels.py results.json" in result.stdout, result.stderr[-2000:]


@pytest.mark.cuda
def test_cuda_gets_the_triton_kernels():
    ops = backend.select_ops("cuda")
    assert {ops.backends[name] for name in backend.TRITON_KERNELS} == {"triton"}
    assert ops.causal_conv1d_update.__module__ == "reference_engine.ops.linear_attention"


@pytest.mark.slow
def test_every_kernel_compiles_for_sm_90_without_a_gpu():
    """Ahead-of-time compile (Triton's bundled ptxas) at the configurations the wrappers pick: about 20 s."""
    result = subprocess.run([sys.executable, "benchmarks/kernels/compile_sm90.py"], check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("ok ") >= 16, result.stdout


def test_host_integer_helpers_equal_tritons():
    """The wrappers' plain-int `cdiv` / `next_power_of_2` give Triton's values (they replace its slower host calls)."""
    import triton

    from reference_engine.kernels.launch import cdiv, next_power_of_2

    for n in [*range(-3, 300), 1023, 1024, 1025, 2**20 - 1, 2**20, 2**31 - 1, 2**31]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for div in (1, 2, 3, 16, 64, 127, 128, 132):
            assert cdiv(n, div) == triton.cdiv(n, div), (n, div)
