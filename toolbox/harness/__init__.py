"""The contract harness: runs any implementation against a contract's cases and reports one record per case.

Public API (import from here; importing this package does not import torch):

* `run_contracts(contracts=(), impl=None, engine=None, devices=None, cases=None, timeout_s=None,
  isolation=True, contracts_dir=None, progress=None, env=None) -> list[Record]`: all of `toolbox test`.
* `bench_contract(contract, impl, profile="h200", benchmarks=None, runs=100, contracts_dir=None,
  env=None) -> list[Record]`: all of `toolbox bench` (CUDA only; UsageError elsewhere).
* `load_contract(id_or_path, contracts_dir=None) -> LoadedContract`, `contract_paths(contracts_dir=None)`.
* `engine_implementations(engine) -> dict[str, list[Declared]]`, `listing(table) -> {id: [impl paths]}`.
* `run_job_inline(Job) / run_job_isolated(Job, timeout_s) -> Outcome`: one case, here or in a child.
* `document(records) -> dict`, `write_json(path, records)`, `junit_xml(records)`, `write_junit(path, records)`,
  `environment(repo_dir=None) -> dict`, `load_profiles() -> dict[str, HardwareProfile]`.
* `Status`, `Record`, `ContractError`, `UsageError`.
"""

from __future__ import annotations

import importlib
from typing import Any

from toolbox.harness.statuses import ContractError, Status, UsageError

_LAZY = {
    "run_contracts": "toolbox.harness.runner",
    "bench_contract": "toolbox.harness.bench",
    "load_contract": "toolbox.harness.loading",
    "contract_paths": "toolbox.harness.loading",
    "LoadedContract": "toolbox.harness.loading",
    "engine_implementations": "toolbox.harness.discovery",
    "listing": "toolbox.harness.discovery",
    "Declared": "toolbox.harness.discovery",
    "Job": "toolbox.harness.isolation",
    "run_job_inline": "toolbox.harness.isolation",
    "run_job_isolated": "toolbox.harness.isolation",
    "Outcome": "toolbox.harness.outcome",
    "Record": "toolbox.harness.records",
    "document": "toolbox.harness.records",
    "write_json": "toolbox.harness.records",
    "environment": "toolbox.harness.records",
    "junit_xml": "toolbox.harness.junit",
    "write_junit": "toolbox.harness.junit",
    "load_profiles": "toolbox.harness.hardware",
    "HardwareProfile": "toolbox.harness.hardware",
}

__all__ = ["ContractError", "Status", "UsageError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'toolbox.harness' has no attribute {name!r}")
