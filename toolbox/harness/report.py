"""The table people read (rich), and a progress bar for long runs."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from toolbox.harness.records import Record, summary
from toolbox.harness.statuses import Status

STYLES = {Status.PASSED: "green", Status.SKIPPED: "yellow"}


def _error(values: dict[str, float | None]) -> str:
    shown = [f"{name}={value:.2e}" for name, value in values.items() if value is not None]
    return " ".join(shown)


def print_table(records: list[Record], console: Console, bench: bool = False) -> None:
    implementations = sorted({record.implementation for record in records})
    single = len(implementations) == 1
    table = Table(show_lines=False, header_style="bold", title=f"implementation: {implementations[0]}" if single else None)
    columns = ("contract", "case", "device", "dtype", "status") if single else ("contract", "implementation", "case", "device", "dtype", "status")
    for column in columns:
        table.add_column(column, overflow="fold")
    if bench:
        table.add_column("latency ms", justify="right")
        table.add_column("roofline", justify="right")
    else:
        table.add_column("max abs error", overflow="fold")
    table.add_column("message", overflow="fold")
    for record in records:
        status = f"[{STYLES.get(record.status, 'red')}]{record.status.value}[/]"
        case = record.case if record.kind != "error" else f"{record.case} (error)"
        row = [record.contract_id, case, record.device, record.dtype, status]
        if not single:
            row.insert(1, record.implementation)
        if bench:
            row += [
                "" if record.latency_ms is None else f"{record.latency_ms:.4f}",
                "" if record.roofline_fraction is None else f"{record.roofline_fraction:.1%}",
            ]
        else:
            row.append(_error(record.max_abs_error))
        row.append(record.message)
        table.add_row(*row)
    console.print(table)
    counts = summary(records)
    line = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    failed = sum(count for status, count in counts.items() if not Status(status).ok)
    console.print(f"{len(records)} records: {line}" + (f" ([red]{failed} failing[/])" if failed else ""))


@contextmanager
def progress_bar(enabled: bool, console: Console):
    """Yields a callback `(done, total, record)`; shows a transient bar on the console when enabled."""
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    )
    with progress:
        task = progress.add_task("cases", total=None)

        def update(done: int, total: int, record: Record) -> None:
            progress.update(task, total=total, completed=done, description=f"{record.contract_id} {record.case}")

        yield update
