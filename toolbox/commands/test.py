"""`toolbox test`: run contract cases against an implementation (`--impl`) or an engine's declared ones (`--engine`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EPILOG = """\b
Examples:
  toolbox test norms-and-activations/rmsnorm --impl mypkg.ops:rms_norm
  toolbox test contracts/attention/partial-rope.yaml --impl mypkg.rope:apply --cases all
  toolbox test --engine reference_engine --device cpu --junit results.xml --output results.json
  toolbox test --engine reference_engine --list --format json
  toolbox test moe/router-topk --impl mypkg.moe:topk --no-isolation   # debug in one process

\b
Exit status: 0 when every record is PASSED or SKIPPED, 1 otherwise, 2 for usage errors.
"""


@click.command(name="test", epilog=EPILOG)
@click.argument("contracts", nargs=-1)
@click.option("--impl", "impl", metavar="MODULE:FUNCTION", help="Implementation to test, importable as package.module:function.")
@click.option("--engine", metavar="PACKAGE", help="Engine package with contract_implementations(); runs every declared implementation.")
@click.option("--device", "devices", type=click.Choice(["cpu", "cuda"]), multiple=True, help="Run only cases on these devices (default: cpu and cuda; cuda cases are SKIPPED without a GPU).")
@click.option("--cases", "cases", multiple=True, metavar="NAME|all", help="Run only the named cases (repeatable); `all` runs every case.")
@click.option("--timeout", "timeout_s", type=float, help="Seconds per case (default: the contract's timeout_s).")
@click.option("--no-isolation", is_flag=True, help="Run cases in this process (debugging; a crash or hang stops the run).")
@click.option("--contracts-dir", type=click.Path(file_okay=False, path_type=Path), help="Where contract ids are looked up (default: the repository's contracts/).")
@click.option("--list", "list_only", is_flag=True, help="With --engine: list {contract id: [implementations]} and run nothing.")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True, help="What to print on stdout.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the JSON document {environment, records} here.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here (one testcase per record).")
def command(contracts, impl, engine, devices, cases, timeout_s, no_isolation, contracts_dir, list_only, output_format, output, junit) -> None:
    """Run a contract's cases (fresh seeded inputs, poisoned outputs, tolerances, invariants, error cases),
    each in its own process, and report one record per (contract, implementation, case)."""
    from rich.console import Console

    from toolbox.harness.discovery import engine_implementations, listing
    from toolbox.harness.junit import write_junit
    from toolbox.harness.records import document, environment, write_json
    from toolbox.harness.report import print_table, progress_bar
    from toolbox.harness.runner import run_contracts
    from toolbox.harness.statuses import ContractError, UsageError

    err = Console(stderr=True)
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # --impl modules resolve from the working directory, as with `python -m`
    try:
        if list_only:
            if engine is None:
                raise UsageError("--list needs --engine PACKAGE")
            table = listing(engine_implementations(engine))
            if contracts:
                table = {key: value for key, value in table.items() if key in contracts}
            if output_format == "json":
                click.echo(json.dumps(table, indent=2))
            else:
                for contract_id, impls in table.items():
                    click.echo(f"{contract_id}: {', '.join(impls)}")
            return
        env = environment()
        with progress_bar(err.is_terminal and output_format == "table", err) as progress:
            records = run_contracts(
                contracts, impl=impl, engine=engine, devices=devices or None, cases=cases or None, timeout_s=timeout_s,
                isolation=not no_isolation, contracts_dir=contracts_dir, progress=progress, env=env,
            )
    except (UsageError, ContractError) as error:
        err.print(f"[red]error:[/] {error}", highlight=False)
        sys.exit(2)
    if output:
        write_json(output, records, env)
    if junit:
        write_junit(junit, records)
    if output_format == "json":
        click.echo(json.dumps(document(records, env), indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
        print_table(records, console, bench=False)
    sys.exit(0 if all(record.status.ok for record in records) else 1)
