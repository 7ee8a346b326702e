"""`run_contracts`: plan the (contract, implementation, case) jobs, run them (isolated by default), return records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbox.harness.discovery import DEVICES, Declared, engine_implementations
from toolbox.harness.isolation import (
    Job,
    run_job_inline,
    run_job_isolated,
    stop_workers,
)
from toolbox.harness.loading import (
    DEFAULT_CONTRACTS_DIR,
    LoadedContract,
    contract_paths,
    import_function,
    load_contract,
)
from toolbox.harness.outcome import Outcome
from toolbox.harness.records import Record, environment
from toolbox.harness.statuses import ContractError, Status, UsageError

NO_CUDA = "no CUDA device"
ALL_CASES = "*"  # the case name of a record about a whole contract (nothing run)


@dataclass(frozen=True)
class Planned:
    """A job to run, or a record already decided (skips), in report order."""

    loaded: LoadedContract
    target: Declared
    kind: str
    name: str
    device: str
    dtype: str
    axes: dict[str, int]
    skip_reason: str | None = None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_contracts(
    contracts: Iterable[str | Path] = (),
    impl: str | None = None,
    engine: str | None = None,
    devices: Iterable[str] | None = None,
    cases: Iterable[str] | None = None,
    timeout_s: float | None = None,
    isolation: bool = True,
    contracts_dir: Path | None = None,
    progress: Callable[[int, int, Record], None] | None = None,
    env: dict[str, Any] | None = None,
) -> list[Record]:
    """Run contracts (ids or YAML paths; with an engine, all contracts when none are given) against `impl`
    ("module:function") or every implementation `engine` declares. Raises UsageError for bad requests;
    everything that goes wrong inside a case becomes that case's record."""
    plan = make_plan(contracts, impl, engine, devices, cases, contracts_dir)
    env = env if env is not None else environment()
    records: list[Record] = []
    total = len(plan)
    try:
        _run_plan(plan, records, total, timeout_s, isolation, progress, env)
    finally:
        stop_workers()
    return records


def _run_plan(plan, records, total, timeout_s, isolation, progress, env) -> None:
    for index, item in enumerate(plan):
        if isinstance(item, Record):
            record = _with_env(item, env)
        elif item.skip_reason is not None:
            record = _record(item, Outcome(Status.SKIPPED, item.skip_reason), env)
        else:
            job = Job(str(item.loaded.path), item.target.impl, item.kind, item.name, item.device)
            limit = timeout_s if timeout_s is not None else item.loaded.contract.timeout_s
            outcome = run_job_isolated(job, limit) if isolation else run_job_inline(job)
            record = _record(item, outcome, env)
        records.append(record)
        if progress is not None:
            progress(index + 1, total, record)


def make_plan(contracts, impl, engine, devices, cases, contracts_dir) -> list[Planned | Record]:
    if (impl is None) == (engine is None):
        raise UsageError("give exactly one of --impl module:function or --engine PACKAGE")
    selected = _devices(devices)
    names = None if cases is None or "all" in list(cases) else set(cases)
    specs = list(contracts)
    if impl is not None:
        if not specs:
            raise UsageError("--impl needs at least one CONTRACT (an id like domain/name, or a path to its YAML)")
        import_function(impl)  # a bad path is a usage error, reported before anything runs
        plan: list[Planned | Record] = []
        loaded_list = _load_all(specs, contracts_dir, impl, plan)
        targets = {loaded.id: [Declared(impl)] for loaded in loaded_list}
    else:
        declared = engine_implementations(engine)
        plan = []
        loaded_list = _load_all(specs or contract_paths(contracts_dir), contracts_dir, engine, plan)
        targets = declared
        known = {loaded.id for loaded in loaded_list}
        plan += [
            Record(contract_id, "", entry.impl, ALL_CASES, "case", "", "", {}, Status.SKIPPED,
                   f"no contract {contract_id} in {contracts_dir or DEFAULT_CONTRACTS_DIR} ({engine} declares an implementation of it)")
            for contract_id, entries in sorted(declared.items()) if not specs and contract_id not in known
            for entry in entries
        ]
    if names is not None:
        every = {c.name for loaded in loaded_list for c in [*loaded.contract.cases, *loaded.contract.errors]}
        unknown = sorted(names - every)
        if unknown:
            raise UsageError(f"no case named {', '.join(unknown)} in the selected contracts")
    has_cuda = cuda_available()
    for loaded in loaded_list:
        entries = targets.get(loaded.id, [])
        if not entries:
            plan.append(_contract_skip(loaded, Declared(engine or ""), "no implementation declared"))
            continue
        for target in entries:
            if target.major is not None and target.major != loaded.contract.major:
                reason = f"implementation declares major {target.major}, contract is at {loaded.contract.major}"
                plan.append(_contract_skip(loaded, target, reason))
                continue
            plan.extend(_plan_cases(loaded, target, selected, names, has_cuda))
    return plan


def _load_all(specs, contracts_dir, implementation: str, plan: list) -> list[LoadedContract]:
    """Load every contract; one that does not load (a contract bug) becomes a RUNTIME_ERROR record and the rest run."""
    loaded_list = []
    for spec in specs:
        try:
            loaded_list.append(load_contract(spec, contracts_dir))
        except ContractError as error:
            name = Path(spec).with_suffix("").as_posix()
            contract_id = "/".join(name.split("/")[-2:]) if str(spec).endswith((".yaml", ".yml")) else str(spec)
            plan.append(Record(contract_id, "", implementation, ALL_CASES, "case", "", "", {}, Status.RUNTIME_ERROR, f"contract bug: {error}"))
    return loaded_list


def _devices(devices: Iterable[str] | None) -> tuple[str, ...]:
    chosen = tuple(devices) if devices else DEVICES
    unknown = sorted(set(chosen) - set(DEVICES))
    if unknown:
        raise UsageError(f"unknown device {', '.join(unknown)}; choose from {', '.join(DEVICES)}")
    return chosen


def _contract_skip(loaded: LoadedContract, target: Declared, reason: str) -> Planned:
    return Planned(loaded, target, "case", ALL_CASES, "", "", {}, reason)


def _plan_cases(loaded, target, selected, names, has_cuda) -> list[Planned]:
    contract = loaded.contract
    plan = []
    for case in contract.cases:
        if (names is not None and case.name not in names) or case.device not in selected or case.device not in target.devices:
            continue
        skip = NO_CUDA if case.device == "cuda" and not has_cuda else None
        plan.append(Planned(loaded, target, "case", case.name, case.device, case.dtype, _axes(loaded, case.axes), skip))
    usable = [d for d in DEVICES if d in selected and d in target.devices]
    for error_case in contract.errors:
        if (names is not None and error_case.name not in names) or not usable:
            continue
        device = usable[0]
        skip = NO_CUDA if device == "cuda" and not has_cuda else None
        plan.append(Planned(loaded, target, "error", error_case.name, device, error_case.dtype, _axes(loaded, error_case.axes), skip))
    return plan


def _axes(loaded: LoadedContract, overrides: dict[str, int]) -> dict[str, int]:
    axes = {name: axis.value for name, axis in loaded.contract.axes.items() if axis.value is not None}
    axes.update(overrides)
    return axes


def _record(item: Planned, outcome: Outcome, env: dict[str, Any]) -> Record:
    contract = item.loaded.contract
    return Record(
        contract_id=contract.id,
        contract_version=contract.version,
        implementation=item.target.impl,
        case=item.name,
        kind=item.kind,
        device=outcome.device or item.device,
        dtype=outcome.dtype or item.dtype,
        axes=outcome.axes or item.axes,
        status=outcome.status,
        message=outcome.message,
        max_abs_error=outcome.max_abs_error,
        max_rel_error=outcome.max_rel_error,
        environment=env,
    )


def _with_env(record: Record, env: dict[str, Any]) -> Record:
    from dataclasses import replace

    return replace(record, environment=env)

