"""`toolbox test` end to end: exit codes, JSON records, JUnit XML, engine discovery, --list, version skips."""

from __future__ import annotations

import json
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixture_impls

from toolbox.commands.test import command
from toolbox.harness.records import ENVIRONMENT_KEYS, environment

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "contracts"
IMPLS = fixture_impls.__name__
DIR = ["--contracts-dir", str(FIXTURES)]


def invoke(*args: str):
    return CliRunner().invoke(command, [*args], catch_exceptions=False)


def records_of(result) -> list[dict]:
    return json.loads(result.output)["records"]


def test_correct_impl_exits_0_with_full_records() -> None:
    result = invoke("demo/axpby", "--impl", f"{IMPLS}:axpby", *DIR, "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert set(ENVIRONMENT_KEYS) <= set(document["environment"])
    records = document["records"]
    assert [(r["case"], r["kind"], r["status"]) for r in records] == [
        ("small-f32", "case", "PASSED"),
        ("wide-bf16", "case", "PASSED"),
        ("length-mismatch", "error", "PASSED"),
    ]
    first = records[0]
    assert first["contract_id"] == "demo/axpby" and first["contract_version"] == "1.2.0"
    assert first["implementation"] == f"{IMPLS}:axpby" and first["axes"] == {"N": 64, "BLOCK": 16}
    assert set(first["max_abs_error"]) == {"out", "ids_out"} and set(first["max_rel_error"]) == {"out", "ids_out"}
    assert first["latency_ms"] is None and first["roofline_fraction"] is None
    assert set(ENVIRONMENT_KEYS) <= set(first["environment"])


def test_environment_commit_inside_and_outside_git(tmp_path: Path, repo_root: Path) -> None:
    inside = environment(repo_root)
    assert len(inside["commit"]) == 40 and all(c in "0123456789abcdef" for c in inside["commit"])
    assert isinstance(inside["dirty"], bool)
    outside = environment(tmp_path)
    assert outside["commit"] == "unknown" and outside["dirty"] is None


def test_failures_exit_1_and_write_json_and_junit(tmp_path: Path) -> None:
    output, junit = tmp_path / "new" / "r.json", tmp_path / "other" / "r.xml"  # missing folders are created
    result = invoke(
        "demo/axpby", "--impl", f"{IMPLS}:axpby_tiled_missing_last", *DIR, "--output", str(output), "--junit", str(junit)
    )
    assert result.exit_code == 1
    assert "UNWRITTEN_OUTPUT" in result.output and "MISSING_ERROR" in result.output
    statuses = {r["case"]: r["status"] for r in json.loads(output.read_text())["records"]}
    assert statuses["small-f32"] == "UNWRITTEN_OUTPUT" and statuses["length-mismatch"] == "MISSING_ERROR"
    root = ET.parse(junit).getroot()
    testcases = root.findall(".//testcase")
    assert len(testcases) == len(statuses)
    failures = root.findall(".//testcase/failure")
    skipped = root.findall(".//testcase/skipped")
    failing = sum(1 for s in statuses.values() if s not in ("PASSED", "SKIPPED"))
    assert len(failures) == failing == int(root.get("failures"))
    assert len(skipped) == sum(1 for s in statuses.values() if s == "SKIPPED")


def test_cuda_cases_skip_without_cuda_and_device_filter() -> None:
    import torch

    result = invoke("demo/axpby", "--impl", f"{IMPLS}:axpby", *DIR, "--format", "json", "--device", "cuda")
    records = records_of(result)
    if not torch.cuda.is_available():
        assert result.exit_code == 0
        assert [(r["case"], r["status"], r["message"]) for r in records if r["kind"] == "case"] == [("gpu-f32", "SKIPPED", "no CUDA device")]
    assert all(r["device"] == "cuda" for r in records)


def test_cases_filter_and_timeout_and_crash_in_one_run() -> None:
    result = invoke("demo/axpby", "--impl", f"{IMPLS}:axpby_hangs", *DIR, "--cases", "small-f32", "--timeout", "1", "--format", "json")
    assert result.exit_code == 1
    assert [(r["case"], r["status"]) for r in records_of(result)] == [("small-f32", "TIMEOUT")]
    result = invoke("demo/axpby", "--impl", f"{IMPLS}:axpby_exits", *DIR, "--device", "cpu", "--format", "json")
    assert [r["status"] for r in records_of(result)] == ["RUNTIME_ERROR"] * 3  # each case crashed alone; the run went on


def test_contract_by_yaml_path_and_no_isolation() -> None:
    path = FIXTURES / "demo" / "sort-custom.yaml"
    result = invoke(str(path), "--impl", f"{IMPLS}:sort_descending", "--no-isolation", "--format", "json")
    assert result.exit_code == 1
    assert {r["status"] for r in records_of(result)} == {"INCORRECT_NUMERICAL"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["demo/nope", "--impl", f"{IMPLS}:axpby", *DIR], "unknown contract 'demo/nope'"),
        (["demo/axpby", "--impl", "no_such_module_xyz:f", *DIR], "cannot import 'no_such_module_xyz'"),
        (["demo/axpby", "--impl", "fixture_impls", *DIR], "not of the form package.module:function"),
        (["demo/axpby", "--impl", f"{IMPLS}:missing", *DIR], "has no attribute 'missing'"),
        (["demo/axpby", *DIR], "exactly one of --impl"),
        (["--engine", "json", *DIR], "no contract_implementations()"),
        (["demo/axpby", "--impl", f"{IMPLS}:axpby", "--cases", "nope", *DIR], "no case named nope"),
        (["--list"], "--list needs --engine"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> str:
    """An engine package declaring: a right and a wrong axpby at major 1, a softmax at major 2 (contract is 1.x),
    the custom sort, and a contract the fixtures do not have; demo/buggy has no implementation."""
    module = types.ModuleType("fake_engine_for_harness_tests")

    def contract_implementations() -> dict:
        return {
            "demo/axpby": [
                {"impl": f"{IMPLS}:axpby", "major": 1, "devices": ["cpu", "cuda"], "backend": "torch"},
                {"impl": f"{IMPLS}:axpby_noisy", "major": 1, "devices": ["cpu"], "backend": "torch"},
            ],
            "demo/softmax-inplace": [{"impl": f"{IMPLS}:softmax_inplace", "major": 2, "devices": ["cpu"], "backend": "torch"}],
            "demo/sort-custom": [{"impl": f"{IMPLS}:sort_values", "major": 1, "devices": ["cpu"], "backend": "torch"}],
            "demo/elsewhere": [{"impl": f"{IMPLS}:axpby", "major": 1, "devices": ["cpu"], "backend": "torch"}],
        }

    module.contract_implementations = contract_implementations
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_list_prints_contract_id_to_impl_paths(fake_engine: str) -> None:
    result = invoke("--engine", fake_engine, "--list", "--format", "json")
    assert result.exit_code == 0
    listed = json.loads(result.output)
    assert listed["demo/axpby"] == [f"{IMPLS}:axpby", f"{IMPLS}:axpby_noisy"]
    assert listed["demo/sort-custom"] == [f"{IMPLS}:sort_values"]


def test_engine_run_major_mismatch_missing_impl_and_failures(fake_engine: str) -> None:
    result = invoke("--engine", fake_engine, *DIR, "--device", "cpu", "--format", "json")
    assert result.exit_code == 1  # axpby_noisy fails
    records = records_of(result)
    by = {(r["contract_id"], r["implementation"].rpartition(":")[2], r["case"]): r for r in records}
    assert by[("demo/axpby", "axpby", "small-f32")]["status"] == "PASSED"
    assert by[("demo/axpby", "axpby_noisy", "wide-bf16")]["status"] == "INCORRECT_NUMERICAL"
    mismatch = by[("demo/softmax-inplace", "softmax_inplace", "*")]
    assert mismatch["status"] == "SKIPPED" and mismatch["message"] == "implementation declares major 2, contract is at 1"
    buggy = [r for r in records if r["contract_id"] == "demo/buggy"]
    assert [(r["status"], r["message"]) for r in buggy] == [("SKIPPED", "no implementation declared")]
    elsewhere = [r for r in records if r["contract_id"] == "demo/elsewhere"]
    assert [r["status"] for r in elsewhere] == ["SKIPPED"] and "no contract demo/elsewhere" in elsewhere[0]["message"]
    assert by[("demo/sort-custom", "sort_values", "hundred")]["status"] == "PASSED"


def test_engine_runs_only_the_devices_it_declares(fake_engine: str) -> None:
    result = invoke("demo/axpby", "--engine", fake_engine, *DIR, "--format", "json")
    records = records_of(result)
    gpu = [(r["implementation"].rpartition(":")[2], r["status"]) for r in records if r["case"] == "gpu-f32"]
    assert gpu == [("axpby", "SKIPPED")] or gpu == [("axpby", "PASSED")]  # the cpu-only axpby_noisy has no cuda record


def test_table_output_names_statuses_and_summary() -> None:
    result = invoke("demo/softmax-inplace", "--impl", f"{IMPLS}:softmax_inplace_scaled", *DIR)
    assert result.exit_code == 1
    assert "INCORRECT_NUMERICAL" in result.output and "rows_sum_to_one" in result.output
    assert "2 records" in result.output


def test_help_has_examples() -> None:
    result = invoke("--help")
    assert result.exit_code == 0 and "Examples:" in result.output and "--engine reference_engine" in result.output


def test_public_api_names_resolve() -> None:
    from toolbox import harness

    for name in harness.__all__:
        assert getattr(harness, name) is not None
