"""The eager prefill ops of the Gated DeltaNet layer: which implementation runs, and that results do not change.

- `model.eager_ops` picks the torch op for CPU tensors unless forced; forcing "triton" runs the kernel.
- Under the Triton interpreter (a subprocess with TRITON_INTERPRET=1), a small `GatedDeltaNet` layer
  prefilled with the Triton ops forced (chunked prefill, gated RMSNorm) gives the output and final
  conv/recurrent states of the torch ops (a fresh prefill, then a continuation from the states, ragged;
  float32 tight, bfloat16 looser); two known-wrong prefills (decay dropped, a sequence boundary moved)
  fail the same comparison.
- The torch ops rewritten to launch fewer kernels (`causal_conv1d`: one index table, no per-tap index
  arithmetic; `gdn_chunked_prefill`: step-major chunks, no per-step gathers or host copies; `gdn_gates`)
  equal independent references, and the chunk scan's launches per chunk step stay bounded.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from reference_engine.model import eager_ops
from reference_engine.ops import linear_attention as la
from reference_engine.ops import moe, norms
from tests.reference_engine.kernels.kernel_interpreter import run_script

F32_BOUND = 1e-5  # rel_fro, Triton (interpreter, ieee dots) vs torch in float32 (measured about 2.5e-7)
BF16_OUT_BOUND = 1e-2  # rel_fro of the bf16 layer output (measured 0: both round the same float32 values)
WRONG_MIN_ERROR = 1e-2  # a known-wrong prefill must be off by at least this (measured 0.09 and 1.0)

# ------------------------------------------------------------------------------------------ selection


@pytest.mark.parametrize("name", sorted(eager_ops.EAGER_OPS))
def test_cpu_tensors_get_the_torch_op_unless_forced(name):
    tensor = torch.randn(3, 4)
    torch_op = eager_ops.EAGER_OPS[name][0]
    assert eager_ops.eager_backend(name, tensor) == "torch"
    assert eager_ops.eager_op(name, tensor) is torch_op
    assert eager_ops.eager_op(name, tensor, backend="torch") is torch_op
    with eager_ops.forced_backend("torch"):
        assert eager_ops.eager_op(name, tensor) is torch_op
    with eager_ops.forced_backend("triton"):
        assert eager_ops.eager_backend(name, tensor) == "triton"
        assert eager_ops.eager_backend(name, tensor, backend="torch") == "torch"  # the argument wins over the block
        with eager_ops.forced_backend(None):
            assert eager_ops.eager_backend(name, tensor) == "torch"
        assert eager_ops.eager_backend(name, tensor) == "triton"  # restored on exit
    assert eager_ops.eager_backend(name, tensor) == "torch"


def test_the_table_pairs_ops_with_the_same_signature():
    assert eager_ops.EAGER_OPS["gdn_chunked_prefill"][0] is la.gdn_chunked_prefill
    assert eager_ops.EAGER_OPS["gated_rms_norm"][0] is norms.gated_rms_norm
    assert eager_ops.EAGER_OPS["router_topk"][0] is moe.router_topk
    pytest.importorskip("triton")
    import inspect

    for name in eager_ops.EAGER_OPS:
        kernel = eager_ops.eager_op(name, torch.empty(0), backend="triton")
        assert kernel is not eager_ops.EAGER_OPS[name][0]
        kernel_params = inspect.signature(kernel).parameters
        op_params = list(inspect.signature(eager_ops.EAGER_OPS[name][0]).parameters)
        assert list(kernel_params)[: len(op_params)] == op_params, name  # the op's signature first, in order
        extras = list(kernel_params.values())[len(op_params):]  # then only optional kernel-only arguments (gdn_gates: valid_tokens)
        assert all(parameter.default is not inspect.Parameter.empty for parameter in extras), (name, extras)


def test_bad_names_and_backends_raise():
    with pytest.raises(ValueError, match="unknown eager op"):
        eager_ops.eager_op("gdn_prefill", torch.empty(1))
    with pytest.raises(ValueError, match="backend must be one of"):
        eager_ops.eager_op("gated_rms_norm", torch.empty(1), backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"), eager_ops.forced_backend("fast"):
        pass


def test_without_triton_forcing_raises_and_nothing_is_found(monkeypatch):
    real_import = eager_ops.importlib.import_module

    def no_kernels(name, *args):
        if name.startswith("reference_engine.kernels."):
            raise ImportError("No module named 'triton'")
        return real_import(name, *args)

    monkeypatch.setattr(eager_ops.importlib, "import_module", no_kernels)
    assert eager_ops._kernel("gdn_chunked_prefill", required=False) is None
    with pytest.raises(ImportError, match="was forced but"):
        eager_ops.eager_op("gdn_chunked_prefill", torch.empty(1), backend="triton")
    assert eager_ops.eager_op("gdn_chunked_prefill", torch.empty(1)) is la.gdn_chunked_prefill


# ------------------------------------------------------------- the layer on the Triton ops (interpreter)

LAYER_SCRIPT = r"""
import json
import torch
from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.kernels import gdn_chunked_prefill as kernel_module
from reference_engine.kernels import norms as norm_module
from reference_engine.model import eager_ops
from reference_engine.model.gated_deltanet import GatedDeltaNet
from reference_engine.model.linear import Linear

HK, HV, DK, DV, K, H, SLOTS = 2, 4, 16, 16, 4, 32, 3
STEPS = [([2, 0], [7, 20]), ([2, 0], [13, 1])]  # (state slots, new tokens per sequence): a fresh prefill, then a continuation

def build_layer(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dtype)
    channels = 2 * HK * DK + HV * DV
    return GatedDeltaNet(
        layer_index=0, in_proj_qkv=Linear.dense(randn(channels, H, scale=H**-0.5)), in_proj_z=Linear.dense(randn(HV * DV, H, scale=H**-0.5)),
        in_proj_b=Linear.dense(randn(HV, H, scale=H**-0.5)), in_proj_a=Linear.dense(randn(HV, H, scale=H**-0.5)),
        conv_weight=randn(channels, K, scale=K**-0.5), A_log=torch.empty(HV).uniform_(1.0, 8.0, generator=gen).log(),
        dt_bias=torch.empty(HV).uniform_(-1.0, 1.0, generator=gen), norm_weight=(1.0 + 0.1 * torch.randn(DV, generator=gen)).to(dtype),
        out_proj=Linear.dense(randn(H, HV * DV, scale=(HV * DV) ** -0.5)), num_k_heads=HK, num_v_heads=HV, k_head_dim=DK, v_head_dim=DV, eps=1e-6,
    )

def run_layer(layer, dtype, backend, seed):
    gen = torch.Generator().manual_seed(seed + 100)
    # Pools poisoned: a fresh sequence must not read its slot (zeros instead), and every used slot must be rewritten.
    conv = torch.full((SLOTS, 2 * HK * DK + HV * DV, K - 1), float("nan"), dtype=dtype)
    recurrent = torch.full((SLOTS, HV, DK, DV), float("nan"))
    caches = ModelCaches(1, 1, SLOTS, {}, {}, {0: conv}, {0: recurrent})
    outputs, fresh = [], True
    for slots, lengths in STEPS:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        tokens = sum(lengths)
        batch = ForwardBatch(
            input_ids=torch.zeros(tokens, dtype=torch.int64), positions=torch.zeros(tokens, dtype=torch.int64), cu_seqlens_q=cu,
            seq_lens=torch.tensor(lengths, dtype=torch.int32), block_tables=torch.zeros(len(lengths), 1, dtype=torch.int32),
            slot_mapping=torch.zeros(tokens, dtype=torch.int64), state_slots=torch.tensor(slots),
            has_initial_state=torch.tensor([not fresh] * len(slots)), logits_indices=torch.zeros(1, dtype=torch.int64), is_decode=False,
        )
        x = torch.randn(tokens, H, generator=gen).to(dtype)
        with eager_ops.forced_backend(backend):
            outputs.append(layer(x, batch, caches))
        fresh = False
    used = sorted({s for slots, _ in STEPS for s in slots})
    return torch.cat(outputs), conv[used], recurrent[used]

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

calls = {"prefill": 0, "norm": 0}
real_prefill, real_norm = kernel_module.gdn_chunked_prefill, norm_module.gated_rms_norm
def counted(key, function):
    def wrapper(*args, **kwargs):
        calls[key] += 1
        return function(*args, **kwargs)
    return wrapper
kernel_module.gdn_chunked_prefill = counted("prefill", real_prefill)
norm_module.gated_rms_norm = counted("norm", real_norm)

def compare(dtype, seed):
    layer = build_layer(dtype, seed)
    reference = run_layer(layer, dtype, "torch", seed)
    result = run_layer(layer, dtype, "triton", seed)
    errors = {name: rel(got, want) for name, got, want in zip(("out", "conv", "recurrent"), result, reference)}
    errors["nan"] = int(sum(t.isnan().sum() for t in (*result, *reference)))
    return errors

measured = {"float32": compare(torch.float32, 1)}
measured["calls"] = dict(calls)
measured["bfloat16"] = compare(torch.bfloat16, 2)

def drops_decay(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64, **pools):
    real_prefill(query, key, value, torch.zeros_like(g), beta, cu_seqlens, initial_state, out=out, final_state=final_state, **pools)

def moves_a_boundary(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64, **pools):
    moved = cu_seqlens.clone()
    moved[1] += 1  # the first sequence takes the second one's first token
    real_prefill(query, key, value, g, beta, moved, initial_state, out=out, final_state=final_state, **pools)

for wrong in (drops_decay, moves_a_boundary):
    kernel_module.gdn_chunked_prefill = wrong
    measured[wrong.__name__] = compare(torch.float32, 1)
print("RESULT" + json.dumps(measured))
"""


@pytest.fixture(scope="module")
def layer_run():
    output = run_script(LAYER_SCRIPT, timeout=600)
    marker = output.rfind("RESULT")
    assert marker >= 0, output
    return json.loads(output[marker + len("RESULT") :].splitlines()[0])


def test_forcing_triton_runs_the_kernels_in_the_layer(layer_run):
    assert layer_run["calls"] == {"prefill": 2, "norm": 2}, layer_run["calls"]  # two prefill steps, each one call of each


def test_float32_layer_matches_the_torch_ops(layer_run):
    errors = layer_run["float32"]
    assert errors["nan"] == 0, errors
    assert errors["conv"] == 0.0, errors  # the conv state is a copy of inputs: exact on either backend
    assert errors["out"] < F32_BOUND and errors["recurrent"] < F32_BOUND, errors


def test_bfloat16_layer_matches_the_torch_ops(layer_run):
    errors = layer_run["bfloat16"]
    assert errors["nan"] == 0, errors
    assert errors["out"] < BF16_OUT_BOUND, errors
    assert errors["recurrent"] < 1e-3, errors  # float32 state; the Triton conv may round a rare bf16 element one ulp off torch's (measured 2.2e-4)


@pytest.mark.parametrize("wrong", ["drops_decay", "moves_a_boundary"])
def test_the_comparison_rejects_a_known_wrong_prefill(layer_run, wrong):
    errors = layer_run[wrong]
    assert max(errors["out"], errors["recurrent"]) > WRONG_MIN_ERROR, errors
    assert max(errors["out"], errors["recurrent"]) > 1000 * F32_BOUND, errors


# ------------------------------------------------------------------- the rewritten torch ops, unchanged


def _prefill_inputs(lengths, dtype, seed, hk=2, hv=4, dk=16, dv=16):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    q = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
    k = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
    v = torch.randn(tokens, hv, dv, generator=gen).to(dtype)
    g = -0.5 * torch.rand(tokens, hv, generator=gen) - 0.01
    beta = 0.98 * torch.rand(tokens, hv, generator=gen) + 0.01
    state = torch.randn(len(lengths), hv, dk, dv, generator=gen)
    return q, k, v, g, beta, cu, state


def _token_recurrence(q, k, v, g, beta, cu, state):
    """gdn_recurrent_decode one token at a time per sequence (no chunks): float32 out, final states."""
    out = torch.empty(v.shape)
    final = state.clone()
    for b, (start, end) in enumerate(itertools.pairwise(cu.tolist())):
        s = state[b : b + 1].clone()
        for t in range(start, end):
            o, nxt = torch.empty(1, *v.shape[1:]), torch.empty_like(s)
            la.gdn_recurrent_decode(q[t : t + 1].float(), k[t : t + 1].float(), v[t : t + 1].float(), g[t : t + 1], beta[t : t + 1], s, o, nxt)
            out[t], s = o[0], nxt
        final[b] = s[0]
    return out, final


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize(
    "lengths,chunk,in_place",
    [
        ([40, 0, 3, 70, 17], 16, False),  # chunk counts out of order, an empty sequence: the plan reorders and restores
        ([1, 5, 16, 17, 40], 8, True),  # final_state is initial_state
        ([33], 64, False),
        ([2, 2, 2], 1, True),
    ],
)
def test_torch_chunked_prefill_matches_the_token_recurrence(lengths, chunk, in_place):
    q, k, v, g, beta, cu, state = _prefill_inputs(lengths, torch.float32, seed=len(lengths) + chunk)
    out = torch.full_like(v, float("nan"))
    final = state.clone() if in_place else torch.full_like(state, float("nan"))
    la.gdn_chunked_prefill(q, k, v, g, beta, cu, final if in_place else state, out, final, chunk_size=chunk)
    expected_out, expected_final = _token_recurrence(q, k, v, g, beta, cu, state)
    assert not out.isnan().any() and not final.isnan().any()
    assert _rel(out, expected_out) < F32_BOUND and _rel(final, expected_final) < F32_BOUND


def test_torch_chunked_prefill_of_a_batch_equals_each_sequence_alone():
    lengths = [40, 0, 3, 70, 17]
    q, k, v, g, beta, cu, state = _prefill_inputs(lengths, torch.bfloat16, seed=9)
    out, final = torch.full_like(v, float("nan")), torch.full_like(state, float("nan"))
    la.gdn_chunked_prefill(q, k, v, g, beta, cu, state, out, final, chunk_size=16)
    for b, (start, end) in enumerate(itertools.pairwise(cu.tolist())):
        one_out, one_final = torch.empty_like(v[start:end]), torch.empty_like(state[b : b + 1])
        one_cu = torch.tensor([0, end - start], dtype=torch.int32)
        la.gdn_chunked_prefill(q[start:end], k[start:end], v[start:end], g[start:end], beta[start:end], one_cu, state[b : b + 1], one_out, one_final, chunk_size=16)
        torch.testing.assert_close(out[start:end], one_out, rtol=0, atol=0)
        torch.testing.assert_close(final[b : b + 1], one_final, rtol=1e-6, atol=1e-6)


def _conv_reference(x, weight, cu, initial_state):
    """Per sequence: history = [state, x], tap by tap in float32 in the op's order, then SiLU."""
    out = torch.empty_like(x)
    final = torch.empty_like(initial_state)
    kernel = weight.shape[1]
    for b, (start, end) in enumerate(itertools.pairwise(cu.tolist())):
        history = torch.cat([initial_state[b].T, x[start:end]])  # [K-1 + n, C]
        acc = history[0 : end - start].float() * weight[:, 0].float()
        for tap in range(1, kernel):
            acc += history[tap : tap + end - start].float() * weight[:, tap].float()
        out[start:end] = F.silu(acc).to(x.dtype)
        final[b] = history[history.shape[0] - (kernel - 1) :].T
    return out, final


@pytest.mark.parametrize(
    "lengths,channels,kernel,dtype",
    [([13], 24, 4, torch.float32), ([1, 5, 0, 2, 30], 24, 4, torch.bfloat16), ([1, 1, 1], 16, 4, torch.float32), ([9, 1, 12], 40, 5, torch.bfloat16)],
)
def test_torch_causal_conv1d_equals_the_per_sequence_definition(lengths, channels, kernel, dtype):
    gen = torch.Generator().manual_seed(sum(lengths))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    x = torch.randn(sum(lengths), channels, generator=gen).to(dtype)
    weight = torch.randn(channels, kernel, generator=gen).to(dtype)
    state = torch.randn(len(lengths), channels, kernel - 1, generator=gen).to(dtype)
    out, final = torch.full_like(x, float("nan")), torch.full_like(state, float("nan"))
    la.causal_conv1d(x, weight, cu, state, out, final)
    expected_out, expected_final = _conv_reference(x, weight, cu, state)
    assert torch.equal(out, expected_out) and torch.equal(final, expected_final)
    in_place = state.clone()  # final_state may be initial_state
    la.causal_conv1d(x, weight, cu, in_place, torch.empty_like(x), in_place)
    assert torch.equal(in_place, expected_final)


def test_conv_reference_detects_a_shifted_tap():
    """The exact comparison above can fail: a conv that reads one position too late differs."""
    lengths, channels, kernel = [5, 9], 8, 4
    gen = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    x, weight = torch.randn(14, channels, generator=gen), torch.randn(channels, kernel, generator=gen)
    state = torch.randn(2, channels, kernel - 1, generator=gen)
    out, final = torch.empty_like(x), torch.empty_like(state)
    la.causal_conv1d(x, torch.roll(weight, 1, dims=1), cu, state, out, final)
    assert not torch.equal(out, _conv_reference(x, weight, cu, state)[0])


def test_torch_gdn_gates_equal_the_formula():
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(11, 6, generator=gen).bfloat16(), torch.randn(11, 6, generator=gen).bfloat16()
    A_log, dt_bias = torch.rand(6, generator=gen) * 2, torch.randn(6, generator=gen)
    g, beta = torch.full((11, 6), float("nan")), torch.full((11, 6), float("nan"))
    la.gdn_gates(a, b, A_log, dt_bias, g=g, beta=beta)
    assert torch.equal(g, -torch.exp(A_log) * F.softplus(a.float() + dt_bias))
    assert torch.equal(beta, torch.sigmoid(b.float()))


# -------------------------------------------------------------------------------------- launch counts


class _CountOps(TorchDispatchMode):
    """Counts aten ops that compute (views and allocations excluded): a proxy for kernel launches."""

    FREE = ("empty", "view", "_unsafe_view", "as_strided", "slice", "select", "t", "transpose", "expand", "unsqueeze", "split",
            "split_with_sizes", "alias", "detach", "_reshape_alias", "lift_fresh", "permute", "squeeze", "_local_scalar_dense")  # fmt: skip

    def __init__(self):
        super().__init__()
        self.count = 0
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func.__name__.split(".")[0] not in self.FREE and "empty" not in func.__name__:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _counted(function, args, monkeypatch, host_functions=()):
    """Ops of `function(*args)`, not counting those of the host-side index builders named (CPU tensors, no launch on CUDA)."""
    counter = _CountOps()
    for name in host_functions:
        original = getattr(la, name)

        def paused(*a, _original=original, **k):
            counter.paused = True
            try:
                return _original(*a, **k)
            finally:
                counter.paused = False

        monkeypatch.setattr(la, name, paused)
    with counter:
        function(*args)
    return counter.count


def _prefill_ops(lengths, chunk, monkeypatch):
    q, k, v, g, beta, cu, state = _prefill_inputs(lengths, torch.float32, seed=1)
    out, final = torch.empty_like(v), torch.empty_like(state)
    return _counted(lambda: la.gdn_chunked_prefill(q, k, v, g, beta, cu, state, out, final, chunk_size=chunk), (), monkeypatch, ("_chunk_plan",))


def test_the_chunk_scan_launches_a_fixed_handful_per_step(monkeypatch):
    """Ops per extra chunk step: 8 (four products, a subtraction, two additions written in place, the decay),
    whatever the batch; the previous form gathered and scattered per step (17, plus two host-to-device copies)."""
    one_step, nine_steps = _prefill_ops([16], 16, monkeypatch), _prefill_ops([144], 16, monkeypatch)
    ragged = _prefill_ops([144, 5, 80, 0, 33], 16, monkeypatch)  # nine steps too, five sequences
    assert (nine_steps - one_step) / 8 <= 8, (one_step, nine_steps)
    assert ragged - nine_steps <= 2, (nine_steps, ragged)  # sequences active for part of the steps: no extra ops per step
    assert one_step <= 55, one_step  # the whole op at one chunk: 51 (the previous form: 84, and 17 more per step)


def test_the_conv_launches_do_not_grow_with_the_batch(monkeypatch):
    def conv_ops(lengths):
        gen = torch.Generator().manual_seed(0)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        x, weight = torch.randn(sum(lengths), 16, generator=gen), torch.randn(16, 4, generator=gen)
        state = torch.randn(len(lengths), 16, 3, generator=gen)
        return _counted(la.causal_conv1d, (x, weight, cu, state, torch.empty_like(x), torch.empty_like(state)), monkeypatch, ("_conv_rows",))

    one, many = conv_ops([50]), conv_ops([3, 0, 17, 1, 30, 9, 2])
    assert one <= many <= one + 1 <= 19, (one, many)  # K = 4 taps: 17, 18 (one more copy of the states when B > 1); the previous form 75


# ---------------------------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_cuda_prefill_picks_triton_and_matches_torch():
    """The tiny model on the GPU (float32): the automatic choice is Triton on sm_90+, and a ragged prefill with
    it gives the logits and recurrent states of the torch ops (tf32x3 dots: about float32 accuracy)."""
    import importlib.util

    from reference_engine.contract_entries.simple_driver import SimpleDriver
    from reference_engine.presets import build_preset

    expected = "triton" if importlib.util.find_spec("triton") and torch.cuda.get_device_capability() >= (9, 0) else "torch"
    probe = torch.empty(1, device="cuda")
    assert eager_ops.eager_backend("gdn_chunked_prefill", probe) == expected
    assert eager_ops.eager_backend("gated_rms_norm", probe) == expected
    model = build_preset("tiny", device="cuda", dtype=torch.float32, seed=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (300, 7, 130)]
    results = {}
    for backend in ("torch", None):  # None: the automatic choice
        driver = SimpleDriver(model, 3, 512)
        with eager_ops.forced_backend(backend):
            logits = driver.step([0, 1, 2], prompts)
        results[backend] = (torch.cat(logits), {i: s.clone() for i, s in driver.caches.recurrent_state.items()})
    assert _rel(results[None][0], results["torch"][0]) < 1e-3
    for layer, state in results["torch"][1].items():
        assert _rel(results[None][1][layer], state) < 1e-3, layer
