"""Running mkdocs on `site/mkdocs.yml` for `toolbox site build|serve` (in a child process, so each build starts clean)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

CONFIG = Path("site") / "mkdocs.yml"
DEFAULT_OUTPUT = Path("site") / "build"
WATCHED = ("knowledge", "contracts", "results", "benchmarks", "toolbox/site_build", "site/gen")
REQUIRED_MODULES = ("mkdocs", "material", "mkdocs_gen_files", "mkdocs_literate_nav", "mkdocs_llmstxt")
# Third-party start-up banners about MkDocs' future; they are not warnings about this site.
QUIET_BANNERS = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


class SiteError(RuntimeError):
    """The site cannot be built here (a missing package or configuration)."""


@dataclass(frozen=True)
class BuildResult:
    returncode: int
    output_dir: Path
    log: str


def missing_packages() -> list[str]:
    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def _check(root: Path) -> Path:
    missing = missing_packages()
    if missing:
        raise SiteError(f"the site needs {', '.join(missing)}; install them with: pip install -e \".[site]\"")
    config = root / CONFIG
    if not config.is_file():
        raise SiteError(f"no {CONFIG} in {root}")
    return config


def _environment() -> dict[str, str]:
    return {**os.environ, **QUIET_BANNERS}


def build_command(root: Path, output: Path, strict: bool) -> list[str]:
    config = _check(root)
    return [sys.executable, "-m", "mkdocs", "build", "--config-file", str(config), "--site-dir", str(output.resolve()),
            "--strict" if strict else "--no-strict", "--clean"]


def build(root: Path, output: Path | None = None, strict: bool = True) -> BuildResult:
    """Build the site into `output` (default `site/build`); the log holds mkdocs' messages (warnings fail a strict build)."""
    output = Path(output) if output is not None else root / DEFAULT_OUTPUT
    completed = subprocess.run(build_command(root, output, strict), cwd=root, env=_environment(),
                               capture_output=True, text=True, check=False)
    return BuildResult(completed.returncode, output, completed.stdout + completed.stderr)


def serve_url(root: Path, host: str, port: int) -> str:
    """Where `mkdocs serve` puts the site: under the path of `site_url` (e.g. /toolbox/)."""
    import yaml

    try:
        site_url = str(yaml.safe_load((root / CONFIG).read_text(encoding="utf-8")).get("site_url") or "/")
    except (OSError, yaml.YAMLError, AttributeError):
        site_url = "/"
    path = urlparse(site_url).path or "/"
    return f"http://{host}:{port}{path if path.endswith('/') else path + '/'}"


def serve(root: Path, host: str, port: int) -> None:
    """Replace this process by `mkdocs serve` (live reload) so that Ctrl-C and signals reach it directly."""
    config = _check(root)
    command = [sys.executable, "-m", "mkdocs", "serve", "--config-file", str(config), "--dev-addr", f"{host}:{port}"]
    for folder in WATCHED:  # the sources of the generated pages, beside site/docs which mkdocs watches itself
        if (root / folder).is_dir():
            command += ["--watch", str(root / folder)]
    os.chdir(root)
    os.execve(sys.executable, command, _environment())
