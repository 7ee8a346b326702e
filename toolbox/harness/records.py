"""Result records (one per contract x implementation x case) and the environment they were produced in."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolbox.harness.statuses import Status

ENVIRONMENT_KEYS = ("device_name", "torch", "triton", "python", "platform", "commit", "dirty", "timestamp")


@dataclass(frozen=True)
class Record:
    contract_id: str
    contract_version: str
    implementation: str
    case: str
    kind: str  # "case" | "error" | "benchmark"
    device: str
    dtype: str
    axes: dict[str, int]
    status: Status
    message: str = ""
    max_abs_error: dict[str, float | None] = field(default_factory=dict)
    max_rel_error: dict[str, float | None] = field(default_factory=dict)
    latency_ms: float | None = None
    roofline_fraction: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["max_abs_error"] = {k: _finite(v) for k, v in self.max_abs_error.items()}
        data["max_rel_error"] = {k: _finite(v) for k, v in self.max_rel_error.items()}
        return data


def _finite(value: float | None) -> float | str | None:
    """JSON has no inf/nan; write them as strings."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def environment(repo_dir: Path | None = None) -> dict[str, Any]:
    """Device name, library versions, git commit (and whether the tree is dirty) of `repo_dir` (default: the cwd), timestamp."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cwd = Path(repo_dir) if repo_dir is not None else Path.cwd()
    commit = _git(["rev-parse", "HEAD"], cwd)
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd) if commit else None
    if torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "device_name": device_name,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "commit": commit.strip() if commit else "unknown",
        "dirty": bool(status.strip()) if status is not None else None,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def document(records: list[Record], env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document `--output` writes: {environment, records}."""
    env = env if env is not None else (records[0].environment if records else environment())
    return {"environment": env, "records": [record.to_dict() for record in records]}


def write_json(path: Path, records: list[Record], env: dict[str, Any] | None = None) -> None:
    """Write the {environment, records} document, creating missing parent folders (a long run must not be lost)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document(records, env), indent=2) + "\n", encoding="utf-8")


def summary(records: list[Record]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status.value] = counts.get(record.status.value, 0) + 1
    return counts
