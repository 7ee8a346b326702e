"""Sampling contracts: the engine sampler passes; known-wrong samplers and a perturbed reference fail."""

from __future__ import annotations

import pytest
import torch

import contract_driver as driver
from reference_engine.ops import sampling

GREEDY, STOCHASTIC = "sampling/greedy", "sampling/stochastic"
SMALL_STOCHASTIC = ["small-vocab-f32", "tiny-vocab-many-draws-f32", "small-vocab-bf16"]


@pytest.mark.parametrize("contract_id,case_name", [(cid, c.name) for cid in (GREEDY, STOCHASTIC) for c in driver.load(cid).cpu_cases()])
def test_engine_sampler_passes(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, sampling.sample_tokens, loaded.case(case_name))
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("contract_id,error_name", [(cid, e.name) for cid in (GREEDY, STOCHASTIC) for e in driver.load(cid).contract.errors])
def test_error_cases_raise(contract_id, error_name):
    loaded = driver.load(contract_id)
    error_case = next(e for e in loaded.contract.errors if e.name == error_name)
    outcome = driver.run_error_case(loaded, sampling.sample_tokens, error_case)
    assert outcome.status == "PASSED", outcome.message


@pytest.mark.parametrize("case_name", [c.name for c in driver.load(GREEDY).cpu_cases()])
def test_greedy_reference_with_one_token_changed_fails(case_name):
    loaded = driver.load(GREEDY)
    assert driver.perturbed(loaded, loaded.case(case_name)).status == "INCORRECT_NUMERICAL"


def test_greedy_cases_really_have_ties():
    loaded = driver.load(GREEDY)
    for case in loaded.cpu_cases():
        _, _, inputs = driver.make_case_inputs(loaded, case)
        logits = inputs["logits"].double()
        maxima = (logits == logits.max(dim=-1, keepdim=True).values).sum(-1)
        assert int((maxima > 1).sum()) >= max(1, logits.shape[0] // 2), case.name


# ---- known-wrong samplers ---------------------------------------------------------------------


def _filtered(logits, temperature, top_k, top_p, *, apply_top_p=True, apply_temperature=True, top_p_first=False, ties_high=False):
    """Filtered probabilities (float64 [B, V], vectorised) with optional deliberate mistakes."""
    rows, vocab = logits.shape
    values = logits.double()
    if apply_temperature:
        values = values / temperature.double().clamp(min=1e-6)[:, None]
    if ties_high:  # among equal values the HIGHER id comes first
        order = vocab - 1 - torch.argsort(values.flip(-1), dim=-1, descending=True, stable=True)
    else:
        order = torch.argsort(values, dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab)[None, :]
    k = top_k.long()
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)[:, None]
    sorted_values = values.gather(1, order)
    p = top_p.double()[:, None]

    def top_p_mask(masked_values):
        masses = torch.softmax(masked_values, -1)
        before = masses.cumsum(-1) - masses
        keep = (before < p) | (p >= 1) | (ranks == 0)
        return keep if apply_top_p else torch.ones_like(keep)

    if top_p_first:
        keep = top_p_mask(sorted_values) & (ranks < k)
    else:
        in_k = ranks < k
        keep = in_k & top_p_mask(sorted_values.masked_fill(~in_k, float("-inf")))
    kept = torch.softmax(sorted_values.masked_fill(~keep, float("-inf")), -1)
    return torch.zeros(rows, vocab, dtype=torch.float64).scatter(1, order, kept)


def _draw(probabilities, seeds):
    uniform = sampling.uniform_from_seeds(seeds.cpu())
    cdf = probabilities.cumsum(-1)
    return torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[1] - 1).squeeze(1)


def _sampler(**mistakes):
    def sample_tokens(logits, temperature, top_k, top_p, seeds, out):
        greedy = temperature.cpu() == 0
        rows = torch.nonzero(~greedy).squeeze(1)  # only the sampled rows need the (slow, float64) filtering
        drawn = torch.zeros(logits.shape[0], dtype=torch.int64)
        if rows.numel():
            probabilities = _filtered(logits.cpu()[rows], temperature.cpu()[rows], top_k.cpu()[rows], top_p.cpu()[rows], **mistakes)
            drawn[rows] = _draw(probabilities, seeds.cpu()[rows])
        if mistakes.get("ties_high"):
            first = torch.argmax(logits.cpu().double().flip(-1), dim=-1)
            argmax = logits.shape[1] - 1 - first
        else:
            argmax = torch.argmax(logits.cpu().double(), dim=-1)
        out.copy_(torch.where(greedy, argmax, drawn))

    return sample_tokens


def sampler_non_reproducible(logits, temperature, top_k, top_p, seeds, out):
    probabilities = _filtered(logits, temperature, top_k, top_p)
    drawn = torch.multinomial(probabilities, 1).squeeze(1)  # global RNG, seeds ignored
    out.copy_(torch.where(temperature == 0, torch.argmax(logits.double(), -1), drawn))


def sampler_one_generator_per_batch(logits, temperature, top_k, top_p, seeds, out):
    generator = torch.Generator().manual_seed(int(seeds[0]))  # a token depends on the batch it sits in
    probabilities = _filtered(logits, temperature, top_k, top_p)
    drawn = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
    out.copy_(torch.where(temperature == 0, torch.argmax(logits.double(), -1), drawn))


def sampler_greedy_rows_unwritten(logits, temperature, top_k, top_p, seeds, out):
    drawn = _draw(_filtered(logits, temperature, top_k, top_p), seeds)
    out[temperature != 0] = drawn[temperature != 0]


def test_the_correct_test_sampler_passes():
    """The helper the wrong samplers are built from is itself right, so each mistake is the only difference."""
    loaded = driver.load(STOCHASTIC)
    outcome = driver.run_case(loaded, _sampler(), loaded.case("small-vocab-f32"))
    assert outcome.status == "PASSED", outcome.message


STOCHASTIC_WRONG = [  # (name, sampler, what the driver must say)
    ("ignores_top_p", _sampler(apply_top_p=False), "outside the allowed set"),
    ("ignores_temperature", _sampler(apply_temperature=False), "total variation distance"),
    ("top_p_before_top_k", _sampler(top_p_first=True), "outside the allowed set"),
    ("ties_to_highest_id", _sampler(ties_high=True), "outside the allowed set"),
    ("non_reproducible", sampler_non_reproducible, "not reproducible"),
    ("one_generator_per_batch", sampler_one_generator_per_batch, "depends on its place in the batch"),
    ("greedy_rows_unwritten", sampler_greedy_rows_unwritten, "unwritten or invalid"),
]


@pytest.mark.parametrize("impl,reason", [w[1:] for w in STOCHASTIC_WRONG], ids=[w[0] for w in STOCHASTIC_WRONG])
def test_known_wrong_sampler_is_caught(impl, reason):
    loaded = driver.load(STOCHASTIC)
    for name in SMALL_STOCHASTIC:
        outcome = driver.run_case(loaded, impl, loaded.case(name))
        assert outcome.status == "INCORRECT_NUMERICAL" and reason in outcome.message, (name, outcome)


greedy_ties_to_highest_id = _sampler(ties_high=True)  # importable by name for the harness

GREEDY_WRONG = [
    ("ties_to_highest_id", _sampler(ties_high=True), "INCORRECT_NUMERICAL"),
    ("greedy_rows_unwritten", sampler_greedy_rows_unwritten, "UNWRITTEN_OUTPUT"),
]


@pytest.mark.parametrize("impl,status", [w[1:] for w in GREEDY_WRONG], ids=[w[0] for w in GREEDY_WRONG])
def test_known_wrong_greedy_is_caught(impl, status):
    loaded = driver.load(GREEDY)
    statuses = {case.name: driver.run_case(loaded, impl, case).status for case in loaded.cpu_cases()}
    assert set(statuses.values()) == {status}, statuses


# ---- the same checks through the real harness (toolbox.harness), in process --------------------

HARNESS_TARGETS = {
    "sampling/greedy": "reference_engine.ops.sampling:sample_tokens",
    "sampling/stochastic": "reference_engine.ops.sampling:sample_tokens",
}
MODULE = "test_sampling_contracts"
HARNESS_WRONG = [
    ("sampling/greedy", "greedy_ties_to_highest_id", "INCORRECT_NUMERICAL"),
    ("sampling/stochastic", "sampler_non_reproducible", "INCORRECT_NUMERICAL"),
]


@pytest.mark.parametrize("contract_id", sorted(HARNESS_TARGETS))
def test_engine_op_passes_through_the_toolbox_harness(contract_id):
    harness = pytest.importorskip("toolbox.harness")
    records = harness.run_contracts([contract_id], impl=HARNESS_TARGETS[contract_id], devices=["cpu"], isolation=False)
    assert records and all(record.status.value == "PASSED" for record in records), [(r.case, r.status.value, r.message) for r in records if r.status.value != "PASSED"]


@pytest.mark.parametrize("contract_id,impl,status", HARNESS_WRONG, ids=[w[1] for w in HARNESS_WRONG])
def test_known_wrong_implementation_fails_through_the_toolbox_harness(contract_id, impl, status):
    harness = pytest.importorskip("toolbox.harness")
    contract = driver.load(contract_id).contract
    small = [c.name for c in contract.cases if c.name in ("small-f32", "small-vocab-f32")] + [e.name for e in contract.errors]  # quick
    records = harness.run_contracts([contract_id], impl=f"{MODULE}:{impl}", devices=["cpu"], cases=small, isolation=False)
    cases = {record.case: record.status.value for record in records if record.kind == "case"}
    errors = {record.case: record.status.value for record in records if record.kind == "error"}
    assert cases and set(cases.values()) == {status}, cases
    assert set(errors.values()) <= {"MISSING_ERROR", "PASSED"}, errors  # wrong impls skip the input checks


CUDA_CASES = [(cid, case.name) for cid in (GREEDY, STOCHASTIC) for case in driver.load(cid).contract.cases if case.device == "cuda"]


@pytest.mark.cuda
@pytest.mark.parametrize("contract_id,case_name", CUDA_CASES)
def test_engine_op_passes_cuda_cases(contract_id, case_name):
    loaded = driver.load(contract_id)
    outcome = driver.run_case(loaded, sampling.sample_tokens, loaded.case(case_name), device="cuda")
    assert outcome.status == "PASSED", outcome.message
