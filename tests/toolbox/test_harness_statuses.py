"""Every known-wrong fixture implementation gets its one exact status; the correct ones pass."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixture_impls

from toolbox.harness.isolation import Job, run_job_inline, run_job_isolated
from toolbox.harness.statuses import Status

DEMO = Path(__file__).resolve().parent / "fixtures" / "contracts" / "demo"
IMPLS = fixture_impls.__name__


def job(contract: str, impl: str, name: str, kind: str = "case") -> Job:
    return Job(str(DEMO / f"{contract}.yaml"), f"{IMPLS}:{impl}", kind, name, "cpu")


AXPBY_CASES = ["small-f32", "wide-bf16"]


@pytest.mark.parametrize("case", AXPBY_CASES)
@pytest.mark.parametrize(
    ("impl", "status", "fragment"),
    [
        ("axpby", Status.PASSED, ""),
        ("axpby_resizes_out", Status.INCORRECT_SHAPE, "out: shape"),
        ("axpby_float64_out", Status.INCORRECT_DTYPE, "dtype float64"),
        ("axpby_tiled_missing_last", Status.UNWRITTEN_OUTPUT, "out: 16 of"),
        ("axpby_skips_one_id", Status.UNWRITTEN_OUTPUT, "ids_out: 1 of"),
        ("axpby_returns_instead", Status.UNWRITTEN_OUTPUT, "returned a value"),
        ("axpby_raises", Status.RUNTIME_ERROR, "RuntimeError: kernel launch failed"),
        ("axpby_nan", Status.INCORRECT_NUMERICAL, "NaN/Inf at 1 positions"),
        ("axpby_noisy", Status.INCORRECT_NUMERICAL, "rel_fro"),
        ("axpby_wrong_id", Status.INCORRECT_NUMERICAL, "ids_out: 1 of"),
        ("axpby_mutates_x", Status.INCORRECT_NUMERICAL, "mutated input x"),
    ],
)
def test_axpby_statuses(impl: str, status: Status, fragment: str, case: str) -> None:
    outcome = run_job_inline(job("axpby", impl, case))
    assert outcome.status == status, outcome.message
    assert fragment in outcome.message
    assert outcome.axes["N"] > 0 and outcome.dtype in ("float32", "bfloat16")


def test_passing_case_records_errors_per_output() -> None:
    outcome = run_job_inline(job("axpby", "axpby", "wide-bf16"))
    assert set(outcome.max_abs_error) == {"out", "ids_out"}
    assert outcome.max_abs_error["ids_out"] == 0.0
    assert 0 < outcome.max_abs_error["out"] < 0.1  # bf16 rounding is visible, not hidden
    assert 0 < outcome.max_rel_error["out"] < 5e-3


@pytest.mark.parametrize(
    ("impl", "status", "fragment"),
    [
        ("axpby", Status.PASSED, "ValueError"),
        ("axpby_no_check", Status.MISSING_ERROR, "did not raise"),
        ("axpby_wrong_exception", Status.MISSING_ERROR, "raised KeyError"),
    ],
)
def test_error_case(impl: str, status: Status, fragment: str) -> None:
    outcome = run_job_inline(job("axpby", impl, "length-mismatch", kind="error"))
    assert outcome.status == status, outcome.message
    assert fragment in outcome.message


@pytest.mark.parametrize(
    ("impl", "status", "fragment"),
    [
        ("softmax_inplace", Status.PASSED, ""),
        ("softmax_inplace_scaled", Status.INCORRECT_NUMERICAL, "invariant rows_sum_to_one"),
        ("softmax_inplace_reshapes", Status.INCORRECT_SHAPE, "probs: shape"),
        ("softmax_not_in_place", Status.INCORRECT_NUMERICAL, "max_abs"),
        ("softmax_mutates_temperature", Status.INCORRECT_NUMERICAL, "mutated input temperature"),
    ],
)
@pytest.mark.parametrize("case", ["rows", "rows-allclose"])
def test_aliased_in_place(impl: str, status: Status, fragment: str, case: str) -> None:
    outcome = run_job_inline(job("softmax-inplace", impl, case))
    assert outcome.status == status, outcome.message
    assert fragment in outcome.message


@pytest.mark.parametrize(
    ("impl", "status", "fragment"),
    [
        ("sort_values", Status.PASSED, "elements"),
        ("sort_descending", Status.INCORRECT_NUMERICAL, "not sorted"),
        ("sort_raises", Status.RUNTIME_ERROR, "TypeError"),
    ],
)
def test_custom_interface(impl: str, status: Status, fragment: str) -> None:
    for case in ("hundred", "small"):
        outcome = run_job_inline(job("sort-custom", impl, case))
        assert outcome.status == status, outcome.message
        assert fragment in outcome.message


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("violates-constraint", "violates constraint 'N % 4 == 0'"),
        ("unbound-axis", "leaves axes M unbound"),
        ("wrong-input-shape", "make_inputs: 'x' has shape (13,), declared (12,)"),
        ("wrong-reference-shape", "reference output 'out' has shape (15,), declared (16,)"),
        ("make-inputs-raises", "make_inputs raised RuntimeError: Expected a 'cuda' device type for generator"),
    ],
)
def test_contract_bugs_are_runtime_errors_naming_the_bug(case: str, fragment: str) -> None:
    outcome = run_job_inline(job("buggy", "double", case))
    assert outcome.status == Status.RUNTIME_ERROR
    assert "contract bug in demo/buggy" in outcome.message and fragment in outcome.message


def test_isolated_raise_crash_and_hang() -> None:
    raised = run_job_isolated(job("axpby", "axpby_raises", "small-f32"), timeout_s=20)
    assert raised.status == Status.RUNTIME_ERROR and "RuntimeError: kernel launch failed" in raised.message
    crashed = run_job_isolated(job("axpby", "axpby_exits", "small-f32"), timeout_s=20)
    assert crashed.status == Status.RUNTIME_ERROR and "exited with code 3" in crashed.message
    segfault = run_job_isolated(job("axpby", "axpby_segfaults", "small-f32"), timeout_s=20)
    assert segfault.status == Status.RUNTIME_ERROR and "SIGSEGV" in segfault.message
    hung = run_job_isolated(job("axpby", "axpby_hangs", "small-f32"), timeout_s=1.0)
    assert hung.status == Status.TIMEOUT
    passed = run_job_isolated(job("axpby", "axpby", "small-f32"), timeout_s=20)
    assert passed.status == Status.PASSED, passed.message


def test_isolated_bad_import_is_a_runtime_error() -> None:
    outcome = run_job_isolated(Job(str(DEMO / "axpby.yaml"), f"{IMPLS}:no_such_function", "case", "small-f32", "cpu"), timeout_s=20)
    assert outcome.status == Status.RUNTIME_ERROR and "no_such_function" in outcome.message


@pytest.mark.slow
def test_spawned_worker_is_reused_and_replaced_after_a_crash() -> None:
    """The mechanism CUDA cases use (exercised here on CPU jobs): one spawned process for many jobs."""
    from toolbox.harness.isolation import SpawnedWorker

    worker = SpawnedWorker()
    try:
        first = worker.run(job("axpby", "axpby", "small-f32"), timeout_s=120)
        pid = worker._process.pid
        second = worker.run(job("axpby", "axpby_wrong_id", "small-f32"), timeout_s=120)
        assert (first.status, second.status) == (Status.PASSED, Status.INCORRECT_NUMERICAL)
        assert worker._process.pid == pid  # reused
        crashed = worker.run(job("axpby", "axpby_exits", "small-f32"), timeout_s=120)
        assert crashed.status == Status.RUNTIME_ERROR and "exited with code 3" in crashed.message
        after = worker.run(job("axpby", "axpby", "wide-bf16"), timeout_s=120)
        assert after.status == Status.PASSED and worker._process.pid != pid
    finally:
        worker.stop()


def test_forked_child_survives_parent_openmp_use() -> None:
    """Regression: after the parent ran a parallel CPU op, a forked child running one hung (GNU OpenMP and fork)."""
    import torch

    torch.softmax(torch.randn(2048, 1024), dim=-1)  # large enough for intra-op parallelism in this process
    outcome = run_job_isolated(job("softmax-inplace", "softmax_inplace", "rows"), timeout_s=20)
    assert outcome.status == Status.PASSED, outcome.message


def test_inputs_are_drawn_from_a_seeded_cpu_generator_for_every_device() -> None:
    """One seed gives the same inputs on every device (make_inputs draws on the CPU, then moves)."""
    import torch

    from toolbox.harness.inputs import Binding, generator_for

    cpu = generator_for(Binding({}, {}, torch.float32, "cpu", 5))
    cuda = generator_for(Binding({}, {}, torch.float32, "cuda", 5))
    assert cuda.device.type == "cpu"
    assert torch.equal(torch.randn(8, generator=cpu), torch.randn(8, generator=cuda))
