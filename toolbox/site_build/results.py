"""Reading the recorded results the site shows: contract records and engine benchmark documents.

Contract records are the `{environment, records}` JSON documents that `toolbox test|check|bench
--output` write (see `toolbox.harness.records`); engine benchmarks are the documents
`toolbox engine bench` writes to `benchmarks/results/` (see `reference_engine.bench.report`).
Files are found under `results/` (except the scratch folder `results/tmp/`) and `benchmarks/`;
a JSON file that is neither kind is reported, never fatal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FOLDERS = ("results", "benchmarks")
SCRATCH_FOLDERS = ("results/tmp", "benchmarks/kernels")  # scratch, and kernel timing records (their own format, read by NOTES.md)
PASSED, SKIPPED = "PASSED", "SKIPPED"


@dataclass(frozen=True)
class RecordFile:
    path: str  # repository-relative
    environment: dict[str, Any]
    records: tuple[dict[str, Any], ...]

    @property
    def timestamp(self) -> str:
        return str(self.environment.get("timestamp") or self.environment.get("date") or "")


@dataclass(frozen=True)
class EngineBenchmark:
    path: str
    document: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.document.get("name") or Path(self.path).stem)

    @property
    def date(self) -> str:
        return str(self.document.get("environment", {}).get("date", ""))


@dataclass(frozen=True)
class ResultFiles:
    record_files: tuple[RecordFile, ...] = ()
    engine_benchmarks: tuple[EngineBenchmark, ...] = ()
    not_understood: tuple[tuple[str, str], ...] = ()  # (path, why)


@dataclass(frozen=True)
class ResultRow:
    """The latest results of one contract x implementation x device (from the newest file holding them)."""

    contract_id: str
    contract_version: str
    implementation: str
    device: str  # cpu | cuda
    device_name: str
    source: str  # repository path of the file
    timestamp: str
    commit: str
    counts: dict[str, int] = field(default_factory=dict)
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    roofline_fractions: tuple[float, ...] = ()
    benchmarks: tuple[dict[str, Any], ...] = ()  # the kind == "benchmark" records
    records: tuple[dict[str, Any], ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def failing_records(self) -> tuple[dict[str, Any], ...]:
        return tuple(r for r in self.records if str(r.get("status")) not in (PASSED, SKIPPED))

    @property
    def failed(self) -> int:
        return sum(count for status, count in self.counts.items() if status not in (PASSED, SKIPPED))


def _json_files(root: Path) -> Iterable[Path]:
    for folder in RESULT_FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.json")):
            relative = path.relative_to(root).as_posix()
            if any(relative.startswith(scratch + "/") for scratch in SCRATCH_FOLDERS):
                continue
            yield path


def load_result_files(root: Path) -> ResultFiles:
    record_files, benchmarks, odd = [], [], []
    for path in _json_files(root):
        relative = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            odd.append((relative, f"not readable JSON: {error}"))
            continue
        if isinstance(data, dict) and isinstance(data.get("records"), list):
            records = tuple(r for r in data["records"] if isinstance(r, dict) and "contract_id" in r and "status" in r)
            environment = data.get("environment") if isinstance(data.get("environment"), dict) else {}
            record_files.append(RecordFile(relative, environment, records))
        elif isinstance(data, dict) and isinstance(data.get("table"), list) and "environment" in data:
            benchmarks.append(EngineBenchmark(relative, data))
        else:
            odd.append((relative, "neither a records document {environment, records} nor an engine benchmark"))
    benchmarks.sort(key=lambda b: (b.date, b.path), reverse=True)
    return ResultFiles(tuple(record_files), tuple(benchmarks), tuple(odd))


def _number(value: Any) -> float | None:
    """Errors are numbers, None, or the strings 'inf'/'nan' (JSON has neither)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number


def _max(values: Iterable[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    if not numbers:
        return None
    if any(math.isnan(v) for v in numbers):
        return math.nan
    return max(numbers)


def latest_rows(files: ResultFiles) -> list[ResultRow]:
    """One row per (contract, implementation, device), taken from the newest file that has records for it."""
    newest: dict[tuple[str, str, str], RecordFile] = {}
    for record_file in files.record_files:
        for record in record_file.records:
            key = (record["contract_id"], str(record.get("implementation", "?")), str(record.get("device", "?")))
            current = newest.get(key)
            if current is None or record_file.timestamp > current.timestamp:
                newest[key] = record_file
    rows = []
    for key, record_file in sorted(newest.items()):
        records = [r for r in record_file.records
                   if (r["contract_id"], str(r.get("implementation", "?")), str(r.get("device", "?"))) == key]
        rows.append(_row(key, record_file, records))
    return rows


def _row(key: tuple[str, str, str], record_file: RecordFile, records: list[dict[str, Any]]) -> ResultRow:
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record["status"])] = counts.get(str(record["status"]), 0) + 1
    checked = [r for r in records if r.get("kind") == "case"]
    abs_errors = [_number(v) for r in checked for v in (r.get("max_abs_error") or {}).values()]
    rel_errors = [_number(v) for r in checked for v in (r.get("max_rel_error") or {}).values()]
    timed = [r for r in records if r.get("kind") == "benchmark"]
    fractions = tuple(f for f in (_number(r.get("roofline_fraction")) for r in timed) if f is not None)
    environment = {**record_file.environment, **(records[0].get("environment") or {})} if records else record_file.environment
    commit = str(environment.get("commit", "unknown"))
    return ResultRow(
        contract_id=key[0], contract_version=str(records[0].get("contract_version", "?")) if records else "?",
        implementation=key[1], device=key[2], device_name=str(environment.get("device_name", key[2])),
        source=record_file.path, timestamp=record_file.timestamp, commit=commit[:12],
        counts=counts, max_abs_error=_max(abs_errors), max_rel_error=_max(rel_errors),
        roofline_fractions=fractions, benchmarks=tuple(timed), records=tuple(records),
    )  # fmt: skip


def format_error(value: float | None) -> str:
    if value is None:
        return "–"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.2e}"
