"""`toolbox check`: the main job. Validate the knowledge base, run every contract against the reference
engine, generate a few tokens with the built-in default model, and print one summary table."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

EPILOG = """\b
Examples:
  toolbox check                                   # everything, on the CPU
  toolbox check --output results/cpu/reference_engine.json
  toolbox check --skip-contracts                  # validate + generate only (seconds)
  toolbox check --device cuda --model full        # on a GPU machine

\b
Exit status: 0 when every step passed, 1 when any failed, 2 for usage errors.
"""

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):")


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    detail: str
    seconds: float


@click.command(name="check", epilog=EPILOG)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Where contracts run and the model generates.")
@click.option("--model", default="tiny", show_default=True, help="Preset name or checkpoint directory for the generation step.")
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=16, show_default=True, help="Tokens to generate per prompt.")
@click.option("--skip-contracts", is_flag=True, help="Skip the contract run (the slowest step).")
@click.option("--timeout", "timeout_s", type=float, help="Seconds per contract case (default: each contract's own).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the contract records (JSON) here, for the site's dashboard.")
def command(device: str, model: str, max_tokens: int, skip_contracts: bool, timeout_s: float | None, output: Path | None) -> None:
    """Run the main job: validate knowledge/ and contracts/, run every contract against the reference
    engine, and generate with the default model; then print a summary."""
    from rich.console import Console

    console = Console(stderr=True)
    steps = [_validate(console)]
    steps.append(_contracts(console, device, timeout_s, output) if not skip_contracts
                 else StepResult("contracts", True, "skipped (--skip-contracts)", 0.0))
    steps.append(_generate(console, device, model, max_tokens))
    _print_summary(steps)
    sys.exit(0 if all(step.ok for step in steps) else 1)


def _validate(console) -> StepResult:
    from toolbox.knowledge_base import default_root
    from toolbox.validate.runner import validate_repository

    start = time.perf_counter()
    console.print("[bold]1/3[/] validating knowledge/ and contracts/ ...")
    report = validate_repository(default_root())
    for finding in report.findings:
        console.print(finding.to_text(), highlight=False, markup=False, soft_wrap=True)
    ok = report.errors == 0
    detail = (f"{report.skills_checked} skills, {report.contracts_checked} contracts: "
              f"{report.errors} errors, {report.warnings} warnings")
    return StepResult("validate", ok, detail, time.perf_counter() - start)


def _contracts(console, device: str, timeout_s: float | None, output: Path | None) -> StepResult:
    from toolbox.harness.records import environment, summary, write_json
    from toolbox.harness.report import progress_bar
    from toolbox.harness.runner import run_contracts

    start = time.perf_counter()
    console.print(f"[bold]2/3[/] running every contract against reference_engine on {device} ...")
    env = environment()
    with progress_bar(console.is_terminal, console) as progress:
        records = run_contracts(engine="reference_engine", devices=[device], timeout_s=timeout_s, progress=progress, env=env)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_json(output, records, env)
    failed = [record for record in records if not record.status.ok]
    for record in failed:
        console.print(f"FAILED {record.contract_id} [{record.case}] {record.status.value}: {record.message}",
                      highlight=False, markup=False)
    counts = summary(records)
    contracts = len({record.contract_id for record in records})
    detail = f"{contracts} contracts, {len(records)} records: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return StepResult("contracts", not failed and bool(records), detail, time.perf_counter() - start)


def _generate(console, device: str, model: str, max_tokens: int) -> StepResult:
    from reference_engine import LLM, SamplingParams

    start = time.perf_counter()
    console.print(f"[bold]3/3[/] generating {max_tokens} tokens per prompt with model {model!r} on {device} ...")
    try:
        llm = LLM(model=model, device=device)
        outputs = llm.generate(list(DEFAULT_PROMPTS), SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                               use_tqdm=False)
    except (ValueError, OSError) as error:
        return StepResult("generate", False, f"{type(error).__name__}: {error}", time.perf_counter() - start)
    generated = sum(len(output.outputs[0].token_ids) for output in outputs)
    for output in outputs:
        console.print(f"  {output.prompt!r} -> {output.outputs[0].text!r}", highlight=False, markup=False)
    ok = generated == max_tokens * len(DEFAULT_PROMPTS)
    elapsed = time.perf_counter() - start
    return StepResult("generate", ok, f"{len(outputs)} prompts, {generated} tokens (greedy, random-weight {model!r} model)", elapsed)


def _print_summary(steps: list[StepResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="toolbox check", header_style="bold")
    for column in ("step", "result", "detail", "seconds"):
        table.add_column(column, overflow="fold")
    for step in steps:
        table.add_row(step.name, "[green]ok[/]" if step.ok else "[red]FAILED[/]", step.detail, f"{step.seconds:.1f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(table)
