"""`toolbox validate`: schema, Agent Skills rules, cross references and versions of skills and contracts."""

from __future__ import annotations

from pathlib import Path

import click

from toolbox.findings import render_json, render_text
from toolbox.knowledge_base import RepositoryNotFound, find_repo_root
from toolbox.validate.runner import UsageProblem, validate_repository


@click.command(
    "validate",
    epilog="""\b
Examples:
  toolbox validate                                  # knowledge/ and contracts/
  toolbox validate knowledge/attention/gated-attention/SKILL.md
  toolbox validate contracts/attention --format json
  toolbox validate --since origin/main --strict    # what CI runs on a pull request

\b
Exit status: 0 clean; 1 errors (or warnings with --strict); 2 bad path or revision.
""",
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one line per finding; json: a list of {file, line, field, severity, message, hint}.")
@click.option("--since", metavar="REV", help="Also require a version bump for documents changed since git revision REV.")
@click.option("--strict", is_flag=True, help="Warnings fail too.")
def command(paths: tuple[Path, ...], output_format: str, since: str | None, strict: bool) -> None:
    """Validate skills and contracts: schema, Agent Skills rules, cross references, semver.

    Every finding names the file, the line and the field, says what was expected and how to
    fix it. The whole repository is read for cross references; only findings for PATHS are shown.
    """
    start = paths[0] if paths else Path.cwd()
    start = start if start.is_dir() else start.absolute().parent
    try:
        root = find_repo_root(start)
        report = validate_repository(root, list(paths), since)
    except (RepositoryNotFound, UsageProblem) as error:
        raise click.UsageError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - checks are guarded per document; this is the last net
        click.echo(f"error: the validator failed: {type(error).__name__}: {error} (a toolbox bug; please report)", err=True)
        raise SystemExit(2) from None
    summary = (
        f"{report.errors} error(s), {report.warnings} warning(s) in {report.skills_checked} skill(s) and "
        f"{report.contracts_checked} contract(s)"
    )
    if output_format == "json":
        click.echo(render_json(report.findings))
        click.echo(summary, err=True)
    else:
        if report.findings:
            click.echo(render_text(report.findings))
        click.echo(summary)
    failed = report.errors > 0 or (strict and report.warnings > 0)
    raise SystemExit(1 if failed else 0)
