"""`toolbox site build|serve`: the knowledge site (mkdocs-material), generated from knowledge/, contracts/ and results."""

from __future__ import annotations

import time
from pathlib import Path

import click

from toolbox.knowledge_base import RepositoryNotFound, default_root


def _root() -> Path:
    try:
        return default_root()
    except RepositoryNotFound as error:
        raise click.UsageError(str(error)) from None


@click.group(
    "site",
    epilog="""\b
Examples:
  toolbox site build                       # strict build into site/build/
  toolbox site build --output /tmp/site    # somewhere else
  toolbox site build --no-strict           # keep going past warnings (drafting)
  toolbox site serve --port 8001           # live preview on http://127.0.0.1:8001/toolbox/
""",
)
def command() -> None:
    """Build or serve the knowledge site: one page per skill and contract, domain indexes, the
    contract status dashboard, engine benchmarks, and llms.txt for agents."""


@command.command(
    "build",
    epilog="""\b
Examples:
  toolbox site build
  toolbox site build --output /tmp/site && python -m http.server -d /tmp/site
  toolbox site build --no-strict --verbose
""",
)
@click.option("--strict/--no-strict", default=True, show_default=True, help="Fail on any mkdocs warning (a broken link, a page missing).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None, help="Where the HTML goes [default: site/build/].")
@click.option("--verbose", is_flag=True, help="Print mkdocs' whole log, not only its warnings.")
def build_command(strict: bool, output: Path | None, verbose: bool) -> None:
    """Generate every page from the repository and build the static site."""
    from toolbox.site_build.build import SiteError, build

    root = _root()
    began = time.perf_counter()
    try:
        result = build(root, output, strict)
    except SiteError as error:
        raise click.ClickException(str(error)) from None
    lines = result.log.splitlines()
    shown = lines if verbose or result.returncode else [line for line in lines if "WARNING" in line or "ERROR" in line]
    for line in shown:
        click.echo(line, err=True)
    if result.returncode:
        raise click.ClickException(f"mkdocs build failed (exit {result.returncode}); see the messages above")
    pages = sum(1 for _ in result.output_dir.rglob("index.html"))
    click.echo(f"built {pages} pages into {result.output_dir} in {time.perf_counter() - began:.1f} s "
               f"(open {result.output_dir / 'index.html'}; llms.txt for agents)")


@command.command(
    "serve",
    epilog="""\b
Examples:
  toolbox site serve
  toolbox site serve --port 8001
""",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
def serve_command(port: int, host: str) -> None:
    """Serve the site with live reload (rebuilds when knowledge/, contracts/ or site/ change)."""
    from toolbox.site_build.build import SiteError, serve, serve_url

    root = _root()
    click.echo(f"building, then serving on {serve_url(root, host, port)} (Ctrl-C stops)", err=True)
    try:
        serve(root, host, port)
    except SiteError as error:
        raise click.ClickException(str(error)) from None
