"""Fixtures for the toolbox tests: a small valid repository tree and a CliRunner-based `toolbox` call."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from toolbox.cli import main

MALFORMED = Path(__file__).resolve().parent / "malformed"
VALID_TREE = MALFORMED / "valid-tree"


@pytest.fixture
def valid_tree(tmp_path: Path) -> Path:
    """A copy of tests/toolbox/malformed/valid-tree: 2 skills, 2 contracts, all valid."""
    root = tmp_path / "repo"
    shutil.copytree(VALID_TREE, root)
    return root


@pytest.fixture
def toolbox_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run `toolbox ARGS...` in-process with the working directory set to `cwd`."""

    def run(*args: str, cwd: Path) -> Result:
        monkeypatch.chdir(cwd)
        return CliRunner().invoke(main, list(args), catch_exceptions=True)

    return run
