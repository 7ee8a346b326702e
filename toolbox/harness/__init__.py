"""The contract harness: runs any implementation against a contract's cases and reports one record per case.

Public API (everything else is internal):

* `run_contracts(contracts, impl=None, engine=None, ...) -> list[Record]`: the whole of `toolbox test`.
* `load_contract(path_or_id, contracts_dir=None) -> LoadedContract`, `contract_paths(contracts_dir)`.
* `engine_implementations(engine_name) -> dict[str, list[Declared]]`.
* `run_case_inline(loaded, case_name, impl) -> Outcome`: one case in this process (no isolation).
* `document(records) -> dict`, `write_json(path, records)`, `write_junit(path, records)`, `environment()`.
* `bench_contract(...) -> list[Record]` (CUDA only), `load_profiles() -> dict[str, HardwareProfile]`.
"""

from __future__ import annotations

from toolbox.harness.statuses import ContractError, Status, UsageError

__all__ = ["ContractError", "Status", "UsageError"]
