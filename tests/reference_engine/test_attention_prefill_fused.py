"""The attention layer's fused eager prefill (`GatedAttention._prefill_fused`: stacked q/k/v GEMM, the prep kernel for
every token, fused attention over the cache, the output gate read in place) against the composed torch path.

Under the Triton interpreter, on an attention layer of the tiny preset: a fresh two-sequence prefill, then a
continuation of one sequence over its cached prefix (the offset causal mask). Caches start poisoned with NaN; the
outputs and every written cache slot must match the composed path. Two known-wrong variants (the prep kernel run
with half the rotary dims; the output gate dropped on the fused path) must be caught, and the fused path must really run (counted).
"""

from __future__ import annotations

import json

import pytest

from tests.reference_engine.kernels.kernel_interpreter import run_script

F32_BOUND = 1e-5  # rel_fro, float32 (one rounding in the prep kernel against two in the composed ops)
WRONG_MIN_ERROR = 1e-2

SCRIPT = r"""
import json
import torch
from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.kernels import attention_prep
from reference_engine.model import attention as attention_module
from reference_engine.model import eager_ops
from reference_engine.presets import build_preset

model = build_preset("tiny", dtype=torch.float32, seed=4)
index = next(i for i, layer in enumerate(model.layers) if hasattr(layer.mixer, "q_norm"))
layer = model.layers[index].mixer
assert layer.qkv is not None
H = model.config.hidden_size
BLOCK = 4

def batch(lengths, positions, slots, tables, seq_lens):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return ForwardBatch(input_ids=torch.zeros(sum(lengths), dtype=torch.int64), positions=torch.tensor(positions), cu_seqlens_q=cu,
                        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=torch.tensor(tables, dtype=torch.int32),
                        slot_mapping=torch.tensor(slots), state_slots=torch.zeros(len(lengths), dtype=torch.int64),
                        has_initial_state=torch.zeros(len(lengths), dtype=torch.bool), logits_indices=torch.zeros(1, dtype=torch.int64), is_decode=False)

STEPS = [  # a fresh prefill of 7 and 5 tokens, then 3 more tokens of the first sequence over its cached 7
    batch([7, 5], [*range(7), *range(5)], [*range(7), *range(8, 13)], [[0, 1, 4], [2, 3, 5]], [7, 5]),
    batch([3], [7, 8, 9], [7, 16, 17], [[0, 1, 4]], [10]),
]
WRITTEN = [*range(13), 16, 17]

def run(backend, seed=0):
    gen = torch.Generator().manual_seed(seed)
    caches = ModelCaches.allocate(model.config, 6, BLOCK, 1)
    k_cache, v_cache = caches.k_cache[index], caches.v_cache[index]
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    outputs = []
    with eager_ops.forced_backend(backend):
        for step in STEPS:
            x = torch.randn(step.positions.shape[0], H, generator=gen)
            outputs.append(layer(x, step, caches))
    flat = lambda cache: cache.flatten(0, 1)[WRITTEN]
    return torch.cat(outputs), flat(k_cache), flat(v_cache)

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

calls = {"prep": 0}
real_prep = attention_prep.attention_decode_prep
def counted(*args, **kwargs):
    calls["prep"] += 1
    return real_prep(*args, **kwargs)
attention_prep.attention_decode_prep = counted

def compare():
    want, got = run("torch"), run("triton")
    errors = {name: rel(g, w) for name, g, w in zip(("out", "k", "v"), got, want)}
    errors["nan"] = int(sum(t.isnan().sum() for t in (*got, *want)))
    return errors

result = {"float32": compare(), "calls": dict(calls)}

def rotary_halved(*args, **kwargs):
    return real_prep(*args, **{**kwargs, "rotary_dim": kwargs["rotary_dim"] // 2})
attention_prep.attention_decode_prep = rotary_halved
result["rotary_dim_halved"] = compare()
attention_prep.attention_decode_prep = real_prep
real_gate = attention_module.output_gate
# only the fused path passes the gate as a strided view of the q_proj output: this variant drops it there alone
attention_module.output_gate = lambda attn, gate, out: real_gate(attn, gate if gate.is_contiguous() else torch.zeros_like(gate), out)
result["fused_gate_dropped"] = compare()
print("RESULT" + json.dumps(result))
"""


@pytest.fixture(scope="module")
def measured():
    output = run_script(SCRIPT, timeout=600)
    marker = output.rfind("RESULT")
    assert marker >= 0, output
    return json.loads(output[marker + len("RESULT") :].splitlines()[0])


def test_the_fused_path_runs_once_per_step(measured):
    assert measured["calls"] == {"prep": 2}, measured["calls"]


def test_fused_prefill_matches_the_composed_path(measured):
    errors = measured["float32"]
    assert errors["nan"] == 0, errors
    assert errors["out"] < F32_BOUND and errors["k"] < F32_BOUND, errors
    assert errors["v"] == 0.0, errors  # values are copied into the cache unchanged


@pytest.mark.parametrize("wrong", ["rotary_dim_halved", "fused_gate_dropped"])
def test_the_comparison_rejects_a_known_wrong_variant(measured, wrong):
    errors = measured[wrong]
    assert max(errors["out"], errors["k"]) > WRONG_MIN_ERROR, errors
