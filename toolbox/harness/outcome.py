"""What running one case produced, before it becomes a record (plain data so it crosses process boundaries)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from toolbox.harness.statuses import Status


@dataclass(frozen=True)
class Outcome:
    status: Status
    message: str = ""
    max_abs_error: dict[str, float | None] = field(default_factory=dict)
    max_rel_error: dict[str, float | None] = field(default_factory=dict)
    axes: dict[str, int] = field(default_factory=dict)
    dtype: str = ""
    device: str = ""


def last_line(error: BaseException) -> str:
    """`ValueError: bad shape`: the last line of the exception as Python prints it."""
    return traceback.format_exception_only(type(error), error)[-1].strip()
