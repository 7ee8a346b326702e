"""`toolbox bench`: GPU timing of an implementation against a contract's benchmark shapes and roofline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EPILOG = """\b
Examples:
  toolbox bench norms-and-activations/rmsnorm --impl mypkg.ops:rms_norm
  toolbox bench moe/routed-experts --impl mypkg.moe:experts --profile b200 --benchmark decode-batch1
  toolbox bench attention/paged-decode --impl mypkg.attn:decode --output bench.json --format json

\b
Needs a CUDA device (exit 2 otherwise). The roofline fraction is
max(bytes / bandwidth, flops / peak) / measured time, with the ceilings of --profile
(toolbox/data/hardware.yaml, each with its source).
"""


@click.command(name="bench", epilog=EPILOG)
@click.argument("contract")
@click.option("--impl", required=True, metavar="MODULE:FUNCTION", help="Implementation to time, importable as package.module:function.")
@click.option("--profile", "profile_key", type=click.Choice(["h200", "b200"]), default="h200", show_default=True, help="Hardware ceilings for the roofline.")
@click.option("--benchmark", "benchmarks", multiple=True, metavar="NAME", help="Only these benchmark shapes (repeatable; default: all).")
@click.option("--runs", type=click.IntRange(50, 100000), default=100, show_default=True, help="Timed runs per shape (median reported).")
@click.option("--contracts-dir", type=click.Path(file_okay=False, path_type=Path), help="Where contract ids are looked up (default: the repository's contracts/).")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the JSON document {environment, records} here.")
def command(contract, impl, profile_key, benchmarks, runs, contracts_dir, output_format, output) -> None:
    """Time IMPL on CONTRACT's benchmark shapes (rotating inputs beyond the L2 cache, warm-up, CUDA graph
    or events, median) and report the latency and the fraction of the roofline."""
    from rich.console import Console

    from toolbox.harness.bench import bench_contract
    from toolbox.harness.records import document, environment, write_json
    from toolbox.harness.report import print_table
    from toolbox.harness.statuses import ContractError, UsageError

    err = Console(stderr=True)
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # --impl modules resolve from the working directory, as with `python -m`
    try:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("toolbox bench needs a CUDA device; none is available here (on the CPU, use `toolbox test`)")
        env = environment()
        records = bench_contract(contract, impl, profile=profile_key, benchmarks=list(benchmarks) or None, runs=runs, contracts_dir=contracts_dir, env=env)
    except (UsageError, ContractError) as error:
        err.print(f"[red]error:[/] {error}", highlight=False)
        sys.exit(2)
    if output:
        write_json(output, records, env)
    if output_format == "json":
        click.echo(json.dumps(document(records, env), indent=2))
    else:
        console = Console() if Console().is_terminal else Console(width=200)
        print_table(records, console, bench=True)
    sys.exit(0 if all(record.status.ok for record in records) else 1)
