"""Run Triton kernels on the CPU through the Triton interpreter, in a subprocess.

Triton reads TRITON_INTERPRET when a kernel is defined, so the variable must be set before the
kernel module is imported: every check here runs in a fresh `python` with it set. This folder is
on its PYTHONPATH, so `wrong_kernels:<name>` resolves as an implementation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def interpreter_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    return env


_RUNNER = """
import contextlib, io, json, sys
from toolbox.harness.runner import run_contracts
request = json.loads(sys.argv[1])
result = {"records": {}, "script": None}
for contract, plan in request["contracts"].items():
    for impl, cases in plan.items():
        records = run_contracts([contract], impl=impl, devices=["cpu"], cases=cases, isolation=False)
        result["records"][contract + "|" + impl] = [r.to_dict() for r in records]
if request["script"]:
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            exec(compile(request["script"], "<kernel test script>", "exec"), {"__name__": "kernel_test_script"})
        result["script"] = {"ok": True, "output": captured.getvalue()}
    except Exception as error:  # reported to the test, which fails with the message
        result["script"] = {"ok": False, "output": captured.getvalue() + f"\\n{type(error).__name__}: {error}"}
print("RECORDS" + json.dumps(result, default=str))
"""


def interpreter_run(contracts: dict[str, dict[str, list[str]]], script: str | None = None, timeout: float = 300) -> dict:
    """One interpreter subprocess: for each contract, the named CPU cases per implementation
    ("module:function" -> case names), then `script` (Python source) if given.
    Returns {"records": {"<contract>|<impl>": [record dicts]}, "script": {"ok", "output"} or None}."""
    request = json.dumps({"contracts": contracts, "script": script})
    result = subprocess.run([sys.executable, "-c", _RUNNER, request], check=False, cwd=REPO, env=interpreter_env(), capture_output=True, text=True, timeout=timeout)
    marker = result.stdout.rfind("RECORDS")
    if result.returncode != 0 or marker < 0:
        raise AssertionError(f"interpreter run failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout[marker + len("RECORDS"):])


def contract_records(contract: str, plan: dict[str, list[str]], timeout: float = 300) -> dict[str, list[dict]]:
    """The records of one contract's run, per implementation."""
    records = interpreter_run({contract: plan}, timeout=timeout)["records"]
    return {key.split("|", 1)[1]: value for key, value in records.items()}


def assert_script_ok(run: dict) -> None:
    script = run["script"]
    assert script is not None and script["ok"], script
    assert script["output"].strip().endswith("ok"), script["output"]


def run_script(source: str, timeout: float = 240) -> str:
    """Run Python `source` under the interpreter; its stdout (AssertionError with the output on failure)."""
    result = subprocess.run([sys.executable, "-c", source], check=False, cwd=REPO, env=interpreter_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"script failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def assert_all_passed(records: list[dict], expected_cases: list[str]) -> None:
    seen = {record["case"]: record for record in records}
    assert sorted(seen) == sorted(expected_cases), f"ran {sorted(seen)}, expected {sorted(expected_cases)}"
    failing = [f"{r['case']}: {r['status']} {r.get('message', '')}" for r in records if r["status"] != "PASSED"]
    assert not failing, "\n".join(failing)


def sm90_compile_report(source: str, timeout: float = 300) -> dict:
    """Run Python `source` WITHOUT the interpreter (it compiles kernels for sm_90 ahead of time with Triton's bundled
    ptxas and prints "JSON" + a report); the report. Skips the calling test when that ptxas is missing."""
    import pytest

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run([sys.executable, "-c", source], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0 and "ptxas" in result.stderr and "No such file" in result.stderr:
        pytest.skip("Triton's bundled ptxas is not available")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.rindex("JSON") + len("JSON"):])
