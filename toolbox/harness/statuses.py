"""Result statuses of one contract case, and the errors the harness raises for bad contracts or bad usage."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """What happened to one (contract, implementation, case); the names are part of the record format."""

    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    UNWRITTEN_OUTPUT = "UNWRITTEN_OUTPUT"
    MISSING_ERROR = "MISSING_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    SKIPPED = "SKIPPED"

    def __str__(self) -> str:
        return self.value

    @property
    def ok(self) -> bool:
        """True for the statuses that do not fail a run."""
        return self in (Status.PASSED, Status.SKIPPED)


class ContractError(ValueError):
    """The contract itself is wrong (an unbound axis, a violated constraint, make_inputs not matching the declared inputs)."""


class UsageError(ValueError):
    """The caller asked for something that does not exist (unknown contract id, bad `module:function` path, engine without declarations)."""
