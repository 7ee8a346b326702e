"""Which implementations to run: one given by `module:function`, or those an engine package declares."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from toolbox.harness.statuses import UsageError

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Declared:
    """One implementation of one contract: its `module:function` path, the major version it satisfies
    (None when given on the command line, which runs it against whatever version the contract is at),
    the devices it runs on, and its backend."""

    impl: str
    major: int | None = None
    devices: tuple[str, ...] = DEVICES
    backend: str = ""


def engine_implementations(engine: str) -> dict[str, list[Declared]]:
    """Import the engine package and read its `contract_implementations()` (contract id -> list of dicts)."""
    try:
        package = importlib.import_module(engine)
    except ImportError as error:
        raise UsageError(f"cannot import engine package {engine!r}: {error}") from None
    declare = getattr(package, "contract_implementations", None)
    if not callable(declare):
        raise UsageError(f"engine {engine!r} has no contract_implementations() function declaring what it implements")
    try:
        table = declare()
    except Exception as error:
        raise UsageError(f"{engine}.contract_implementations() raised {type(error).__name__}: {error}") from None
    if not isinstance(table, dict):
        raise UsageError(f"{engine}.contract_implementations() returned {type(table).__name__}, expected a dict")
    result: dict[str, list[Declared]] = {}
    for contract_id, entries in table.items():
        declared = []
        for entry in entries:
            try:
                impl, major = str(entry["impl"]), int(entry["major"])
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{engine}: declaration {entry!r} for {contract_id} needs `impl` and an integer `major`") from None
            devices = tuple(entry.get("devices") or DEVICES)
            unknown = sorted(set(devices) - set(DEVICES))
            if unknown:
                raise UsageError(f"{engine}: {impl} declares unknown devices {unknown} (known: {', '.join(DEVICES)})")
            declared.append(Declared(impl, major, devices, str(entry.get("backend", ""))))
        result[str(contract_id)] = declared
    return result


def listing(table: dict[str, list[Declared]]) -> dict[str, list[str]]:
    """{contract_id: [impl paths]} for `toolbox test --list`."""
    return {contract_id: [d.impl for d in entries] for contract_id, entries in sorted(table.items())}
