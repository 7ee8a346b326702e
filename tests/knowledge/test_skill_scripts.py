"""Every runnable helper a skill ships (`knowledge/**/scripts/*.py`) runs on the CPU and exits 0.

The scripts are the checks behind many numbers in the skills (floors, tie tables, layouts); each
exits non-zero when its own check fails, so a skill whose arithmetic drifts fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(REPO_ROOT.glob("knowledge/*/*/scripts/*.py"))

# Scripts that need arguments (or the Triton interpreter) to run their CPU self-check.
ARGUMENTS = {
    "measure_ceilings.py": ["--device", "cpu", "--small"],
    "latency_metrics.py": ["--self-test"],
    "detect_quant_format.py": ["--self-test"],
}
NEEDS_TRITON_INTERPRETER = {"triton_w4a16_gemv.py", "triton_decode_moe.py", "triton_router_topk.py"}


def test_the_knowledge_base_ships_scripts():
    assert len(SCRIPTS) >= 20, [str(p) for p in SCRIPTS]
    names = {path.name for path in SCRIPTS}
    assert set(ARGUMENTS) <= names and NEEDS_TRITON_INTERPRETER <= names


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(REPO_ROOT / "knowledge")) for p in SCRIPTS])
def test_skill_script_runs_clean(script: Path):
    env = dict(os.environ)
    if script.name in NEEDS_TRITON_INTERPRETER:
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run(
        [sys.executable, str(script), *ARGUMENTS.get(script.name, [])],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
