"""Attention contracts: the engine ops pass; known-wrong implementations and a perturbed reference fail."""

from __future__ import annotations

import pytest
import torch

import contract_driver as driver
from reference_engine.ops import attention, norms

ENGINE = {
    "attention/partial-rope": attention.partial_rope,
    "attention/qk-norm": norms.rms_norm,
    "attention/q-gate-split": attention.split_q_gate,
    "attention/output-gate": attention.output_gate,
    "attention/gqa-prefill": attention.gqa_prefill,
    "attention/paged-prefill": attention.paged_prefill,
    "attention/paged-decode": attention.paged_decode,
}
CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).cpu_cases()]
ERRORS = [(cid, error.name) for cid in ENGINE for error in driver.load(cid).contract.errors]


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_engine_op_passes(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("contract_id,case_name", CASES)
def test_perturbed_reference_fails(contract_id, case_name):
    loaded = driver.load(contract_id)
    assert driver.perturbed(loaded, loaded.case(case_name)).status == "INCORRECT_NUMERICAL"


@pytest.mark.parametrize("contract_id,error_name", ERRORS)
def test_error_cases_raise(contract_id, error_name):
    loaded = driver.load(contract_id)
    error_case = next(e for e in loaded.contract.errors if e.name == error_name)
    outcome = driver.run_error_case(loaded, ENGINE[contract_id], error_case)
    assert outcome.status == "PASSED", outcome.message


# ---- known-wrong implementations -------------------------------------------------------------


def _angles(positions, rotary_dim, theta):
    inverse = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = positions.double()[:, None] * inverse[None, :]
    return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]


def rope_last_dims(x, positions, out, rotary_dim, theta):  # rotates the last rotary_dim dims
    cos, sin = _angles(positions, rotary_dim, theta)
    half, head_dim = rotary_dim // 2, x.shape[-1]
    start = head_dim - rotary_dim
    a, b = x[..., start : start + half].float(), x[..., start + half :].float()
    out.copy_(x)
    out[..., start : start + half] = a * cos - b * sin
    out[..., start + half :] = b * cos + a * sin


def rope_interleaved(x, positions, out, rotary_dim, theta):  # pairs (2i, 2i+1) instead of (i, i + half)
    cos, sin = _angles(positions, rotary_dim, theta)
    a, b = x[..., 0:rotary_dim:2].float(), x[..., 1:rotary_dim:2].float()
    out.copy_(x)
    out[..., 0:rotary_dim:2] = a * cos - b * sin
    out[..., 1:rotary_dim:2] = b * cos + a * sin


def rope_positions_float32(x, positions, out, rotary_dim, theta):  # correct math, float32 angles: must PASS
    inverse = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = positions.float()[:, None] * inverse[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    half = rotary_dim // 2
    a, b = x[..., :half].float(), x[..., half:rotary_dim].float()
    out.copy_(x)
    out[..., :half] = a * cos - b * sin
    out[..., half:rotary_dim] = b * cos + a * sin


def qk_norm_whole_token(x, weight, out, eps):  # one norm over H * D instead of per head
    x32 = x.float()
    normalised = x32 * torch.rsqrt(x32.pow(2).mean(dim=(-2, -1), keepdim=True) + eps)
    out.copy_(normalised * (1 + weight.float()))


def split_two_blocks(q_proj_out, query, gate, head_dim):  # first half all queries, second half all gates
    width = q_proj_out.shape[1] // 2
    query.copy_(q_proj_out[:, :width].view(query.shape))
    gate.copy_(q_proj_out[:, width:])


def gate_missing(attn, gate, out):
    out.copy_(attn)


def gate_silu(attn, gate, out):
    out.copy_(attn.float() * torch.nn.functional.silu(gate.float()))


def _dense(query, key, value, scale, mask):  # mask [Tq, Tk] True = allowed
    group = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(group, dim=1)
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


def gqa_no_causal_mask(query, key, value, cu_seqlens, out, scale):
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds, bounds[1:]):
        out[s:e] = _dense(query[s:e], key[s:e], value[s:e], scale, torch.ones(e - s, e - s, dtype=torch.bool))


def gqa_across_sequences(query, key, value, cu_seqlens, out, scale):  # causal over the packed batch
    tokens = query.shape[0]
    out.copy_(_dense(query, key, value, scale, torch.ones(tokens, tokens, dtype=torch.bool).tril()))


def gqa_modulo_heads(query, key, value, cu_seqlens, out, scale):  # query head h -> kv head h % HKV
    kv_heads = key.shape[1]
    group = query.shape[1] // kv_heads
    index = torch.arange(query.shape[1]) % kv_heads
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds, bounds[1:]):
        # reorder query heads so that the engine's h // group mapping becomes h % HKV
        order = torch.argsort(index * group + torch.arange(query.shape[1]) // kv_heads)
        part = torch.empty_like(out[s:e])
        attention.gqa_prefill(query[s:e, order].contiguous(), key[s:e], value[s:e], torch.tensor([0, e - s], dtype=torch.int32), part, scale)
        out[s:e, order] = part


def gqa_last_sequence_unwritten(query, key, value, cu_seqlens, out, scale):
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds[:-2], bounds[1:-1]):
        mask = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        out[s:e] = _dense(query[s:e], key[s:e], value[s:e], scale, mask)


def _in_order_tables(block_tables, seq_lens, block_size):
    table = block_tables.clone()
    for row, length in enumerate(seq_lens.tolist()):
        needed = -(-length // block_size)
        offset = int(sum(-(-n // block_size) for n in seq_lens.tolist()[:row]))
        table[row, :needed] = torch.arange(offset, offset + needed, dtype=table.dtype)
    return table


def paged_prefill_blocks_in_order(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
    table = _in_order_tables(block_tables, seq_lens, k_cache.shape[1])
    attention.paged_prefill(query, k_cache, v_cache, table, cu_seqlens_q, seq_lens, out, scale)


def paged_prefill_no_causal_mask(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
    block_size = k_cache.shape[1]
    bounds = cu_seqlens_q.tolist()
    for row, (s, e) in enumerate(zip(bounds, bounds[1:])):
        length = int(seq_lens[row])
        blocks = block_tables[row, : -(-length // block_size)].long()
        keys, values = k_cache[blocks].flatten(0, 1)[:length], v_cache[blocks].flatten(0, 1)[:length]
        out[s:e] = _dense(query[s:e], keys, values, scale, torch.ones(e - s, length, dtype=torch.bool))


def paged_prefill_queries_first(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
    """Treats the queries as the FIRST q_len tokens of the sequence."""
    block_size = k_cache.shape[1]
    bounds = cu_seqlens_q.tolist()
    for row, (s, e) in enumerate(zip(bounds, bounds[1:])):
        length = int(seq_lens[row])
        blocks = block_tables[row, : -(-length // block_size)].long()
        keys, values = k_cache[blocks].flatten(0, 1)[:length], v_cache[blocks].flatten(0, 1)[:length]
        mask = torch.arange(length)[None, :] <= torch.arange(e - s)[:, None]
        out[s:e] = _dense(query[s:e], keys, values, scale, mask)


def decode_blocks_in_order(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
    table = _in_order_tables(block_tables, seq_lens, k_cache.shape[1])
    attention.paged_decode(query, k_cache, v_cache, table, seq_lens, out, scale)


def decode_ignores_seq_lens(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
    """Attends to every token of every used block (reads past seq_len inside the last block)."""
    block_size = k_cache.shape[1]
    full = ((seq_lens.long() + block_size - 1) // block_size * block_size).to(seq_lens.dtype)
    attention.paged_decode(query, k_cache, v_cache, block_tables, full, out, scale)


def decode_last_sequence_unwritten(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
    part = torch.empty_like(out[:-1])
    attention.paged_decode(query[:-1], k_cache, v_cache, block_tables[:-1], seq_lens[:-1], part, scale)
    out[:-1] = part


WRONG = [
    ("attention/partial-rope", rope_last_dims, "INCORRECT_NUMERICAL"),
    ("attention/partial-rope", rope_interleaved, "INCORRECT_NUMERICAL"),
    ("attention/qk-norm", qk_norm_whole_token, "INCORRECT_NUMERICAL"),
    ("attention/q-gate-split", split_two_blocks, "INCORRECT_NUMERICAL"),
    ("attention/output-gate", gate_missing, "INCORRECT_NUMERICAL"),
    ("attention/output-gate", gate_silu, "INCORRECT_NUMERICAL"),
    ("attention/gqa-prefill", gqa_no_causal_mask, "INCORRECT_NUMERICAL"),
    ("attention/gqa-prefill", gqa_across_sequences, "INCORRECT_NUMERICAL"),
    ("attention/gqa-prefill", gqa_modulo_heads, "INCORRECT_NUMERICAL"),
    ("attention/gqa-prefill", gqa_last_sequence_unwritten, "UNWRITTEN_OUTPUT"),
    ("attention/paged-prefill", paged_prefill_blocks_in_order, "INCORRECT_NUMERICAL"),
    ("attention/paged-prefill", paged_prefill_no_causal_mask, "INCORRECT_NUMERICAL"),
    ("attention/paged-prefill", paged_prefill_queries_first, "INCORRECT_NUMERICAL"),
    ("attention/paged-decode", decode_blocks_in_order, "INCORRECT_NUMERICAL"),
    ("attention/paged-decode", decode_ignores_seq_lens, "INCORRECT_NUMERICAL"),
    ("attention/paged-decode", decode_last_sequence_unwritten, "UNWRITTEN_OUTPUT"),
]
# Cases where a wrong implementation coincides with the right one by construction (e.g. a
# single sequence cannot show cross-sequence leakage, a 1-token block cannot be misordered).
EXEMPT = {
    ("rope_last_dims", "full-rotary-f32"),  # rotary_dim == head_dim: first and last dims coincide
    ("gqa_across_sequences", "single-seq-f32"),
    ("gqa_last_sequence_unwritten", "single-seq-f32"),
    ("gqa_modulo_heads", "single-seq-f32"),  # one KV head: h % 1 == h // G
    ("gqa_modulo_heads", "small-bf16"),
    ("decode_last_sequence_unwritten", "model-heads-b1-bf16"),
    ("decode_blocks_in_order", "model-heads-b1-bf16"),
}


@pytest.mark.parametrize("contract_id,impl,status", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_known_wrong_implementation_is_caught(contract_id, impl, status):
    loaded = driver.load(contract_id)
    results = {
        case.name: driver.run_case(loaded, impl, case).status
        for case in loaded.cpu_cases()
        if (impl.__name__, case.name) not in EXEMPT
    }
    assert set(results.values()) == {status}, results


def test_rope_with_float32_angles_passes_every_case():
    """The float32 cases keep positions small enough that the usual float32 angle table is accepted."""
    loaded = driver.load("attention/partial-rope")
    for case in loaded.cpu_cases():
        assert driver.run_case(loaded, rope_positions_float32, case).status == "PASSED", case.name


def test_rope_matches_transformers_apply_rotary_pos_emb():
    """Independent check of the contract's convention against transformers' own partial rotary code."""
    modeling = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    loaded = driver.load("attention/partial-rope")
    case = loaded.case("decode-t16-query-f32")
    axes, params, inputs = driver.make_case_inputs(loaded, case)
    cos, sin = _angles(inputs["positions"], params["rotary_dim"], params["theta"])  # [T, 1, R/2]
    cos_full, sin_full = torch.cat([cos, cos], -1).squeeze(1), torch.cat([sin, sin], -1).squeeze(1)  # [T, R]
    x = inputs["x"].transpose(0, 1)[None]  # [1, H, T, D]
    rotated, _ = modeling.apply_rotary_pos_emb(x, x, cos_full[None], sin_full[None])
    expected = loaded.module.reference(**inputs, **params)["out"]
    assert torch.allclose(rotated[0].transpose(0, 1).double(), expected, atol=1e-5)


# ---- the same checks through the real harness (toolbox.harness), in process --------------------

HARNESS_TARGETS = {
    "attention/partial-rope": "reference_engine.ops.attention:partial_rope",
    "attention/qk-norm": "reference_engine.ops.norms:rms_norm",
    "attention/q-gate-split": "reference_engine.ops.attention:split_q_gate",
    "attention/output-gate": "reference_engine.ops.attention:output_gate",
    "attention/gqa-prefill": "reference_engine.ops.attention:gqa_prefill",
    "attention/paged-prefill": "reference_engine.ops.attention:paged_prefill",
    "attention/paged-decode": "reference_engine.ops.attention:paged_decode",
}
MODULE = "test_attention_contracts"
HARNESS_WRONG = [
    ("attention/partial-rope", "rope_interleaved", "INCORRECT_NUMERICAL"),
    ("attention/q-gate-split", "split_two_blocks", "INCORRECT_NUMERICAL"),
    ("attention/output-gate", "gate_missing", "INCORRECT_NUMERICAL"),
    ("attention/gqa-prefill", "gqa_no_causal_mask", "INCORRECT_NUMERICAL"),
    ("attention/paged-decode", "decode_ignores_seq_lens", "INCORRECT_NUMERICAL"),
]


@pytest.mark.parametrize("contract_id", sorted(HARNESS_TARGETS))
def test_engine_op_passes_through_the_toolbox_harness(contract_id):
    harness = pytest.importorskip("toolbox.harness")
    records = harness.run_contracts([contract_id], impl=HARNESS_TARGETS[contract_id], devices=["cpu"], isolation=False)
    assert records and all(record.status.value == "PASSED" for record in records), [(r.case, r.status.value, r.message) for r in records if r.status.value != "PASSED"]


@pytest.mark.parametrize("contract_id,impl,status", HARNESS_WRONG, ids=[w[1] for w in HARNESS_WRONG])
def test_known_wrong_implementation_fails_through_the_toolbox_harness(contract_id, impl, status):
    harness = pytest.importorskip("toolbox.harness")
    records = harness.run_contracts([contract_id], impl=f"{MODULE}:{impl}", devices=["cpu"], isolation=False)
    cases = {record.case: record.status.value for record in records if record.kind == "case"}
    errors = {record.case: record.status.value for record in records if record.kind == "error"}
    assert cases and set(cases.values()) == {status}, cases
    assert set(errors.values()) <= {"MISSING_ERROR", "PASSED"}, errors  # wrong impls skip the input checks


CUDA_CASES = [(cid, case.name) for cid in ENGINE for case in driver.load(cid).contract.cases if case.device == "cuda"]


@pytest.mark.cuda
@pytest.mark.parametrize("contract_id,case_name", CUDA_CASES)
def test_engine_op_passes_cuda_cases(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, ENGINE[contract_id], loaded.case(case_name), device="cuda")
    assert outcome.status == "PASSED", outcome.message


def gqa_flash_style_bf16(query, key, value, cu_seqlens, out, scale):
    """Right but cheaper, as flash attention does it: P = exp(s - max) rounded to the input dtype before P @ V."""
    group = query.shape[1] // key.shape[1]
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds, bounds[1:]):
        k = key[s:e].float().repeat_interleave(group, dim=1)
        v = value[s:e].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[s:e].float(), k) * scale
        scores = scores.masked_fill(~torch.ones(e - s, e - s, dtype=torch.bool).tril()[None], float("-inf"))
        unnormalised = torch.exp(scores - scores.amax(-1, keepdim=True))  # [H, q, k] float32
        weights = unnormalised.to(query.dtype).float()
        out[s:e] = torch.einsum("hqk,khd->qhd", weights, v.float()) / unnormalised.sum(-1).transpose(0, 1)[..., None]


def test_flash_style_attention_passes():
    """The bounds admit the usual kernel shortcut (P in the input dtype, float32 accumulation); bf16 measures about 1.6e-3."""
    loaded = driver.load("attention/gqa-prefill")
    for case in loaded.cpu_cases():
        outcome = driver.run_case(loaded, gqa_flash_style_bf16, case)
        assert outcome.status == "PASSED", (case.name, outcome)


PREFILL = driver.load("attention/paged-prefill")


@pytest.mark.parametrize("case_name", [case.name for case in PREFILL.cpu_cases()])
def test_fused_attention_prefill_passes(case_name):
    """`paged_prefill_sdpa` (torch's fused attention; the eager prefill's choice on the GPU) against the contract."""
    outcome = driver.run_case(PREFILL, attention.paged_prefill_sdpa, PREFILL.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("error_name", [error.name for error in PREFILL.contract.errors])
def test_fused_attention_prefill_rejects_bad_inputs(error_name):
    outcome = driver.run_error_case(PREFILL, attention.paged_prefill_sdpa, next(e for e in PREFILL.contract.errors if e.name == error_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.cuda
@pytest.mark.parametrize("case_name", [case.name for case in PREFILL.contract.cases if case.device == "cuda"])
def test_fused_attention_prefill_real_shapes_on_cuda(case_name):
    outcome = driver.run_case(PREFILL, attention.paged_prefill_sdpa, PREFILL.case(case_name), device="cuda")
    assert outcome.status == "PASSED", outcome.message


def fused_prefill_top_left_causal(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
    """Known wrong: the causal mask aligned to the first key (SDPA's is_causal) for continued sequences too."""
    bounds, lengths, block_size = cu_seqlens_q.tolist(), seq_lens.tolist(), k_cache.shape[1]
    for index, (start, end, length) in enumerate(zip(bounds, bounds[1:], lengths)):
        if end == start:
            continue
        blocks = block_tables[index, : -(-length // block_size)].long()
        key, value = (cache[blocks].flatten(0, 1)[:length] for cache in (k_cache, v_cache))
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query[start:end], key, value))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        out[start:end].copy_(attended[0].transpose(0, 1))
    return out


def test_top_left_causal_mask_is_caught():
    statuses = {case.name: driver.run_case(PREFILL, fused_prefill_top_left_causal, case).status for case in PREFILL.cpu_cases()}
    assert "INCORRECT_NUMERICAL" in statuses.values(), statuses  # a case continues a cached prefix
