"""`toolbox bench`: roofline arithmetic, input rotation, hardware profiles with sources; timing itself on CUDA only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixture_impls

from toolbox.commands.bench import command
from toolbox.harness.hardware import load_profiles
from toolbox.harness.inputs import bind
from toolbox.harness.loading import load_contract
from toolbox.harness.roofline import MAX_INPUT_SETS, input_sets_needed, roofline_point

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "contracts"
IMPLS = fixture_impls.__name__


def test_profiles_have_sources_and_the_stated_ceilings() -> None:
    profiles = load_profiles()
    assert {"h200", "b200"} <= set(profiles)
    h200, b200 = profiles["h200"], profiles["b200"]
    assert h200.memory_bandwidth.value == 4.27e12 and "Measured on an H200 (2026-12-02)" in h200.memory_bandwidth.source
    assert h200.peak_for("bfloat16").value == 690e12
    assert h200.datasheet["memory_bandwidth"].value == 4.8e12 and h200.datasheet["bfloat16"].value == 989e12
    assert b200.memory_bandwidth.value == 8e12 and b200.peak_for("bfloat16").value == 2.25e15
    assert b200.peak_for("nvfp4").value == 9e15
    assert b200.peak_for("float32") == b200.peak_flops["default"]
    for profile in profiles.values():
        ceilings = [profile.memory_bandwidth, *profile.peak_flops.values(), *profile.datasheet.values()]
        assert all(c.source.strip() and c.value > 0 for c in ceilings)


def test_roofline_point_uses_axes_and_itemsize() -> None:
    loaded = load_contract(FIXTURES / "demo" / "axpby.yaml")
    binding = bind(loaded.contract, {"N": 1 << 20}, {}, "bfloat16", "cpu", 0, "test")
    h200 = load_profiles()["h200"]
    point = roofline_point(loaded.contract.roofline, binding, h200)
    n = 1 << 20
    assert point.bytes == n * (3 * 2 + 8) and point.flops == 3 * n
    assert point.memory_s == pytest.approx(point.bytes / 4.27e12)
    assert point.ideal_s == point.memory_s  # an elementwise op is memory-bound
    assert point.fraction(2 * point.ideal_s) == pytest.approx(0.5)
    f32 = roofline_point(loaded.contract.roofline, bind(loaded.contract, {"N": n}, {}, "float32", "cpu", 0, "t"), h200)
    assert f32.bytes == n * (3 * 4 + 8)


@pytest.mark.parametrize(
    ("set_bytes", "l2", "free", "expected"),
    [
        (1 << 30, 50 << 20, None, 1),  # one big set already exceeds 2x L2
        (10 << 20, 50 << 20, None, 11),  # 11 x 10 MB > 100 MB
        (1 << 10, 50 << 20, None, MAX_INPUT_SETS),  # tiny sets: capped
        (10 << 20, 50 << 20, 40 << 20, 2),  # limited by free memory
    ],
)
def test_input_sets_exceed_twice_l2(set_bytes: int, l2: int, free: int | None, expected: int) -> None:
    count = input_sets_needed(set_bytes, l2, free)
    assert count == expected
    if free is None and count < MAX_INPUT_SETS:
        assert count * set_bytes > 2 * l2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_bench_without_cuda_exits_2_with_a_clear_message() -> None:
    result = CliRunner().invoke(command, ["demo/axpby", "--impl", f"{IMPLS}:axpby", "--contracts-dir", str(FIXTURES)])
    assert result.exit_code == 2
    assert "needs a CUDA device" in result.output and "Traceback" not in result.output


def test_bench_help_has_examples() -> None:
    result = CliRunner().invoke(command, ["--help"])
    assert result.exit_code == 0 and "Examples:" in result.output


@pytest.mark.cuda
def test_bench_on_cuda_reports_latency_and_fraction(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    args = ["demo/axpby", "--impl", f"{IMPLS}:axpby", "--contracts-dir", str(FIXTURES), "--format", "json", "--output", str(output)]
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (record,) = json.loads(output.read_text())["records"]
    assert record["kind"] == "benchmark" and record["status"] == "PASSED" and record["device"] == "cuda"
    assert record["latency_ms"] > 0 and 0 < record["roofline_fraction"] < 1.5
    assert "input sets" in record["message"]


@pytest.mark.cuda
def test_bench_of_a_raising_impl_is_a_runtime_error() -> None:
    args = ["demo/axpby", "--impl", f"{IMPLS}:axpby_raises", "--contracts-dir", str(FIXTURES), "--format", "json"]
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    assert result.exit_code == 1
    assert json.loads(result.output)["records"][0]["status"] == "RUNTIME_ERROR"


@pytest.mark.cuda
def test_cuda_case_runs_isolated_with_spawn() -> None:
    from toolbox.commands.test import command as test_command

    args = ["demo/axpby", "--impl", f"{IMPLS}:axpby", "--contracts-dir", str(FIXTURES), "--device", "cuda", "--format", "json"]
    result = CliRunner().invoke(test_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)["records"]
    assert [(r["case"], r["status"]) for r in records] == [("gpu-f32", "PASSED"), ("length-mismatch", "PASSED")]
    bad = ["demo/axpby", "--impl", f"{IMPLS}:axpby_tiled_missing_last", "--contracts-dir", str(FIXTURES), "--device", "cuda", "--format", "json"]
    records = json.loads(CliRunner().invoke(test_command, bad, catch_exceptions=False).output)["records"]
    assert records[0]["status"] == "UNWRITTEN_OUTPUT"
