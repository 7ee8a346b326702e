"""The whole MoE block for decode in one op (`moe_block_decode`): router [E+1, H], top-k with a shared slot,
NVFP4 routed experts and the sigmoid-gated NVFP4 shared expert summed by one kernel.

Interpreter (one subprocess): the Triton op and the torch op against an independent float64 reference
of the whole block (softmax over the E routed logits, top-k renormalised, SwiGLU experts on weights
dequantised here in float64, plus sigmoid(shared logit) * shared expert), T = 1 and 3 (a padding-like
duplicate row), float32 and bfloat16, outputs poisoned with NaN; the expert kernels with repeated ids;
the router variant against the torch router; four known-wrong variants that the comparison must
reject; the Triton op wired into a tiny model's MoE block against the block's eager path.
In process (torch): the model builds the fused form once (router and shared Linears become views),
the static decode path runs through `moe_block_decode` and equals the eager path, and blocks that
cannot be fused (dense experts, shared intermediate != routed I) keep the composed path.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

SCRIPT = r"""
from dataclasses import replace

import torch

from reference_engine.kernels import launch, moe_decode, router
from reference_engine.ops import moe, static_moe
from reference_engine.ops.backend import torch_ops
from reference_engine.presets import build_preset
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(11)
E, H, I, K = 6, 64, 32, 2

def q(rows, cols, scale):
    return quantize_nvfp4(torch.randn(rows, cols, generator=g) * scale)

experts = moe_decode.stack_nvfp4_experts([q(I, H, 0.2) for _ in range(E)], [q(I, H, 0.3) for _ in range(E)], [q(H, I, 0.3) for _ in range(E)])
shared = static_moe.SharedNvfp4Expert.concatenate(q(I, H, 0.2), q(I, H, 0.3), q(H, I, 0.3))
router_weight = torch.randn(E + 1, H, generator=g) * 0.15  # logits ~ N(0, 1.4)
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)

def deq64(packed, scale, scale_2):
    # independent float64 dequantisation: element 2j in the low nibble, one E4M3 scale per 16 elements
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    return LUT[codes] * scale.double().repeat_interleave(16, dim=-1) * torch.as_tensor(scale_2).double()

routed_gate_up = torch.stack([torch.cat([deq64(experts.gate_up_packed[e, :I], experts.gate_up_scale[e, :I], experts.gate_up_scale_2[e, 0]),
                                         deq64(experts.gate_up_packed[e, I:], experts.gate_up_scale[e, I:], experts.gate_up_scale_2[e, 1])]) for e in range(E)])
routed_down = torch.stack([deq64(experts.down_packed[e], experts.down_scale[e], experts.down_scale_2[e]) for e in range(E)])
shared_gate_up = torch.cat([deq64(shared.gate_up_packed[:I], shared.gate_up_scale[:I], shared.gate_up_scale_2[0]),
                            deq64(shared.gate_up_packed[I:], shared.gate_up_scale[I:], shared.gate_up_scale_2[1])])
shared_down = deq64(shared.down_packed, shared.down_scale, shared.down_scale_2)

def swiglu64(x, gate_up, down):
    h = x @ gate_up.t()
    return (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ down.t()

def experts_reference(x, weights, ids):
    # float64: sum_j w_j expert_{ids_j}(x) over the routed slots + w_K shared(x); repeated ids count twice
    x = x.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            out[t] += float(weights[t, j]) * swiglu64(x[t : t + 1], routed_gate_up[e], routed_down[e])[0]
    return out + weights[:, K : K + 1].double() * swiglu64(x, shared_gate_up, shared_down)

def block_reference(x, rw):
    # float64 block: logits in x's dtype (as F.linear returns them), softmax over the E routed columns only
    logits = (x.double() @ rw.double().t()).to(x.dtype).double()
    probs = torch.softmax(logits[:, :E], dim=-1)
    top = probs.topk(K, dim=-1)
    weights = torch.cat([top.values / top.values.sum(-1, keepdim=True), torch.sigmoid(logits[:, E:])], dim=1)
    return experts_reference(x, weights, top.indices), top.indices

def rel(out, expected):
    assert torch.isfinite(out).all(), "unwritten (NaN) output"
    return float((out.double() - expected.double()).norm() / expected.double().norm())

def inputs(T, dtype):
    x = torch.randn(T, H, generator=g)
    if T == 3:
        x[2] = x[1]  # a padding-like duplicate row (same routing as row 1)
    return x.to(dtype), router_weight.to(dtype)

BOUND = {torch.float32: 1e-5, torch.bfloat16: 8e-3}  # measured: 2.4e-7 and 3.8e-3 (torch op), 2.5e-3 (Triton)
# Triton op vs torch op: float32 exact to rounding; bf16 differ by the torch op's bf16 dequantised weights.
AGREE = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
for T in (1, 3):
    for dtype in (torch.float32, torch.bfloat16):
        x, rw = inputs(T, dtype)
        expected, expected_ids = block_reference(x, rw)
        results = {}
        for name, op, words, split in (("triton", moe_decode.moe_block_decode, 0, 1), ("triton words", moe_decode.moe_block_decode, 1, 1),
                                       ("triton half", moe_decode.moe_block_decode, 2, 1), ("triton half e4m3", moe_decode.moe_block_decode, 3, 1),
                                       ("triton split 2", moe_decode.moe_block_decode, 2, 2), ("triton split 3", moe_decode.moe_block_decode, 0, 3),
                                       ("torch", static_moe.moe_block_decode, 0, 1)):  # fmt: skip
            # WORDS 1: int32 word reads, two codes per shift and mask; 2: packed float16 pairs (bf16 x); 3: those with the E4M3 decode.
            # DOWN_SPLIT: the K + 1 down slots dealt over that many programs per row block (split 2: {0, shared}, {1}).
            moe_decode.WORDS, moe_decode.DOWN_SPLIT = words, split
            out = torch.full((T, H), float("nan"), dtype=dtype)
            op(x, rw, experts, shared, K, out)
            moe_decode.WORDS, moe_decode.DOWN_SPLIT = 0, 1
            results[name] = out
            error = rel(out, expected)
            print(f"block T={T} {dtype} {name} vs float64: {error:.2e}")
            assert error < BOUND[dtype], (T, dtype, name, error)
        assert rel(results["triton words"], results["triton"]) < 1e-5, (T, dtype, "word reads change the result")
        assert rel(results["triton half"], results["triton"]) < 1e-5, (T, dtype, "packed float16 pairs change the result")
        assert rel(results["triton half e4m3"], results["triton"]) < 1e-5, (T, dtype, "the E4M3 decode changes the result")
        for split in (2, 3):  # the ticket-ordered sum over parts: same value up to float32 summation order
            assert rel(results[f"triton split {split}"], results["triton"]) < 1e-5, (T, dtype, split)
        assert int(launch._TICKETS[x.device].abs().sum()) == 0, "a split left its tickets behind"
        agree = rel(results["triton"], results["torch"])
        print(f"block T={T} {dtype} triton vs torch: {agree:.2e}")
        assert agree < AGREE[dtype], (T, dtype, agree)
        if T == 3:
            assert torch.equal(results["triton"][2], results["triton"][1])  # duplicate rows, identical outputs

# The router variant: same ids and weights as the torch op, the shared slot = (E, sigmoid(logit E)), every slot written.
for T in (1, 3):
    logits = torch.randn(T, E + 1, generator=g) * 2
    got_w, got_i = torch.full((T, K + 1), float("nan")), torch.full((T, K + 1), -7, dtype=torch.int32)
    router.router_topk_with_shared(logits, got_w, got_i, K)
    want_w, want_i = torch.full((T, K + 1), float("nan")), torch.full((T, K + 1), -7, dtype=torch.int32)
    moe.router_topk_with_shared(logits, want_w, want_i, K)
    assert torch.equal(got_i, want_i) and (got_i[:, K] == E).all(), (got_i, want_i)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_w[:, K], torch.sigmoid(logits[:, E]), rtol=1e-6, atol=1e-7)
    probs = torch.softmax(logits[:, :E].double(), -1).topk(K, -1)
    assert torch.equal(got_i[:, :K].long(), probs.indices)
    torch.testing.assert_close(got_w[:, :K].double(), probs.values / probs.values.sum(-1, keepdim=True), rtol=1e-6, atol=1e-7)

# Repeated ids (within a row and across rows) through the expert kernels directly.
T = 3
x = torch.randn(T, H, generator=g)
ids = torch.tensor([[3, 3, E], [3, 0, E], [5, 5, E]], dtype=torch.int32)
weights = torch.rand(T, K + 1, generator=g) + 0.1
expected = experts_reference(x, weights, ids)
for name, op in (("triton", moe_decode.nvfp4_experts_with_shared), ("torch", static_moe.nvfp4_experts_with_shared)):
    out = torch.full((T, H), float("nan"))
    op(x, weights, ids, experts, shared, out)
    error = rel(out, expected)
    print(f"repeated ids {name} vs float64: {error:.2e}")
    assert error < 1e-5, (name, error)

# Known-wrong variants: each must miss the float64 reference by far more than the bound.
def routed_then(x, rw, fix):
    logits = torch.nn.functional.linear(x, rw)
    w = torch.empty(x.shape[0], K + 1)
    i = torch.empty(x.shape[0], K + 1, dtype=torch.int32)
    router.router_topk_with_shared(logits, w, i, K)
    return logits, fix(logits, w), i

def gate_ignored(x, rw, out):  # shared expert added without its sigmoid gate
    _, w, i = routed_then(x, rw, lambda l, w: torch.cat([w[:, :K], torch.ones(w.shape[0], 1)], 1))
    moe_decode.nvfp4_experts_with_shared(x, w, i, experts, shared, out)

def shared_missing(x, rw, out):  # the shared slot left out of the sum
    _, w, i = routed_then(x, rw, lambda l, w: torch.cat([w[:, :K], torch.zeros(w.shape[0], 1)], 1))
    moe_decode.nvfp4_experts_with_shared(x, w, i, experts, shared, out)

def softmax_over_e_plus_1(x, rw, out):  # the shared gate logit taken into the softmax: p_E instead of sigmoid
    _, w, i = routed_then(x, rw, lambda l, w: torch.cat([w[:, :K], torch.softmax(l.float(), -1)[:, E:]], 1))
    moe_decode.nvfp4_experts_with_shared(x, w, i, experts, shared, out)

def shared_scales_swapped(x, rw, out):  # the shared expert's gate and up tensor scales exchanged
    moe_decode.moe_block_decode(x, rw, experts, replace(shared, gate_up_scale_2=shared.gate_up_scale_2.flip(0).contiguous()), K, out)

assert float(shared.gate_up_scale_2[0] / shared.gate_up_scale_2[1]) < 0.9  # the swap changes the function
x, rw = inputs(3, torch.float32)
expected, _ = block_reference(x, rw)
for wrong in (gate_ignored, shared_missing, softmax_over_e_plus_1, shared_scales_swapped):
    out = torch.full((3, H), float("nan"))
    wrong(x, rw, out)
    error = rel(out, expected)
    print(f"wrong {wrong.__name__}: {error:.2e}")
    assert error > 100 * BOUND[torch.float32], (wrong.__name__, error)

# Wired into the model: a tiny NVFP4 model's MoE block, Triton op through `ops`, against its eager path.
model = build_preset("tiny", quantize="nvfp4", seed=5)
block = model.layers[1].mlp
assert block.shared_nvfp4 is not None
ops = replace(torch_ops(), moe_block_decode=moe_decode.moe_block_decode)
for T in (1, 3):
    x = torch.randn(T, model.config.hidden_size, generator=g)
    error = rel(block(x, ops=ops), block(x))
    print(f"tiny block T={T} triton vs eager: {error:.2e}")
    assert error < 1e-5, (T, error)
print("ok")
"""


@pytest.fixture(scope="module")
def run():
    return interpreter_run({}, SCRIPT)


def test_triton_and_torch_block_match_float64_reference_and_reject_wrong_variants(run):
    assert_script_ok(run)


def _spy_ops(calls: list):
    from reference_engine.ops import static_moe
    from reference_engine.ops.backend import torch_ops

    def counted(op):
        def call(*args, **kwargs):
            calls.append(args[0].shape[0])
            return op(*args, **kwargs)

        return call

    # the block called with `ops` takes the first; graph decode hands the block its norm too and takes the second
    return replace(torch_ops(), moe_block_decode=counted(static_moe.moe_block_decode),
                   moe_block_decode_add_norm=counted(static_moe.moe_block_decode_add_norm))  # fmt: skip


def test_model_builds_the_fused_form_once_with_views():
    from reference_engine.presets import build_preset

    model = build_preset("tiny", quantize="nvfp4", seed=3)
    for layer in model.layers:
        block = layer.mlp
        assert block.shared_nvfp4 is not None and block.router_weight is not None
        E = block.experts.num_experts
        assert tuple(block.router_weight.shape) == (E + 1, model.config.hidden_size)
        # nothing held twice: the router, the shared gate and the shared Linears are views of the fused tensors
        assert block.gate.weight.data_ptr() == block.router_weight.data_ptr()
        assert block.shared_expert_gate.weight.data_ptr() == block.router_weight[E:].data_ptr()
        shared = block.shared_nvfp4
        assert block.shared_gate_proj.weight_packed.data_ptr() == shared.gate_up_packed.data_ptr()
        assert block.shared_up_proj.weight_packed.data_ptr() == shared.gate_up_packed[shared.intermediate_size :].data_ptr()
        assert block.shared_down_proj.weight_packed.data_ptr() == shared.down_packed.data_ptr()


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_block_static_torch_op_equals_eager(num_tokens):
    from reference_engine.presets import build_preset

    model = build_preset("tiny", quantize="nvfp4", seed=3)
    block = model.layers[0].mlp
    x = torch.randn(num_tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(num_tokens))
    calls: list = []
    fused = block(x, ops=_spy_ops(calls))
    assert calls == [num_tokens]
    eager = block(x)
    assert torch.isfinite(fused).all()
    error = float((fused - eager).norm() / eager.norm())
    assert error < 1e-5, error


def test_static_decode_of_the_nvfp4_model_uses_the_fused_block_and_equals_eager(monkeypatch):
    """tiny preset, quantize="nvfp4": decode_mode="static" (the ops a CUDA graph captures, run eagerly on the
    CPU, 5 sequences in a bucket of 8: three padding rows) gives the eager path's logits and tokens."""
    from reference_engine import runner
    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine
    from reference_engine.presets import build_preset
    from reference_engine.sampling_params import SamplingParams
    from reference_engine.tokenizer import load_tokenizer

    calls: list = []
    monkeypatch.setattr(runner, "select_ops", lambda device, use_triton=True: _spy_ops(calls))
    model = build_preset("tiny", quantize="nvfp4", seed=3)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, model.config.vocab_size, (int(n),), generator=generator).tolist() for n in torch.randint(3, 20, (5,), generator=generator)]

    def decode(mode):
        engine = LLMEngine(model, load_tokenizer("tiny"), EngineConfig(device="cpu", dtype="float32", max_num_seqs=8, max_model_len=64, num_blocks=64), decode_mode=mode, use_triton=False)
        for index, prompt in enumerate(prompts):
            engine.add_request(str(index), prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        logits, tokens = [], {}
        while engine.has_unfinished():
            plan = engine.scheduler.schedule()
            is_decode = plan.is_decode and bool(plan.chunks)
            for output in _step(engine, plan):
                tokens[output.request_id] = list(output.outputs[0].token_ids)
            if is_decode:
                logits.append(engine.runner.last_logits.detach().double().clone())
        return tokens, logits

    eager_tokens, eager_logits = decode("eager")
    assert calls == []  # the eager path never takes the fused op
    static_tokens, static_logits = decode("static")
    assert calls and set(calls) == {8}  # every static decode step: bucket 8 (5 real rows, 3 padding rows)
    assert len(calls) == len(static_logits) * model.config.num_hidden_layers
    assert static_tokens == eager_tokens
    for expected, actual in zip(eager_logits, static_logits, strict=True):
        assert torch.isfinite(actual).all()
        error = float((actual - expected).norm() / expected.norm())
        assert error < 1e-5, error


def _step(engine, plan):
    """engine.step() for an already scheduled plan (as tests/reference_engine/test_cuda_graphs.py drives it)."""
    sampled = [engine.scheduler.get(chunk.request_id) for chunk in plan.chunks if chunk.samples]
    tokens, _ = engine.runner.execute(plan, [engine._row(seq) for seq in sampled])
    engine.scheduler.commit(plan)
    outputs = []
    for seq, token in zip(sampled, tokens):
        seq.output_token_ids.append(int(token))
        reason = seq.stop_reason_after(int(token), engine.eos_token_ids)
        if reason is not None:
            engine.scheduler.finish(seq, reason)
        outputs.append(engine._output(seq))
    return outputs


def test_blocks_that_cannot_be_fused_keep_the_composed_path():
    from reference_engine.model.linear import Linear
    from reference_engine.model.moe_block import SparseMoeBlock
    from reference_engine.presets import build_preset, quantized_linear

    dense = build_preset("tiny", seed=3).layers[0].mlp  # dense experts
    assert dense.shared_nvfp4 is None and dense.router_weight is None
    quantised = build_preset("tiny", quantize="nvfp4", seed=3).layers[0].mlp
    generator = torch.Generator().manual_seed(2)
    hidden, wider = 64, 48  # shared intermediate 48 != routed I 32
    block = SparseMoeBlock(
        Linear.dense(quantised.gate.weight.clone()), quantised.experts,
        quantized_linear(torch.randn(wider, hidden, generator=generator) * 0.1), quantized_linear(torch.randn(wider, hidden, generator=generator) * 0.1),
        quantized_linear(torch.randn(hidden, wider, generator=generator) * 0.1), Linear.dense(quantised.shared_expert_gate.weight.clone()), quantised.top_k,
    )  # fmt: skip
    assert block.shared_nvfp4 is None
    calls: list = []
    x = torch.randn(3, hidden, generator=generator)
    out = block(x, ops=_spy_ops(calls))
    assert calls == []
    torch.testing.assert_close(out, block(x), rtol=1e-5, atol=1e-6)


def test_wrappers_reject_bad_shapes():
    from reference_engine.ops import moe, static_moe
    from reference_engine.presets import build_preset

    block = build_preset("tiny", quantize="nvfp4", seed=3).layers[0].mlp
    x = torch.randn(2, 64)
    out = torch.empty(2, 64)
    with pytest.raises(ValueError, match="router_weight"):
        static_moe.moe_block_decode(x, block.router_weight[:-1], block.experts.stacked, block.shared_nvfp4, block.top_k, out)
    narrow = replace(block.shared_nvfp4, down_packed=block.shared_nvfp4.down_packed[:, :8])
    with pytest.raises(ValueError, match="shared.down_packed"):
        static_moe.moe_block_decode(x, block.router_weight, block.experts.stacked, narrow, block.top_k, out)
    with pytest.raises(ValueError, match="topk_weights"):  # [T, top_k] instead of [T, top_k + 1]
        moe.router_topk_with_shared(torch.randn(2, 17), torch.empty(2, 4), torch.empty(2, 5, dtype=torch.int32), 4)


@pytest.mark.cuda
@pytest.mark.parametrize(("words", "split"), [(0, 1), (1, 1), (2, 1), (2, 9), (2, 3), (0, 2), (3, 1), (3, 9)])
@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_triton_block_matches_the_torch_op_on_cuda_at_the_real_shape(tokens, words, split, monkeypatch):
    from reference_engine.kernels import moe_decode
    from reference_engine.kernels.moe_decode import moe_block_decode

    monkeypatch.setattr(moe_decode, "WORDS", words)  # 1: int32 word reads decoded in PTX; 2: packed float16 pairs; 3: with the E4M3 decode
    monkeypatch.setattr(moe_decode, "DOWN_SPLIT", split)  # the down slots over `split` programs per row block
    monkeypatch.setattr(moe_decode, "BATCH_ONE", None)  # the module settings above at one token too
    assert _block_error_on_cuda(tokens, moe_block_decode) < 1e-2


def _block_error_on_cuda(tokens: int, moe_block_decode) -> float:
    """Relative error of `moe_block_decode` against the torch op on a random NVFP4 block of the real shape."""
    from reference_engine.ops import static_moe

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    experts_count, hidden, inter, top_k = 256, 2048, 512, 8

    def codes(*shape):
        return torch.randint(0, 256, shape, generator=generator, device="cuda", dtype=torch.int32).to(torch.uint8)

    def scales(*shape):
        return torch.randint(0x28, 0x48, shape, generator=generator, device="cuda", dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)

    experts = static_moe.StackedNvfp4Experts(
        codes(experts_count, 2 * inter, hidden // 2), scales(experts_count, 2 * inter, hidden // 16),
        torch.rand(experts_count, 2, generator=generator, device="cuda") * 1e-2 + 1e-3,
        codes(experts_count, hidden, inter // 2), scales(experts_count, hidden, inter // 16),
        torch.rand(experts_count, generator=generator, device="cuda") * 1e-2 + 1e-3,
    )  # fmt: skip
    shared = static_moe.SharedNvfp4Expert(
        codes(2 * inter, hidden // 2), scales(2 * inter, hidden // 16), torch.rand(2, generator=generator, device="cuda") * 1e-2 + 1e-3,
        codes(hidden, inter // 2), scales(hidden, inter // 16), torch.rand((), generator=generator, device="cuda") * 1e-2 + 1e-3,
    )  # fmt: skip
    router_weight = (torch.randn(experts_count + 1, hidden, generator=generator, device="cuda") * hidden**-0.5).to(torch.bfloat16)
    x = torch.randn(tokens, hidden, generator=generator, device="cuda").to(torch.bfloat16)
    expected = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    static_moe.moe_block_decode(x, router_weight, experts, shared, top_k, expected)
    out = torch.full_like(expected, float("nan"))
    moe_block_decode(x, router_weight, experts, shared, top_k, out)
    assert torch.isfinite(out).all()
    return float((out.double() - expected.double()).norm() / expected.double().norm())


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [2, 3, 4, 8, 12])
def test_the_committed_small_batch_settings_match_the_torch_op_on_cuda(tokens, tmp_path, monkeypatch):
    """The tuning file's per-pair settings for 2 to 15 tokens (`moe_decode_small_batches` and the module setting, run80),
    installed alone (the other modules keep their settings; these are restored after the test)."""
    import json

    from reference_engine.kernels import moe_decode, tuning

    for name in ("LOOP", "GATE_UP_BLOCK_N", "GATE_UP_BLOCK_K", "DOWN_BLOCK_H", "DOWN_BLOCK_I", "WORDS", "DOWN_SPLIT", "SMALL_BATCHES"):
        monkeypatch.setattr(moe_decode, name, getattr(moe_decode, name))
    committed = json.loads(tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability()).read_text())
    (tmp_path / "t.json").write_text(json.dumps({key: committed[key] for key in ("device", "moe_decode", "moe_decode_small_batches")}))
    tuning.apply_tuning(tmp_path / "t.json")
    assert moe_decode._settings(tokens) != (0, 32, 64, 32, 64, 2, 1)  # the pre-run80 setting is no longer what runs here
    assert _block_error_on_cuda(tokens, moe_decode.moe_block_decode) < 1e-2
