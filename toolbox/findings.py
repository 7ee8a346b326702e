"""A finding: one problem in one document, with where it is and how to fix it.

Every check in `toolbox.validate` returns findings instead of raising, so the CLI never shows a
traceback for a bad document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning"]
SEVERITIES = ("error", "warning")


@dataclass(frozen=True)
class Finding:
    """`file` is relative to the repository root (posix); `line` is 1-based, None when unknown."""

    file: str
    line: int | None
    field: str
    severity: Severity
    message: str
    hint: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_text(self) -> str:
        """One line: `path:line: severity: field: message (hint: ...)`."""
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        field = f"{self.field}: " if self.field else ""
        hint = f" (hint: {self.hint})" if self.hint else ""
        text = f"{where}: {self.severity}: {field}{self.message}{hint}"
        return " ".join(text.split("\n"))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    unique = dict.fromkeys(findings)  # drops exact repeats, keeps order of first appearance
    return sorted(unique, key=lambda f: (f.file, f.line or 0, f.field, f.message))


def render_text(findings: Iterable[Finding]) -> str:
    return "\n".join(finding.to_text() for finding in findings)


def render_json(findings: Iterable[Finding]) -> str:
    return json.dumps([finding.to_dict() for finding in findings], indent=2)


def count(findings: Iterable[Finding]) -> tuple[int, int]:
    """(errors, warnings)."""
    items = list(findings)
    errors = sum(1 for f in items if f.is_error)
    return errors, len(items) - errors
