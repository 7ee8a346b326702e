"""Which engine function satisfies which contract (id and major version), declared next to the function.

The toolbox discovers this through `reference_engine.contract_implementations()`; no list is kept
by hand anywhere else. Implementations follow the contract's calling convention (destination
passing: inputs, preallocated outputs and params as keyword arguments).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class ContractImplementation:
    contract_id: str
    major: int
    target: str  # "package.module:function"
    devices: tuple[str, ...]
    backend: str  # "torch" or "triton"


_LOCK = threading.Lock()
_IMPLEMENTATIONS: dict[str, list[ContractImplementation]] = {}


def satisfies(contract_id: str, major: int, devices: tuple[str, ...] = ("cpu", "cuda"), backend: str = "torch") -> Callable[[F], F]:
    """Mark a function as an implementation of `contract_id` at major version `major`."""

    def mark(function: F) -> F:
        entry = ContractImplementation(contract_id, major, f"{function.__module__}:{function.__qualname__}", tuple(devices), backend)
        with _LOCK:
            entries = _IMPLEMENTATIONS.setdefault(contract_id, [])
            if entry not in entries:
                entries.append(entry)
        return function

    return mark


def registered() -> dict[str, list[ContractImplementation]]:
    with _LOCK:
        return {key: list(value) for key, value in sorted(_IMPLEMENTATIONS.items())}
