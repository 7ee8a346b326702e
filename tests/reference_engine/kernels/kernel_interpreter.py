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
import json, sys
from toolbox.harness.runner import run_contracts
contract, plan = sys.argv[1], json.loads(sys.argv[2])
result = {impl: [r.to_dict() for r in run_contracts([contract], impl=impl, devices=["cpu"], cases=cases, isolation=False)]
          for impl, cases in plan.items()}
print("RECORDS" + json.dumps(result, default=str))
"""


def contract_records(contract: str, plan: dict[str, list[str]], timeout: float = 240) -> dict[str, list[dict]]:
    """Run, in one interpreter subprocess, the named CPU cases of `contract` for each implementation
    ("module:function" -> case names); the harness records per implementation."""
    command = [sys.executable, "-c", _RUNNER, contract, json.dumps(plan)]
    result = subprocess.run(command, cwd=REPO, env=interpreter_env(), capture_output=True, text=True, timeout=timeout)
    marker = result.stdout.rfind("RECORDS")
    if result.returncode != 0 or marker < 0:
        raise AssertionError(f"harness run failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout[marker + len("RECORDS"):])


def run_script(source: str, timeout: float = 240) -> str:
    """Run Python `source` under the interpreter; its stdout (AssertionError with the output on failure)."""
    result = subprocess.run([sys.executable, "-c", source], cwd=REPO, env=interpreter_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"script failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def assert_all_passed(records: list[dict], expected_cases: list[str]) -> None:
    seen = {record["case"]: record for record in records}
    assert sorted(seen) == sorted(expected_cases), f"ran {sorted(seen)}, expected {sorted(expected_cases)}"
    failing = [f"{r['case']}: {r['status']} {r.get('message', '')}" for r in records if r["status"] != "PASSED"]
    assert not failing, "\n".join(failing)
